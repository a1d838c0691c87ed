// SpatialCrossAttention's sampling as one op (Ops::spatial_cross_attention; spec §2.9): per BEV
// cell, MSDeformableAttention3D on every camera that sees it and the mean over those cameras, for
// the layer's output_proj. Upstream rebatches the cells per camera into max_len slots (padded),
// runs the deformable attention on the slots and scatters their mean back. Run that way
// (gather_rows, deformable_attention, scatter_mean_rows) every slot pays for the query's two
// projections, including the padding and the cells seen by two cameras: on the bundled nuScenes
// frame, base's 40000 cells fill 45114 slots of 57084.
//
// Here a pool participant takes a chunk of cells: their rows (rounded to bf16 in bf16 precision,
// as the rebatch rounds them), the sampling_offsets and attention_weights linears once per cell
// (Linear::RowRunner), the softmax; then per slot of those cells the sampling locations from the
// cell's offsets and the slot's reference point, msda's kernel over the slots of each camera in
// turn (MsdaChunks::run_batch), and the cell's sum over its slots in slot order from +0, times
// 1 / count. Each step is the unfused ops' own code on the same rows, in the same order, so the
// output has their bits (the tests compare them).
#pragma once

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// query [HW, C] f32 or bf16 (rounded to a.query_dtype first); query_index i64 [N * max_len]: the
// cell of each slot, camera-major (slot / max_len is the camera, the value's batch), -1 for
// padding; reference f32 [N * max_len, Lr, R, D] per slot; inv_count f32 [HW, 1]; value [N, Lv,
// heads, hd] f32 or bf16; out [HW, heads * hd] f32 or bf16, preallocated. Every shape and index is
// checked (Error(kInvalidInput)).
void spatial_cross_attention(const Tensor& query, const Tensor& query_index, const Tensor& reference,
                             const Tensor& inv_count, const Tensor& value, const DeformableAttentionAttrs& attrs,
                             Tensor& out, ThreadPool& pool);

}  // namespace bev::cpu
