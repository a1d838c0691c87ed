// y = relu?(x @ W^T + b), f32, where each output row is the same bits for any number of rows, any
// position among them and any thread count: the linears' kernel where oneDNN's matmul is not.
//
// Why it exists: on CPUs without AVX-512 (Zen 3, most laptops) oneDNN 2.6's f32 matmul is
// `gemm:jit`, whose blocking and kernels depend on M: a row of a 200-row call differs from the
// same row in a 50-row call (tests/test_op_linear.cpp, LinearRows). A batch of vehicles stacks
// their rows, so a vehicle's boxes would depend on which others shared its batch. oneDNN's
// brgemm (AVX-512) computes a row alike for every M, so Linear keeps oneDNN there
// (`row_gemm_needed`).
//
// How: W packed once into panels of 16 output columns, each [K][16] contiguous (the last panel
// padded with zeros). A 6 x 16 register tile runs one FMA chain per output element over k in
// order from 0, adds the bias, applies the ReLU: the element's bits depend on its own row of x and
// column of W only. Rows are taken in chunks, and K in blocks, that keep a chunk's x rows in L2
// and a panel's block in L1 while every panel passes over them (between K blocks the sums wait in
// y as f32: the same chain). AVX2 + FMA; a scalar loop of the same per-element order where the CPU (or
// ONEDNN_MAX_CPU_ISA, core/cpu_features.h) has neither.
#pragma once

#include <cstdint>
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// Whether Linear runs on RowGemm here: f32 arithmetic where oneDNN's matmul is not brgemm (no
// AVX-512 core, or capped below it).
bool row_gemm_needed();

class RowGemm {
 public:
  // weight_out_in: [out][in] row-major (PyTorch's layout); bias: [out] or null.
  RowGemm(const float* weight_out_in, int64_t out, int64_t in, const float* bias, bool relu);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  // x: [rows][in], y: [rows][out], both dense. On the pool's participants (chunks of rows), or on
  // the calling thread alone without a pool.
  void run(const float* x, int64_t rows, float* y, ThreadPool* pool) const;
  // On the calling thread alone (a fused op's participant).
  void run_rows(const float* x, int64_t rows, float* y) const;
  // Which kernel runs: "row_gemm:avx2" or "row_gemm:scalar".
  static const char* impl_name();

 private:
  int64_t in_ = 0, out_ = 0, panels_ = 0;
  bool relu_ = false;
  Tensor packed_;  // f32 [panels_][in_][16], 64-byte aligned
  Tensor bias_;    // f32 [panels_ * 16], zero-padded
};

}  // namespace bev::cpu
