// Shape errors of the CPU kernels, worded alike: "<op>: <what> is f32[2, 3] (non-contiguous);
// expected <expected>".
#pragma once

#include <string>

#include "bevformer/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

[[noreturn]] inline void bad_tensor(const char* op, const Tensor& t, const std::string& what,
                                    const std::string& expected) {
  std::string got = t.defined() ? t.describe() : std::string("undefined");
  if (t.defined() && !t.is_contiguous()) got += " (non-contiguous)";
  throw Error(ErrorKind::kInvalidInput, what + " is " + got).where(op).expected(expected);
}

// t must be a contiguous host tensor of `dtype` and exactly `shape` ("expected contiguous host
// f32[2, 3]").
inline void expect_host_shape(const char* op, const Tensor& t, const char* what, DType dtype, const Shape& shape) {
  if (!t.defined() || t.dtype() != dtype || t.device() != Device::kCpu || t.shape() != shape || !t.is_contiguous()) {
    bad_tensor(op, t, what, std::string("contiguous host ") + dtype_name(dtype) + shape_str(shape));
  }
}
inline void expect_f32_shape(const char* op, const Tensor& t, const char* what, const Shape& shape) {
  expect_host_shape(op, t, what, DType::kF32, shape);
}

// Whether two tensors' spans of bytes (from their first element, nbytes long: contiguous
// tensors) share any byte.
inline bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.raw_data());
  const auto* b0 = static_cast<const char*>(b.raw_data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// fn(begin, end) over [0, n): split over the pool in chunks of at least `grain` when there is
// more than one chunk's work and a pool of more than one thread; on the calling thread otherwise.
template <typename Fn>
void for_chunks(ThreadPool* pool, int64_t n, int64_t grain, const Fn& fn) {
  if (pool == nullptr || pool->size() == 1 || n <= grain) {
    fn(int64_t{0}, n);
  } else {
    pool->parallel_for(n, grain, fn);
  }
}

}  // namespace bev::cpu
