// The transformer bricks of BEVFormer, one per upstream module (spec §2.9, §2.11):
//   TemporalSelfAttention       (encoder attentions.0)
//   SpatialCrossAttention       (encoder attentions.1, wrapping MSDeformableAttention3D)
//   MultiheadAttention          (decoder attentions.0, nn.MultiheadAttention)
//   CustomMSDeformableAttention (decoder attentions.1)
//   FFN                         (mmcv FFN: Linear + ReLU, Linear)
// Activations are token-major [tokens, C] (batch 1). Each forward returns its module's output
// before the residual: upstream adds the identity (the forward's x) inside the module, here the
// layer adds it in the norm that follows (add_norm_forward: one op, the sum never written).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace bev {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;  // (H, W) per level

// mmcv FFN: `<p>.layers.0.0` Linear(C, F) + ReLU, `<p>.layers.1` Linear(F, C).
struct FfnWeights {
  PreparedWeights fc1, fc2;
};
FfnWeights load_ffn(Ops& ops, const WeightSource& w, const std::string& prefix);
Tensor ffn_forward(Ops& ops, const FfnWeights& f, const Tensor& x, const std::string& label);
// The layer's FFN with its residual and norm: add_norm_forward(norm, x, ffn_forward(x)), as one op
// (Ops::ffn_norm) where the backend fuses it.
Tensor ffn_norm_forward(Ops& ops, const FfnWeights& f, const LayerNormWeights& norm, const Tensor& x,
                        const std::string& label, const std::string& norm_label);

// The dtype of an activation that only linears and msda read (deformable attention's projected
// values and the rows they are projected from, TSA's query_cat, SCA's rebatched queries, the FFN's
// hidden layer): bf16 when the backend's float arithmetic is bf16 (bf16 precision, or int8 on
// AMX and AMD), which halves its bytes (msda's random gathers, the 2C-wide rows) and spares each reading
// linear a conversion; f32 otherwise.
DType compact_dtype(Ops& ops);

// TemporalSelfAttention: `<p>.{sampling_offsets, attention_weights, value_proj, output_proj}`.
struct TsaWeights {
  PreparedWeights sampling_offsets;   // [heads*queue*levels*points*2, 2C]
  PreparedWeights attention_weights;  // [heads*queue*levels*points, 2C]
  PreparedWeights value_proj;
  PreparedWeights output_proj;  // its weight halved: the queue mean (load_tsa)
};
// output_proj's weight carries the queue mean's 1 / num_bev_queue (which must be 2).
TsaWeights load_tsa(Ops& ops, const WeightSource& w, const std::string& prefix, int num_bev_queue);

struct TsaInputs {
  Tensor value0;     // [B*HW, C]: the rotated previous BEV, or the layer input without history
  Tensor value1;     // [HW, C]: the encoder's input query with history, else the layer input (B = 1)
  // The value rows already stacked per sample, [B*2*HW, C] = for each sample its value0 then its
  // value1: for B > 1 (samples with and without history differ, so the caller gathers them) and
  // for B = 1 with history (the same rows in every layer, stacked once); else undefined.
  Tensor value_stack;
  Tensor bev_pos;    // [HW, C]
  Tensor reference;  // f32 [B*HW, queue, 1, 2]: hybrid reference points (geometry.h tsa_reference)
  int bev_h = 0, bev_w = 0;
  int64_t batch = 1;
};
// query x [HW, C] -> x + output_proj(mean over queues of MSDA(value_q, ref_q + offsets))
Tensor tsa_forward(Ops& ops, const TsaWeights& w, const DeformAttnConfig& cfg, int num_bev_queue, const Tensor& x,
                   const TsaInputs& in, const std::string& label);

// SpatialCrossAttention: `<p>.deformable_attention.{sampling_offsets, attention_weights,
// value_proj}` (MSDeformableAttention3D; value_proj runs in the image stage) and `<p>.output_proj`.
struct ScaWeights {
  PreparedWeights sampling_offsets;   // [heads*levels*points*2, C]
  PreparedWeights attention_weights;  // [heads*levels*points, C]
  PreparedWeights value_proj;         // applied to the camera features (image stage)
  PreparedWeights output_proj;
};
ScaWeights load_sca(Ops& ops, const WeightSource& w, const std::string& prefix);

struct ScaInputs {
  Tensor value;        // [N, L_tot, heads, hd]: value_proj of the camera features (image stage)
  SpatialShapes spatial_shapes;
  std::vector<int64_t> level_start;
  Tensor query_index;  // i64 [N*max_len]: BEV cell per rebatched slot, -1 = padding
  Tensor reference;    // f32 [N*max_len, 1, D, 2]: reference_points_cam per slot
  Tensor inv_count;    // f32 [HW, 1]: 1 / max(cameras seeing the cell, 1)
};
// query x [HW, C] -> x + output_proj(sum over cameras of MSDA3D(x[cells of cam]) / count)
Tensor sca_forward(Ops& ops, const ScaWeights& w, const DeformAttnConfig& cfg, const Tensor& x, const ScaInputs& in,
                   const std::string& label);

// nn.MultiheadAttention: `<p>.attn.{in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias}`.
struct MhaWeights {
  PreparedWeights q_proj, k_proj, v_proj, out_proj;  // in_proj rows [0,C), [C,2C), [2C,3C)
};
MhaWeights load_mha(Ops& ops, const WeightSource& w, const std::string& prefix, int embed_dims);
// x [Q, C]: q = k = x + pos, v = x; softmax(q k^T / sqrt(hd)) v per head, out_proj, + x.
// x [B*Q, C] (B samples of Q queries), pos [Q, C].
Tensor mha_forward(Ops& ops, const MhaWeights& w, int num_heads, const Tensor& x, const Tensor& pos,
                   const std::string& label, int64_t batch = 1);

// CustomMSDeformableAttention: `<p>.{sampling_offsets, attention_weights, value_proj, output_proj}`.
struct DecoderCrossWeights {
  PreparedWeights sampling_offsets, attention_weights, value_proj, output_proj;
};
DecoderCrossWeights load_decoder_cross(Ops& ops, const WeightSource& w, const std::string& prefix);
// x [Q, C], pos [Q, C], value [1, HW, heads, hd] (value_proj of the BEV), reference [Q, 3]
// (sigmoid space; x, y used) -> x + output_proj(MSDA(value, ref + offsets(x + pos))).
// x [B*Q, C], pos [Q, C], value [B, HW, heads, hd], reference [B*Q, 3].
Tensor decoder_cross_forward(Ops& ops, const DecoderCrossWeights& w, const DeformAttnConfig& cfg, const Tensor& x,
                             const Tensor& pos, const Tensor& value, const Tensor& reference, int bev_h, int bev_w,
                             const std::string& label, int64_t batch = 1);

}  // namespace bev
