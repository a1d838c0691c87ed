#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <utility>

#include "bevformer/error.h"
#include "model/config_util.h"

namespace bev {

using json = nlohmann::json;

using config_detail::describe;
using config_detail::fail;
using config_detail::join_path;
using config_detail::place;
using config_detail::text;

const char* resnet_style_name(ResNetStyle s) { return s == ResNetStyle::kCaffe ? "caffe" : "pytorch"; }

const char* extra_convs_name(ExtraConvs e) {
  switch (e) {
    case ExtraConvs::kOff: return "off";
    case ExtraConvs::kOnInput: return "on_input";
    case ExtraConvs::kOnLateral: return "on_lateral";
    case ExtraConvs::kOnOutput: return "on_output";
  }
  return "?";
}

const char* layer_op_name(LayerOp op) {
  switch (op) {
    case LayerOp::kSelfAttn: return "self_attn";
    case LayerOp::kCrossAttn: return "cross_attn";
    case LayerOp::kNorm: return "norm";
    case LayerOp::kFfn: return "ffn";
  }
  return "?";
}

std::vector<int> resnet_stage_blocks(const BackboneConfig& b) {
  std::vector<int> all;
  switch (b.depth) {
    case 50: all = {3, 4, 6, 3}; break;
    case 101: all = {3, 4, 23, 3}; break;
    case 152: all = {3, 8, 36, 3}; break;
    default: return {};
  }
  all.resize(static_cast<size_t>(std::clamp(b.num_stages, 0, 4)));  // mmdet: arch[:num_stages]
  return all;
}

int resnet_stage_planes(const BackboneConfig& b, int stage) { return b.base_channels << stage; }
int resnet_stage_out_channels(const BackboneConfig& b, int stage) {
  return resnet_stage_planes(b, stage) * 4;
}
bool resnet_stage_has_dcn(const BackboneConfig& b, int stage) {
  return b.dcn && stage >= 0 && static_cast<size_t>(stage) < b.stage_with_dcn.size() &&
         b.stage_with_dcn[static_cast<size_t>(stage)];
}

int fpn_backbone_end_level(const NeckConfig& n) {
  return n.end_level == -1 ? static_cast<int>(n.in_channels.size()) : n.end_level;
}
int fpn_num_extra_levels(const NeckConfig& n) {
  return n.num_outs - fpn_backbone_end_level(n) + n.start_level;
}

ImageSize image_resized_size(const ImageConfig& img, ImageSize original) {
  // Python's int(x * s): truncation of the double product.
  return {static_cast<int>(original.width * img.resize_scale), static_cast<int>(original.height * img.resize_scale)};
}

ImageSize image_padded_size(const ImageConfig& img, ImageSize original) {
  ImageSize s = image_resized_size(img, original);
  const int d = std::max(img.size_divisor, 1);
  return {(s.width + d - 1) / d * d, (s.height + d - 1) / d * d};
}

ImageSize image_resized_size(const ImageConfig& img) { return image_resized_size(img, {img.width, img.height}); }
ImageSize image_padded_size(const ImageConfig& img) { return image_padded_size(img, {img.width, img.height}); }

std::vector<LayerOp> post_norm_operation_order() {
  return {LayerOp::kSelfAttn, LayerOp::kNorm, LayerOp::kCrossAttn,
          LayerOp::kNorm,     LayerOp::kFfn,  LayerOp::kNorm};
}

const std::vector<std::string>& nuscenes_class_names() {
  static const std::vector<std::string> names = {
      "car", "truck", "construction_vehicle", "bus", "trailer",
      "barrier", "motorcycle", "bicycle", "pedestrian", "traffic_cone"};
  return names;
}

// ---------------------------------------------------------------------------------------------
// Presets (docs/bevformer-spec.md §1)

namespace {

ModelConfig preset_common() {
  ModelConfig c;
  c.backbone.num_stages = 4;
  c.backbone.strides = {1, 2, 2, 2};
  c.backbone.frozen_stages = 1;
  c.neck.out_channels = 256;
  c.neck.add_extra_convs = ExtraConvs::kOnOutput;
  c.neck.relu_before_extra_convs = true;
  c.image.size_divisor = 32;
  c.image.width = 1600;
  c.image.height = 900;
  auto& t = c.transformer;
  t.encoder_operation_order = post_norm_operation_order();
  t.decoder_operation_order = post_norm_operation_order();
  t.encoder_layers = 3;
  t.decoder_layers = 6;
  t.tsa = {8, 1, 4};
  t.sca = {8, 1, 8};
  t.decoder_cross = {8, 1, 4};
  auto& h = c.head;
  h.num_query = 900;
  h.with_box_refine = true;
  h.post_center_range = std::array<double, 6>{-61.2, -61.2, -10.0, 61.2, 61.2, 10.0};
  h.max_num = 300;
  c.class_names = nuscenes_class_names();
  c.video_test_mode = true;
  return c;
}

void set_caffe_r101_dcn(ModelConfig& c) {
  c.backbone.depth = 101;
  c.backbone.style = ResNetStyle::kCaffe;
  c.backbone.dcn = true;
  c.backbone.stage_with_dcn = {false, false, true, true};
  c.image.mean = {103.530, 116.280, 123.675};
  c.image.std = {1.0, 1.0, 1.0};
  c.image.to_rgb = false;
}

void set_bev(ModelConfig& c, int bev) {
  c.head.bev_h = c.head.bev_w = bev;
  c.head.pos_row_num_embed = c.head.pos_col_num_embed = bev;
}

ModelConfig make_preset(std::string_view name) {
  ModelConfig c = preset_common();
  c.name = std::string(name);
  c.image.source = "preset " + c.name;
  if (name == "tiny") {
    c.image.resize_scale = 0.5;
    set_bev(c, 50);
  } else if (name == "small") {
    set_caffe_r101_dcn(c);
    c.image.resize_scale = 0.8;
    set_bev(c, 150);
  } else {  // base
    set_caffe_r101_dcn(c);
    c.backbone.out_indices = {1, 2, 3};
    c.neck.in_channels = {512, 1024, 2048};
    c.neck.num_outs = 4;
    c.transformer.sca.num_levels = 4;
    c.transformer.encoder_layers = 6;
    set_bev(c, 200);
  }
  return c;
}

}  // namespace

std::vector<std::string> config_preset_names() { return {"tiny", "small", "base"}; }

ModelConfig config_preset(std::string_view name) {
  for (const auto& p : config_preset_names()) {
    if (name == p) {
      ModelConfig c = make_preset(name);
      validate_config(c, "preset " + p, "model");
      return c;
    }
  }
  throw Error(ErrorKind::kNotFound, "no model preset named '" + std::string(name) + "'")
      .expected("one of tiny, small, base, or the path of a JSON config");
}

// ---------------------------------------------------------------------------------------------
// Validation

namespace {

class Checker {
 public:
  Checker(std::string where, std::string prefix) : where_(std::move(where)), prefix_(std::move(prefix)) {}

  void require(bool ok, std::string_view key, const std::string& problem,
               const std::string& expected, ErrorKind kind = ErrorKind::kInvalidInput,
               const std::string& hint = {}) const {
    if (!ok) fail(kind, where_, join_path(prefix_, key), problem, expected, hint);
  }
  void positive(int64_t v, std::string_view key) const {
    require(v > 0, key, "is " + std::to_string(v), "a positive integer");
  }
  void range6(const std::array<double, 6>& r, std::string_view key) const {
    require(r[0] < r[3] && r[1] < r[4] && r[2] < r[5], key, "is " + text(r),
            "[x_min, y_min, z_min, x_max, y_max, z_max] with each min < max");
  }
  void heads(const DeformAttnConfig& a, int embed_dims, const std::string& key) const {
    positive(a.num_heads, key + ".num_heads");
    require(embed_dims % a.num_heads == 0, key + ".num_heads",
            "embed_dims " + std::to_string(embed_dims) + " is not divisible by num_heads " +
                std::to_string(a.num_heads),
            "a divisor of embed_dims");
    positive(a.num_levels, key + ".num_levels");
    positive(a.num_points, key + ".num_points");
  }

 private:
  std::string where_;
  std::string prefix_;
};

const std::string kT = "pts_bbox_head.transformer";
const std::string kEnc = kT + ".encoder.transformerlayers";
const std::string kDec = kT + ".decoder.transformerlayers";

void validate_backbone(const Checker& c, const BackboneConfig& b) {
  c.require(b.depth != 18 && b.depth != 34, "img_backbone.depth",
            "ResNet-" + std::to_string(b.depth) + " (BasicBlock) is not supported", "50, 101 or 152",
            ErrorKind::kUnsupported);
  c.require(b.depth == 50 || b.depth == 101 || b.depth == 152, "img_backbone.depth",
            "unknown ResNet depth " + std::to_string(b.depth), "50, 101 or 152");
  c.positive(b.in_channels, "img_backbone.in_channels");
  c.positive(b.stem_channels, "img_backbone.stem_channels");
  c.positive(b.base_channels, "img_backbone.base_channels");
  c.require(b.num_stages >= 1 && b.num_stages <= 4, "img_backbone.num_stages",
            "is " + std::to_string(b.num_stages), "1..4");
  c.require(b.strides.size() == static_cast<size_t>(b.num_stages), "img_backbone.strides",
            "has " + std::to_string(b.strides.size()) + " entries", "one per stage (num_stages)");
  for (int s : b.strides) c.positive(s, "img_backbone.strides");
  c.require(!b.out_indices.empty(), "img_backbone.out_indices", "is empty", "at least one stage");
  for (size_t i = 0; i < b.out_indices.size(); ++i) {
    const int o = b.out_indices[i];
    c.require(o >= 0 && o < b.num_stages, "img_backbone.out_indices",
              "index " + std::to_string(o) + " is out of range",
              "stage indices in [0, " + std::to_string(b.num_stages) + ")");
    c.require(i == 0 || o > b.out_indices[i - 1], "img_backbone.out_indices",
              "is " + text(b.out_indices) + "", "strictly increasing stage indices");
  }
  c.require(b.norm_eps > 0, "img_backbone.norm_cfg.eps", "is " + text(b.norm_eps), "> 0");
  if (!b.dcn) return;
  c.require(b.stage_with_dcn.size() == static_cast<size_t>(b.num_stages),
            "img_backbone.stage_with_dcn", "has " + std::to_string(b.stage_with_dcn.size()) +
            " entries", "one per stage (num_stages)");
  c.positive(b.dcn_deform_groups, "img_backbone.dcn.deform_groups");
  c.require(!b.dcn_fallback_on_stride, "img_backbone.dcn.fallback_on_stride", "is True", "False",
            ErrorKind::kUnsupported);
  for (int s = 0; s < b.num_stages; ++s) {
    c.require(!resnet_stage_has_dcn(b, s) || resnet_stage_planes(b, s) % b.dcn_deform_groups == 0,
              "img_backbone.dcn.deform_groups", "does not divide the planes of stage " +
              std::to_string(s) + " (" + std::to_string(resnet_stage_planes(b, s)) + ")",
              "a divisor of every DCN stage's planes");
  }
}

void validate_neck(const Checker& c, const ModelConfig& cfg) {
  const NeckConfig& n = cfg.neck;
  const BackboneConfig& b = cfg.backbone;
  const int num_ins = static_cast<int>(n.in_channels.size());
  std::vector<int> backbone_out;
  for (int o : b.out_indices) backbone_out.push_back(resnet_stage_out_channels(b, o));
  c.require(n.in_channels == backbone_out, "img_neck.in_channels", "is " + text(n.in_channels),
            text(backbone_out) + ", the channels of backbone stages " + text(b.out_indices));
  c.positive(n.out_channels, "img_neck.out_channels");
  c.require(n.start_level >= 0 && n.start_level < num_ins, "img_neck.start_level",
            "is " + std::to_string(n.start_level), "in [0, len(in_channels))");
  if (n.end_level == -1) {
    c.require(n.num_outs >= num_ins - n.start_level, "img_neck.num_outs",
              "is " + std::to_string(n.num_outs) + ", fewer than the inputs it builds",
              ">= len(in_channels) - start_level = " + std::to_string(num_ins - n.start_level));
  } else {
    c.require(n.end_level > n.start_level && n.end_level <= num_ins, "img_neck.end_level",
              "is " + std::to_string(n.end_level), "-1 or in (start_level, len(in_channels)]");
    c.require(n.num_outs == n.end_level - n.start_level, "img_neck.num_outs",
              "is " + std::to_string(n.num_outs), "end_level - start_level when end_level is set");
  }
  c.require(n.out_channels == cfg.transformer.embed_dims, "img_neck.out_channels",
            "is " + std::to_string(n.out_channels) + " but the transformer works in " +
            std::to_string(cfg.transformer.embed_dims) + " channels",
            "pts_bbox_head.transformer.embed_dims");
}

void validate_transformer(const Checker& c, const ModelConfig& cfg) {
  const TransformerConfig& t = cfg.transformer;
  const int dims = t.embed_dims;
  c.positive(dims, kT + ".embed_dims");
  c.require(dims % 2 == 0, kT + ".embed_dims", "is odd", "an even number (can_bus_mlp uses C/2)");
  c.require(t.num_feature_levels >= cfg.neck.num_outs, kT + ".num_feature_levels",
            "is " + std::to_string(t.num_feature_levels) + " but the FPN gives " +
            std::to_string(cfg.neck.num_outs) + " levels",
            ">= img_neck.num_outs (rows of level_embeds)");
  c.positive(t.num_cams, kT + ".num_cams");
  c.positive(t.encoder_layers, kT + ".encoder.num_layers");
  c.positive(t.decoder_layers, kT + ".decoder.num_layers");
  c.positive(t.num_points_in_pillar, kT + ".encoder.num_points_in_pillar");
  c.range6(t.pc_range, kT + ".encoder.pc_range");
  c.heads(t.tsa, dims, kEnc + ".attn_cfgs[0]");
  c.require(t.tsa.num_levels == 1, kEnc + ".attn_cfgs[0].num_levels",
            "is " + std::to_string(t.tsa.num_levels) + "; TSA attends the single BEV level", "1",
            ErrorKind::kInvalidInput, "TemporalSelfAttention defaults to 4: set num_levels=1");
  c.require(t.tsa_num_bev_queue == 2, kEnc + ".attn_cfgs[0].num_bev_queue",
            "is " + std::to_string(t.tsa_num_bev_queue), "2 (upstream asserts it)");
  c.heads(t.sca, dims, kEnc + ".attn_cfgs[1].deformable_attention");
  c.require(t.sca.num_levels == cfg.neck.num_outs, kEnc + ".attn_cfgs[1].deformable_attention.num_levels",
            "is " + std::to_string(t.sca.num_levels) + " but the FPN gives " +
            std::to_string(cfg.neck.num_outs) + " levels", "img_neck.num_outs");
  c.require(t.sca.num_points % t.num_points_in_pillar == 0,
            kEnc + ".attn_cfgs[1].deformable_attention.num_points",
            "is " + std::to_string(t.sca.num_points), "a multiple of encoder.num_points_in_pillar (" +
            std::to_string(t.num_points_in_pillar) + ")");
  c.positive(t.encoder_ffn_dims, kEnc + ".feedforward_channels");
  c.heads(DeformAttnConfig{t.decoder_self_attn_heads, 1, 1}, dims, kDec + ".attn_cfgs[0]");
  c.heads(t.decoder_cross, dims, kDec + ".attn_cfgs[1]");
  c.require(t.decoder_cross.num_levels == 1, kDec + ".attn_cfgs[1].num_levels",
            "is " + std::to_string(t.decoder_cross.num_levels) +
            "; the decoder attends the single BEV level", "1", ErrorKind::kInvalidInput,
            "CustomMSDeformableAttention defaults to 4: set num_levels=1");
  c.positive(t.decoder_ffn_dims, kDec + ".feedforward_channels");
  const std::string order = "['self_attn', 'norm', 'cross_attn', 'norm', 'ffn', 'norm'] (post-norm)";
  c.require(t.encoder_operation_order == post_norm_operation_order(), kEnc + ".operation_order",
            "is not the post-norm order", order, ErrorKind::kUnsupported);
  c.require(t.decoder_operation_order == post_norm_operation_order(), kDec + ".operation_order",
            "is not the post-norm order", order, ErrorKind::kUnsupported);
}

void validate_head(const Checker& c, const ModelConfig& cfg) {
  const HeadConfig& h = cfg.head;
  c.positive(h.bev_h, "pts_bbox_head.bev_h");
  c.positive(h.bev_w, "pts_bbox_head.bev_w");
  c.positive(h.num_query, "pts_bbox_head.num_query");
  c.positive(h.num_classes, "pts_bbox_head.num_classes");
  c.require(h.code_size == 10, "pts_bbox_head.code_size", "is " + std::to_string(h.code_size),
            "10 (cx, cy, w, l, cz, h, sin, cos, vx, vy)", ErrorKind::kUnsupported);
  c.require(h.num_reg_fcs == 2, "pts_bbox_head.num_reg_fcs", "is " + std::to_string(h.num_reg_fcs),
            "2", ErrorKind::kUnsupported);
  c.require(!h.as_two_stage, "pts_bbox_head.as_two_stage", "is True", "False",
            ErrorKind::kUnsupported, "BEVFormer's released models are single-stage");
  c.require(!h.code_weights.empty(), "pts_bbox_head.code_weights", "is empty", "a list of numbers");
  c.require(h.pos_num_feats * 2 == cfg.transformer.embed_dims,
            "pts_bbox_head.positional_encoding.num_feats", "is " + std::to_string(h.pos_num_feats),
            "embed_dims / 2 = " + std::to_string(cfg.transformer.embed_dims / 2));
  c.require(h.pos_row_num_embed >= h.bev_h, "pts_bbox_head.positional_encoding.row_num_embed",
            "is " + std::to_string(h.pos_row_num_embed) + ", fewer than bev_h", ">= bev_h");
  c.require(h.pos_col_num_embed >= h.bev_w, "pts_bbox_head.positional_encoding.col_num_embed",
            "is " + std::to_string(h.pos_col_num_embed) + ", fewer than bev_w", ">= bev_w");
  c.range6(h.pc_range, "pts_bbox_head.bbox_coder.pc_range");
  if (h.post_center_range) {
    const auto& r = *h.post_center_range;
    c.require(r[0] <= r[3] && r[1] <= r[4] && r[2] <= r[5], "pts_bbox_head.bbox_coder.post_center_range",
              "is " + text(r), "[x_min, y_min, z_min, x_max, y_max, z_max] with min <= max");
  }
  c.positive(h.max_num, "pts_bbox_head.bbox_coder.max_num");
  c.require(static_cast<int64_t>(h.max_num) <= static_cast<int64_t>(h.num_query) * h.num_classes,
            "pts_bbox_head.bbox_coder.max_num", "is " + std::to_string(h.max_num) +
            ", more than num_query * num_classes scores", "<= num_query * num_classes");
}

void validate_image(const Checker& c, const ImageConfig& img) {
  for (double s : img.std) {
    c.require(s != 0 && std::isfinite(s), "img_norm_cfg.std", "is " + text(img.std), "non-zero numbers");
  }
  c.require(img.resize_scale > 0 && std::isfinite(img.resize_scale), "resize_scale",
            "is " + text(img.resize_scale), "a positive scale");
  c.positive(img.size_divisor, "size_divisor");
  c.positive(img.width, "image_size_raw_wh[0]");
  c.positive(img.height, "image_size_raw_wh[1]");
  const ImageSize r = image_resized_size(img);
  c.require(r.width > 0 && r.height > 0, "resize_scale", "shrinks the image to nothing", "a larger scale");
}

}  // namespace

void validate_config(const ModelConfig& cfg, const std::string& where, const std::string& key_prefix) {
  const Checker c(where, key_prefix);
  validate_backbone(c, cfg.backbone);
  validate_neck(c, cfg);
  validate_transformer(c, cfg);
  validate_head(c, cfg);
  // Class names and image settings live outside `model` upstream.
  const Checker top(where, "");
  top.require(cfg.class_names.size() == static_cast<size_t>(cfg.head.num_classes), "class_names",
              "has " + std::to_string(cfg.class_names.size()) + " names",
              "one per class (pts_bbox_head.num_classes = " + std::to_string(cfg.head.num_classes) + ")");
  validate_image(top, cfg.image);
}

// ---------------------------------------------------------------------------------------------
// Summaries

nlohmann::json to_json(const ModelConfig& cfg) {
  const auto& b = cfg.backbone;
  const auto& n = cfg.neck;
  const auto& img = cfg.image;
  const auto& t = cfg.transformer;
  const auto& h = cfg.head;
  auto attn = [](const DeformAttnConfig& a) {
    return json{{"num_heads", a.num_heads}, {"num_levels", a.num_levels}, {"num_points", a.num_points}};
  };
  auto order = [](const std::vector<LayerOp>& ops) {
    json a = json::array();
    for (LayerOp op : ops) a.push_back(layer_op_name(op));
    return a;
  };
  std::vector<int> out_channels;
  for (int o : b.out_indices) out_channels.push_back(resnet_stage_out_channels(b, o));
  const ImageSize resized = image_resized_size(img);
  const ImageSize padded = image_padded_size(img);
  json j;
  j["name"] = cfg.name;
  j["backbone"] = {{"type", "ResNet"}, {"depth", b.depth}, {"in_channels", b.in_channels},
                   {"stem_channels", b.stem_channels}, {"base_channels", b.base_channels},
                   {"num_stages", b.num_stages}, {"stage_blocks", resnet_stage_blocks(b)},
                   {"strides", b.strides}, {"out_indices", b.out_indices},
                   {"out_channels", out_channels}, {"style", resnet_style_name(b.style)},
                   {"frozen_stages", b.frozen_stages}, {"norm_eps", b.norm_eps},
                   {"dcn", b.dcn ? json{{"type", "DCNv2"}, {"deform_groups", b.dcn_deform_groups},
                                        {"fallback_on_stride", b.dcn_fallback_on_stride}}
                                 : json(nullptr)},
                   {"stage_with_dcn", b.stage_with_dcn}};
  j["neck"] = {{"type", "FPN"}, {"in_channels", n.in_channels}, {"out_channels", n.out_channels},
               {"start_level", n.start_level}, {"end_level", n.end_level}, {"num_outs", n.num_outs},
               {"add_extra_convs", extra_convs_name(n.add_extra_convs)},
               {"relu_before_extra_convs", n.relu_before_extra_convs}};
  j["image"] = {{"img_norm_cfg", {{"mean", img.mean}, {"std", img.std}, {"to_rgb", img.to_rgb}}},
                {"input_wh", {img.width, img.height}}, {"resize_scale", img.resize_scale},
                {"resized_wh", {resized.width, resized.height}}, {"size_divisor", img.size_divisor},
                {"padded_wh", {padded.width, padded.height}}, {"source", img.source}};
  j["transformer"] = {
      {"embed_dims", t.embed_dims}, {"num_feature_levels", t.num_feature_levels},
      {"num_cams", t.num_cams}, {"rotate_prev_bev", t.rotate_prev_bev}, {"use_shift", t.use_shift},
      {"use_can_bus", t.use_can_bus}, {"can_bus_norm", t.can_bus_norm},
      {"use_cams_embeds", t.use_cams_embeds}, {"rotate_center", t.rotate_center},
      {"shift_ref_2d_alias", t.shift_ref_2d_alias},
      {"encoder", {{"num_layers", t.encoder_layers}, {"num_points_in_pillar", t.num_points_in_pillar},
                   {"pc_range", t.pc_range}, {"tsa", attn(t.tsa)},
                   {"tsa_num_bev_queue", t.tsa_num_bev_queue}, {"sca", attn(t.sca)},
                   {"ffn_dims", t.encoder_ffn_dims}, {"operation_order", order(t.encoder_operation_order)}}},
      {"decoder", {{"num_layers", t.decoder_layers}, {"self_attn_heads", t.decoder_self_attn_heads},
                   {"cross_attn", attn(t.decoder_cross)}, {"ffn_dims", t.decoder_ffn_dims},
                   {"operation_order", order(t.decoder_operation_order)}}}};
  j["head"] = {{"bev_h", h.bev_h}, {"bev_w", h.bev_w}, {"num_query", h.num_query},
               {"num_classes", h.num_classes}, {"code_size", h.code_size},
               {"num_reg_fcs", h.num_reg_fcs}, {"with_box_refine", h.with_box_refine},
               {"as_two_stage", h.as_two_stage}, {"code_weights", h.code_weights},
               {"positional_encoding", {{"num_feats", h.pos_num_feats},
                                        {"row_num_embed", h.pos_row_num_embed},
                                        {"col_num_embed", h.pos_col_num_embed}}},
               {"bbox_coder", {{"pc_range", h.pc_range},
                               {"post_center_range", h.post_center_range ? json(*h.post_center_range) : json(nullptr)},
                               {"max_num", h.max_num},
                               {"score_threshold", h.score_threshold ? json(*h.score_threshold) : json(nullptr)}}}};
  j["class_names"] = cfg.class_names;
  j["video_test_mode"] = cfg.video_test_mode;
  return j;
}

std::string config_summary(const ModelConfig& cfg) {
  const auto& b = cfg.backbone;
  const auto& t = cfg.transformer;
  const auto& h = cfg.head;
  const ImageSize r = image_resized_size(cfg.image);
  const ImageSize p = image_padded_size(cfg.image);
  auto wh = [](int w, int hh) { return std::to_string(w) + "x" + std::to_string(hh); };
  std::string dcn = "no DCN";
  if (b.dcn) {
    dcn = "DCNv2 in stages";
    for (int s = 0; s < b.num_stages; ++s) {
      if (resnet_stage_has_dcn(b, s)) dcn += " " + std::to_string(s + 1);
    }
  }
  const double cell_y = (t.pc_range[4] - t.pc_range[1]) / h.bev_h;
  const double cell_x = (t.pc_range[3] - t.pc_range[0]) / h.bev_w;
  std::string s;
  s += "model " + cfg.name + ": ResNet-" + std::to_string(b.depth) + " (" + resnet_style_name(b.style) +
       ", " + dcn + ", out_indices " + text(b.out_indices) + ") -> FPN " +
       std::to_string(cfg.neck.num_outs) + " level(s) x " + std::to_string(cfg.neck.out_channels) + " ch\n";
  s += "image: " + wh(cfg.image.width, cfg.image.height) + " x" + text(cfg.image.resize_scale) + " -> " +
       wh(r.width, r.height) + ", padded to " + wh(p.width, p.height) + "; " +
       (cfg.image.to_rgb ? "RGB" : "BGR") + " mean " + text(cfg.image.mean) + " std " +
       text(cfg.image.std) + "\n";
  auto metres = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return std::string(buf);
  };
  s += "BEV " + wh(h.bev_h, h.bev_w) + " (rows x cols, " + metres(cell_y) + " x " + metres(cell_x) +
       " m cells), C=" + std::to_string(t.embed_dims) + "; encoder " + std::to_string(t.encoder_layers) +
       " layers (TSA " + std::to_string(t.tsa.num_points) + " pts, SCA " + std::to_string(t.sca.num_levels) +
       " lvl x " + std::to_string(t.sca.num_points) + " pts), decoder " + std::to_string(t.decoder_layers) +
       " layers, " + std::to_string(t.tsa.num_heads) + " heads, FFN " + std::to_string(t.encoder_ffn_dims) + "\n";
  s += "head: " + std::to_string(h.num_query) + " queries, " + std::to_string(h.num_classes) +
       " classes, " + (h.with_box_refine ? "box refine" : "shared branches") + ", top " +
       std::to_string(h.max_num) + "; temporal: rotate " + (t.rotate_prev_bev ? "on" : "off") +
       " (centre " + text(t.rotate_center) + "), shift " + (t.use_shift ? "on" : "off") +
       (t.shift_ref_2d_alias ? " (alias, original release)" : "") + ", can_bus " +
       (t.use_can_bus ? "on" : "off") + ", video_test_mode " + (cfg.video_test_mode ? "on" : "off") + "\n";
  return s;
}

}  // namespace bev
