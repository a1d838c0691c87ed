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
// Below AVX-512 (row_gemm_needed) an f32 Linear runs on cpu::RowGemm instead of oneDNN: there
// oneDNN's matmul is gemm:jit, whose rows depend on M, and a batch of vehicles must give each
// vehicle its own bits (row_gemm.h).
//
// batched_matmul: y[b] = scale * a[b] @ (transpose_b ? b[b]^T : b[b]), for attention scores and
// attention-weighted values. Primitives are cached per shape in a small process-wide table.
//
// run() and batched_matmul may be called from several threads; calls are serialized per object
// (per process for batched_matmul).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

using bev::Precision;

class Linear {
  struct State;

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

  // This linear on chunks of rows from inside another op's parallel region (a fused op that
  // consumes the output while it is in cache: cpu::deformable_attention, cpu::ffn_norm). Made
  // once per call outside the region: it holds the linear's lock for its life and makes the
  // primitives and lanes for the two chunk lengths the op uses (its chunks and its last one);
  // run() is then called by each pool participant (`lane` below `lanes`) on its own rows. x rows
  // are bf16 when `bf16_in` (bf16 precision), else f32; y rows f32, or bf16 when `bf16_out` (bf16
  // precision). A row's sums are those of run() over all rows at once (oneDNN's matmul computes
  // a row alike for every M: the tests compare the bits). Allocates nothing once the primitives
  // and lanes exist (a replayed plan's calls).
  class RowRunner {
   public:
    RowRunner(const Linear& linear, bool bf16_in, int64_t chunk_rows, int64_t last_rows, int lanes,
              bool bf16_out = false);
    void run(const void* x, int64_t rows, void* y, int lane) const;

   private:
    State& s_;
    std::unique_lock<std::mutex> lock_;
    int64_t rows_[2] = {0, 0};
    void* plans_[2] = {nullptr, nullptr};  // the State::Plan of each chunk length
  };

 private:
  // bf16 precision, f32 x of m >= kChunkMinRows rows (linear.cpp): the pool's participants, each
  // its chunks of `rows` rows converted and multiplied in its cache. Called with the state's lock held.
  void run_chunks(const Tensor& x, Tensor& y, int64_t m, int64_t rows, ThreadPool& pool, bool bf16_out) const;

  std::unique_ptr<State> state_;
};

// a: f32 [B, M, K]; b: f32 [B, K, N], or [B, N, K] when transpose_b; y: f32 [B, M, N],
// preallocated. All contiguous; y must not overlap a or b.
void batched_matmul(const Tensor& a, const Tensor& b, bool transpose_b, float scale, Tensor& y,
                    Precision precision);

}  // namespace bev::cpu
