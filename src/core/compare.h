// How far one tensor is from another: relative L2 error and max abs error, the two numbers every
// golden comparison and bf16-vs-f32 check reports.
#pragma once

#include "core/tensor.h"

namespace bev {

struct TensorDiff {
  double relative_l2 = 0.0;  // ||got - want|| / ||want|| (||got - want|| when want is all zeros)
  double max_abs = 0.0;
};

// Both tensors must have the same shape; any float dtype, any strides (compared as f64).
TensorDiff compare(const Tensor& got, const Tensor& want);

}  // namespace bev
