// BEVFormerEncoder (spec §2.5, §2.9, §2.10): the BEV queries with the CAN-bus MLP, then
// num_layers BEVFormerLayers in post-norm order TSA -> LN -> SCA -> LN -> FFN -> LN.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/taps.h"
#include "model/weights.h"

namespace bev {

// pts_bbox_head.transformer.encoder.layers.{i}
struct EncoderLayerWeights {
  TsaWeights tsa;                  // .attentions.0
  ScaWeights sca;                  // .attentions.1
  FfnWeights ffn;                  // .ffns.0
  LayerNormWeights norms[3];       // .norms.{0,1,2}
};

// The queries' inputs: pts_bbox_head.{bev_embedding, positional_encoding} and
// pts_bbox_head.transformer.can_bus_mlp.
struct BevQueryWeights {
  Tensor bev_embedding;     // .bev_embedding.weight [HW, C]
  Tensor bev_pos;           // LearnedPositionalEncoding: [HW, C] = concat(col_embed[col], row_embed[row])
  PreparedWeights can_bus_fc1, can_bus_fc2;  // .can_bus_mlp.0 (+ReLU), .can_bus_mlp.2 (+ReLU)
  LayerNormWeights can_bus_norm;             // .can_bus_mlp.norm (when can_bus_norm)
};

struct EncoderWeights {
  BevQueryWeights queries;
  std::vector<EncoderLayerWeights> layers;
};

EncoderWeights load_encoder(Ops& ops, const WeightSource& w, const ModelConfig& cfg);

// The per-frame inputs of the bev stage that the host prepared (geometry.h). One frame (batch 1)
// or a batch of frames of different streams, each sample's rows one after the other.
struct EncoderInputs {
  Tensor can_bus;          // f32 [B, 18] after the test-time delta
  Tensor prev_bev;         // B = 1: [HW, C] the previous frame's bev_embed, or undefined (no history)
  Tensor rotation_index;   // B = 1: i64 [HW]: source cell of the rotated previous BEV (-1: zero)
  Tensor tsa_reference;    // f32 [B*HW, 2, 1, 2]
  std::vector<ScaInputs> sca;  // per layer: that layer's camera values and the frames' SCA lists
  // B > 1, where samples with history and first frames mix: every sample's previous BEV (its own
  // stream's buffer; unread for a first frame), and TSA's value rows as gather_rows_multi indices
  // into [prev_bevs[0..B), the encoder's input query, the layer input] (sources 0..B-1, B, B+1):
  // value_index [B*2*HW] the stacked value0|value1 of each sample, value0_index [B*HW] value0.
  int64_t batch = 1;
  std::vector<Tensor> prev_bevs;
  Tensor value_index, value0_index;
};

// -> bev_embed [HW, C]. Taps: dbg.bev_query_in, dbg.bev_pos, dbg.prev_bev_rotated, dbg.enc_layer.{i}.
Tensor encoder_forward(Ops& ops, const EncoderWeights& w, const ModelConfig& cfg, const EncoderInputs& in, Taps* taps);

}  // namespace bev
