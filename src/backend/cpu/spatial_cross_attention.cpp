#include "backend/cpu/spatial_cross_attention.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/attention_glue.h"
#include "backend/cpu/deformable_attention.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_check.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/msda.h"
#include "backend/cpu/row_chunks.h"
#include "bevformer/error.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

constexpr const char* kOp = "spatial_cross_attention";

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where(kOp).expected(expected);
}

// A chunk's scratch: its cells' projections and sums, and its slots' locations, weights and
// samples (about 1.13 slots a cell on nuScenes rigs).
constexpr int64_t kChunkBytes = int64_t{512} << 10;

// Each cell's slots in increasing slot order: cell q's are slot[start[q] .. start[q + 1]). A
// stable counting sort of query_index, into the calling thread's buffers (they only grow, so a
// replayed call allocates nothing).
struct CellSlots {
  const int64_t* start = nullptr;
  const int64_t* slot = nullptr;
};

CellSlots cell_slots(const int64_t* index, int64_t slots, int64_t cells) {
  thread_local std::vector<int64_t> start, slot;
  if (start.size() < static_cast<size_t>(cells + 1)) start.resize(static_cast<size_t>(cells + 1));
  std::fill(start.begin(), start.begin() + cells + 1, int64_t{0});
  for (int64_t s = 0; s < slots; ++s) {
    if (index[s] < -1 || index[s] >= cells)
      invalid("query_index[" + std::to_string(s) + "] = " + std::to_string(index[s]) + " is out of range",
              "cells in [0, " + std::to_string(cells) + ") or -1 (padding)");
    if (index[s] >= 0) ++start[static_cast<size_t>(index[s] + 1)];
  }
  for (int64_t q = 0; q < cells; ++q) start[static_cast<size_t>(q + 1)] += start[static_cast<size_t>(q)];
  // Room for every slot, used or not: a replayed plan's frames share the slot count, not the
  // number in use, so sized by the former a replay never allocates.
  if (slot.size() < static_cast<size_t>(slots)) slot.resize(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    if (index[s] >= 0) slot[static_cast<size_t>(start[static_cast<size_t>(index[s])]++)] = s;
  }
  // start[q] now ends cell q's run: shift back by one cell.
  for (int64_t q = cells; q > 0; --q) start[static_cast<size_t>(q)] = start[static_cast<size_t>(q - 1)];
  start[0] = 0;
  return {start.data(), slot.data()};
}

}  // namespace

void spatial_cross_attention(const Tensor& query, const Tensor& query_index, const Tensor& reference,
                             const Tensor& inv_count, const Tensor& value, const DeformableAttentionAttrs& a, Tensor& out,
                             ThreadPool& pool) {
  if (!query.defined() || query.device() != Device::kCpu || query.dim() != 2 || !query.is_contiguous() ||
      (query.dtype() != DType::kF32 && query.dtype() != DType::kBF16))
    bad_tensor(kOp, query, "query", "contiguous host f32 or bf16 [HW, C]");
  // Rows go to the projections in the rebatch's dtype: f32 rows rounded to bf16 in bf16 precision.
  if (a.query_dtype != DType::kF32 && a.query_dtype != DType::kBF16)
    invalid(std::string("query rounded to ") + dtype_name(a.query_dtype), "f32 or bf16");
  const bool convert = query.dtype() != a.query_dtype;
  if (convert && query.dtype() != DType::kF32)
    bad_tensor(kOp, query, "query", std::string("f32, or already ") + dtype_name(a.query_dtype));
  const bool bf16_rows = a.query_dtype == DType::kBF16;
  if (value.dim() != 4) bad_tensor(kOp, value, "value", "[cameras, Lv, heads, hd]");
  const int64_t cells = query.size(0), cams = value.size(0), heads = value.size(2), hd = value.size(3);
  const int64_t width = heads * hd;
  const auto levels = static_cast<int64_t>(a.msda.spatial_shapes.size());
  const int64_t points = a.points;
  const DeformableProjections proj = deformable_projections(kOp, a, query.size(1), heads);
  const int64_t samples = proj.samples;
  if (!query_index.defined() || query_index.device() != Device::kCpu || query_index.dtype() != DType::kI64 ||
      query_index.dim() != 1 || !query_index.is_contiguous() || cams < 1 || query_index.size(0) % cams != 0)
    bad_tensor(kOp, query_index, "query_index", "contiguous host i64 [cameras * max_len], cameras = value's first extent");
  const int64_t slots = query_index.size(0), max_len = slots / cams;
  if (!reference.defined() || reference.device() != Device::kCpu || reference.dtype() != DType::kF32 ||
      reference.dim() != 4 || reference.size(0) != slots || !reference.is_contiguous())
    bad_tensor(kOp, reference, "reference", "contiguous host f32 [" + std::to_string(slots) + ", Lr, R, D]");
  const int64_t lr = reference.size(1), r_len = reference.size(2), d_len = reference.size(3);
  if ((lr != 1 && lr != levels) || r_len < 1 || points % r_len != 0 || d_len < 2)
    bad_tensor(kOp, reference, "reference",
               "[slots, 1 or " + std::to_string(levels) + ", R dividing " + std::to_string(points) + ", >= 2]");
  expect_f32_shape(kOp, inv_count, "inv_count", {cells, 1});
  if (!out.defined() || out.device() != Device::kCpu || out.shape() != Shape{cells, width} || !out.is_contiguous() ||
      (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16))
    bad_tensor(kOp, out, "out", "contiguous host f32 or bf16 [" + std::to_string(cells) + ", heads * hd]");
  if (overlaps(out, query)) bad_tensor(kOp, out, "out", "memory disjoint from query");
  const CellSlots by_cell = cell_slots(query_index.data<int64_t>(), slots, cells);
  if (cells == 0 || width == 0) return;

  const bool bf16_out = out.dtype() == DType::kBF16;
  const int lanes = pool.size();
  const MsdaChunks msda(value, a.msda.spatial_shapes, a.msda.level_start, points, lanes);
  // Per cell: its row (when rounded here), offsets, weights and sums; per slot (at most
  // kSlotsPerCell a cell in one pass, more in several): locations, weights and the samples.
  constexpr int64_t kSlotsPerCell = 2;
  const int64_t q_row = query.size(1) * static_cast<int64_t>(dtype_size(a.query_dtype));
  const int64_t cell_bytes = (convert ? q_row : 0) + (3 * samples + (bf16_out ? width : 0)) * 4;
  const int64_t slot_bytes = (3 * samples + width) * 4 + 8;
  const RowChunks chunks = row_chunks(cells, cell_bytes + kSlotsPerCell * slot_bytes, lanes, kChunkBytes);
  const int64_t batch = kSlotsPerCell * chunks.rows;  // slots a pass
  const Linear::RowRunner offsets_rows(proj.offsets, bf16_rows, chunks.rows, chunks.last, lanes);
  const Linear::RowRunner weights_rows(proj.weights, bf16_rows, chunks.rows, chunks.last, lanes);
  const int64_t rows_bytes = convert ? line_pairs(chunks.rows * q_row) : 0;
  const int64_t offsets_bytes = line_pairs(chunks.rows * 2 * samples * 4);
  const int64_t weights_bytes = line_pairs(chunks.rows * samples * 4);
  const int64_t sums_bytes = bf16_out ? line_pairs(chunks.rows * width * 4) : 0;
  const int64_t loc_bytes = line_pairs(batch * 2 * samples * 4), attn_bytes = line_pairs(batch * samples * 4);
  const int64_t samples_bytes = line_pairs(batch * width * 4), place_bytes = line_pairs(batch * 8);
  const int64_t cams_bytes = line_pairs((cams + 1) * 8);
  const int64_t lane_bytes = rows_bytes + offsets_bytes + weights_bytes + sums_bytes + loc_bytes + attn_bytes +
                             samples_bytes + place_bytes + cams_bytes;
  char* base = lane_scratch(lane_bytes, lanes);

  const auto* q = static_cast<const char*>(query.raw_data());
  const size_t src_row = static_cast<size_t>(query.size(1)) * dtype_size(query.dtype());
  const int64_t softmax_cols = a.softmax_per_level ? points : levels * points;
  const float* ref = reference.data<float>();
  const int64_t ref_row = lr * r_len * d_len;
  const float* scale = inv_count.data<float>();
  pool.parallel_for_indexed(chunks.count, chunks.grain, [&](int64_t c0, int64_t c1, int lane) {
    char* p = base + lane * lane_bytes;
    auto take = [&p](int64_t bytes) {
      char* at = p;
      p += bytes;
      return at;
    };
    auto* rows = take(rows_bytes);
    auto* offsets = reinterpret_cast<float*>(take(offsets_bytes));
    auto* weights = reinterpret_cast<float*>(take(weights_bytes));
    auto* bf16_sums = reinterpret_cast<float*>(take(sums_bytes));
    auto* loc = reinterpret_cast<float*>(take(loc_bytes));
    auto* attn = reinterpret_cast<float*>(take(attn_bytes));
    auto* sampled = reinterpret_cast<float*>(take(samples_bytes));
    auto* place = reinterpret_cast<int64_t*>(take(place_bytes));  // a pass's k-th slot: its row in loc / sampled
    auto* cam_start = reinterpret_cast<int64_t*>(take(cams_bytes));
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * chunks.rows, n = std::min(chunks.rows, cells - r0);
      const void* x = q + static_cast<size_t>(r0) * src_row;
      if (convert) {
        float_to_bf16_n(static_cast<const float*>(x), reinterpret_cast<uint16_t*>(rows),
                        static_cast<size_t>(n * query.size(1)));
        x = rows;
      }
      offsets_rows.run(x, n, offsets, lane);
      weights_rows.run(x, n, weights, lane);
      softmax_rows(weights, weights, softmax_cols, 0, n * samples / softmax_cols);
      // The sums in out itself when it is f32; a bf16 out gets them rounded once.
      float* sums = bf16_out ? bf16_sums : out.data<float>() + r0 * width;
      std::memset(sums, 0, static_cast<size_t>(n * width) * sizeof(float));
      // The chunk's slots in cell order, each cell's in slot order: the order of the sums.
      const int64_t k_begin = by_cell.start[r0], k_end = by_cell.start[r0 + n];
      int64_t cell = r0;  // the cell of slot entry k (advanced with k)
      for (int64_t k0 = k_begin; k0 < k_end; k0 += batch) {
        const int64_t k1 = std::min(k_end, k0 + batch);
        // Each camera's slots of this pass together, in pass order: one msda run per camera.
        std::fill(cam_start, cam_start + cams + 1, int64_t{0});
        for (int64_t k = k0; k < k1; ++k) ++cam_start[by_cell.slot[k] / max_len + 1];
        for (int64_t b = 0; b < cams; ++b) cam_start[b + 1] += cam_start[b];
        int64_t at_cell = cell;
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t s = by_cell.slot[k];
          while (by_cell.start[at_cell + 1] <= k) ++at_cell;
          const int64_t i = cam_start[s / max_len]++;
          place[k - k0] = i;
          const int64_t row = at_cell - r0;
          sampling_locations_rows(offsets + row * 2 * samples, ref + s * ref_row, lr, r_len, d_len, heads, points,
                                  a.msda.spatial_shapes, loc + i * 2 * samples, 0, 1);
          std::memcpy(attn + i * samples, weights + row * samples, static_cast<size_t>(samples) * sizeof(float));
        }
        // cam_start[b] now ends camera b's run.
        for (int64_t b = 0, first = 0; b < cams; ++b) {
          const int64_t end = cam_start[b];
          if (end > first)
            msda.run_batch(b, end - first, loc + first * 2 * samples, attn + first * samples, sampled + first * width, lane);
          first = end;
        }
        for (int64_t k = k0; k < k1; ++k) {
          while (by_cell.start[cell + 1] <= k) ++cell;
          float* d = sums + (cell - r0) * width;
          const float* v = sampled + place[k - k0] * width;
          for (int64_t j = 0; j < width; ++j) d[j] += v[j];
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        const float k = scale[r0 + r];
        float* d = sums + r * width;
        for (int64_t j = 0; j < width; ++j) d[j] *= k;
      }
      if (bf16_out)
        float_to_bf16_n(sums, static_cast<uint16_t*>(out.raw_data()) + r0 * width, static_cast<size_t>(n * width));
    }
  });
}

}  // namespace bev::cpu
