#include "model/decoder.h"


namespace bev {
namespace {

// Stacks same-shaped tensors along a new leading axis with an op (so a replayed plan refreshes it).
Tensor stack(Ops& ops, const std::vector<Tensor>& parts, const Shape& each, const std::string& label) {
  Shape s = each;
  s.insert(s.begin(), 1);
  std::vector<Tensor> views;
  for (const Tensor& p : parts) views.push_back(p.reshape(s));
  return views.size() == 1 ? views[0] : ops.concat(views, 0, label);
}

}  // namespace

DecoderWeights load_decoder(Ops& ops, const WeightSource& w, const ModelConfig& cfg) {
  const int64_t c = cfg.transformer.embed_dims;
  DecoderWeights d;
  const Tensor qe = w.get("pts_bbox_head.query_embedding.weight");
  d.query_pos = ops.constant(qe.slice(1, 0, c));
  d.query = ops.constant(qe.slice(1, c, 2 * c));
  d.reference_points = load_linear(ops, w, "pts_bbox_head.transformer.reference_points");
  for (int i = 0; i < cfg.transformer.decoder_layers; ++i) {
    const std::string p = "pts_bbox_head.transformer.decoder.layers." + std::to_string(i);
    DecoderLayerWeights l;
    l.self_attn = load_mha(ops, w, p + ".attentions.0", cfg.transformer.embed_dims);
    l.cross = load_decoder_cross(ops, w, p + ".attentions.1");
    l.ffn = load_ffn(ops, w, p + ".ffns.0");
    for (int n = 0; n < 3; ++n) l.norms[n] = load_layer_norm(ops, w, p + ".norms." + std::to_string(n));
    d.layers.push_back(std::move(l));
  }
  return d;
}

DecoderOutputs decoder_forward(Ops& ops, const DecoderWeights& w, const HeadWeights& head, const ModelConfig& cfg,
                               const Tensor& bev_embed, Taps* taps) {
  const TransformerConfig& t = cfg.transformer;
  const int64_t hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w, c = t.embed_dims, q_len = w.query.size(0);
  const int64_t heads = t.decoder_cross.num_heads, batch = bev_embed.size(0) / hw;
  // B copies of a per-query tensor: every sample's decoder starts from the same queries.
  auto per_sample = [&](const Tensor& t_in, const std::string& label) {
    return batch == 1 ? t_in : ops.concat(std::vector<Tensor>(static_cast<size_t>(batch), t_in), 0, label);
  };

  ops.set_stage("dec.value_proj");
  std::vector<Tensor> values;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    values.push_back(ops.linear(bev_embed, w.layers[i].cross.value_proj,
                                "decoder.layers." + std::to_string(i) + ".attentions.1.value_proj", compact_dtype(ops))
                         .reshape({batch, hw, heads, c / heads}));
  }
  Tensor reference = per_sample(
      ops.sigmoid(ops.linear(w.query_pos, w.reference_points, "reference_points"), "init_reference"), "init_reference.batch");
  if (taps) taps->put("dbg.init_reference", reference.reshape({1, q_len, 3}));

  DecoderOutputs out;
  Tensor x = per_sample(w.query, "query.batch");
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayerWeights& l = w.layers[i];
    const std::string stage = "dec" + std::to_string(i);
    const std::string p = "decoder.layers." + std::to_string(i);
    ops.set_stage(stage + ".self");
    x = add_norm_forward(ops, l.norms[0], x,
                         mha_forward(ops, l.self_attn, t.decoder_self_attn_heads, x, w.query_pos, p + ".attentions.0", batch),
                         p + ".norms.0");
    ops.set_stage(stage + ".cross");
    x = add_norm_forward(ops, l.norms[1], x,
                         decoder_cross_forward(ops, l.cross, t.decoder_cross, x, w.query_pos, values[i], reference,
                                               cfg.head.bev_h, cfg.head.bev_w, p + ".attentions.1", batch),
                         p + ".norms.1");
    ops.set_stage(stage + ".ffn");
    x = ffn_norm_forward(ops, l.ffn, l.norms[2], x, p + ".ffns.0", p + ".norms.2");
    ops.set_stage(stage + ".reg");
    const std::string r = "reg_branches." + std::to_string(i);
    const Tensor reg = reg_branch_forward(ops, head.reg[i], x, r);
    const Tensor refined = ops.reference_refine(reg, reference, r + ".refine");
    // Without box refinement the decoder keeps its initial references (reg_branches is None).
    if (cfg.head.with_box_refine) reference = refined;
    out.states.push_back(x);
    out.reg.push_back(reg);
    out.refined.push_back(refined);
    out.references.push_back(reference);
  }
  if (taps) {
    taps->put("dbg.inter_states", stack(ops, out.states, {q_len, 1, c}, "inter_states"));
    taps->put("dbg.inter_references", stack(ops, out.references, {1, q_len, 3}, "inter_references"));
  }
  return out;
}

}  // namespace bev
