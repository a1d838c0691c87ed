// Shared by the kernel tests: random inputs (uniform f32 in [lo, hi), never zeros by
// construction) and a scoped thread count.
#pragma once

#include <cstdint>
#include <random>

#include "backend/cpu/onednn.h"
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

// Sets the CPU backend's thread count (oneDNN's and our OpenMP kernels') for a scope, restoring
// it even when a check throws.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) : saved_(cpu::num_threads()) { cpu::set_num_threads(n); }
  ~ThreadsGuard() { cpu::set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_;
};

}  // namespace bev::kernel_test
