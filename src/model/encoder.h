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

// The per-frame inputs of the bev stage that the host prepared (geometry.h).
struct EncoderInputs {
  Tensor can_bus;          // f32 [1, 18] after the test-time delta
  Tensor prev_bev;         // [HW, C] the previous frame's bev_embed, or undefined (no history)
  Tensor rotation_index;   // i64 [HW]: source cell of the rotated previous BEV (-1: zero)
  Tensor tsa_reference;    // f32 [HW, 2, 1, 2]
  std::vector<ScaInputs> sca;  // per layer: that layer's camera values and the frame's SCA plan
};

// -> bev_embed [HW, C]. Taps: dbg.bev_query_in, dbg.bev_pos, dbg.prev_bev_rotated, dbg.enc_layer.{i}.
Tensor encoder_forward(Ops& ops, const EncoderWeights& w, const ModelConfig& cfg, const EncoderInputs& in, Taps* taps);

}  // namespace bev
