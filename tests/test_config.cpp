// Model config (presets, upstream-key JSON, validation) and the expected state_dict of a config,
// checked against the spec's parameter counts and the golden micro checkpoint's tensors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "core/dtype.h"
#include "micro_frames.h"
#include "model/config.h"
#include "model/param_spec.h"

namespace bev {
namespace {

using json = nlohmann::json;

const std::string& kMicro = testing::kMicroDir;
json read_json(const std::string& path) { return testing::read_json_file(path); }

json micro_json() { return read_json(kMicro + "/config.json"); }

// The safetensors header: 8-byte little-endian length, then {name: {dtype, shape, data_offsets}}.
std::vector<std::pair<std::string, TensorMeta>> safetensors_metas(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  unsigned char len_bytes[8] = {};
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  std::string header(len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(len));
  const json h = json::parse(header);
  std::vector<std::pair<std::string, TensorMeta>> out;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    TensorMeta m{};
    EXPECT_TRUE(dtype_from_safetensors_name(v.at("dtype").get<std::string>(), &m.dtype)) << name;
    m.shape = v.at("shape").get<Shape>();
    out.emplace_back(name, m);
  }
  return out;
}

// Runs `f`, which must throw bev::Error of `kind` whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, ErrorKind kind, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << parts.at(0);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

void expect_json_error(const json& j, ErrorKind kind, std::vector<std::string> parts) {
  expect_error([&] { config_from_json(j, "config.json"); }, kind, std::move(parts));
}

int64_t count_with_prefix(const std::vector<ParamSpec>& specs, const std::string& prefix) {
  std::vector<ParamSpec> subset;
  for (const auto& s : specs) {
    if (s.name.rfind(prefix, 0) == 0) subset.push_back(s);
  }
  return count_parameters(subset);
}

// ---- presets -------------------------------------------------------------------------------

TEST(ConfigPreset, ParameterCountsMatchSpec) {
  EXPECT_EQ(count_parameters(expected_params(config_preset("tiny"))), 33'521'157);
  EXPECT_EQ(count_parameters(expected_params(config_preset("small"))), 59'463'619);
  EXPECT_EQ(count_parameters(expected_params(config_preset("base"))), 69'034'947);
}

TEST(ConfigPreset, BaseBreakdownMatchesSpec) {
  const auto specs = expected_params(config_preset("base"));
  EXPECT_EQ(count_with_prefix(specs, "img_backbone."), 44'304'894);
  int64_t offsets = 0;
  for (const auto& s : specs) {
    if (s.name.find("conv_offset") != std::string::npos) offsets += shape_numel(s.shape);
  }
  EXPECT_EQ(offsets, 1'804'734);
  EXPECT_EQ(count_with_prefix(specs, "img_neck."), 3'278'592);
  EXPECT_EQ(count_with_prefix(specs, "pts_bbox_head.transformer.encoder."), 4'940'928);
  EXPECT_EQ(count_with_prefix(specs, "pts_bbox_head.transformer.decoder."), 4'103'232);
  const int64_t transformer = count_with_prefix(specs, "pts_bbox_head.transformer.");
  EXPECT_EQ(transformer - 4'940'928 - 4'103'232, 39'299);
  EXPECT_EQ(count_with_prefix(specs, "pts_bbox_head.") - transformer, 12'368'002);
}

TEST(ConfigPreset, ValuesFromSpecTable) {
  const ModelConfig tiny = config_preset("tiny");
  EXPECT_EQ(tiny.backbone.depth, 50);
  EXPECT_EQ(tiny.backbone.style, ResNetStyle::kPytorch);
  EXPECT_FALSE(tiny.backbone.dcn);
  EXPECT_TRUE(tiny.image.to_rgb);
  EXPECT_EQ(image_resized_size(tiny.image), (ImageSize{800, 450}));
  EXPECT_EQ(image_padded_size(tiny.image), (ImageSize{800, 480}));
  EXPECT_EQ(tiny.transformer.encoder_layers, 3);
  EXPECT_EQ(tiny.head.bev_h, 50);
  EXPECT_EQ(tiny.transformer.rotate_center, (std::array<double, 2>{100, 100}));
  EXPECT_FALSE(tiny.transformer.shift_ref_2d_alias);

  const ModelConfig small = config_preset("small");
  EXPECT_EQ(small.backbone.depth, 101);
  EXPECT_EQ(small.backbone.style, ResNetStyle::kCaffe);
  EXPECT_TRUE(resnet_stage_has_dcn(small.backbone, 2));
  EXPECT_FALSE(resnet_stage_has_dcn(small.backbone, 1));
  EXPECT_FALSE(small.image.to_rgb);
  EXPECT_EQ(image_padded_size(small.image), (ImageSize{1280, 736}));
  EXPECT_EQ(small.head.bev_w, 150);

  const ModelConfig base = config_preset("base");
  EXPECT_EQ(image_padded_size(base.image), (ImageSize{1600, 928}));
  EXPECT_EQ(base.neck.num_outs, 4);
  EXPECT_EQ(fpn_num_extra_levels(base.neck), 1);
  EXPECT_EQ(base.transformer.sca.num_levels, 4);
  EXPECT_EQ(base.transformer.encoder_layers, 6);
  EXPECT_EQ(base.head.max_num, 300);
  EXPECT_EQ(base.class_names.size(), 10u);
  EXPECT_TRUE(base.video_test_mode);
  const auto specs = expected_params(base);
  auto find = [&](const std::string& n) {
    for (const auto& s : specs) if (s.name == n) return s.shape;
    return Shape{-1};
  };
  EXPECT_EQ(find("pts_bbox_head.transformer.level_embeds"), (Shape{4, 256}));
  EXPECT_EQ(find("img_neck.fpn_convs.3.conv.weight"), (Shape{256, 256, 3, 3}));
  EXPECT_EQ(find("pts_bbox_head.transformer.encoder.layers.5.attentions.1.deformable_attention.sampling_offsets.weight"),
            (Shape{512, 256}));
  EXPECT_EQ(find("img_backbone.layer3.22.conv2.conv_offset.weight"), (Shape{27, 256, 3, 3}));
  EXPECT_EQ(find("pts_bbox_head.bev_embedding.weight"), (Shape{40000, 256}));
  // tiny and small: one FPN level, no extra conv.
  for (const auto& s : expected_params(tiny)) EXPECT_EQ(s.name.find("fpn_convs.1"), std::string::npos) << s.name;
}

TEST(ConfigPreset, UnknownNameListsPresets) {
  expect_error([] { config_preset("huge"); }, ErrorKind::kNotFound, {"huge", "tiny", "small", "base"});
  expect_error([] { load_config("huge"); }, ErrorKind::kNotFound, {"huge", "tiny, small, base"});
  EXPECT_EQ(load_config("small").head.bev_h, 150);
}

TEST(ConfigPreset, SummaryAndJson) {
  const ModelConfig c = config_preset("tiny");
  const std::string s = config_summary(c);
  EXPECT_NE(s.find("ResNet-50"), std::string::npos) << s;
  EXPECT_NE(s.find("800x480"), std::string::npos) << s;
  const json j = to_json(c);
  EXPECT_EQ(j["image"]["padded_wh"], json({800, 480}));
  EXPECT_EQ(j["transformer"]["encoder"]["operation_order"][2], "cross_attn");
  EXPECT_EQ(j["head"]["bbox_coder"]["score_threshold"], nullptr);
}

// ---- the golden micro config ----------------------------------------------------------------

TEST(ConfigJson, MicroLoads) {
  const ModelConfig c = load_config(kMicro + "/config.json");
  EXPECT_EQ(c.backbone.base_channels, 2);
  EXPECT_EQ(c.backbone.stem_channels, 2);
  EXPECT_EQ(c.backbone.style, ResNetStyle::kCaffe);
  EXPECT_EQ(c.neck.in_channels, (std::vector<int>{16, 32, 64}));
  EXPECT_EQ(c.neck.add_extra_convs, ExtraConvs::kOnOutput);
  EXPECT_EQ(c.transformer.embed_dims, 32);
  EXPECT_EQ(c.transformer.num_feature_levels, 4);  // upstream default
  EXPECT_EQ(c.transformer.tsa.num_points, 4);      // upstream default
  EXPECT_EQ(c.transformer.tsa_num_bev_queue, 2);
  EXPECT_EQ(c.transformer.sca.num_levels, 4);
  EXPECT_EQ(c.transformer.encoder_ffn_dims, 64);
  EXPECT_EQ(c.transformer.rotate_center, (std::array<double, 2>{10, 10}));
  EXPECT_EQ(c.head.bev_h, 20);
  EXPECT_EQ(c.head.num_query, 50);
  EXPECT_EQ(c.head.max_num, 300);
  EXPECT_FALSE(c.head.score_threshold.has_value());
  EXPECT_FALSE(c.image.to_rgb);
  EXPECT_EQ(c.image.mean, (std::array<double, 3>{103.53, 116.28, 123.675}));
  EXPECT_EQ(image_padded_size(c.image), (ImageSize{128, 64}));
  EXPECT_EQ(c.class_names.front(), "car");
  EXPECT_TRUE(c.video_test_mode);
}

TEST(ConfigJson, MicroParamsEqualGoldenWeights) {
  const auto specs = expected_params(load_config(kMicro + "/config.json"));
  const auto tensors = safetensors_metas(kMicro + "/weights.safetensors");
  ASSERT_EQ(tensors.size(), 493u);
  std::map<std::string, TensorMeta> golden(tensors.begin(), tensors.end());
  std::map<std::string, const ParamSpec*> ours;
  for (const auto& s : specs) ours[s.name] = &s;
  ASSERT_EQ(ours.size(), specs.size()) << "duplicate spec names";
  for (const auto& [name, meta] : golden) {
    auto it = ours.find(name);
    if (it == ours.end()) {
      ADD_FAILURE() << "golden tensor not expected: " << name;
      continue;
    }
    EXPECT_EQ(it->second->shape, meta.shape) << name;
    EXPECT_EQ(it->second->dtype, meta.dtype) << name;
  }
  for (const auto& s : specs) EXPECT_TRUE(golden.contains(s.name)) << "expected but not in golden: " << s.name;

  // state_dict order (checked against checkpoint.pth's key order when this was written).
  EXPECT_EQ(specs.front().name, "pts_bbox_head.code_weights");
  EXPECT_EQ(specs[142].name, "pts_bbox_head.query_embedding.weight");
  EXPECT_EQ(specs[143].name, "img_backbone.conv1.weight");
  EXPECT_EQ(specs[484].name, "img_neck.lateral_convs.2.conv.bias");
  EXPECT_EQ(specs.back().name, "img_neck.fpn_convs.3.conv.bias");

  const ValidationReport r = validate_state_dict(specs, tensors);
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_EQ(r.matched, 493u);
  int64_t values = 0;
  for (const auto& [n, m] : tensors) values += shape_numel(m.shape);
  EXPECT_EQ(values, 239'451);  // README: 239,451 values
  EXPECT_NE(format_report(r).find("493 tensors match"), std::string::npos);
}

TEST(ConfigJson, ValidationReportsEverythingAtOnce) {
  const auto specs = expected_params(load_config(kMicro + "/config.json"));
  auto tensors = safetensors_metas(kMicro + "/weights.safetensors");
  const std::string removed = "pts_bbox_head.transformer.encoder.layers.1.norms.2.bias";
  const std::string changed = "img_backbone.layer3.0.conv2.conv_offset.weight";
  std::erase_if(tensors, [&](const auto& t) { return t.first == removed; });
  tensors.push_back({"pts_bbox_head.transformer.extra.weight", {DType::kF32, {4}}});
  for (auto& [n, m] : tensors) {
    if (n == changed) m.shape = {18, 8, 3, 3};
  }
  const ValidationReport r = validate_state_dict(specs, tensors);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.missing, std::vector<std::string>{removed});
  EXPECT_EQ(r.unexpected, std::vector<std::string>{"pts_bbox_head.transformer.extra.weight"});
  ASSERT_EQ(r.mismatched.size(), 1u);
  EXPECT_EQ(r.mismatched[0].name, changed);
  EXPECT_EQ(r.mismatched[0].expected, "float [27, 8, 3, 3]");
  EXPECT_EQ(r.mismatched[0].got, "f32 [18, 8, 3, 3]");
  EXPECT_EQ(r.matched, 491u);
  const std::string text = format_report(r);
  for (const auto& s : {removed, changed, std::string("extra.weight"), std::string("1 missing")}) {
    EXPECT_NE(text.find(s), std::string::npos) << text;
  }
}

TEST(ConfigJson, ValidationDtypes) {
  const std::vector<ParamSpec> specs = {
      {"w", {2, 3}, DType::kF32, false, true},
      {"bn.num_batches_tracked", {}, DType::kI64, true, false},
      {"code_weights", {10}, DType::kF32, true, false}};
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    EXPECT_TRUE(validate_state_dict(specs, {{"w", {d, {2, 3}}}}).ok()) << dtype_name(d);
  }
  EXPECT_TRUE(validate_state_dict(specs, {{"w", {DType::kF32, {2, 3}}}, {"bn.num_batches_tracked", {DType::kI32, {}}}}).ok());
  auto r = validate_state_dict(specs, {{"w", {DType::kI64, {2, 3}}}, {"bn.num_batches_tracked", {DType::kF32, {}}}});
  EXPECT_EQ(r.mismatched.size(), 2u);
  r = validate_state_dict(specs, {{"w", {DType::kF32, {2, 3}}}, {"w", {DType::kF32, {2, 3}}}});
  ASSERT_EQ(r.mismatched.size(), 1u);  // a name given twice
  EXPECT_EQ(r.expected_params, 6);
  // Long sections are cut.
  ValidationReport many;
  for (int i = 0; i < 10; ++i) many.missing.push_back("k" + std::to_string(i));
  EXPECT_NE(format_report(many, 3).find("... and 7 more"), std::string::npos);
}

TEST(ConfigJson, WithoutBoxRefineListsRepeatedBranches) {
  json j = micro_json();
  j["model"]["pts_bbox_head"]["with_box_refine"] = false;
  j["effective"]["with_box_refine"] = false;
  const auto specs = expected_params(config_from_json(j, "config.json"));
  const auto refined = expected_params(load_config(kMicro + "/config.json"));
  ASSERT_EQ(specs.size(), refined.size());  // same keys: state_dict lists every index
  int aliases = 0;
  for (const auto& s : specs) {
    if (s.name.rfind("pts_bbox_head.cls_branches.1.", 0) == 0) {
      EXPECT_EQ(s.alias_of, "pts_bbox_head.cls_branches.0." + s.name.substr(29)) << s.name;
      ++aliases;
    }
  }
  EXPECT_EQ(aliases, 10);
  const int64_t branch_params = count_with_prefix(refined, "pts_bbox_head.cls_branches.1.") +
                                count_with_prefix(refined, "pts_bbox_head.reg_branches.1.");
  EXPECT_EQ(count_parameters(specs), count_parameters(refined) - branch_params);
}

// ---- JSON forms and defaults ----------------------------------------------------------------

TEST(ConfigJson, ModelDictAlone) {
  const json j = micro_json()["model"];
  const ModelConfig c = config_from_json(j, "model.json");
  EXPECT_EQ(c.transformer.embed_dims, 32);
  // No img_norm_cfg: the caffe-style values, and the summary says so.
  EXPECT_EQ(c.image.mean, (std::array<double, 3>{103.53, 116.28, 123.675}));
  EXPECT_NE(c.image.source.find("not given"), std::string::npos) << c.image.source;
  // Paths have no "model." prefix when the dict is the whole file.
  json bad = j;
  bad["img_neck"]["num_outs"] = 2;
  expect_error([&] { config_from_json(bad, "model.json"); }, ErrorKind::kInvalidInput,
               {"model.json: img_neck.num_outs", ">= len(in_channels)"});
}

TEST(ConfigJson, UpstreamDefaultsFillAbsentKeys) {
  json j = micro_json();
  j.erase("effective");
  auto& t = j["model"]["pts_bbox_head"]["transformer"];
  t.erase("rotate_center");
  t["encoder"]["transformerlayers"]["attn_cfgs"][0].erase("num_levels");
  t["encoder"]["transformerlayers"]["attn_cfgs"][0]["num_levels"] = 1;  // TSA default is 4
  j["model"]["pts_bbox_head"]["bbox_coder"].erase("max_num");
  j["model"].erase("video_test_mode");
  j["point_cloud_range"] = {-51.2, -51.2, -5.0, 51.2, 51.2, 3.0};
  j["model"]["pts_bbox_head"]["bbox_coder"].erase("pc_range");
  const ModelConfig c = config_from_json(j, "config.json");
  EXPECT_EQ(c.transformer.rotate_center, (std::array<double, 2>{100, 100}));
  EXPECT_EQ(c.head.max_num, 100);
  EXPECT_FALSE(c.video_test_mode);
  EXPECT_EQ(c.head.pc_range[3], 51.2);
  EXPECT_EQ(c.image.width, 1600);  // no effective section: nuScenes size
  // The effective section must agree with the model dict.
  json e = micro_json();
  e["effective"]["rotate_center"] = {100, 100};
  expect_json_error(e, ErrorKind::kInvalidInput, {"config.json: effective.rotate_center", "[10.0,10.0]"});
}

TEST(ConfigJson, TestPipelineGivesScaleAndPadding) {
  json j = micro_json();
  j.erase("effective");
  j["img_norm_cfg"] = {{"mean", {1, 2, 3}}, {"std", {4, 5, 6}}, {"to_rgb", true}};
  j["test_pipeline"] = json::parse(R"([
    {"type": "LoadMultiViewImageFromFiles", "to_float32": true},
    {"type": "RandomScaleImageMultiViewImage", "scales": [0.5]},
    {"type": "MultiScaleFlipAug3D", "img_scale": [1600, 900], "transforms": [
      {"type": "PadMultiViewImage", "size_divisor": 64}]}])");
  const ModelConfig c = config_from_json(j, "config.json");
  EXPECT_EQ(c.image.mean, (std::array<double, 3>{1, 2, 3}));
  EXPECT_TRUE(c.image.to_rgb);
  EXPECT_EQ(image_padded_size(c.image), (ImageSize{832, 512}));
}

TEST(ConfigJson, LoadErrors) {
  expect_error([] { load_config("/nonexistent/config.json"); }, ErrorKind::kNotFound, {"/nonexistent/config.json"});
  const std::string path = ::testing::TempDir() + "/bad_config.json";
  std::ofstream(path) << "{\"model\": {\"img_backbone\": [1, 2,}";
  try {
    load_config(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(e.offset().has_value());
    EXPECT_EQ(e.place(), path);
  }
  expect_error([] { config_from_json(json::array(), "x.json"); }, ErrorKind::kInvalidInput, {"x.json", "a dict"});
  expect_error([] { config_from_json(json{{"foo", 1}}, "x.json"); }, ErrorKind::kInvalidInput, {"x.json", "'model'"});
}

// bevformer_tiny.py's model dict and test pipeline as JSON: like the upstream file it leaves
// rotate_center, num_feature_levels, TSA num_points, ffn_cfgs etc. to the class defaults.
json upstream_tiny_json() {
  return json::parse(R"({
  "point_cloud_range": [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0],
  "img_norm_cfg": {"mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375], "to_rgb": true},
  "class_names": ["car", "truck", "construction_vehicle", "bus", "trailer", "barrier",
                  "motorcycle", "bicycle", "pedestrian", "traffic_cone"],
  "test_pipeline": [
    {"type": "LoadMultiViewImageFromFiles", "to_float32": true},
    {"type": "NormalizeMultiviewImage", "mean": [123.675, 116.28, 103.53], "std": [58.395, 57.12, 57.375], "to_rgb": true},
    {"type": "MultiScaleFlipAug3D", "img_scale": [1600, 900], "pts_scale_ratio": 1, "flip": false, "transforms": [
      {"type": "RandomScaleImageMultiViewImage", "scales": [0.5]},
      {"type": "PadMultiViewImage", "size_divisor": 32},
      {"type": "DefaultFormatBundle3D", "with_label": false},
      {"type": "CustomCollect3D", "keys": ["img"]}]}],
  "model": {
    "type": "BEVFormer", "use_grid_mask": true, "video_test_mode": true,
    "pretrained": {"img": "torchvision://resnet50"},
    "img_backbone": {"type": "ResNet", "depth": 50, "num_stages": 4, "out_indices": [3], "frozen_stages": 1,
                     "norm_cfg": {"type": "BN", "requires_grad": false}, "norm_eval": true, "style": "pytorch"},
    "img_neck": {"type": "FPN", "in_channels": [2048], "out_channels": 256, "start_level": 0,
                 "add_extra_convs": "on_output", "num_outs": 1, "relu_before_extra_convs": true},
    "pts_bbox_head": {
      "type": "BEVFormerHead", "bev_h": 50, "bev_w": 50, "num_query": 900, "num_classes": 10,
      "in_channels": 256, "sync_cls_avg_factor": true, "with_box_refine": true, "as_two_stage": false,
      "transformer": {
        "type": "PerceptionTransformer", "rotate_prev_bev": true, "use_shift": true, "use_can_bus": true,
        "embed_dims": 256,
        "encoder": {
          "type": "BEVFormerEncoder", "num_layers": 3, "pc_range": [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0],
          "num_points_in_pillar": 4, "return_intermediate": false,
          "transformerlayers": {
            "type": "BEVFormerLayer",
            "attn_cfgs": [
              {"type": "TemporalSelfAttention", "embed_dims": 256, "num_levels": 1},
              {"type": "SpatialCrossAttention", "pc_range": [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0],
               "deformable_attention": {"type": "MSDeformableAttention3D", "embed_dims": 256, "num_points": 8,
                                        "num_levels": 1},
               "embed_dims": 256}],
            "feedforward_channels": 512, "ffn_dropout": 0.1,
            "operation_order": ["self_attn", "norm", "cross_attn", "norm", "ffn", "norm"]}},
        "decoder": {
          "type": "DetectionTransformerDecoder", "num_layers": 6, "return_intermediate": true,
          "transformerlayers": {
            "type": "DetrTransformerDecoderLayer",
            "attn_cfgs": [
              {"type": "MultiheadAttention", "embed_dims": 256, "num_heads": 8, "dropout": 0.1},
              {"type": "CustomMSDeformableAttention", "embed_dims": 256, "num_levels": 1}],
            "feedforward_channels": 512, "ffn_dropout": 0.1,
            "operation_order": ["self_attn", "norm", "cross_attn", "norm", "ffn", "norm"]}}},
      "bbox_coder": {"type": "NMSFreeCoder", "post_center_range": [-61.2, -61.2, -10.0, 61.2, 61.2, 10.0],
                     "pc_range": [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0], "max_num": 300,
                     "voxel_size": [0.2, 0.2, 8], "num_classes": 10},
      "positional_encoding": {"type": "LearnedPositionalEncoding", "num_feats": 128, "row_num_embed": 50,
                              "col_num_embed": 50},
      "loss_cls": {"type": "FocalLoss", "use_sigmoid": true, "gamma": 2.0, "alpha": 0.25, "loss_weight": 2.0},
      "loss_bbox": {"type": "L1Loss", "loss_weight": 0.25},
      "loss_iou": {"type": "GIoULoss", "loss_weight": 0.0}}}})");
}

json comparable(const ModelConfig& c) {
  json j = to_json(c);
  j.erase("name");
  j["image"].erase("source");
  return j;
}

TEST(ConfigJson, UpstreamConfigsEqualPresets) {
  json tiny = upstream_tiny_json();
  EXPECT_EQ(comparable(config_from_json(tiny, "bevformer_tiny.json")), comparable(config_preset("tiny")));

  json base = upstream_tiny_json();
  json& m = base["model"];
  m["img_backbone"] = json::parse(R"({"type": "ResNet", "depth": 101, "num_stages": 4, "out_indices": [1, 2, 3],
      "frozen_stages": 1, "norm_cfg": {"type": "BN2d", "requires_grad": false}, "norm_eval": true,
      "style": "caffe", "dcn": {"type": "DCNv2", "deform_groups": 1, "fallback_on_stride": false},
      "stage_with_dcn": [false, false, true, true]})");
  m["img_neck"]["in_channels"] = {512, 1024, 2048};
  m["img_neck"]["num_outs"] = 4;
  for (const char* k : {"bev_h", "bev_w"}) m["pts_bbox_head"][k] = 200;
  for (const char* k : {"row_num_embed", "col_num_embed"}) m["pts_bbox_head"]["positional_encoding"][k] = 200;
  json& enc = m["pts_bbox_head"]["transformer"]["encoder"];
  enc["num_layers"] = 6;
  enc["transformerlayers"]["attn_cfgs"][1]["deformable_attention"]["num_levels"] = 4;
  base["img_norm_cfg"] = {{"mean", {103.530, 116.280, 123.675}}, {"std", {1.0, 1.0, 1.0}}, {"to_rgb", false}};
  base["test_pipeline"][1] = {{"type", "NormalizeMultiviewImage"}};  // superseded by img_norm_cfg
  base["test_pipeline"][2]["transforms"].erase(0);                   // base does not resize
  EXPECT_EQ(comparable(config_from_json(base, "bevformer_base.json")), comparable(config_preset("base")));
}

// ---- bad configs name their key path ---------------------------------------------------------

struct BadCase {
  const char* pointer;  // JSON pointer into the golden config
  json value;           // new value (null: remove the key)
  ErrorKind kind;
  std::vector<std::string> parts;
};

TEST(ConfigJson, BadValuesNameTheirKeyPath) {
  const std::string enc = "model.pts_bbox_head.transformer.encoder.transformerlayers";
  const std::vector<BadCase> cases = {
      {"/model/pts_bbox_head/as_two_stage", true, ErrorKind::kUnsupported,
       {"config.json: model.pts_bbox_head.as_two_stage", "False"}},
      {"/model/img_backbone/depth", 42, ErrorKind::kInvalidInput,
       {"model.img_backbone.depth", "unknown ResNet depth 42", "50, 101 or 152"}},
      {"/model/img_backbone/depth", 18, ErrorKind::kUnsupported, {"model.img_backbone.depth", "BasicBlock"}},
      {"/model/img_neck/num_outs", 2, ErrorKind::kInvalidInput, {"config.json: model.img_neck.num_outs", ">= len"}},
      {"/model/img_neck/num_outs", "4", ErrorKind::kInvalidInput,
       {"config.json: model.img_neck.num_outs", "a string (\"4\")", "an integer"}},
      {"/model/img_backbone/out_indices", json({1, 2, 4}), ErrorKind::kInvalidInput,
       {"model.img_backbone.out_indices", "index 4 is out of range"}},
      {"/model/pts_bbox_head/bev_h", -20, ErrorKind::kInvalidInput, {"model.pts_bbox_head.bev_h", "positive"}},
      {"/model/pts_bbox_head/transformer/decoder/transformerlayers/attn_cfgs/0/num_heads", 5,
       ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.transformer.decoder.transformerlayers.attn_cfgs[0].num_heads", "not divisible"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/attn_cfgs/0/num_levels", nullptr,
       ErrorKind::kInvalidInput, {enc + ".attn_cfgs[0].num_levels", "is 4", "set num_levels=1"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/ffn_cfgs", nullptr, ErrorKind::kInvalidInput,
       {enc + ".ffn_cfgs", "256 channels"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/attn_cfgs/1/deformable_attention/embed_dims",
       nullptr, ErrorKind::kInvalidInput, {enc + ".attn_cfgs[1].deformable_attention.embed_dims", "256"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/attn_cfgs/1/deformable_attention/num_levels", 1,
       ErrorKind::kInvalidInput, {"deformable_attention.num_levels", "img_neck.num_outs"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/operation_order/0", "ffn",
       ErrorKind::kUnsupported, {enc + ".operation_order", "post-norm"}},
      {"/model/pts_bbox_head/transformer/encoder/transformerlayers/operation_order/0", "conv",
       ErrorKind::kInvalidInput, {enc + ".operation_order", "'conv'"}},
      {"/model/pts_bbox_head/transformer/use_shift", "yes", ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.transformer.use_shift", "true or false"}},
      {"/model/pts_bbox_head/transformer/embed_dims", 48, ErrorKind::kInvalidInput,
       {"embed_dims", "48"}},
      {"/model/img_neck/in_channels", json({16, 32, 65}), ErrorKind::kInvalidInput,
       {"model.img_neck.in_channels", "[16,32,64]"}},
      {"/model/img_neck/num_out", 4, ErrorKind::kInvalidInput, {"model.img_neck.num_out", "typo"}},
      {"/model/img_backbone/dcn/type", "DCN", ErrorKind::kUnsupported, {"model.img_backbone.dcn.type", "'DCNv2'"}},
      {"/model/img_backbone/dcn/fallback_on_stride", true, ErrorKind::kUnsupported,
       {"model.img_backbone.dcn.fallback_on_stride"}},
      {"/model/pts_bbox_head/positional_encoding/num_feats", 8, ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.positional_encoding.num_feats", "embed_dims / 2 = 16"}},
      {"/model/pts_bbox_head/positional_encoding/row_num_embed", 10, ErrorKind::kInvalidInput,
       {"positional_encoding.row_num_embed", ">= bev_h"}},
      {"/model/pts_bbox_head/bbox_coder/num_classes", 5, ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.bbox_coder.num_classes", "10"}},
      {"/model/pts_bbox_head/bbox_coder/pc_range", json({1, 2, 3}), ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.bbox_coder.pc_range", "6 numbers"}},
      {"/model/pts_bbox_head/loss_cls/use_sigmoid", false, ErrorKind::kUnsupported,
       {"model.pts_bbox_head.loss_cls.use_sigmoid"}},
      {"/model/pts_bbox_head/transformer/type", "Detr3DTransformer", ErrorKind::kUnsupported,
       {"model.pts_bbox_head.transformer.type", "PerceptionTransformer"}},
      {"/model/pts_bbox_head/transformer/num_feature_levels", 3, ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.transformer.num_feature_levels", "level_embeds"}},
      {"/model/pts_bbox_head/transformer/decoder/return_intermediate", false, ErrorKind::kUnsupported,
       {"model.pts_bbox_head.transformer.decoder.return_intermediate"}},
      {"/model/pts_bbox_head/num_classes", nullptr, ErrorKind::kInvalidInput,
       {"model.pts_bbox_head.num_classes", "missing"}},
      {"/effective/bev_h", 30, ErrorKind::kInvalidInput, {"config.json: effective.bev_h", "30", "20"}},
      {"/effective/class_names", json({"car"}), ErrorKind::kInvalidInput, {"config.json: class_names", "1 names"}},
      {"/effective/img_norm_cfg/std", json({0, 1, 1}), ErrorKind::kInvalidInput,
       {"config.json: img_norm_cfg.std", "non-zero"}},
      {"/effective/image_size_padded_wh", json({128, 96}), ErrorKind::kInvalidInput,
       {"effective.image_size_padded_wh", "[128,64]"}},
  };
  for (const auto& bc : cases) {
    SCOPED_TRACE(bc.pointer);
    json j = micro_json();
    const json::json_pointer ptr(bc.pointer);
    if (bc.value.is_null()) {
      j[ptr.parent_pointer()].erase(ptr.back());
    } else {
      j[ptr] = bc.value;
    }
    expect_json_error(j, bc.kind, bc.parts);
  }
}

TEST(ConfigJson, ValidateAfterEditing) {
  ModelConfig c = config_preset("base");
  c.transformer.sca.num_levels = 1;
  expect_error([&] { expected_params(c); }, ErrorKind::kInvalidInput,
               {"model.pts_bbox_head.transformer.encoder.transformerlayers.attn_cfgs[1].deformable_attention.num_levels"});
  c = config_preset("tiny");
  c.neck.in_channels = {1024};
  expect_error([&] { validate_config(c, "edited"); }, ErrorKind::kInvalidInput,
               {"edited: model.img_neck.in_channels", "[2048]"});
}

}  // namespace
}  // namespace bev
