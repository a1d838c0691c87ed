// Fully connected layers and batched matrix products through oneDNN's matmul.
//
// Linear: y = relu?(x @ W^T + b) with W in PyTorch's [out, in] f32 layout. The weights are packed
// once, at construction, into the layout oneDNN's brgemm kernel prefers (bf16 for
// Precision::kBF16). One primitive per row count M is created on the first run with that M and
// reused: measured on this machine (Zen 5, 2 cores), fixed-M brgemm beats a single runtime-M
// primitive (which falls back to gemm:jit) by 1.1-1.7x at BEVFormer's shapes, and the model uses a
// handful of distinct M, so the per-M cache stays small. In bf16 precision an f32 x of many rows
// (base's BEV maps) runs on chunks instead, each thread converting and multiplying its own rows
// in its cache (run_chunks); the tests find the bits of one call.
//
// batched_matmul: y[b] = scale * a[b] @ (transpose_b ? b[b]^T : b[b]), for attention scores and
// attention-weighted values. Primitives are cached per shape in a small process-wide table.
//
// run() and batched_matmul may be called from several threads; calls are serialized per object
// (per process for batched_matmul).
#pragma once

#include <memory>
#include <string>

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

using bev::Precision;

class Linear {
 public:
  // weight_out_in: f32 [out, in]; bias: f32 [out] or null.
  Linear(const Tensor& weight_out_in, const Tensor* bias, bool relu, Precision precision);
  ~Linear();
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;

  int64_t in_features() const;
  int64_t out_features() const;

  // x: f32 [M, in] (or [..., in]: leading dims are flattened into M), contiguous;
  // y: f32 [M, out] (same leading dims as x), or bf16 in Precision::kBF16, preallocated,
  // contiguous, not overlapping x. pool: where a bf16 linear on a large f32 x runs its chunks (the
  // CPU backend's OpenMP pool); without one, or with one thread, it is one oneDNN call.
  void run(const Tensor& x, Tensor& y, ThreadPool* pool = nullptr) const;

  // The oneDNN implementation used for m rows, e.g. "brg:avx512_core" (for reports).
  std::string impl_name(int64_t m) const;

 private:
  // bf16 precision, f32 x of m >= kChunkMinRows rows (linear.cpp): the pool's participants, each
  // its chunks of `rows` rows converted and multiplied in its cache. Called with the state's lock held.
  void run_chunks(const Tensor& x, Tensor& y, int64_t m, int64_t rows, ThreadPool& pool, bool bf16_out) const;

  struct State;
  std::unique_ptr<State> state_;
};

// a: f32 [B, M, K]; b: f32 [B, K, N], or [B, N, K] when transpose_b; y: f32 [B, M, N],
// preallocated. All contiguous; y must not overlap a or b.
void batched_matmul(const Tensor& a, const Tensor& b, bool transpose_b, float scale, Tensor& y,
                    Precision precision);

}  // namespace bev::cpu
