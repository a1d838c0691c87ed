// Shape errors of the CPU kernels, worded alike: "<op>: <what> is f32[2, 3] (non-contiguous);
// expected <expected>".
#pragma once

#include <string>

#include "bevformer/error.h"
#include "core/tensor.h"

namespace bev::cpu {

[[noreturn]] inline void bad_tensor(const char* op, const Tensor& t, const std::string& what,
                                    const std::string& expected) {
  std::string got = t.defined() ? t.describe() : std::string("undefined");
  if (t.defined() && !t.is_contiguous()) got += " (non-contiguous)";
  throw Error(ErrorKind::kInvalidInput, what + " is " + got).where(op).expected(expected);
}

// t must be a contiguous host f32 tensor of exactly `shape` ("expected contiguous host f32[2, 3]").
inline void expect_f32_shape(const char* op, const Tensor& t, const char* what, const Shape& shape) {
  if (!t.defined() || t.dtype() != DType::kF32 || t.device() != Device::kCpu || t.shape() != shape ||
      !t.is_contiguous()) {
    bad_tensor(op, t, what, "contiguous host f32" + shape_str(shape));
  }
}

}  // namespace bev::cpu
