// Index-driven ops: top-k, row gather/scatter-add, concat and strided (permuting) copies.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// The k largest of scores [n] (f32, contiguous), sorted descending, into values [k] f32 and
// indices [k] i64; 0 <= k <= n.
// Order is total and deterministic: equal scores keep the lower index first (torch.topk
// promises no tie order, and CUDA's differs from run to run, so compare sets in tests), NaN
// counts as smaller than every number including -inf (torch.topk treats NaN as the largest),
// and -0.0 equals +0.0.
void topk(const Tensor& scores, int64_t k, Tensor& values, Tensor& indices);

// dst[m, :] = src[idx[m], :], or a row of zeros (all-zero bytes) where idx[m] = -1: padding,
// e.g. the empty slots of SCA's per-camera query lists. src [N, C] and dst [M, C] contiguous,
// any (same) dtype; idx [M] i64. Every index is checked to be -1 or in [0, N) before anything
// is written, so a bad index (< -1 or >= N) throws and leaves dst untouched. dst may instead be
// bf16 for an f32 src (rows rounded to nearest even; then disjoint from src). Rows split over
// `pool`.
void gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst, ThreadPool* pool = nullptr);

// dst[m, :] = srcs[s][r, :] for idx[m] = gather_multi_index(s, r), or a row of zeros for -1. Every
// source [N_s, C] and dst [M, C] contiguous, one dtype; idx [M] i64. Every index is checked (a
// source that exists, a row inside it) before anything is written.
void gather_rows_multi(std::span<const Tensor> srcs, const Tensor& idx, Tensor& dst);

// dst[idx[m], :] += src[m, :] in increasing m (duplicates accumulate in that order, so the
// result is deterministic); rows with idx[m] = -1 (padding) are skipped. src [M, C] f32, idx [M]
// i64, dst [N, C] f32; indices checked (-1 or in [0, N)) before anything is written.
void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& dst);

// y[n] = scale[n] * (+0 + src[m] for each m with idx[m] = n, in increasing m): zeros,
// scatter_add_rows and a multiply by scale [N, 1] with their bits, in one pass over y. y's rows
// are made in blocks that stay in cache (the rows of src that each block takes are found by one
// counting sort of idx first), the blocks split over the pool. src [M, C] f32, idx [M] i64
// (checked: -1 or in [0, N)), y [N, C] f32, or bf16 (each f32 result rounded once to nearest
// even), contiguous, disjoint from src.
void scatter_mean_rows(const Tensor& src, const Tensor& idx, const Tensor& scale, Tensor& y, ThreadPool* pool = nullptr);

// Concatenation of contiguous tensors of one dtype along `axis` (negative counts from the
// end); they agree on every other extent; dst contiguous with the summed extent, of their dtype
// or bf16 for f32 inputs (rounded to nearest even), disjoint from every input. Split over
// `pool`.
void concat(std::span<const Tensor> inputs, int64_t axis, Tensor& dst, ThreadPool* pool = nullptr);

// dst (contiguous, same shape and dtype) = src, an arbitrary strided view of any rank, e.g.
// x.permute({0, 3, 1, 2}) for NHWC -> NCHW. Transposing views are copied in square blocks,
// split over `pool` when large.
void permute_copy(const Tensor& src, Tensor& dst, ThreadPool* pool = nullptr);

}  // namespace bev::cpu
