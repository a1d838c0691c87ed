// Row-wise and elementwise f32 ops of the bev stage. Every tensor is contiguous host f32;
// outputs are preallocated with the input's shape. "In place" means y may be the very same
// memory as x (partial overlap is refused). `pool` is optional: null runs on the caller.
#pragma once

#include <cmath>
#include <span>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// The scalar formulas of sigmoid and inverse_sigmoid below, shared with the kernels that fuse
// them (attention_glue's reference_refine), so both agree bit for bit.
inline float sigmoid_scalar(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float inverse_sigmoid_scalar(float x, float eps) {
  // Comparisons written so that NaN falls through every clamp, as torch.clamp lets it.
  const float v = x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
  const float x1 = v < eps ? eps : v;
  const float one_minus = 1.0f - v;
  const float x2 = one_minus < eps ? eps : one_minus;
  return std::log(x1 / x2);
}

// LayerNorm over the last dim C (x viewed as [M, C]); gamma, beta [C]. Two passes per row in
// f32 (mean, then mean of squared deviations, biased variance as PyTorch), so a large mean does
// not cancel the variance. y = (x - mean) / sqrt(var + eps) * gamma + beta. In place allowed.
// With `residual` (x's shape): layer_norm(x + residual), each row's sum (the bits of cpu::add)
// made into y in cache and normalized there, so the sum never goes to memory.
void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                ThreadPool* pool = nullptr, const Tensor* residual = nullptr);

// Softmax over the last dim: exp(x - max) / sum, the sum in f32, then multiplied by 1/sum as
// PyTorch's CPU kernel does. A row of all -inf gives NaN (as PyTorch). In place allowed.
void softmax(const Tensor& x, Tensor& y, ThreadPool* pool = nullptr);
// layer_norm (with residual: of x + residual) over rows [r0, r1) of contiguous [rows, c_len]
// tensors, on the calling thread (y may be x or residual): the kernel layer_norm runs on each
// chunk of its pool.
void layer_norm_rows(const float* x, const float* residual, const float* gamma, const float* beta, float eps, float* y,
                     int64_t c_len, int64_t r0, int64_t r1);
// softmax over rows [r0, r1) of a contiguous [rows, c_len] (y may be x), on the calling thread:
// the kernel softmax runs on each chunk of its pool.
void softmax_rows(const float* x, float* y, int64_t c_len, int64_t r0, int64_t r1);
// softmax without its division, for ops that divide later (attention divides its context rows,
// hd values, instead of its probabilities, K values): each row's exp(x - max) in place in x, or
// rounded to bf16 into y_bf16 when that is not null, and the sum of the row's exponentials (in
// f32, before rounding) in sums[r]. NaN poisons the row as in softmax.
void softmax_numerators(float* x, uint16_t* y_bf16, float* sums, int64_t c_len, int64_t r0, int64_t r1);

// max(x, 0); NaN stays NaN (torch.relu). In place allowed.
void relu(const Tensor& x, Tensor& y, ThreadPool* pool = nullptr);

// 1 / (1 + exp(-x)) in f32; saturates to exactly 0 and 1. In place allowed.
void sigmoid(const Tensor& x, Tensor& y, ThreadPool* pool = nullptr);

// Upstream's inverse_sigmoid: x clamped to [0, 1], x1 = max(x, eps), x2 = max(1 - x, eps),
// log(x1 / x2) (division, then log). NaN stays NaN, as torch.clamp lets it through. Upstream's
// eps is 1e-5 (InverseSigmoidAttrs' default). In place allowed.
void inverse_sigmoid(const Tensor& x, float eps, Tensor& y, ThreadPool* pool = nullptr);

// y = a + b and y = a * b (f32, one rounding each). b has a's rank and each extent equal to
// a's or 1 (numpy broadcasting of b only); y has a's shape. Equal shapes take a flat loop and y
// may be a or b; otherwise dims are merged into runs that b broadcasts or follows, and y may be
// a but must not overlap b. Operand order is a then b (IEEE + and * commute, so it does not
// change a bit). add's y may be bf16 (each f32 sum rounded to nearest even; disjoint from a and b).
void add(const Tensor& a, const Tensor& b, Tensor& y, ThreadPool* pool = nullptr);
void mul(const Tensor& a, const Tensor& b, Tensor& y, ThreadPool* pool = nullptr);

// out (i64 [G]) = the number of NaN and infinite values in each of x's G equal parts (x contiguous
// f32 or bf16, viewed as [G, numel / G]).
void count_nonfinite(const Tensor& x, Tensor& out, ThreadPool* pool = nullptr);

// y = 0 (all bytes zero, so 0.0f for f32); any dtype, contiguous host.
void zeros(Tensor& y, ThreadPool* pool = nullptr);  // split over `pool` in 256 KiB pieces

// y[m, :] = a[m, :] + row[:] (a viewed as [M, C], row [C]), y f32 (which may be a) or bf16 (the
// f32 sum rounded to nearest even; disjoint from a).
void add_rows(const Tensor& a, const Tensor& row, Tensor& y, ThreadPool* pool = nullptr);

// Ops::feat_flatten (backend/ops.h): y [images, sum hw_l, C] f32 or bf16, level l's rows after the
// levels before it, y[i, start_l + r, c] = (levels[l][i, r, c] + cams_embeds[i % cams, c]) +
// level_rows[l][c] in f32 (without cams_embeds: the level row only), rounded once to y's dtype
// (bf16: to nearest even). y overlaps no input.
void feat_flatten(std::span<const Tensor> levels, std::span<const Tensor> level_rows, const Tensor* cams_embeds,
                  Tensor& y, ThreadPool* pool = nullptr);

}  // namespace bev::cpu
