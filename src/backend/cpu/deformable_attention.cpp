#include "backend/cpu/deformable_attention.h"

#include <algorithm>
#include <string>

#include "backend/cpu/attention_glue.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_check.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/msda.h"
#include "backend/cpu/row_chunks.h"
#include "bevformer/error.h"

namespace bev::cpu {
namespace {

constexpr const char* kOp = "deformable_attention";

// A participant's chunk takes about this much scratch: its offsets (then locations) and weights.
// `test_backend_ops --perf --op deformable_attention --shapes base --precision bf16`, AMX Xeon, 2
// threads: SCA 165.0 / 156.6 / 158.7 / 159.4 ms and TSA 36.3 / 34.9 / 36.7 / 36.1 ms with 128,
// 256, 512 and 1024 KiB.
constexpr int64_t kChunkBytes = int64_t{256} << 10;

}  // namespace

DeformableProjections deformable_projections(const char* op, const DeformableAttentionAttrs& a, int64_t in,
                                             int64_t heads) {
  const auto invalid_here = [op](const std::string& problem, const std::string& expected) {
    throw Error(ErrorKind::kInvalidInput, problem).where(op).expected(expected);
  };
  if (!a.sampling_offsets || !a.attention_weights) invalid_here("projections missing", "two prepared linears");
  const auto& offsets = *static_cast<const Linear*>(a.sampling_offsets.get());
  const auto& weights = *static_cast<const Linear*>(a.attention_weights.get());
  const auto levels = static_cast<int64_t>(a.msda.spatial_shapes.size());
  const int64_t samples = heads * levels * a.points;
  if (offsets.in_features() != in || weights.in_features() != in || offsets.out_features() != 2 * samples ||
      weights.out_features() != samples || a.points < 1)
    invalid_here("projections " + std::to_string(offsets.in_features()) + " -> " + std::to_string(offsets.out_features()) +
                     " and " + std::to_string(weights.in_features()) + " -> " + std::to_string(weights.out_features()) +
                     " for " + std::to_string(in) + " features, " + std::to_string(heads) + " heads, " +
                     std::to_string(levels) + " levels, " + std::to_string(a.points) + " points",
                 std::to_string(2 * samples) + " offsets and " + std::to_string(samples) +
                     " weights per query, from the query's features");
  return {offsets, weights, samples};
}

void deformable_attention(const Tensor& query, const Tensor& reference, const Tensor& value,
                          const DeformableAttentionAttrs& a, Tensor& out, ThreadPool& pool) {
  const bool bf16_in = query.defined() && query.dtype() == DType::kBF16;
  if (!query.defined() || query.device() != Device::kCpu || query.dim() != 2 || !query.is_contiguous() ||
      (query.dtype() != DType::kF32 && !bf16_in))
    bad_tensor(kOp, query, "query", "contiguous host f32 or bf16 [M, C]");
  if (value.dim() != 4) bad_tensor(kOp, value, "value", "[bs, Lv, heads, hd]");
  const int64_t rows = query.size(0), bs = value.size(0), heads = value.size(2), hd = value.size(3);
  const auto levels = static_cast<int64_t>(a.msda.spatial_shapes.size());
  const int64_t points = a.points;
  const DeformableProjections proj = deformable_projections(kOp, a, query.size(1), heads);
  const int64_t samples = proj.samples;
  if (bs < 1 || rows % bs != 0) bad_tensor(kOp, query, "query", "bs * Lq rows for value " + value.describe());
  if (!reference.defined() || reference.device() != Device::kCpu || reference.dtype() != DType::kF32 ||
      reference.dim() != 4 || reference.size(0) != rows || !reference.is_contiguous())
    bad_tensor(kOp, reference, "reference", "contiguous host f32 [" + std::to_string(rows) + ", Lr, R, D]");
  const int64_t lr = reference.size(1), r_len = reference.size(2);
  if ((lr != 1 && lr != levels) || r_len < 1 || points % r_len != 0 || reference.size(3) < 2)
    bad_tensor(kOp, reference, "reference",
               "[M, 1 or " + std::to_string(levels) + ", R dividing " + std::to_string(points) + ", >= 2]");
  if (!out.defined() || out.shape() != Shape{rows, heads * hd}) bad_tensor(kOp, out, "out", "f32 [M, heads * hd]");
  if (rows == 0) return;
  const int64_t lq = rows / bs;
  Tensor out3 = out.reshape({bs, lq, heads * hd});  // (Shape is inline: replays allocate nothing)
  const int lanes = pool.size();
  const MsdaChunks msda(value, a.msda.spatial_shapes, a.msda.level_start, lq, points, out3, lanes);

  const RowChunks chunks = row_chunks(rows, 3 * samples * static_cast<int64_t>(sizeof(float)), lanes, kChunkBytes);
  const Linear::RowRunner offsets_rows(proj.offsets, bf16_in, chunks.rows, chunks.last, lanes);
  const Linear::RowRunner weights_rows(proj.weights, bf16_in, chunks.rows, chunks.last, lanes);
  // Per participant: offsets (2 * samples per row, then the locations in place) and weights.
  const int64_t offsets_bytes = line_pairs(chunks.rows * 2 * samples * 4);
  const int64_t lane_bytes = offsets_bytes + line_pairs(chunks.rows * samples * 4);
  char* base = lane_scratch(lane_bytes, lanes);

  const auto* q = static_cast<const char*>(query.raw_data());
  const size_t q_row = static_cast<size_t>(query.size(1)) * dtype_size(query.dtype());
  const int64_t softmax_cols = a.softmax_per_level ? points : levels * points;
  const float* ref = reference.data<float>();
  const int64_t d_len = reference.size(3);
  pool.parallel_for_indexed(chunks.count, chunks.grain, [&](int64_t c0, int64_t c1, int lane) {
    auto* offsets = reinterpret_cast<float*>(base + lane * lane_bytes);
    auto* weights = reinterpret_cast<float*>(base + lane * lane_bytes + offsets_bytes);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * chunks.rows, n = std::min(chunks.rows, rows - r0);
      const void* x = q + static_cast<size_t>(r0) * q_row;
      offsets_rows.run(x, n, offsets, lane);
      weights_rows.run(x, n, weights, lane);
      softmax_rows(weights, weights, softmax_cols, 0, n * samples / softmax_cols);
      sampling_locations_rows(offsets, ref + r0 * lr * r_len * d_len, lr, r_len, d_len, heads, points,
                              a.msda.spatial_shapes, offsets, 0, n);
      msda.run(r0, r0 + n, offsets, weights, lane);
    }
  });
}

}  // namespace bev::cpu
