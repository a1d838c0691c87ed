// Random inputs for the kernel tests: uniform f32 in [lo, hi), never zeros by construction.
#pragma once

#include <cstdint>
#include <random>

#include "core/tensor.h"

namespace bev::kernel_test {

// Draws from `rng`, so consecutive tensors of one test continue the same sequence.
inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

inline Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  return random_tensor(shape, rng, lo, hi);
}

}  // namespace bev::kernel_test
