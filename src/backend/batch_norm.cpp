#include "backend/batch_norm.h"

#include <cmath>
#include <string>
#include <utility>

#include "bevformer/error.h"

namespace bev {
namespace {

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("fold_batch_norm").expected(expected);
}

void check_f32(const char* name, const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::kF32 || t.device() != Device::kCpu) {
    invalid(std::string(name) + " is " + (t.defined() ? t.describe() : std::string("undefined")), "a host f32 tensor");
  }
}

}  // namespace

void fold_batch_norm(const Tensor& weight_oihw, const Tensor* bias, const Tensor& gamma, const Tensor& beta,
                     const Tensor& running_mean, const Tensor& running_var, float eps, Tensor* folded_weight,
                     Tensor* folded_bias) {
  check_f32("weight", weight_oihw);
  if (weight_oihw.dim() != 4) invalid("weight is " + weight_oihw.describe(), "rank 4 OIHW");
  if (!folded_weight || !folded_bias) {
    throw Error(ErrorKind::kInternal, "fold_batch_norm needs both output pointers").where("fold_batch_norm");
  }
  if (!(eps >= 0.0f)) invalid("BatchNorm eps is " + std::to_string(eps), "eps >= 0");
  const int64_t o = weight_oihw.size(0);
  const Shape vec = {o};
  const std::pair<const char*, const Tensor*> params[] = {
      {"bias", bias}, {"gamma", &gamma}, {"beta", &beta}, {"running_mean", &running_mean}, {"running_var", &running_var}};
  for (const auto& [name, t] : params) {
    if (!t) continue;
    check_f32(name, *t);
    if (t->shape() != vec) invalid(std::string(name) + " is " + t->describe(), "f32" + shape_str(vec));
  }
  const Tensor w = weight_oihw.contiguous();
  const Tensor g = gamma.contiguous(), be = beta.contiguous(), mu = running_mean.contiguous(),
               var = running_var.contiguous();
  const Tensor b = bias ? bias->contiguous() : Tensor();
  Tensor fw = Tensor::empty(w.shape(), DType::kF32);
  Tensor fb = Tensor::empty(vec, DType::kF32);
  const int64_t per_out = w.numel() / o;
  const float* src = w.data<float>();
  float* dst = fw.data<float>();
  for (int64_t i = 0; i < o; ++i) {
    const double scale = static_cast<double>(g.data<float>()[i]) /
                         std::sqrt(static_cast<double>(var.data<float>()[i]) + static_cast<double>(eps));
    if (!std::isfinite(scale)) {
      invalid("BatchNorm channel " + std::to_string(i) + " has scale gamma/sqrt(var+eps) = " + std::to_string(scale),
              "running_var + eps > 0");
    }
    for (int64_t j = 0; j < per_out; ++j) {
      dst[i * per_out + j] = static_cast<float>(static_cast<double>(src[i * per_out + j]) * scale);
    }
    const double b0 = b.defined() ? static_cast<double>(b.data<float>()[i]) : 0.0;
    fb.data<float>()[i] =
        static_cast<float>((b0 - static_cast<double>(mu.data<float>()[i])) * scale + static_cast<double>(be.data<float>()[i]));
  }
  *folded_weight = std::move(fw);
  *folded_bias = std::move(fb);
}

}  // namespace bev
