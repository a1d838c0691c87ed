// A 1x1, stride-1 f32 convolution with few input channels as a direct AVX-512 kernel:
// y[p] = relu?(W x[p] + b) over the pixels of an NHWC map, i.e. a GEMM [P, K] x [K, O].
//
// Why not oneDNN: at ResNet's layer1 (6x120x200 maps, 37-147 MB per tensor) oneDNN 2.6 ran these
// convs at 50-60% of the f32 peak (64 -> 64: 5.7-5.9 ms), because reading the input is
// latency-bound: K = 64 gives one 256-byte pixel per 8 KFLOP, and the hardware prefetcher keeps
// too few lines in flight. This kernel computes a tile of 6 pixels x 64 output channels in 24
// registers and prefetches the input of the tile two ahead as it goes, inside the loop that computes
// on the current one, so the misses overlap the arithmetic: 64 -> 64 3.0-3.1 ms (97-101%),
// 64 -> 256 13.7-14.5 ms (83-88%) in the same runs (docs/PERF.md). Weights stay in L1/L2 (at most
// K x 64 floats per column block).
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
  // precision, 1 <= in_channels <= kMaxInChannels, out_channels a multiple of 64, and a CPU with
  // AVX-512. (The expand conv with its residual keeps oneDNN's chunked path: measured no faster.)
  static bool supports(const Conv2dAttrs& attrs, int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                       Precision precision);
  static constexpr int64_t kMaxInChannels = 256;  // measured up to ResNet's 256 -> 64 reduce

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
