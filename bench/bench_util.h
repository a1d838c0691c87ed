// Shared by the kernel benchmarks: deterministic inputs and this machine's measured peaks.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cpu/onednn.h"
#include "core/tensor.h"

namespace bev::bench {

// Deterministic values in [-1, 1) without the cost of a random engine on big tensors.
inline Tensor filled(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = static_cast<float>(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return t;
}

// GFLOP/s of a large oneDNN matmul, measured once per process: the "% of peak" denominator.
// int8 (GOP/s of u8 x s8) is measured on first use only: benchmarks that have no int8 row never pay.
inline double peak(cpu::Precision p) {
  // A precision this CPU lacks has no peak (0): its rows skip (skip_unless_runs).
  static const double f32 = cpu::measure_peak_gflops(cpu::Precision::kF32);
  static const double bf16 = cpu::precision_lacks(cpu::Precision::kBF16).empty() ? cpu::measure_peak_gflops(cpu::Precision::kBF16) : 0;
  switch (p) {
    case cpu::Precision::kF32: return f32;
    case cpu::Precision::kBF16: return bf16;
    case cpu::Precision::kInt8: {
      static const double int8 = cpu::precision_lacks(cpu::Precision::kInt8).empty() ? cpu::measure_peak_gflops(cpu::Precision::kInt8) : 0;
      return int8;
    }
  }
  return 0;
}

// Whether to register rows in precision p: rows this CPU cannot run are left out, and the
// first time for each precision stdout says why (Google Benchmark 1.7 can only skip a row as an
// error, which the smoke runs rightly count as a failure).
inline bool runs_here(cpu::Precision p) {
  const std::string lacks = cpu::precision_lacks(p);
  if (lacks.empty()) return true;
  static bool said[3] = {false, false, false};  // per Precision: f32, bf16, int8
  if (!said[static_cast<int>(p)]) {
    said[static_cast<int>(p)] = true;
    std::printf("%s rows left out: this CPU lacks %s\n", bev::precision_name(p), lacks.c_str());
  }
  return false;
}

// The start of main() for the oneDNN benchmarks: BEV_THREADS=n sizes the OpenMP team (default:
// every core), Google Benchmark takes its flags, and the banner names the ISA, the team and the
// measured peaks that the pct_peak counters divide by.
inline void start(int* argc, char** argv) {
  if (const char* t = std::getenv("BEV_THREADS")) cpu::set_num_threads(std::atoi(t));
  benchmark::Initialize(argc, argv);
  std::printf("oneDNN isa %s, %d threads; measured peak: f32 %.0f GFLOP/s, bf16 %.0f GFLOP/s\n", cpu::isa_name().c_str(),
              cpu::num_threads(), peak(cpu::Precision::kF32), peak(cpu::Precision::kBF16));
}

}  // namespace bev::bench
