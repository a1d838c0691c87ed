// A ResNet bottleneck block at stride 1, run depth-first: mmdet's Bottleneck
//   y = relu(conv3(relu(conv2(relu(conv1(x))))) + identity),  identity = downsample(x) or x
// with every BatchNorm already folded into its conv.
//
// Why: run conv by conv, layer1's expand conv (64 -> 256 channels) reads its 147 MB residual and
// writes its 147 MB output while doing little arithmetic per byte, and stays near 55% of the f32
// peak whatever oneDNN kernel or hand-written tile does it (docs/PERF.md). Run in strips of a few
// rows, the strip of x that conv1 has just read is still in the core's L2 when conv3 adds it, and
// conv1's and conv2's outputs never leave it: per block the memory traffic drops from about 590 to
// 295 MB at tiny's layer1.
//
// Threads: the map is cut into bands of rows (whole images when they divide evenly among the
// threads), each thread runs its bands strip by strip, and every conv runs single-threaded on its
// own lane of the cpu::Conv2d (oneDNN does not nest inside our OpenMP region). x may be y itself
// (the block input is dead afterwards): each band's halo rows of conv1's output are computed
// before any thread writes y, so no thread reads a row another has overwritten.
//
// The results are those of the convs run one by one on the whole map (same kernels' arithmetic
// per pixel; test_op_bottleneck checks it against a plain reference and against the unfused convs).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu/conv2d.h"
#include "core/tensor.h"

namespace bev::cpu {

class Bottleneck {
 public:
  // conv1: 1x1 + ReLU; conv2: 3x3, pad 1, + ReLU; conv3: 1x1 + residual + ReLU; downsample: 1x1
  // or null. All stride 1, dilation 1, groups 1 (bev::bottleneck_attrs_fusable, backend/op.h).
  // strip_bytes: see kStripBytes (tests make it tiny to run many strips on small maps).
  Bottleneck(std::shared_ptr<const Conv2d> conv1, std::shared_ptr<const Conv2d> conv2,
             std::shared_ptr<const Conv2d> conv3, std::shared_ptr<const Conv2d> downsample,
             size_t strip_bytes = kStripBytes);
  ~Bottleneck();

  // [N, H, W, C] -> [N, H, W, E] (E: conv3's output channels).
  Shape output_shape(const Shape& input_nhwc) const;

  // x: [N, H, W, C] contiguous f32 (or bf16 in bf16 precision); y: output_shape, f32 or bf16,
  // contiguous: either x itself (no downsample, same dtype) or not overlapping x. t1 and t2 (the
  // outputs of conv1 and conv2) are kept in `act`, as the unfused block keeps them.
  void run(const Tensor& x, Tensor& y, DType act) const;

  // Seconds each member took in the last run, summed over threads (benchmarks: how near its own
  // peak each conv runs inside the block). [0] conv1, [1] conv2, [2] conv3, [3] downsample,
  // [4] the halo rows.
  std::vector<double> last_member_seconds() const;
  int last_threads() const;

  // Whether fusing pays on input x (activations in `act`): when a strip holds at least
  // kMinStripPixels. Narrow maps give strips so small that oneDNN's fixed cost per call outweighs
  // the memory traffic saved (ResNet-50 layer3 at 30x50: 5% slower fused, layer4 at 15x25: 22%);
  // their maps fit in L3 anyway. bf16 on AMX fuses only where its 1x1 members run on
  // cpu::Amx1x1 (channels multiples of 32) and one image's output map is at least
  // kAmxMinImageBytes: there the strips' oneDNN calls cost more than the cache saves (tiny layer1
  // on the AMX Xeon, 2 threads: block 0 19.6 ms conv by conv against 23.0 fused), while Amx1x1,
  // which takes the next strip's rows into L2 while conv3 computes, wins on the large maps
  // (bench_bottleneck, 2026-12-05: tiny layer1 blocks 15.3-16.9 -> 12.8-14.0 ms, block 0
  // 18.3-19.4 -> 15.7-17.7; base layer1 76.2 -> 63.5, layer2 46.2 -> 37.8) and loses on tiny's
  // layer2 (60x100, 6 MB an image: 8.1-8.3 -> 8.8-9.4 ms).
  static bool pays(const Shape& x_nhwc, int64_t planes, int64_t out_ch, DType act);

  // Strips are as many rows as keep a thread's working set (x, t1, t2 and y rows, conv3's f32 sum)
  // within kStripBytes: measured at ResNet-50 layer1, 1 / 2.25 / 4.5 MiB gave 59-69 / 58-62 /
  // 62-78 ms for block 0 and the same within noise for the others.
  static constexpr size_t kStripBytes = 2304 << 10;
  static constexpr int64_t kMinStripPixels = 256;
  static constexpr int64_t kAmxMinImageBytes = int64_t{8} << 20;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace bev::cpu
