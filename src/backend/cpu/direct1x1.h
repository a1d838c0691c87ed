// A 1x1, stride-1 f32 convolution with few input channels as a direct AVX-512 kernel:
// y[p] = relu?(W x[p] + b) over the pixels of an NHWC map, i.e. a GEMM [P, K] x [K, O].
//
// Why not oneDNN: at ResNet's layer1 (6x120x200 maps, 37-147 MB per tensor) oneDNN 2.6 ran these
// convs at 51-70% of the f32 peak, because reading the input is latency-bound: K = 64 gives one
// 256-byte pixel per 8 KFLOP, and the hardware prefetcher keeps too few lines in flight. This
// kernel computes a tile of 6 pixels x 64 output channels in 24 registers, and before each tile
// asks for the input of the tile two further on, so those misses overlap two tiles of arithmetic.
// bench_conv, tiny, the same runs: 64 -> 64 at 87-94% of the peak against oneDNN's 51-53%,
// 64 -> 256 at 83-93% against 65-70% (docs/PERF.md). A tile reads every weight (K x O floats),
// so supports() keeps them within L2 (kMaxWeights).
//
// Dispatch is by what the CPU reports (__builtin_cpu_supports), as for our other AVX-512
// kernels: DNNL_MAX_CPU_ISA limits oneDNN only.
//
// The arithmetic of a pixel does not depend on which pixels a call covers (the tile and the sum
// order over K are fixed), so strips of a map give the bits of the whole map.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/op.h"
#include "core/tensor.h"

namespace bev::cpu {

class Direct1x1 {
 public:
  // Whether a conv runs here: 1x1, stride 1, no padding, dilation 1, groups 1, no residual, f32
  // precision, 1 <= in_channels <= kMaxInChannels, out_channels a multiple of 64, at most
  // kMaxWeights weights, and a CPU with AVX-512. (The expand conv with its residual keeps oneDNN's
  // chunked path: measured no faster.)
  static bool supports(const Conv2dAttrs& attrs, int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                       Precision precision);
  static constexpr int64_t kMaxInChannels = 256;   // measured up to ResNet's 256 -> 64 reduce
  static constexpr int64_t kMaxWeights = 256 * 256;  // 256 KiB of f32: in L2 (measured up to 64 KiB)

  // weight_oihw: f32 [O, K, 1, 1] (contiguous or not); bias: f32 [O] or null.
  Direct1x1(const Tensor& weight_oihw, const Tensor* bias, bool relu);

  // x: `pixels` rows of K floats, y: `pixels` rows of O floats (contiguous, not overlapping). On the
  // OpenMP team of cpu::num_threads(), each thread a contiguous range of pixels; on the calling
  // thread alone when called inside a parallel region (the fused bottleneck's lanes).
  void run(const float* x, float* y, int64_t pixels) const;

 private:
  int64_t k_ = 0, o_ = 0;
  bool relu_ = false;
  std::vector<float> w_;  // [O / 64][K][64]: one column block's weights contiguous per input channel
  std::vector<float> b_;  // [O], zeros without a bias
};

}  // namespace bev::cpu
