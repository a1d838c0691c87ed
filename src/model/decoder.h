// DetectionTransformerDecoder (spec §2.11): queries from query_embedding (positional half
// first), initial reference points sigmoid(reference_points(query_pos)), then num_layers
// DetrTransformerDecoderLayers (self-attention -> LN -> deformable cross-attention over the BEV ->
// LN -> FFN -> LN), each followed by the reference refinement with that layer's reg branch.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/head.h"
#include "model/taps.h"
#include "model/weights.h"

namespace bev {

// pts_bbox_head.transformer.decoder.layers.{i}
struct DecoderLayerWeights {
  MhaWeights self_attn;        // .attentions.0
  DecoderCrossWeights cross;   // .attentions.1
  FfnWeights ffn;              // .ffns.0
  LayerNormWeights norms[3];   // .norms.{0,1,2}
};

struct DecoderWeights {
  Tensor query_pos;                  // pts_bbox_head.query_embedding.weight[:, :C]
  Tensor query;                      // pts_bbox_head.query_embedding.weight[:, C:]
  PreparedWeights reference_points;  // pts_bbox_head.transformer.reference_points (Linear(C, 3))
  std::vector<DecoderLayerWeights> layers;
};

DecoderWeights load_decoder(Ops& ops, const WeightSource& w, const ModelConfig& cfg);

struct DecoderOutputs {
  std::vector<Tensor> states;     // per layer [Q, C] (inter_states)
  std::vector<Tensor> reg;        // per layer [Q, code]: that layer's reg branch output
  std::vector<Tensor> refined;    // per layer [Q, 3]: sigmoid(reg + inverse_sigmoid(layer's input reference))
  std::vector<Tensor> references; // per layer [Q, 3]: the reference after the layer (inter_references)
};

// bev_embed [B*HW, C] (B samples) -> per-layer states, box codes and references, [B*Q, ...] with
// each sample's queries together. Taps (B = 1): dbg.init_reference, dbg.inter_states,
// dbg.inter_references.
DecoderOutputs decoder_forward(Ops& ops, const DecoderWeights& w, const HeadWeights& head, const ModelConfig& cfg,
                               const Tensor& bev_embed, Taps* taps);

}  // namespace bev
