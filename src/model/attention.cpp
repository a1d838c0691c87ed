#include "model/attention.h"

#include <cmath>

#include "bevformer/error.h"

namespace bev {
namespace {

void require(bool ok, const std::string& what, const std::string& expected) {
  if (!ok) throw Error(ErrorKind::kUnsupported, what).expected(expected);
}

// Deformable attention's sampling (spec §2.12): the query's sampling_offsets and
// attention_weights, the softmax of the weights (over each level's points, or over a head's levels
// and points), the sampling locations around `reference` and msda over `value` -> [rows, heads *
// hd]. One op where the backend fuses them (the projections then never reach memory), the same
// ops one by one otherwise.
Tensor sample_values(Ops& ops, const PreparedWeights& sampling_offsets, const PreparedWeights& attention_weights,
                     const Tensor& query, const Tensor& reference, const Tensor& value, const MsdaAttrs& levels,
                     int64_t points, bool softmax_per_level, const std::string& label) {
  if (ops.backend().fuses_deformable_attention()) {
    return ops.deformable_attention(query, reference, value, sampling_offsets, attention_weights, levels,
                                    softmax_per_level, label + ".deformable_attention");
  }
  const int64_t rows = query.size(0), bs = value.size(0), heads = value.size(2), lq = rows / bs;
  const auto n_levels = static_cast<int64_t>(levels.spatial_shapes.size());
  const Tensor offsets =
      ops.linear(query, sampling_offsets, label + ".sampling_offsets").reshape({rows, heads, n_levels, points, 2});
  const int64_t softmax_cols = softmax_per_level ? points : n_levels * points;
  const Tensor weights = ops.softmax(ops.linear(query, attention_weights, label + ".attention_weights")
                                         .reshape({rows * heads * n_levels * points / softmax_cols, softmax_cols}),
                                     label + ".attention_softmax")
                             .reshape({bs, lq, heads, n_levels, points});
  SamplingLocationsAttrs la{levels.spatial_shapes};
  const Tensor loc = ops.sampling_locations(offsets, reference, la, label + ".sampling_locations")
                         .reshape({bs, lq, heads, n_levels, points, 2});
  return ops.msda(value, loc, weights, levels, label + ".msda").reshape({rows, heads * value.size(3)});
}

}  // namespace

DType compact_dtype(Ops& ops) {
  return ops.backend().float_precision() == Precision::kBF16 ? DType::kBF16 : DType::kF32;
}

// ---- FFN ----

FfnWeights load_ffn(Ops& ops, const WeightSource& w, const std::string& prefix) {
  return {load_linear(ops, w, prefix + ".layers.0.0", /*relu=*/true), load_linear(ops, w, prefix + ".layers.1")};
}

Tensor ffn_forward(Ops& ops, const FfnWeights& f, const Tensor& x, const std::string& label) {
  const Tensor h = ops.linear(x, f.fc1, label + ".layers.0", compact_dtype(ops));
  return ops.linear(h, f.fc2, label + ".layers.1");
}

Tensor ffn_norm_forward(Ops& ops, const FfnWeights& f, const LayerNormWeights& norm, const Tensor& x,
                        const std::string& label, const std::string& norm_label) {
  if (ops.backend().fuses_ffn()) {
    return ops.ffn_norm(x, f.fc1, f.fc2, norm.weight, norm.bias, 1e-5f, compact_dtype(ops), label);
  }
  return add_norm_forward(ops, norm, x, ffn_forward(ops, f, x, label), norm_label);
}

// ---- TemporalSelfAttention ----

TsaWeights load_tsa(Ops& ops, const WeightSource& w, const std::string& p, int num_bev_queue) {
  require(num_bev_queue == 2, "TSA num_bev_queue " + std::to_string(num_bev_queue), "2 (previous and current BEV)");
  // The queue mean (the MSDA sum over both queue entries times 1/2) folded into output_proj's
  // weight: W (s / 2) + b = (W / 2) s + b, exactly, since halving is exact in f32 and in bf16
  // (short of subnormal weights). One elementwise pass over the BEV fewer per layer.
  Tensor out_w = w.get(p + ".output_proj.weight").clone();
  float* wp = out_w.data<float>();
  for (int64_t i = 0; i < out_w.numel(); ++i) wp[i] *= 0.5f;
  const Tensor out_b = w.get(p + ".output_proj.bias");
  return {load_linear(ops, w, p + ".sampling_offsets"), load_linear(ops, w, p + ".attention_weights"),
          load_linear(ops, w, p + ".value_proj"), ops.prepare_linear(out_w, &out_b, {})};
}

Tensor tsa_forward(Ops& ops, const TsaWeights& w, const DeformAttnConfig& cfg, int num_bev_queue, const Tensor& x,
                   const TsaInputs& in, const std::string& label) {
  require(cfg.num_levels == 1, "TSA with " + std::to_string(cfg.num_levels) + " levels", "1 (the BEV is one level)");
  require(num_bev_queue == 2, "TSA num_bev_queue " + std::to_string(num_bev_queue), "2 (previous and current BEV)");
  // rows = batch * hw: the batch's samples one after the other, each its whole BEV.
  const int64_t rows = x.size(0), c = x.size(1), heads = cfg.num_heads, points = cfg.num_points;
  const int64_t batch = in.batch, hw = rows / batch;
  const int64_t queue = num_bev_queue;
  // The two queue entries become two "levels" of one MSDA call: value rows [prev | current] per
  // sample, offsets laid out (head, queue, point, xy) exactly as MSDA's (head, level, point, xy).
  const Tensor stacked =
      in.value_stack.defined() ? in.value_stack : ops.concat({in.value0, in.value1}, 0, label + ".value", compact_dtype(ops));
  const Tensor value = ops.linear(stacked, w.value_proj, label + ".value_proj", compact_dtype(ops))
                           .reshape({batch, queue * hw, heads, c / heads});
  // query_cat = [value0 | x + bev_pos], which only the two projections read. With one sample,
  // both halves come compact (bf16 in bf16 precision): value0 as the first rows of the stacked
  // values (rounded once for every layer), the sum rounded by the add, so the concat copies
  // 2-byte rows instead of reading f32 and converting (the bits the concat's rounding gave). A
  // batch's value0 is gathered in f32, so its sum stays f32 and the concat rounds both.
  const DType query_dtype = batch == 1 ? compact_dtype(ops) : DType::kF32;
  const Tensor query = batch == 1 ? ops.add(x, in.bev_pos, label + ".query", query_dtype)
                                  : ops.add(x.reshape({batch, hw, c}), in.bev_pos.reshape({1, hw, c}), label + ".query")
                                        .reshape({rows, c});
  const Tensor value0 = batch == 1 ? stacked.slice(0, 0, hw) : in.value0;
  const Tensor qcat = ops.concat({value0, query}, 1, label + ".query_cat", compact_dtype(ops));
  // The two queue entries are two levels of the BEV's shape; the softmax runs over the points of
  // each queue entry separately (spec §5.2).
  MsdaAttrs ma;
  ma.spatial_shapes.assign(static_cast<size_t>(queue), {in.bev_h, in.bev_w});
  for (int64_t q = 0; q < queue; ++q) ma.level_start.push_back(q * hw);
  // The queue mean's 1/2 is in output_proj's weight (load_tsa).
  const Tensor summed = sample_values(ops, w.sampling_offsets, w.attention_weights, qcat, in.reference, value, ma, points,
                                      /*softmax_per_level=*/true, label);
  return ops.linear(summed, w.output_proj, label + ".output_proj");
}

// ---- SpatialCrossAttention ----

ScaWeights load_sca(Ops& ops, const WeightSource& w, const std::string& p) {
  const std::string d = p + ".deformable_attention";
  return {load_linear(ops, w, d + ".sampling_offsets"), load_linear(ops, w, d + ".attention_weights"),
          load_linear(ops, w, d + ".value_proj"), load_linear(ops, w, p + ".output_proj")};
}

Tensor sca_forward(Ops& ops, const ScaWeights& w, const DeformAttnConfig& cfg, const Tensor& x, const ScaInputs& in,
                   const std::string& label) {
  const int64_t points = cfg.num_points;
  // Only output_proj reads the mean: compact (rounded once, where the linear rounded its input).
  if (ops.backend().fuses_spatial_cross_attention()) {
    const Tensor mean = ops.spatial_cross_attention(x, in.query_index, in.reference, in.inv_count, in.value,
                                                    w.sampling_offsets, w.attention_weights,
                                                    {in.spatial_shapes, in.level_start}, compact_dtype(ops),
                                                    label + ".deformable_attention", compact_dtype(ops));
    return ops.linear(mean, w.output_proj, label + ".output_proj");
  }
  // Rebatch: each camera's visible BEV cells, padded with zero queries (spec §2.9).
  const Tensor queries = ops.gather_rows(x, in.query_index, label + ".rebatch", compact_dtype(ops));
  const Tensor sampled = sample_values(ops, w.sampling_offsets, w.attention_weights, queries, in.reference, in.value,
                                      {in.spatial_shapes, in.level_start}, points, /*softmax_per_level=*/false, label);
  // Each cell's mean over the cameras that see it (spec §2.9: slots summed, divided by count).
  const Tensor slots =
      ops.scatter_mean_rows(sampled, in.query_index, in.inv_count, label + ".count_mean", compact_dtype(ops));
  return ops.linear(slots, w.output_proj, label + ".output_proj");
}

// ---- nn.MultiheadAttention ----

MhaWeights load_mha(Ops& ops, const WeightSource& w, const std::string& p, int embed_dims) {
  const Tensor in_w = w.get(p + ".attn.in_proj_weight"), in_b = w.get(p + ".attn.in_proj_bias");
  auto part = [&](int64_t k) {
    const Tensor wk = in_w.slice(0, k * embed_dims, (k + 1) * embed_dims).contiguous();
    const Tensor bk = in_b.slice(0, k * embed_dims, (k + 1) * embed_dims).contiguous();
    return ops.prepare_linear(wk, &bk, {});
  };
  return {part(0), part(1), part(2), load_linear(ops, w, p + ".attn.out_proj")};
}

Tensor mha_forward(Ops& ops, const MhaWeights& w, int num_heads, const Tensor& x, const Tensor& pos,
                   const std::string& label, int64_t batch) {
  const int64_t rows = x.size(0), q_len = rows / batch, c = x.size(1), hd = c / num_heads;
  const Tensor qk = batch == 1 ? ops.add(x, pos, label + ".query")
                               : ops.add(x.reshape({batch, q_len, c}), pos.reshape({1, q_len, c}), label + ".query")
                                     .reshape({rows, c});
  // Each sample's queries attend within the sample, head by head over hd = C / heads columns.
  const Tensor q = ops.linear(qk, w.q_proj, label + ".q_proj").reshape({batch, q_len, c});
  const Tensor k = ops.linear(qk, w.k_proj, label + ".k_proj").reshape({batch, q_len, c});
  const Tensor v = ops.linear(x, w.v_proj, label + ".v_proj").reshape({batch, q_len, c});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Tensor ctx = ops.attention(q, k, v, {.heads = num_heads, .scale = scale}, label + ".attention").reshape({rows, c});
  return ops.linear(ctx, w.out_proj, label + ".out_proj");
}

// ---- CustomMSDeformableAttention ----

DecoderCrossWeights load_decoder_cross(Ops& ops, const WeightSource& w, const std::string& p) {
  return {load_linear(ops, w, p + ".sampling_offsets"), load_linear(ops, w, p + ".attention_weights"),
          load_linear(ops, w, p + ".value_proj"), load_linear(ops, w, p + ".output_proj")};
}

Tensor decoder_cross_forward(Ops& ops, const DecoderCrossWeights& w, const DeformAttnConfig& cfg, const Tensor& x,
                             const Tensor& pos, const Tensor& value, const Tensor& reference, int bev_h, int bev_w,
                             const std::string& label, int64_t batch) {
  require(cfg.num_levels == 1, "decoder cross-attention with " + std::to_string(cfg.num_levels) + " levels",
          "1 (the BEV is one level)");
  const int64_t rows = x.size(0), q_len = rows / batch, c = x.size(1), points = cfg.num_points;
  const Tensor query = batch == 1 ? ops.add(x, pos, label + ".query")
                                  : ops.add(x.reshape({batch, q_len, c}), pos.reshape({1, q_len, c}), label + ".query")
                                        .reshape({rows, c});
  MsdaAttrs levels;
  levels.spatial_shapes = {{bev_h, bev_w}};
  levels.level_start = {0};
  const Tensor out = sample_values(ops, w.sampling_offsets, w.attention_weights, query, reference.reshape({rows, 1, 1, 3}),
                                   value, levels, points, /*softmax_per_level=*/false, label);
  return ops.linear(out, w.output_proj, label + ".output_proj");
}

}  // namespace bev
