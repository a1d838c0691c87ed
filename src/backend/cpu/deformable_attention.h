// Deformable attention from the query on, as one op (Ops::deformable_attention; spec §2.12): per
// chunk of queries, a pool participant runs the sampling_offsets and attention_weights linears
// into its own scratch, the softmax and the sampling locations over that scratch in place, and
// msda's kernel on it. The projections never reach memory: as four ops, base's SCA wrote and read
// back about 600 MB a layer of offsets, logits, weights and locations.
//
// Each step is the op-by-op path's own code on a chunk of rows (Linear::RowRunner, softmax_rows,
// sampling_locations_rows, MsdaChunks), so the output has the bits of the ops run one by one (the
// tests compare them). The linears are the model's prepared cpu::Linear objects; query is f32,
// or bf16 in bf16 precision; reference and the output are f32.
#pragma once

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

class Linear;

// The op's two prepared projections (cpu::Linear), checked: both present, both reading `in`
// features, 2 * samples offsets and `samples` weights a query (samples = heads * levels *
// points). Shared by deformable_attention and spatial_cross_attention; `op` names the op in the
// errors (Error(kInvalidInput)).
struct DeformableProjections {
  const Linear& offsets;
  const Linear& weights;
  int64_t samples;
};
DeformableProjections deformable_projections(const char* op, const DeformableAttentionAttrs& attrs, int64_t in,
                                             int64_t heads);

// query [M, C]; reference [M, Lr, R, D]; value [bs, Lv, heads, hd] (f32 or bf16); out [M, heads *
// hd] f32, contiguous, preallocated. M = bs * Lq. Shapes are checked (Error(kInvalidInput)).
void deformable_attention(const Tensor& query, const Tensor& reference, const Tensor& value,
                          const DeformableAttentionAttrs& attrs, Tensor& out, ThreadPool& pool);

}  // namespace bev::cpu
