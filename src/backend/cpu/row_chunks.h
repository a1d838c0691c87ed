// How the fused row ops (cpu::deformable_attention, cpu::ffn_norm) split their rows: each pool
// participant works through a contiguous run of chunks in its own scratch, so a chunk's
// intermediates are consumed while they are in its cache.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace bev::cpu {

struct RowChunks {
  int64_t rows = 0;   // rows per chunk, a multiple of 16
  int64_t count = 0;  // chunks
  int64_t last = 0;   // rows of the last chunk
  // parallel_for_indexed's grain for one contiguous run of chunks per participant (it makes at
  // most count / grain pieces; Linear's chunks measured 2-8% slower as four smaller runs each).
  int64_t grain = 1;
};

// Chunks of about target_bytes of scratch at scratch_bytes_per_row, at most a participant's
// share of the rows (so every participant gets some); rows >= 1.
inline RowChunks row_chunks(int64_t rows, int64_t scratch_bytes_per_row, int participants, int64_t target_bytes) {
  RowChunks c;
  const int64_t share = ((rows + participants - 1) / participants + 15) / 16 * 16;
  c.rows = std::clamp<int64_t>(target_bytes / std::max<int64_t>(1, scratch_bytes_per_row) / 16 * 16, 16,
                               std::max<int64_t>(16, share));
  c.count = (rows + c.rows - 1) / c.rows;
  c.last = rows - (c.count - 1) * c.rows;
  c.grain = std::max<int64_t>(1, c.count / participants);
  return c;
}

// `lanes` blocks of `lane_bytes` (a multiple of 128: each lane on its own line pairs) in the
// calling thread's buffer, which only grows: a replayed call allocates nothing. Valid until the
// thread's next call (the fused ops do not nest).
inline char* lane_scratch(int64_t lane_bytes, int lanes) {
  thread_local std::vector<char> buffer;
  const auto need = static_cast<size_t>(lane_bytes * lanes + 128);
  if (buffer.size() < need) buffer.resize(need);
  return buffer.data() + (128 - reinterpret_cast<uintptr_t>(buffer.data()) % 128) % 128;
}

// n bytes rounded up to whole 128-byte line pairs.
inline int64_t line_pairs(int64_t n) { return (n + 127) / 128 * 128; }

}  // namespace bev::cpu
