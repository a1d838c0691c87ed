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
#include <memory>

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

// The spec: plain loops, one output pixel at a time, samples rounded to f32 exactly as mmcv
// forms them (val * mask), dot products accumulated in f64. Used by tests; slow.
void deform_conv2d_reference(const Tensor& x_nhwc, const Tensor& offset_mask_nhwc, const Tensor& weight_oihw,
                             const Tensor* bias, int stride, int pad, int dilation, Tensor& y_nhwc);

}  // namespace bev::cpu
