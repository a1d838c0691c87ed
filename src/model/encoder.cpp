#include "model/encoder.h"

#include <cstring>

#include "bevformer/error.h"

namespace bev {
namespace {

// LearnedPositionalEncoding (mmdet): pos[row, col] = concat(col_embed[col], row_embed[row]).
Tensor learned_positional_encoding(const Tensor& row_embed, const Tensor& col_embed, int bev_h, int bev_w) {
  const int64_t f = row_embed.size(1);
  if (row_embed.size(0) < bev_h || col_embed.size(0) < bev_w) {
    throw Error(ErrorKind::kInvalidInput, "positional_encoding embeds " + row_embed.describe() + " / " +
                                              col_embed.describe() + " for a " + std::to_string(bev_h) + "x" +
                                              std::to_string(bev_w) + " BEV")
        .expected("at least bev_h rows and bev_w columns");
  }
  Tensor pos = Tensor::empty({int64_t{bev_h} * bev_w, 2 * f}, DType::kF32);
  float* out = pos.data<float>();
  for (int r = 0; r < bev_h; ++r) {
    for (int c = 0; c < bev_w; ++c) {
      float* row = out + (int64_t{r} * bev_w + c) * 2 * f;
      std::memcpy(row, col_embed.data<float>() + int64_t{c} * f, static_cast<size_t>(f) * 4);
      std::memcpy(row + f, row_embed.data<float>() + int64_t{r} * f, static_cast<size_t>(f) * 4);
    }
  }
  return pos;
}

const char* kHead = "pts_bbox_head";

}  // namespace

EncoderWeights load_encoder(Ops& ops, const WeightSource& w, const ModelConfig& cfg) {
  const std::string head = kHead, tr = head + ".transformer";
  EncoderWeights e;
  BevQueryWeights& q = e.queries;
  q.bev_embedding = ops.constant(w.get(head + ".bev_embedding.weight"));
  q.bev_pos = ops.constant(learned_positional_encoding(w.get(head + ".positional_encoding.row_embed.weight"),
                                                       w.get(head + ".positional_encoding.col_embed.weight"),
                                                       cfg.head.bev_h, cfg.head.bev_w));
  q.can_bus_fc1 = load_linear(ops, w, tr + ".can_bus_mlp.0", true);
  q.can_bus_fc2 = load_linear(ops, w, tr + ".can_bus_mlp.2", true);
  if (cfg.transformer.can_bus_norm) q.can_bus_norm = load_layer_norm(ops, w, tr + ".can_bus_mlp.norm");
  for (int i = 0; i < cfg.transformer.encoder_layers; ++i) {
    const std::string p = tr + ".encoder.layers." + std::to_string(i);
    EncoderLayerWeights l;
    l.tsa = load_tsa(ops, w, p + ".attentions.0", cfg.transformer.tsa_num_bev_queue);
    l.sca = load_sca(ops, w, p + ".attentions.1");
    l.ffn = load_ffn(ops, w, p + ".ffns.0");
    for (int n = 0; n < 3; ++n) l.norms[n] = load_layer_norm(ops, w, p + ".norms." + std::to_string(n));
    e.layers.push_back(std::move(l));
  }
  return e;
}

Tensor encoder_forward(Ops& ops, const EncoderWeights& w, const ModelConfig& cfg, const EncoderInputs& in, Taps* taps) {
  const TransformerConfig& t = cfg.transformer;
  const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;
  const int64_t hw = int64_t{bev_h} * bev_w, c = t.embed_dims, batch = in.batch;

  // enc.queries: bev_embedding + can_bus_mlp(can_bus); the previous BEV rotated into this frame.
  ops.set_stage("enc.queries");
  Tensor bev_query = w.queries.bev_embedding;
  if (batch > 1) {
    // Every sample starts from the same learned queries: B copies, each then shifted by its own
    // CAN-bus embedding below.
    bev_query = ops.concat(std::vector<Tensor>(static_cast<size_t>(batch), bev_query), 0, "bev_embedding.batch");
  }
  if (t.use_can_bus) {
    Tensor can = ops.linear(ops.linear(in.can_bus, w.queries.can_bus_fc1, "can_bus_mlp.0"), w.queries.can_bus_fc2,
                            "can_bus_mlp.2");
    if (t.can_bus_norm) can = layer_norm_forward(ops, w.queries.can_bus_norm, can, "can_bus_mlp.norm");
    bev_query = batch == 1 ? ops.add_rows(bev_query, can.reshape({c}), "bev_queries")
                           : ops.add(bev_query.reshape({batch, hw, c}), can.reshape({batch, 1, c}), "bev_queries")
                                 .reshape({batch * hw, c});
  }
  Tensor prev;
  if (in.prev_bev.defined()) {
    prev = t.rotate_prev_bev ? ops.gather_rows(in.prev_bev, in.rotation_index, "prev_bev_rotated") : in.prev_bev;
  }
  if (taps) {
    taps->put("dbg.bev_query_in", bev_query.reshape({hw, 1, c}));
    taps->put("dbg.bev_pos", w.queries.bev_pos.reshape({hw, 1, c}));
    if (prev.defined()) taps->put("dbg.prev_bev_rotated", prev.reshape({hw, 1, c}));
  }

  // With history (B = 1) every layer's TSA values are the same rows, [prev | bev_query]: stacked
  // once for all layers (each projects them with its own value_proj).
  Tensor history_stack;
  if (batch == 1 && prev.defined()) history_stack = ops.concat({prev, bev_query}, 0, "encoder.tsa_value", compact_dtype(ops));

  Tensor x = bev_query;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const EncoderLayerWeights& l = w.layers[i];
    const std::string stage = "enc" + std::to_string(i);
    const std::string p = "encoder.layers." + std::to_string(i);
    ops.set_stage(stage + ".tsa");
    TsaInputs tsa_in;
    if (batch == 1) {
      tsa_in.value0 = prev.defined() ? prev : x;
      tsa_in.value1 = prev.defined() ? bev_query : x;
      tsa_in.value_stack = history_stack;
    } else {
      // Each sample's rows from its previous BEV (rotated by the index) and the queries, or, for
      // a first frame, the layer input twice: gathered, since the kinds mix in one batch.
      std::vector<Tensor> sources = in.prev_bevs;
      sources.push_back(bev_query);
      sources.push_back(x);
      tsa_in.value_stack = ops.gather_rows_multi(sources, in.value_index, p + ".attentions.0.value_stack");
      tsa_in.value0 = ops.gather_rows_multi(sources, in.value0_index, p + ".attentions.0.value0");
      tsa_in.batch = batch;
    }
    tsa_in.bev_pos = w.queries.bev_pos;
    tsa_in.reference = in.tsa_reference;
    tsa_in.bev_h = bev_h;
    tsa_in.bev_w = bev_w;
    x = add_norm_forward(ops, l.norms[0], x, tsa_forward(ops, l.tsa, t.tsa, t.tsa_num_bev_queue, x, tsa_in, p + ".attentions.0"),
                         p + ".norms.0");
    ops.set_stage(stage + ".sca");
    x = add_norm_forward(ops, l.norms[1], x, sca_forward(ops, l.sca, t.sca, x, in.sca[i], p + ".attentions.1"),
                         p + ".norms.1");
    ops.set_stage(stage + ".ffn");
    x = ffn_norm_forward(ops, l.ffn, l.norms[2], x, p + ".ffns.0", p + ".norms.2");
    if (taps) taps->put("dbg.enc_layer." + std::to_string(i), x.reshape({1, hw, c}));
  }
  ops.set_stage("enc.out");
  return x;
}

}  // namespace bev
