// Modulated deformable convolution v2 (mmcv ModulatedDeformConv2dPack's forward after its
// conv_offset; torchvision.ops.deform_conv2d with a mask), deform_groups = 1, NHWC f32.
//
// offset_mask [N, Ho, Wo, 3K] (K = kh*kw, tap k = i*kw + j) is conv_offset's raw output:
//   channel 2k   = Δy (rows) of tap k, channel 2k+1 = Δx (cols) of tap k,
//   channel 2K+k = mask logit of tap k (sigmoid is applied here).
// Tap k of output (ho, wo) samples x at (ho*stride - pad + i*dil + Δy, wo*stride - pad + j*dil + Δx)
// bilinearly: 0 unless -1 < y < H and -1 < x < W (NaN positions read 0, as mmcv's test does),
// and only the corners inside the map contribute. The sample is multiplied by sigmoid(logit)
// and the result is the dot with the weight, plus bias if any (BEVFormer's conv2 has none).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

class DeformConv2d {
 public:
  // Upper bound on the column tile (rows = output pixels, cols = K*Cin floats). 8 MB keeps a
  // tile in Zen 5's L3 slice share while giving the matmul ≥ ~900 rows at base's widest layer.
  static constexpr size_t kDefaultColBudgetBytes = size_t{8} << 20;

  // weight_oihw [Cout, Cin, kh, kw] f32; bias [Cout] f32 or nullptr. The weight is reordered
  // once to [kh*kw*Cin, Cout] (row = tap*Cin + cin); the tensors are not kept.
  // precision kBF16: the column tile and the weight in bf16 (samples rounded once, as a bf16
  // convolution rounds its input), accumulated in f32 by a bf16 oneDNN matmul and written in f32
  // or bf16 (y's dtype). relu: y = max(0, ...), applied by the matmul before y is written.
  DeformConv2d(const Tensor& weight_oihw, const Tensor* bias, int stride, int pad, int dilation,
               size_t col_budget_bytes = kDefaultColBudgetBytes, Precision precision = Precision::kF32,
               bool relu = false);
  ~DeformConv2d();
  DeformConv2d(DeformConv2d&&) noexcept;
  DeformConv2d& operator=(DeformConv2d&&) noexcept;

  // [N, Ho, Wo, Cout] for an input [N, H, W, Cin]; throws kInvalidInput on a bad shape.
  Shape output_shape(const Shape& x_nhwc) const;

  // x_nhwc is f32, or bf16 in bf16 precision (its values widened exactly before sampling);
  // y_nhwc is preallocated [N, Ho, Wo, Cout], f32 or bf16 in bf16 precision. Sampling runs on
  // `pool`; the matmul runs on oneDNN's own (OpenMP) threads. Concurrent calls on one object
  // serialize (shared scratch).
  void run(const Tensor& x_nhwc, const Tensor& offset_mask_nhwc, Tensor& y_nhwc, ThreadPool& pool) const;

  int64_t in_channels() const;
  int64_t out_channels() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace deform_conv2d_detail {

// The taps' geometry of one output pixel, made 16 taps at a time before their columns are
// combined: what DeformConv2d::run does per pixel, exposed so tests can hold the AVX-512 form to
// the scalar one bit for bit.
struct TapGeometry {
  int64_t h = 0, w = 0, cin = 0, kh = 0, kw = 0, stride = 1, pad = 0, dil = 1, taps = 0;
  // Whether pixel_taps_avx512 may run: the CPU has AVX-512 (F, BW, VL, DQ) and the map's offsets
  // and positions fit int32. Its tables then: i * dilation and j * dilation of tap t = i * kw + j,
  // 0 past the taps.
  bool avx512 = false;
  std::vector<int32_t> tap_y, tap_x;
};
TapGeometry tap_geometry(int64_t h, int64_t w, int64_t cin, int64_t kh, int64_t kw, int stride, int pad, int dilation);

// Per tap, the bilinear corners inside the map in mmcv's order (0 to 4 of (h_low, w_low),
// (h_low, w_high), (h_high, w_low), (h_high, w_high)) with their f32 weights and element offsets
// (y * W + x) * Cin into the image, and the mask sigmoid(logit). A position outside (-1, H) x
// (-1, W), or NaN, has no corner.
struct TapCorners {
  int n = 0;
  float w[4];
  int64_t off[4];
};
struct PixelTaps {
  TapCorners tap[16];
  float mask[16];
};

// Taps [t0, t0 + count) of output pixel (ho, wo), count <= 16, from o, the pixel's 3 * taps
// floats of offset_mask.
void pixel_taps_scalar(const TapGeometry& g, int64_t ho, int64_t wo, const float* o, int64_t t0, int64_t count,
                       PixelTaps& out);
// The same bits 16 lanes at a time, where g.avx512.
void pixel_taps_avx512(const TapGeometry& g, int64_t ho, int64_t wo, const float* o, int64_t t0, int64_t count,
                       PixelTaps& out);

}  // namespace deform_conv2d_detail

// The spec: plain loops, one output pixel at a time, samples rounded to f32 exactly as mmcv
// forms them (val * mask), dot products accumulated in f64. Used by tests; slow.
void deform_conv2d_reference(const Tensor& x_nhwc, const Tensor& offset_mask_nhwc, const Tensor& weight_oihw,
                             const Tensor* bias, int stride, int pad, int dilation, Tensor& y_nhwc);

}  // namespace bev::cpu
