// ModelConfig from JSON written with upstream's config keys (the golden sets' config.json, or a
// model dict exported from an mmdet3d config), filling upstream's defaults for absent keys.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <utility>

#include "bevformer/error.h"
#include "io/byte_source.h"
#include "model/config_util.h"

namespace bev {

using json = nlohmann::json;
using config_detail::describe;
using config_detail::fail;
using config_detail::join_path;
using config_detail::place;
using config_detail::text;

// ---------------------------------------------------------------------------------------------
// JSON (upstream keys)

namespace {

// A dict of the config together with its key path, so every error names where it happened.
// null counts as absent (Python None), which upstream treats as "use the default" for every key
// read here.
class Dict {
 public:
  Dict(const json& j, std::string path, const std::string& where)
      : j_(&j), path_(std::move(path)), where_(&where) {}

  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const { return join_path(path_, key); }
  const json* get(std::string_view key) const {
    auto it = j_->find(key);
    return it == j_->end() || it->is_null() ? nullptr : &*it;
  }
  bool has(std::string_view key) const { return get(key) != nullptr; }
  const json* raw(std::string_view key) const {  // including null
    auto it = j_->find(key);
    return it == j_->end() ? nullptr : &*it;
  }
  // Upstream's default dict for an absent key, read with that key's path.
  Dict defaulted(const json& def, std::string_view key) const { return Dict(def, key_path(key), *where_); }

  [[noreturn]] void fail(ErrorKind kind, std::string_view key, const std::string& problem,
                         const std::string& expected = {}, const std::string& hint = {}) const {
    bev::fail(kind, *where_, key.empty() ? path_ : key_path(key), problem, expected, hint);
  }
  [[noreturn]] void missing(std::string_view key, const std::string& expected) const {
    fail(ErrorKind::kInvalidInput, key, "is missing", expected);
  }
  [[noreturn]] void wrong_type(const json& v, const std::string& path, const std::string& expected) const {
    bev::fail(ErrorKind::kInvalidInput, *where_, path, "is " + describe(v), expected);
  }

  std::optional<Dict> dict(std::string_view key) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_object()) wrong_type(*v, key_path(key), "a dict");
    return Dict(*v, key_path(key), *where_);
  }
  Dict required_dict(std::string_view key) const {
    auto d = dict(key);
    if (!d) missing(key, "a dict");
    return *d;
  }
  // A list of dicts (attn_cfgs).
  std::vector<Dict> dicts(std::string_view key) const {
    const json* v = get(key);
    if (!v) missing(key, "a list of dicts");
    if (!v->is_array()) wrong_type(*v, key_path(key), "a list of dicts, one per attention");
    std::vector<Dict> out;
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string p = key_path(key) + "[" + std::to_string(i) + "]";
      if (!(*v)[i].is_object()) wrong_type((*v)[i], p, "a dict");
      out.emplace_back((*v)[i], p, *where_);
    }
    return out;
  }

  int integer(std::string_view key, std::optional<int> def = std::nullopt) const {
    const json* v = get(key);
    if (!v) {
      if (!def) missing(key, "an integer");
      return *def;
    }
    return as_int(*v, key_path(key));
  }
  double number(std::string_view key, std::optional<double> def = std::nullopt) const {
    const json* v = get(key);
    if (!v) {
      if (!def) missing(key, "a number");
      return *def;
    }
    return as_number(*v, key_path(key));
  }
  bool boolean(std::string_view key, bool def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) wrong_type(*v, key_path(key), "true or false");
    return v->get<bool>();
  }
  std::string string(std::string_view key, std::optional<std::string> def = std::nullopt) const {
    const json* v = get(key);
    if (!v) {
      if (!def) missing(key, "a string");
      return *def;
    }
    if (!v->is_string()) wrong_type(*v, key_path(key), "a string");
    return v->get<std::string>();
  }
  template <typename T, typename Conv>
  std::optional<std::vector<T>> list(std::string_view key, Conv conv, const char* what) const {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_array()) wrong_type(*v, key_path(key), std::string("a list of ") + what);
    std::vector<T> out;
    for (size_t i = 0; i < v->size(); ++i) {
      out.push_back(conv((*v)[i], key_path(key) + "[" + std::to_string(i) + "]"));
    }
    return out;
  }
  std::optional<std::vector<int>> ints(std::string_view key) const {
    return list<int>(key, [this](const json& e, const std::string& p) { return as_int(e, p); }, "integers");
  }
  std::optional<std::vector<double>> numbers(std::string_view key) const {
    return list<double>(key, [this](const json& e, const std::string& p) { return as_number(e, p); }, "numbers");
  }
  std::optional<std::vector<bool>> bools(std::string_view key) const {
    return list<bool>(key, [this](const json& e, const std::string& p) {
      if (!e.is_boolean()) wrong_type(e, p, "true or false");
      return e.get<bool>();
    }, "booleans");
  }
  std::optional<std::vector<std::string>> strings(std::string_view key) const {
    return list<std::string>(key, [this](const json& e, const std::string& p) {
      if (!e.is_string()) wrong_type(e, p, "a string");
      return e.get<std::string>();
    }, "strings");
  }
  template <size_t N>
  std::optional<std::array<double, N>> fixed(std::string_view key) const {
    auto v = numbers(key);
    if (!v) return std::nullopt;
    if (v->size() != N) {
      fail(ErrorKind::kInvalidInput, key, "has " + std::to_string(v->size()) + " numbers",
           std::to_string(N) + " numbers");
    }
    std::array<double, N> a{};
    std::copy(v->begin(), v->end(), a.begin());
    return a;
  }

  template <size_t N>
  std::array<double, N> required_fixed(std::string_view key) const {
    auto v = fixed<N>(key);
    if (!v) missing(key, std::to_string(N) + " numbers");
    return *v;
  }

  // `type` must be one of `accepted`; anything else is a module we do not build.
  void check_type(std::initializer_list<std::string_view> accepted, bool required = true) const {
    std::string names;
    for (auto a : accepted) names += (names.empty() ? "'" : ", '") + std::string(a) + "'";
    if (!has("type")) {
      if (required) missing("type", names);
      return;
    }
    const std::string t = string("type");
    for (auto a : accepted) {
      if (t == a) return;
    }
    fail(ErrorKind::kUnsupported, "type", "is '" + t + "'", names);
  }
  // For classes without **kwargs (mmdet ResNet, FPN), where upstream rejects unknown keys too.
  void only_keys(std::initializer_list<std::string_view> known) const {
    for (const auto& [k, v] : j_->items()) {
      bool ok = false;
      for (auto n : known) ok = ok || k == n;
      if (!ok) fail(ErrorKind::kInvalidInput, k, "is not an argument of this module (typo?)");
    }
  }
  // Options whose non-default values change the network in ways we do not implement.
  void must_be_absent(std::string_view key, const std::string& expected = "None") const {
    if (has(key)) fail(ErrorKind::kUnsupported, key, "is set", expected);
  }
  void must_be(std::string_view key, bool value, bool def) const {
    if (boolean(key, def) != value) {
      fail(ErrorKind::kUnsupported, key, std::string("is ") + (value ? "False" : "True"),
           value ? "True" : "False");
    }
  }

 private:
  int as_int(const json& v, const std::string& p) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return static_cast<int>(v.get<uint64_t>());
    }
    if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= std::numeric_limits<int>::min() &&
        v.get<int64_t>() <= std::numeric_limits<int>::max()) {
      return static_cast<int>(v.get<int64_t>());
    }
    wrong_type(v, p, "an integer");
  }
  double as_number(const json& v, const std::string& p) const {
    if (!v.is_number()) wrong_type(v, p, "a number");
    return v.get<double>();
  }

  const json* j_;
  std::string path_;
  const std::string* where_;
};

BackboneConfig parse_backbone(const Dict& d) {
  d.check_type({"ResNet"});
  d.only_keys({"type", "depth", "in_channels", "stem_channels", "base_channels", "num_stages",
               "strides", "dilations", "out_indices", "style", "deep_stem", "avg_down",
               "frozen_stages", "conv_cfg", "norm_cfg", "norm_eval", "dcn", "stage_with_dcn",
               "plugins", "with_cp", "zero_init_residual", "pretrained", "init_cfg"});
  BackboneConfig b;
  b.depth = d.integer("depth");
  b.in_channels = d.integer("in_channels", 3);
  b.base_channels = d.integer("base_channels", 64);
  b.stem_channels = d.integer("stem_channels", b.base_channels);
  b.num_stages = d.integer("num_stages", 4);
  b.strides = d.ints("strides").value_or(std::vector<int>{1, 2, 2, 2});
  for (int dil : d.ints("dilations").value_or(std::vector<int>{1})) {
    if (dil != 1) d.fail(ErrorKind::kUnsupported, "dilations", "has dilation " + std::to_string(dil), "all 1");
  }
  b.out_indices = d.ints("out_indices").value_or(std::vector<int>{0, 1, 2, 3});
  const std::string style = d.string("style", "pytorch");
  if (style != "pytorch" && style != "caffe") {
    d.fail(ErrorKind::kInvalidInput, "style", "is '" + style + "'", "'pytorch' or 'caffe'");
  }
  b.style = style == "caffe" ? ResNetStyle::kCaffe : ResNetStyle::kPytorch;
  d.must_be("deep_stem", false, false);
  d.must_be("avg_down", false, false);
  d.must_be_absent("conv_cfg");
  d.must_be_absent("plugins");
  b.frozen_stages = d.integer("frozen_stages", -1);
  if (auto n = d.dict("norm_cfg")) {
    n->check_type({"BN", "BN2d", "SyncBN"});
    b.norm_eps = n->number("eps", 1e-5);
  }
  if (auto dcn = d.dict("dcn")) {
    dcn->check_type({"DCNv2"});
    b.dcn = true;
    b.dcn_deform_groups = dcn->integer("deform_groups", 1);
    b.dcn_fallback_on_stride = dcn->boolean("fallback_on_stride", false);
  }
  b.stage_with_dcn = d.bools("stage_with_dcn").value_or(std::vector<bool>{false, false, false, false});
  return b;
}

NeckConfig parse_neck(const Dict& d) {
  d.check_type({"FPN"});
  d.only_keys({"type", "in_channels", "out_channels", "num_outs", "start_level", "end_level",
               "add_extra_convs", "extra_convs_on_inputs", "relu_before_extra_convs",
               "no_norm_on_lateral", "conv_cfg", "norm_cfg", "act_cfg", "upsample_cfg", "init_cfg"});
  NeckConfig n;
  auto in = d.ints("in_channels");
  if (!in) d.missing("in_channels", "a list of integers");
  n.in_channels = *in;
  n.out_channels = d.integer("out_channels");
  n.num_outs = d.integer("num_outs");
  n.start_level = d.integer("start_level", 0);
  n.end_level = d.integer("end_level", -1);
  if (const json* v = d.get("add_extra_convs"); v && v->is_boolean()) {
    // mmdet: True means 'on_input' (older versions: unless extra_convs_on_inputs=False).
    const bool on_inputs = d.boolean("extra_convs_on_inputs", true);
    n.add_extra_convs = !v->get<bool>() ? ExtraConvs::kOff : on_inputs ? ExtraConvs::kOnInput : ExtraConvs::kOnOutput;
  } else if (v) {
    const std::string s = d.string("add_extra_convs");
    if (s == "on_input") n.add_extra_convs = ExtraConvs::kOnInput;
    else if (s == "on_lateral") n.add_extra_convs = ExtraConvs::kOnLateral;
    else if (s == "on_output") n.add_extra_convs = ExtraConvs::kOnOutput;
    else d.fail(ErrorKind::kInvalidInput, "add_extra_convs", "is '" + s + "'",
                "False, True, 'on_input', 'on_lateral' or 'on_output'");
  }
  n.relu_before_extra_convs = d.boolean("relu_before_extra_convs", false);
  d.must_be_absent("conv_cfg");
  d.must_be_absent("norm_cfg");
  d.must_be_absent("act_cfg");
  if (auto u = d.dict("upsample_cfg")) {
    if (u->string("mode", "nearest") != "nearest") {
      u->fail(ErrorKind::kUnsupported, "mode", "is '" + u->string("mode") + "'", "'nearest'");
    }
    u->must_be_absent("scale_factor", "absent (upsampling to the lateral's size)");
  }
  return n;
}

struct LayerCfg {
  std::vector<Dict> attns;
  std::vector<LayerOp> order;
  int ffn_dims = 0;
};

// BEVFormerLayer / DetrTransformerDecoderLayer (both mmcv BaseTransformerLayer underneath).
LayerCfg parse_layer(const Dict& d, std::string_view type, int embed_dims) {
  d.check_type({type});
  LayerCfg l;
  auto ops = d.strings("operation_order");
  if (!ops) d.missing("operation_order", "a list of 'self_attn', 'cross_attn', 'norm', 'ffn'");
  for (const auto& op : *ops) {
    if (op == "self_attn") l.order.push_back(LayerOp::kSelfAttn);
    else if (op == "cross_attn") l.order.push_back(LayerOp::kCrossAttn);
    else if (op == "norm") l.order.push_back(LayerOp::kNorm);
    else if (op == "ffn") l.order.push_back(LayerOp::kFfn);
    else d.fail(ErrorKind::kInvalidInput, "operation_order", "has '" + op + "'",
                "'self_attn', 'cross_attn', 'norm' or 'ffn'");
  }
  l.attns = d.dicts("attn_cfgs");
  if (l.attns.size() != 2) {
    d.fail(ErrorKind::kInvalidInput, "attn_cfgs", "has " + std::to_string(l.attns.size()) + " entries",
           "2 (self-attention, cross-attention)");
  }
  if (auto n = d.dict("norm_cfg")) n->check_type({"LN"});
  // The layer's feedforward_channels / ffn_num_fcs override ffn_cfgs (mmcv's deprecated-argument
  // path); ffn_cfgs.embed_dims defaults to 256 whatever the model width.
  int ffn_embed = 256;
  std::optional<int> ffn_channels;
  if (auto f = d.dict("ffn_cfgs")) {
    f->check_type({"FFN"}, false);
    ffn_embed = f->integer("embed_dims", embed_dims);
    if (f->has("feedforward_channels")) ffn_channels = f->integer("feedforward_channels");
    if (auto act = f->dict("act_cfg")) act->check_type({"ReLU"});
    f->must_be("add_identity", true, true);
    if (ffn_embed != embed_dims) {
      f->fail(ErrorKind::kInvalidInput, "embed_dims", "is " + std::to_string(ffn_embed),
              "the transformer's embed_dims " + std::to_string(embed_dims));
    }
  } else {
    ffn_channels = 1024;
    if (embed_dims != 256) {
      d.fail(ErrorKind::kInvalidInput, "ffn_cfgs", "is absent, so upstream builds the FFN for 256 channels",
             "ffn_cfgs with embed_dims=" + std::to_string(embed_dims));
    }
  }
  if (d.has("feedforward_channels")) ffn_channels = d.integer("feedforward_channels");
  if (!ffn_channels) d.missing("feedforward_channels", "an integer");
  l.ffn_dims = *ffn_channels;
  const int num_fcs = d.integer("ffn_num_fcs", 2);
  if (num_fcs != 2) {
    d.fail(ErrorKind::kUnsupported, "ffn_num_fcs", "is " + std::to_string(num_fcs), "2");
  }
  return l;
}

DeformAttnConfig parse_deform_attn(const Dict& d, DeformAttnConfig def, int embed_dims) {
  const int e = d.integer("embed_dims", 256);
  if (e != embed_dims) {
    d.fail(ErrorKind::kInvalidInput, "embed_dims", "is " + std::to_string(e) + " (256 when absent)",
           "the transformer's embed_dims " + std::to_string(embed_dims));
  }
  return {d.integer("num_heads", def.num_heads), d.integer("num_levels", def.num_levels),
          d.integer("num_points", def.num_points)};
}

using Range6 = std::optional<std::array<double, 6>>;

Range6 pc_range_or(const Dict& d, const Range6& fallback) {
  Range6 r = d.fixed<6>("pc_range");
  if (!r) r = fallback;
  if (!r) {
    d.missing("pc_range", "[x_min, y_min, z_min, x_max, y_max, z_max] (or a top-level point_cloud_range)");
  }
  return r;
}

void parse_transformer(const Dict& d, TransformerConfig& t, const Range6& pc_fallback) {
  d.check_type({"PerceptionTransformer"});
  t.embed_dims = d.integer("embed_dims", 256);
  t.num_feature_levels = d.integer("num_feature_levels", 4);
  t.num_cams = d.integer("num_cams", 6);
  t.rotate_prev_bev = d.boolean("rotate_prev_bev", true);
  t.use_shift = d.boolean("use_shift", true);
  t.use_can_bus = d.boolean("use_can_bus", true);
  t.can_bus_norm = d.boolean("can_bus_norm", true);
  t.use_cams_embeds = d.boolean("use_cams_embeds", true);
  t.rotate_center = d.fixed<2>("rotate_center").value_or(std::array<double, 2>{100, 100});

  const Dict enc = d.required_dict("encoder");
  enc.check_type({"BEVFormerEncoder"});
  t.encoder_layers = enc.integer("num_layers");
  t.pc_range = *pc_range_or(enc, pc_fallback);
  t.num_points_in_pillar = enc.integer("num_points_in_pillar", 4);
  enc.must_be("return_intermediate", false, false);
  const LayerCfg el = parse_layer(enc.required_dict("transformerlayers"), "BEVFormerLayer", t.embed_dims);
  t.encoder_operation_order = el.order;
  t.encoder_ffn_dims = el.ffn_dims;
  el.attns[0].check_type({"TemporalSelfAttention"});
  t.tsa = parse_deform_attn(el.attns[0], {8, 4, 4}, t.embed_dims);
  t.tsa_num_bev_queue = el.attns[0].integer("num_bev_queue", 2);
  const Dict& sca = el.attns[1];
  sca.check_type({"SpatialCrossAttention"});
  parse_deform_attn(sca, {}, t.embed_dims);
  if (sca.integer("num_cams", 6) != t.num_cams) {
    sca.fail(ErrorKind::kInvalidInput, "num_cams", "is " + std::to_string(sca.integer("num_cams", 6)),
             "the transformer's num_cams " + std::to_string(t.num_cams));
  }
  const json default_msda = {{"type", "MSDeformableAttention3D"}, {"embed_dims", 256}, {"num_levels", 4}};
  auto msda = sca.dict("deformable_attention");
  const Dict m = msda ? *msda : sca.defaulted(default_msda, "deformable_attention");
  m.check_type({"MSDeformableAttention3D"});
  t.sca = parse_deform_attn(m, {8, 4, 8}, t.embed_dims);

  const Dict dec = d.required_dict("decoder");
  dec.check_type({"DetectionTransformerDecoder"});
  t.decoder_layers = dec.integer("num_layers");
  dec.must_be("return_intermediate", true, false);
  const LayerCfg dl = parse_layer(dec.required_dict("transformerlayers"), "DetrTransformerDecoderLayer", t.embed_dims);
  t.decoder_operation_order = dl.order;
  t.decoder_ffn_dims = dl.ffn_dims;
  dl.attns[0].check_type({"MultiheadAttention"});
  const int mha_dims = dl.attns[0].integer("embed_dims");
  if (mha_dims != t.embed_dims) {
    dl.attns[0].fail(ErrorKind::kInvalidInput, "embed_dims", "is " + std::to_string(mha_dims),
                     "the transformer's embed_dims " + std::to_string(t.embed_dims));
  }
  t.decoder_self_attn_heads = dl.attns[0].integer("num_heads");
  dl.attns[1].check_type({"CustomMSDeformableAttention"});
  t.decoder_cross = parse_deform_attn(dl.attns[1], {8, 4, 4}, t.embed_dims);
}

void parse_head(const Dict& d, ModelConfig& cfg, const Range6& pc_fallback) {
  d.check_type({"BEVFormerHead"});
  HeadConfig& h = cfg.head;
  h.bev_h = d.integer("bev_h", 30);
  h.bev_w = d.integer("bev_w", 30);
  h.num_query = d.integer("num_query", 100);
  h.num_classes = d.integer("num_classes");
  h.code_size = d.integer("code_size", 10);
  h.num_reg_fcs = d.integer("num_reg_fcs", 2);
  h.with_box_refine = d.boolean("with_box_refine", false);
  h.as_two_stage = d.boolean("as_two_stage", false);
  if (auto w = d.numbers("code_weights")) h.code_weights = *w;
  // DETRHead: sigmoid classification (num_classes logits) only with a sigmoid loss; its default
  // CrossEntropyLoss gives num_classes + 1 softmax logits, which NMSFreeCoder cannot decode.
  auto loss = d.dict("loss_cls");
  const bool sigmoid = loss && loss->boolean("use_sigmoid", loss->string("type", "") == "FocalLoss");
  if (!sigmoid) {
    d.fail(ErrorKind::kUnsupported, loss ? "loss_cls.use_sigmoid" : "loss_cls",
           loss ? "is False (softmax classification)" : "is absent (mmdet defaults to softmax CrossEntropyLoss)",
           "loss_cls with use_sigmoid=True (FocalLoss), as every BEVFormer config has");
  }
  auto pos = d.dict("positional_encoding");
  if (!pos) {
    d.fail(ErrorKind::kUnsupported, "positional_encoding",
           "is absent (mmdet defaults to SinePositionalEncoding)", "a LearnedPositionalEncoding dict");
  }
  pos->check_type({"LearnedPositionalEncoding"});
  h.pos_num_feats = pos->integer("num_feats");
  h.pos_row_num_embed = pos->integer("row_num_embed", 50);
  h.pos_col_num_embed = pos->integer("col_num_embed", 50);
  const Dict coder = d.required_dict("bbox_coder");
  coder.check_type({"NMSFreeCoder"});
  h.pc_range = *pc_range_or(coder, pc_fallback);
  h.post_center_range = coder.fixed<6>("post_center_range");
  h.max_num = coder.integer("max_num", 100);
  if (coder.has("score_threshold")) h.score_threshold = coder.number("score_threshold");
  // The coder's own num_classes splits the flattened top-k index into (query, label).
  if (coder.integer("num_classes", 10) != h.num_classes) {
    coder.fail(ErrorKind::kInvalidInput, "num_classes",
               "is " + std::to_string(coder.integer("num_classes", 10)) + " (10 when absent)",
               "pts_bbox_head.num_classes " + std::to_string(h.num_classes));
  }
  parse_transformer(d.required_dict("transformer"), cfg.transformer, pc_fallback);
}

// test_pipeline steps may nest (MultiScaleFlipAug3D.transforms).
std::optional<Dict> pipeline_step(const json& steps, const std::string& path, std::string_view type,
                                  const std::string& where) {
  if (!steps.is_array()) return std::nullopt;
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    if (!s.is_object()) continue;
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (s.value("type", "") == type) return Dict(s, p, where);
    if (auto t = s.find("transforms"); t != s.end()) {
      if (auto r = pipeline_step(*t, p + ".transforms", type, where)) return r;
    }
  }
  return std::nullopt;
}

// Values upstream keeps outside `model`: the top-level variables first, then the test pipeline,
// then the golden set's `effective` section; what none of them gives is stated in image.source.
void parse_image(const std::optional<Dict>& top, const std::optional<Dict>& eff, const std::string& where,
                 ModelConfig& cfg) {
  ImageConfig& img = cfg.image;
  auto step = [&](std::string_view type) -> std::optional<Dict> {
    const json* p = top ? top->get("test_pipeline") : nullptr;
    return p ? pipeline_step(*p, "test_pipeline", type, where) : std::nullopt;
  };
  std::optional<Dict> norm = top ? top->dict("img_norm_cfg") : std::nullopt;
  if (!norm) norm = step("NormalizeMultiviewImage");
  if (!norm && eff) norm = eff->dict("img_norm_cfg");
  std::string src;
  if (norm) {
    img.mean = norm->required_fixed<3>("mean");
    img.std = norm->required_fixed<3>("std");
    img.to_rgb = norm->boolean("to_rgb", true);
    src = "img_norm_cfg from " + norm->path();
  } else if (cfg.backbone.style == ResNetStyle::kCaffe) {
    img.mean = {103.530, 116.280, 123.675};
    img.std = {1, 1, 1};
    img.to_rgb = false;
    src = "img_norm_cfg not given: caffe-style BGR values of the official configs";
  } else {
    src = "img_norm_cfg not given: pytorch-style ImageNet RGB values of the official configs";
  }
  if (auto s = step("RandomScaleImageMultiViewImage")) {
    auto scales = s->numbers("scales");
    if (!scales || scales->size() != 1) {
      s->fail(ErrorKind::kUnsupported, "scales", "does not hold exactly one scale", "[scale]");
    }
    img.resize_scale = scales->front();
  } else if (eff) {
    img.resize_scale = eff->number("resize_scale", 1.0);
  }
  if (auto s = step("PadMultiViewImage")) {
    s->must_be_absent("size", "absent (size_divisor padding)");
    img.size_divisor = s->integer("size_divisor");
  } else if (eff) {
    img.size_divisor = eff->integer("size_divisor", 32);
  }
  if (auto wh = eff ? eff->ints("image_size_raw_wh") : std::nullopt) {
    if (wh->size() != 2) eff->fail(ErrorKind::kInvalidInput, "image_size_raw_wh", "is " + text(*wh), "[width, height]");
    img.width = (*wh)[0];
    img.height = (*wh)[1];
    src += "; image size from effective.image_size_raw_wh";
  } else {
    src += "; image size not given: nuScenes 1600x900";
  }
  img.source = place(where, src);
}

std::vector<std::string> parse_class_names(const std::optional<Dict>& top, const std::optional<Dict>& eff,
                                           int num_classes) {
  if (auto n = top ? top->strings("class_names") : std::nullopt) return *n;
  if (auto n = eff ? eff->strings("class_names") : std::nullopt) return *n;
  if (num_classes == 10) return nuscenes_class_names();
  std::vector<std::string> names;
  for (int i = 0; i < num_classes; ++i) names.push_back("class_" + std::to_string(i));
  return names;
}

// The golden sets' `effective` section restates values under its own names; each one present
// must equal what we derived (this is how a wrong upstream default would show up).
json effective_view(const ModelConfig& c) {
  const auto& t = c.transformer;
  const auto& h = c.head;
  auto uniform = [](std::vector<int> v) {
    return std::all_of(v.begin(), v.end(), [&](int x) { return x == v[0]; }) ? json(v[0]) : json(v);
  };
  std::vector<int> out_channels;
  for (int o : c.backbone.out_indices) out_channels.push_back(resnet_stage_out_channels(c.backbone, o));
  const ImageSize padded = image_padded_size(c.image);
  return {
      {"point_cloud_range", t.pc_range}, {"bev_h", h.bev_h}, {"bev_w", h.bev_w},
      {"embed_dims", t.embed_dims},
      {"num_heads", uniform({t.tsa.num_heads, t.sca.num_heads, t.decoder_self_attn_heads, t.decoder_cross.num_heads})},
      {"ffn_dims", uniform({t.encoder_ffn_dims, t.decoder_ffn_dims})}, {"pos_num_feats", h.pos_num_feats},
      {"num_feature_levels_fpn", c.neck.num_outs}, {"num_feature_levels_transformer_param", t.num_feature_levels},
      {"num_cams", t.num_cams}, {"encoder_layers", t.encoder_layers}, {"decoder_layers", t.decoder_layers},
      {"num_points_in_pillar", t.num_points_in_pillar}, {"tsa_num_points", t.tsa.num_points},
      {"tsa_num_levels", t.tsa.num_levels}, {"tsa_num_bev_queue", t.tsa_num_bev_queue},
      {"sca_num_points", t.sca.num_points}, {"sca_num_levels", t.sca.num_levels},
      {"decoder_msda_num_points", t.decoder_cross.num_points}, {"decoder_msda_num_levels", t.decoder_cross.num_levels},
      {"num_query", h.num_query}, {"num_classes", h.num_classes}, {"code_size", h.code_size},
      {"code_weights", h.code_weights},
      {"post_center_range", h.post_center_range ? json(*h.post_center_range) : json(nullptr)},
      {"max_num", h.max_num}, {"score_threshold", h.score_threshold ? json(*h.score_threshold) : json(nullptr)},
      {"rotate_prev_bev", t.rotate_prev_bev}, {"use_shift", t.use_shift}, {"use_can_bus", t.use_can_bus},
      {"can_bus_norm", t.can_bus_norm}, {"use_cams_embeds", t.use_cams_embeds}, {"rotate_center", t.rotate_center},
      {"shift_ref_2d_alias", t.shift_ref_2d_alias}, {"with_box_refine", h.with_box_refine},
      {"as_two_stage", h.as_two_stage}, {"video_test_mode", c.video_test_mode},
      {"img_norm_cfg", {{"mean", c.image.mean}, {"std", c.image.std}, {"to_rgb", c.image.to_rgb}}},
      {"size_divisor", c.image.size_divisor}, {"resize_scale", c.image.resize_scale},
      {"image_size_padded_wh", {padded.width, padded.height}}, {"class_names", c.class_names},
      {"backbone", {{"type", "ResNet"}, {"depth", c.backbone.depth}, {"base_channels", c.backbone.base_channels},
                    {"style", resnet_style_name(c.backbone.style)}, {"out_indices", c.backbone.out_indices},
                    {"out_channels", out_channels}}},
      {"neck", {{"type", "FPN"}, {"out_channels", c.neck.out_channels}, {"num_outs", c.neck.num_outs},
                {"add_extra_convs", c.neck.add_extra_convs == ExtraConvs::kOff
                                        ? json(false) : json(extra_convs_name(c.neck.add_extra_convs))},
                {"relu_before_extra_convs", c.neck.relu_before_extra_convs}}}};
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) <= 1e-9 * std::max({1.0, std::abs(x), std::abs(y)});
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_value(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

void check_effective(const json& ours, const Dict& eff) {
  for (const auto& [key, v] : ours.items()) {
    const json* e = eff.raw(key);
    if (!e) continue;
    if (v.is_object() && e->is_object()) {
      check_effective(v, eff.required_dict(key));
    } else if (!same_value(v, *e)) {
      eff.fail(ErrorKind::kInvalidInput, key, "is " + e->dump() + " but the model dict gives " + v.dump(),
               v.dump(), "the effective section must restate the config's values");
    }
  }
}

}  // namespace

ModelConfig config_from_json(const nlohmann::json& j, const std::string& where) {
  const std::string expected = "a dict with a 'model' dict (upstream config), or the model dict itself";
  if (!j.is_object()) fail(ErrorKind::kInvalidInput, where, "", "the config is " + describe(j), expected);
  const bool wrapped = j.contains("model");
  if (!wrapped && !j.contains("img_backbone") && !j.contains("pts_bbox_head")) {
    fail(ErrorKind::kInvalidInput, where, "", "has neither 'model' nor 'img_backbone'/'pts_bbox_head'", expected);
  }
  const Dict root(j, "", where);
  const Dict model = wrapped ? root.required_dict("model") : root;
  const std::optional<Dict> top = wrapped ? std::optional<Dict>(root) : std::nullopt;
  const std::optional<Dict> eff = top ? top->dict("effective") : std::nullopt;
  model.check_type({"BEVFormer", "BEVFormer_fp16"}, false);

  Range6 pc_fallback = top ? top->fixed<6>("point_cloud_range") : std::nullopt;
  if (!pc_fallback && eff) pc_fallback = eff->fixed<6>("point_cloud_range");

  ModelConfig cfg;
  cfg.name = where;
  cfg.video_test_mode = model.boolean("video_test_mode", false);
  cfg.backbone = parse_backbone(model.required_dict("img_backbone"));
  cfg.neck = parse_neck(model.required_dict("img_neck"));
  parse_head(model.required_dict("pts_bbox_head"), cfg, pc_fallback);
  parse_image(top, eff, where, cfg);
  cfg.class_names = parse_class_names(top, eff, cfg.head.num_classes);
  if (top && top->has("shift_ref_2d_alias")) {
    cfg.transformer.shift_ref_2d_alias = top->boolean("shift_ref_2d_alias", false);
  } else if (eff) {
    cfg.transformer.shift_ref_2d_alias = eff->boolean("shift_ref_2d_alias", false);
  }
  validate_config(cfg, where, model.path());
  if (eff) check_effective(effective_view(cfg), *eff);
  return cfg;
}

// ---------------------------------------------------------------------------------------------
// Loading

ModelConfig load_config(const std::string& preset_or_json_path) {
  for (const auto& p : config_preset_names()) {
    if (preset_or_json_path == p) return config_preset(p);
  }
  std::string text;
  try {
    // A regular file of bounded size only (a FIFO would block, /dev/zero never end).
    text = read_regular_file(preset_or_json_path, 16u << 20, "config");
  } catch (Error& e) {
    if (e.kind() != ErrorKind::kNotFound) throw;
    throw Error(ErrorKind::kNotFound, "'" + preset_or_json_path + "' is neither a model preset nor a readable file")
        .expected("one of tiny, small, base, or the path of a JSON config");
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("not valid JSON: ") + e.what())
        .where(preset_or_json_path)
        .at_offset(e.byte);
  } catch (const json::exception& e) {  // e.g. a number too large for a double
    throw Error(ErrorKind::kInvalidInput, std::string("JSON cannot be read: ") + e.what()).where(preset_or_json_path);
  }
  ModelConfig cfg = config_from_json(j, preset_or_json_path);
  cfg.name = preset_or_json_path;
  return cfg;
}

}  // namespace bev
