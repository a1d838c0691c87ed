#include "backend/cpu/ffn.h"

#include <algorithm>
#include <string>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_check.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/row_chunks.h"
#include "bevformer/error.h"

namespace bev::cpu {
namespace {

// A participant's chunk of hidden rows takes about this much scratch (measured on the AMX Xeon:
// docs/PERF.md).
constexpr int64_t kChunkBytes = int64_t{256} << 10;

}  // namespace

void ffn_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const FfnNormAttrs& a, Tensor& y,
              ThreadPool& pool) {
  const char* op = "ffn_norm";
  if (!a.fc1 || !a.fc2) throw Error(ErrorKind::kInvalidInput, "layers missing").where(op).expected("two prepared linears");
  const auto& fc1 = *static_cast<const Linear*>(a.fc1.get());
  const auto& fc2 = *static_cast<const Linear*>(a.fc2.get());
  const int64_t c = fc1.in_features(), h = fc1.out_features();
  if (fc2.in_features() != h || fc2.out_features() != c)
    throw Error(ErrorKind::kInvalidInput, "layers " + std::to_string(c) + " -> " + std::to_string(h) + " and " +
                                              std::to_string(fc2.in_features()) + " -> " +
                                              std::to_string(fc2.out_features()))
        .where(op)
        .expected("fc2 back from fc1's width to its input's");
  if (x.dim() != 2) bad_tensor(op, x, "x", "contiguous host f32 [M, " + std::to_string(c) + "]");
  const int64_t rows = x.size(0);
  expect_f32_shape(op, x, "x", {rows, c});
  expect_f32_shape(op, gamma, "gamma", {c});
  expect_f32_shape(op, beta, "beta", {c});
  expect_f32_shape(op, y, "y", {rows, c});
  if (overlaps(x, y)) bad_tensor(op, y, "y", "a tensor disjoint from x");
  if (rows == 0) return;
  const bool bf16_hidden = a.hidden == DType::kBF16;
  const int lanes = pool.size();
  const int64_t row_bytes = h * (bf16_hidden ? 2 : 4);
  const RowChunks chunks = row_chunks(rows, row_bytes, lanes, kChunkBytes);
  // fc1 reads the f32 rows of x (converted per chunk in bf16, as the linear op does).
  const Linear::RowRunner fc1_rows(fc1, /*bf16_in=*/false, chunks.rows, chunks.last, lanes, /*bf16_out=*/bf16_hidden);
  const Linear::RowRunner fc2_rows(fc2, /*bf16_in=*/bf16_hidden, chunks.rows, chunks.last, lanes);
  // Per participant: its hidden rows.
  const int64_t lane_bytes = line_pairs(chunks.rows * row_bytes);
  char* base = lane_scratch(lane_bytes, lanes);

  const float* xp = x.data<float>();
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  float* yp = y.data<float>();
  pool.parallel_for_indexed(chunks.count, chunks.grain, [&](int64_t c0, int64_t c1, int lane) {
    char* hidden = base + lane * lane_bytes;
    for (int64_t k = c0; k < c1; ++k) {
      const int64_t r0 = k * chunks.rows, n = std::min(chunks.rows, rows - r0);
      fc1_rows.run(xp + r0 * c, n, hidden, lane);
      fc2_rows.run(hidden, n, yp + r0 * c, lane);
      layer_norm_rows(xp, yp, g, b, a.eps, yp, c, r0, r0 + n);
    }
  });
}

}  // namespace bev::cpu
