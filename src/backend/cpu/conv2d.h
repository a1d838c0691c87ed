// 2-D convolution on NHWC f32 activations through oneDNN, with bias, residual add and ReLU fused
// as post-ops: y = relu?(conv(x) + bias + residual?).
//
// Weights arrive in PyTorch OIHW f32 and are reordered once, at construction, into the layout the
// oneDNN kernel prefers (format_tag::any), in bf16 for Precision::kBF16. A primitive is created on
// the first run for each input shape and reused after that, together with its scratchpad, the
// dnnl::memory objects its tensors are bound to (and, in bf16 mode, the bf16 copy of the source),
// so a replayed plan allocates nothing here (oneDNN's own execution still does: see onednn.h).
// run() may be called from several threads: see run() for what runs concurrently.
#pragma once

#include <memory>
#include <string>

#include "backend/op.h"
#include "core/tensor.h"

namespace bev::cpu {

class Amx1x1;
using bev::Conv2dAttrs;  // stride, pad, dilation, groups, relu, residual (backend/op.h)
using bev::Precision;

class Conv2d {
 public:
  // weight_oihw: f32 [O, I/groups, KH, KW]; bias: f32 [O] or null. 1x1 convs that
  // cpu::Direct1x1::supports run on that kernel instead of oneDNN's (faster where it applies:
  // direct1x1.h); allow_direct = false keeps them on oneDNN (benchmarks and tests compare).
  Conv2d(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs, Precision precision,
         bool allow_direct = true);
  ~Conv2d();
  Conv2d(Conv2d&&) noexcept;
  Conv2d& operator=(Conv2d&&) noexcept;

  // The same packed weights and bias under other attributes (same kernel size and groups): the
  // fused bottleneck's 3x3 runs on strips of rows that carry their own halo, so it pads only
  // left and right.
  Conv2d with_attrs(const Conv2dAttrs& attrs) const;

  // [N, H, W, C] -> [N, HO, WO, O]; throws kInvalidInput if C or the map size do not fit.
  Shape output_shape(const Shape& input_nhwc) const;

  // x_nhwc: f32 [N, H, W, C] contiguous; residual_nhwc: f32, same shape as y, required iff
  // attrs.residual; y_nhwc: f32, preallocated with output_shape(x.shape()), contiguous, not
  // overlapping x. The residual is added in y (oneDNN's sum post-op): passing y itself as the
  // residual (y already holds the identity, e.g. the downsample conv wrote it there or the block
  // input's buffer is reused as y) saves a copy of the residual into y: 5% (ResNet-50 layer4) to
  // 35% (layer1) of an expand conv's time.
  //
  // Threads: each (input shape, dtypes, lane) has a plan of its own, and runs on one plan are
  // serialized. Calls on different lanes run concurrently, each with oneDNN's whole team, or
  // single-threaded when made from inside an OpenMP parallel region (oneDNN does not nest): the
  // fused bottleneck (cpu::Bottleneck) gives each of its threads a lane and strips of the map.
  void run(const Tensor& x_nhwc, const Tensor* residual_nhwc, Tensor& y_nhwc, int lane = 0) const;

  // Multiply-adds x2 for one run on this input shape (for GFLOP/s reports).
  double flops(const Shape& input_nhwc) const;
  // The implementation that runs this input shape, e.g. "brgconv:avx512_core" (reports).
  std::string impl_name(const Shape& input_nhwc) const;

  int64_t in_channels() const;   // C: I/groups x groups
  int64_t out_channels() const;  // O
  const Conv2dAttrs& attrs() const;
  // This conv's weights packed for cpu::Amx1x1 (bf16 arithmetic on AMX, 1x1 convs it supports),
  // or null. run() does not use it: over whole maps oneDNN's kernels stream memory better (docs/
  // PERF.md); the fused bottleneck runs its strips on it, cache-resident. Packed on the first call
  // (a fused block's first run, when its plan is recorded), so the convs of blocks that never fuse
  // hold no second copy of their weights. Thread-safe.
  const Amx1x1* amx1x1() const;
  Precision precision() const;  // kInt8 for a conv with an int8 step; else its arithmetic, f32 or bf16

  // Eval-mode BatchNorm folded into the preceding conv:
  //   conv'(x) = (conv(x) + b - mean) / sqrt(var + eps) * gamma + beta
  //   w'[o] = w[o] * s[o],  b'[o] = (b[o] - mean[o]) * s[o] + beta[o],  s = gamma / sqrt(var + eps)
  // computed in double and stored as new contiguous f32 tensors. bias may be null (zero).
  static void fold_batch_norm(const Tensor& weight_oihw, const Tensor* bias, const Tensor& gamma,
                              const Tensor& beta, const Tensor& running_mean, const Tensor& running_var,
                              float eps, Tensor* folded_weight, Tensor* folded_bias);

 private:
  struct State;
  explicit Conv2d(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace bev::cpu
