#include "core/compare.h"

#include <cmath>

#include "bevformer/error.h"

namespace bev {

TensorDiff compare(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) {
    throw Error(ErrorKind::kInvalidInput, "cannot compare " + got.describe() + " with " + want.describe())
        .expected("equal shapes");
  }
  const Tensor a = got.to(DType::kF64), b = want.to(DType::kF64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double num = 0, den = 0;
  TensorDiff d;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double e = pa[i] - pb[i];
    num += e * e;
    den += pb[i] * pb[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
  }
  d.relative_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

}  // namespace bev
