// Eval-mode BatchNorm folded into the preceding convolution, once at load (spec §2.2):
//   conv'(x) = (conv(x) + b - mean) / sqrt(var + eps) * gamma + beta
//   w'[o] = w[o] * s[o],  b'[o] = (b[o] - mean[o]) * s[o] + beta[o],  s = gamma / sqrt(var + eps)
// computed in double and stored as new contiguous f32 tensors. bias may be null (zero). Errors
// (kInvalidInput) name the parameter; a non-finite scale (var + eps <= 0) is refused.
#pragma once

#include "core/tensor.h"

namespace bev {

void fold_batch_norm(const Tensor& weight_oihw, const Tensor* bias, const Tensor& gamma, const Tensor& beta,
                     const Tensor& running_mean, const Tensor& running_var, float eps, Tensor* folded_weight,
                     Tensor* folded_bias);

}  // namespace bev
