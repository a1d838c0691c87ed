#include "model/param_spec.h"

#include <string_view>
#include <unordered_map>

namespace bev {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Emits specs in the order the upstream modules register them, with helpers named after the
// torch modules whose parameters they stand for.
class SpecList {
 public:
  explicit SpecList(std::vector<ParamSpec>& out) : out_(out) {}

  void param(std::string name, Shape shape, bool used = true) {
    out_.push_back({std::move(name), std::move(shape), DType::kF32, false, used});
  }
  void linear(const std::string& p, int64_t in, int64_t out, bool used = true) {
    param(p + ".weight", {out, in}, used);
    param(p + ".bias", {out}, used);
  }
  void layer_norm(const std::string& p, int64_t c, bool used = true) {
    param(p + ".weight", {c}, used);
    param(p + ".bias", {c}, used);
  }
  void conv(const std::string& p, int64_t out, int64_t in, int64_t k, bool bias) {
    param(p + ".weight", {out, in, k, k});
    if (bias) param(p + ".bias", {out});
  }
  // BatchNorm2d: the running statistics are used in eval; the batch counter never is.
  void batch_norm(const std::string& p, int64_t c) {
    param(p + ".weight", {c});
    param(p + ".bias", {c});
    param(p + ".running_mean", {c});
    param(p + ".running_var", {c});
    out_.push_back({p + ".num_batches_tracked", {}, DType::kI64, true, false});
  }
  // Copies of the specs [begin, end) with the name prefix `from` replaced by `to`, each marked as
  // an alias of its original.
  void alias_range(size_t begin, size_t end, const std::string& from, const std::string& to) {
    for (size_t i = begin; i < end; ++i) {
      ParamSpec s = out_[i];
      s.alias_of = s.name;
      s.name = to + s.name.substr(from.size());
      out_.push_back(std::move(s));
    }
  }
  size_t size() const { return out_.size(); }

 private:
  std::vector<ParamSpec>& out_;
};

// mmdet ResNet: stem, then stages of Bottlenecks (expansion 4). Caffe vs pytorch style only moves
// the stride between conv1 and conv2, so shapes do not depend on it.
void resnet(SpecList& s, const BackboneConfig& b) {
  const std::string p = "img_backbone.";
  s.conv(p + "conv1", b.stem_channels, b.in_channels, 7, false);
  s.batch_norm(p + "bn1", b.stem_channels);
  int64_t inplanes = b.stem_channels;
  const std::vector<int> blocks = resnet_stage_blocks(b);
  for (int stage = 0; stage < static_cast<int>(blocks.size()); ++stage) {
    const int64_t planes = resnet_stage_planes(b, stage);
    const int64_t out = planes * 4;
    const bool dcn = resnet_stage_has_dcn(b, stage);
    for (int block = 0; block < blocks[static_cast<size_t>(stage)]; ++block) {
      const std::string q = p + "layer" + std::to_string(stage + 1) + "." + std::to_string(block) + ".";
      s.conv(q + "conv1", planes, inplanes, 1, false);
      s.batch_norm(q + "bn1", planes);
      s.conv(q + "conv2", planes, planes, 3, false);
      // ModulatedDeformConv2dPack: conv_offset predicts (dy, dx) x 9 taps + 9 mask logits per
      // deform group, with bias.
      if (dcn) s.conv(q + "conv2.conv_offset", 27LL * b.dcn_deform_groups, planes, 3, true);
      s.batch_norm(q + "bn2", planes);
      s.conv(q + "conv3", out, planes, 1, false);
      s.batch_norm(q + "bn3", out);
      if (block == 0 && (b.strides[static_cast<size_t>(stage)] != 1 || inplanes != out)) {
        s.conv(q + "downsample.0", out, inplanes, 1, false);
        s.batch_norm(q + "downsample.1", out);
      }
      inplanes = out;
    }
  }
}

// mmdet FPN: ConvModules (conv + bias, no norm) for laterals and outputs, then extra stride-2
// convs appended to fpn_convs (none when add_extra_convs is off: those levels are max-pools).
void fpn(SpecList& s, const NeckConfig& n) {
  const std::string p = "img_neck.";
  const int end = fpn_backbone_end_level(n);
  const int64_t c = n.out_channels;
  for (int i = n.start_level; i < end; ++i) {
    const std::string idx = std::to_string(i - n.start_level);
    s.conv(p + "lateral_convs." + idx + ".conv", c, n.in_channels[static_cast<size_t>(i)], 1, true);
  }
  for (int i = n.start_level; i < end; ++i) {
    s.conv(p + "fpn_convs." + std::to_string(i - n.start_level) + ".conv", c, c, 3, true);
  }
  if (n.add_extra_convs == ExtraConvs::kOff) return;
  for (int k = 0; k < fpn_num_extra_levels(n); ++k) {
    const int64_t in = k == 0 && n.add_extra_convs == ExtraConvs::kOnInput
                           ? n.in_channels[static_cast<size_t>(end - 1)] : c;
    s.conv(p + "fpn_convs." + std::to_string(end - n.start_level + k) + ".conv", c, in, 3, true);
  }
}

// mmcv FFN with num_fcs=2: layers.0 = Sequential(Linear, ReLU, Dropout), layers.1 = Linear.
void ffn(SpecList& s, const std::string& p, int64_t c, int64_t hidden) {
  s.linear(p + ".layers.0.0", c, hidden);
  s.linear(p + ".layers.1", hidden, c);
}

void norms(SpecList& s, const std::string& p, const std::vector<LayerOp>& order, int64_t c) {
  int n = 0;
  for (LayerOp op : order) {
    if (op == LayerOp::kNorm) s.layer_norm(p + ".norms." + std::to_string(n++), c);
  }
}

// The projections every deformable attention of BEVFormer has (TSA, SCA's inner
// MSDeformableAttention3D, the decoder's CustomMSDeformableAttention): offsets and weights read a
// `query_in`-wide query, the value projection keeps C. `samples` = heads x levels x points (x queue).
void deformable_attention(SpecList& s, const std::string& p, int64_t query_in, int64_t c, int64_t samples) {
  s.linear(p + ".sampling_offsets", query_in, samples * 2);
  s.linear(p + ".attention_weights", query_in, samples);
  s.linear(p + ".value_proj", c, c);
}

void encoder(SpecList& s, const TransformerConfig& t) {
  const int64_t c = t.embed_dims;
  const int64_t q = t.tsa_num_bev_queue;
  const DeformAttnConfig& tsa = t.tsa;
  const DeformAttnConfig& sca = t.sca;
  for (int i = 0; i < t.encoder_layers; ++i) {
    const std::string p = "pts_bbox_head.transformer.encoder.layers." + std::to_string(i);
    // TSA: offsets and weights read concat(prev BEV, query + pos), i.e. C * queue inputs.
    const int64_t tsa_samples = q * tsa.num_heads * tsa.num_levels * tsa.num_points;
    deformable_attention(s, p + ".attentions.0", c * q, c, tsa_samples);
    s.linear(p + ".attentions.0.output_proj", c, c);
    // SCA: MSDeformableAttention3D has no output_proj of its own; SCA's follows the averaging.
    const int64_t sca_samples = static_cast<int64_t>(sca.num_heads) * sca.num_levels * sca.num_points;
    deformable_attention(s, p + ".attentions.1.deformable_attention", c, c, sca_samples);
    s.linear(p + ".attentions.1.output_proj", c, c);
    ffn(s, p + ".ffns.0", c, t.encoder_ffn_dims);
    norms(s, p, t.encoder_operation_order, c);
  }
}

void decoder(SpecList& s, const TransformerConfig& t) {
  const int64_t c = t.embed_dims;
  const DeformAttnConfig& x = t.decoder_cross;
  for (int i = 0; i < t.decoder_layers; ++i) {
    const std::string p = "pts_bbox_head.transformer.decoder.layers." + std::to_string(i);
    // mmcv MultiheadAttention wraps nn.MultiheadAttention as `.attn` (q, k, v stacked in in_proj).
    s.param(p + ".attentions.0.attn.in_proj_weight", {3 * c, c});
    s.param(p + ".attentions.0.attn.in_proj_bias", {3 * c});
    s.linear(p + ".attentions.0.attn.out_proj", c, c);
    const int64_t samples = static_cast<int64_t>(x.num_heads) * x.num_levels * x.num_points;
    deformable_attention(s, p + ".attentions.1", c, c, samples);
    s.linear(p + ".attentions.1.output_proj", c, c);
    ffn(s, p + ".ffns.0", c, t.decoder_ffn_dims);
    norms(s, p, t.decoder_operation_order, c);
  }
}

// BEVFormerHead._init_layers: cls = [Linear, LayerNorm, ReLU] x num_reg_fcs + Linear;
// reg = [Linear, ReLU] x num_reg_fcs + Linear. With box refinement each decoder layer has its own
// copy; without, the ModuleList repeats one module, and state_dict still lists it per index.
void branches(SpecList& s, const HeadConfig& h, int64_t c, int num_pred) {
  const int fcs = h.num_reg_fcs;
  auto cls = [&](const std::string& p) {
    for (int r = 0; r < fcs; ++r) {
      s.linear(p + std::to_string(3 * r), c, c);
      s.layer_norm(p + std::to_string(3 * r + 1), c);
    }
    s.linear(p + std::to_string(3 * fcs), c, h.num_classes);
  };
  auto reg = [&](const std::string& p) {
    for (int r = 0; r < fcs; ++r) s.linear(p + std::to_string(2 * r), c, c);
    s.linear(p + std::to_string(2 * fcs), c, h.code_size);
  };
  auto module_list = [&](const std::string& base, auto&& emit) {
    size_t first = 0, first_end = 0;
    for (int l = 0; l < num_pred; ++l) {
      const std::string p = base + std::to_string(l) + ".";
      if (h.with_box_refine || l == 0) {
        first = s.size();
        emit(p);
        first_end = s.size();
      } else {
        s.alias_range(first, first_end, base + "0.", p);
      }
    }
  };
  module_list("pts_bbox_head.cls_branches.", cls);
  module_list("pts_bbox_head.reg_branches.", reg);
}

}  // namespace

// In state_dict order: modules register their own parameters before their children, and
// MVXTwoStageDetector builds pts_bbox_head before img_backbone and img_neck.
std::vector<ParamSpec> expected_params(const ModelConfig& cfg) {
  validate_config(cfg);
  std::vector<ParamSpec> out;
  SpecList s(out);
  const TransformerConfig& t = cfg.transformer;
  const HeadConfig& h = cfg.head;
  const int64_t c = t.embed_dims;
  // A non-trainable nn.Parameter holding the loss weights: saved, never read at inference.
  out.push_back({"pts_bbox_head.code_weights", {static_cast<int64_t>(h.code_weights.size())},
                 DType::kF32, true, false});
  s.param("pts_bbox_head.positional_encoding.row_embed.weight", {h.pos_row_num_embed, h.pos_num_feats});
  s.param("pts_bbox_head.positional_encoding.col_embed.weight", {h.pos_col_num_embed, h.pos_num_feats});
  const std::string tr = "pts_bbox_head.transformer.";
  s.param(tr + "level_embeds", {t.num_feature_levels, c});
  s.param(tr + "cams_embeds", {t.num_cams, c}, t.use_cams_embeds);
  encoder(s, t);
  decoder(s, t);
  s.linear(tr + "reference_points", c, 3);
  // Built even when use_can_bus is off (its output is then multiplied by 0).
  s.linear(tr + "can_bus_mlp.0", 18, c / 2, t.use_can_bus);
  s.linear(tr + "can_bus_mlp.2", c / 2, c, t.use_can_bus);
  if (t.can_bus_norm) s.layer_norm(tr + "can_bus_mlp.norm", c, t.use_can_bus);
  branches(s, h, c, t.decoder_layers);
  s.param("pts_bbox_head.bev_embedding.weight", {static_cast<int64_t>(h.bev_h) * h.bev_w, c});
  s.param("pts_bbox_head.query_embedding.weight", {h.num_query, 2 * c});
  resnet(s, cfg.backbone);
  fpn(s, cfg.neck);
  return out;
}

ValidationReport validate_state_dict(const std::vector<ParamSpec>& specs,
                                     const std::vector<std::pair<std::string, TensorMeta>>& tensors) {
  ValidationReport r;
  std::unordered_map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : specs) {
    by_name.emplace(s.name, &s);
    if (!s.optional && s.used && s.alias_of.empty() && dtype_is_float(s.dtype)) {
      r.expected_params += shape_numel(s.shape);
    }
  }
  std::unordered_map<std::string, int> seen;
  for (const auto& [name, meta] : tensors) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      r.unexpected.push_back(name);
      continue;
    }
    const std::string got = std::string(dtype_name(meta.dtype)) + " " + shape_str(meta.shape);
    if (++seen[name] > 1) {
      r.mismatched.push_back({name, "one tensor", "a second tensor (" + got + ")"});
      continue;
    }
    const ParamSpec& s = *it->second;
    const bool want_float = dtype_is_float(s.dtype);
    const bool is_int = !dtype_is_float(meta.dtype) && meta.dtype != DType::kBool;
    const bool dtype_ok = want_float ? dtype_is_float(meta.dtype) : is_int;
    if (!dtype_ok || meta.shape != s.shape) {
      r.mismatched.push_back({name, std::string(want_float ? "float " : "integer ") + shape_str(s.shape), got});
    } else {
      ++r.matched;
    }
  }
  for (const ParamSpec& s : specs) {
    if (!s.optional && !seen.contains(s.name)) r.missing.push_back(s.name);
  }
  return r;
}

std::string format_report(const ValidationReport& r, size_t max_lines_per_section) {
  std::string s = "state dict: " + std::to_string(r.matched) + " tensors match";
  if (r.ok()) return s + "; nothing missing, unexpected or mismatched\n";
  s += "; " + std::to_string(r.missing.size()) + " missing, " + std::to_string(r.unexpected.size()) +
       " unexpected, " + std::to_string(r.mismatched.size()) + " mismatched\n";
  auto section = [&](const char* title, size_t n, auto&& line) {
    if (n == 0) return;
    s += std::string(title) + " (" + std::to_string(n) + "):\n";
    for (size_t i = 0; i < n && i < max_lines_per_section; ++i) s += "  " + line(i) + "\n";
    if (n > max_lines_per_section) s += "  ... and " + std::to_string(n - max_lines_per_section) + " more\n";
  };
  section("missing", r.missing.size(), [&](size_t i) { return r.missing[i]; });
  section("unexpected", r.unexpected.size(), [&](size_t i) { return r.unexpected[i]; });
  section("mismatched", r.mismatched.size(), [&](size_t i) {
    const auto& m = r.mismatched[i];
    return m.name + ": expected " + m.expected + ", got " + m.got;
  });
  return s;
}

int64_t count_parameters(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& s : specs) {
    if (!s.alias_of.empty() || ends_with(s.name, ".running_mean") || ends_with(s.name, ".running_var") ||
        ends_with(s.name, ".num_batches_tracked")) {
      continue;
    }
    n += shape_numel(s.shape);
  }
  return n;
}

}  // namespace bev
