// ModelConfig: everything needed to build BEVFormer, named after upstream's config keys (the
// comment on each field gives its key path under the upstream `model` dict, or the top-level
// config variable it comes from). Built from a preset (tiny, small, base: docs/bevformer-spec.md
// §1) or from an upstream-style JSON config (shared/golden/*/config.json), where absent keys take
// the defaults of the upstream class signatures, exactly as mmcv's builders would.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace bev {

enum class ResNetStyle : uint8_t { kPytorch, kCaffe };  // stride on conv2 (3x3) vs on conv1 (1x1)
enum class ExtraConvs : uint8_t { kOff, kOnInput, kOnLateral, kOnOutput };
enum class LayerOp : uint8_t { kSelfAttn, kCrossAttn, kNorm, kFfn };  // operation_order entries

const char* resnet_style_name(ResNetStyle s);  // "pytorch" | "caffe"
const char* extra_convs_name(ExtraConvs e);    // "off" | "on_input" | "on_lateral" | "on_output"
const char* layer_op_name(LayerOp op);         // "self_attn" | "cross_attn" | "norm" | "ffn"

// model.img_backbone (mmdet ResNet with Bottleneck blocks).
struct BackboneConfig {
  int depth = 50;              // .depth: 50 | 101 | 152
  int in_channels = 3;         // .in_channels
  int stem_channels = 64;      // .stem_channels (None -> base_channels)
  int base_channels = 64;      // .base_channels; stage i has planes base*2^i, outputs 4x that
  int num_stages = 4;          // .num_stages
  std::vector<int> strides = {1, 2, 2, 2};  // .strides (one per stage)
  std::vector<int> out_indices = {3};       // .out_indices (stage indices fed to the neck)
  ResNetStyle style = ResNetStyle::kPytorch;  // .style
  int frozen_stages = -1;      // .frozen_stages (training only; kept for the summary)
  double norm_eps = 1e-5;      // .norm_cfg.eps (BatchNorm in eval mode)
  bool dcn = false;            // .dcn is not None (only type='DCNv2' = ModulatedDeformConv2dPack)
  int dcn_deform_groups = 1;   // .dcn.deform_groups
  bool dcn_fallback_on_stride = false;  // .dcn.fallback_on_stride (only False is supported)
  std::vector<bool> stage_with_dcn = {false, false, false, false};  // .stage_with_dcn
};

// Blocks per stage for the depth: 50 -> {3,4,6,3}, 101 -> {3,4,23,3}, 152 -> {3,8,36,3}.
std::vector<int> resnet_stage_blocks(const BackboneConfig& b);
int resnet_stage_planes(const BackboneConfig& b, int stage);        // base_channels * 2^stage
int resnet_stage_out_channels(const BackboneConfig& b, int stage);  // planes * 4 (expansion)
bool resnet_stage_has_dcn(const BackboneConfig& b, int stage);      // conv2 of every block is DCNv2

// model.img_neck (mmdet FPN, no norm, no activation, nearest upsampling).
struct NeckConfig {
  std::vector<int> in_channels = {2048};  // .in_channels (one per backbone output)
  int out_channels = 256;                 // .out_channels
  int start_level = 0;                    // .start_level
  int end_level = -1;                     // .end_level (-1: through the last input)
  int num_outs = 1;                       // .num_outs (= feature levels seen by SCA)
  ExtraConvs add_extra_convs = ExtraConvs::kOff;  // .add_extra_convs (True = 'on_input')
  bool relu_before_extra_convs = false;   // .relu_before_extra_convs (ReLU before the 2nd+ only)
};

int fpn_backbone_end_level(const NeckConfig& n);  // index past the last input level used
int fpn_num_extra_levels(const NeckConfig& n);    // levels beyond the inputs (conv or max-pool)

// Test-time image preprocessing; upstream keeps these outside `model` (img_norm_cfg and the
// test_pipeline's RandomScaleImageMultiViewImage / PadMultiViewImage).
struct ImageConfig {
  std::array<double, 3> mean = {123.675, 116.28, 103.53};  // img_norm_cfg.mean (after to_rgb)
  std::array<double, 3> std = {58.395, 57.12, 57.375};     // img_norm_cfg.std
  bool to_rgb = true;        // img_norm_cfg.to_rgb (false: the network sees BGR)
  double resize_scale = 1.0; // RandomScaleImageMultiViewImage.scales[0] (tiny 0.5, small 0.8)
  int size_divisor = 32;     // PadMultiViewImage.size_divisor
  int width = 1600;          // camera image as delivered, before resize (nuScenes 1600x900)
  int height = 900;
  std::string source;        // where these came from, e.g. "config.json: effective"
};

struct ImageSize {
  int width = 0;
  int height = 0;
  bool operator==(const ImageSize&) const = default;
};
// Of an image of `original` size (the config's own when not given): (int(W*s), int(H*s)) as
// upstream; the network input, that padded to the size divisor.
ImageSize image_resized_size(const ImageConfig& img, ImageSize original);
ImageSize image_padded_size(const ImageConfig& img, ImageSize original);
ImageSize image_resized_size(const ImageConfig& img);
ImageSize image_padded_size(const ImageConfig& img);

// One deformable attention (TSA, SCA's MSDeformableAttention3D, decoder cross-attention).
struct DeformAttnConfig {
  int num_heads = 8;   // .num_heads
  int num_levels = 4;  // .num_levels
  int num_points = 4;  // .num_points
};

// model.pts_bbox_head.transformer (PerceptionTransformer) with its encoder and decoder.
struct TransformerConfig {
  int embed_dims = 256;          // .embed_dims (C)
  int num_feature_levels = 4;    // .num_feature_levels (rows of level_embeds)
  int num_cams = 6;              // .num_cams (rows of cams_embeds)
  bool rotate_prev_bev = true;   // .rotate_prev_bev
  bool use_shift = true;         // .use_shift
  bool use_can_bus = true;       // .use_can_bus
  bool can_bus_norm = true;      // .can_bus_norm (LayerNorm at the end of can_bus_mlp)
  bool use_cams_embeds = true;   // .use_cams_embeds
  std::array<double, 2> rotate_center = {100, 100};  // .rotate_center, pixels [x=col, y=row]
  // Not an upstream key: the original release aliased shift_ref_2d to ref_2d and so shifted both
  // TSA queue branches (spec §2.7); false = HEAD's clone (only the previous-BEV branch shifts).
  bool shift_ref_2d_alias = false;

  // .encoder (BEVFormerEncoder of BEVFormerLayer)
  int encoder_layers = 6;                    // .encoder.num_layers
  int num_points_in_pillar = 4;              // .encoder.num_points_in_pillar
  std::array<double, 6> pc_range = {-51.2, -51.2, -5.0, 51.2, 51.2, 3.0};  // .encoder.pc_range
  DeformAttnConfig tsa = {8, 1, 4};          // .encoder.transformerlayers.attn_cfgs[0]
  int tsa_num_bev_queue = 2;                 //   .num_bev_queue
  DeformAttnConfig sca = {8, 4, 8};          // .encoder.transformerlayers.attn_cfgs[1].deformable_attention
  int encoder_ffn_dims = 512;                // .encoder.transformerlayers.feedforward_channels
  std::vector<LayerOp> encoder_operation_order;  // .encoder.transformerlayers.operation_order

  // .decoder (DetectionTransformerDecoder of DetrTransformerDecoderLayer)
  int decoder_layers = 6;                    // .decoder.num_layers
  int decoder_self_attn_heads = 8;           // .decoder.transformerlayers.attn_cfgs[0].num_heads
  DeformAttnConfig decoder_cross = {8, 1, 4};  // .decoder.transformerlayers.attn_cfgs[1]
  int decoder_ffn_dims = 512;                // .decoder.transformerlayers.feedforward_channels
  std::vector<LayerOp> decoder_operation_order;  // .decoder.transformerlayers.operation_order
};

// The post-norm order every official config uses (and the only one supported).
std::vector<LayerOp> post_norm_operation_order();

// model.pts_bbox_head (BEVFormerHead) with its positional encoding and NMSFreeCoder.
struct HeadConfig {
  int bev_h = 30;              // .bev_h (rows, along lidar y)
  int bev_w = 30;              // .bev_w (cols, along lidar x)
  int num_query = 100;         // .num_query
  int num_classes = 10;        // .num_classes (sigmoid classification: logits per class)
  int code_size = 10;          // .code_size
  int num_reg_fcs = 2;         // .num_reg_fcs (hidden Linear layers in the cls/reg branches)
  bool with_box_refine = false;  // .with_box_refine
  bool as_two_stage = false;     // .as_two_stage (only False is supported)
  std::vector<double> code_weights = {1, 1, 1, 1, 1, 1, 1, 1, 0.2, 0.2};  // .code_weights (loss)
  int pos_num_feats = 128;       // .positional_encoding.num_feats (LearnedPositionalEncoding)
  int pos_row_num_embed = 50;    // .positional_encoding.row_num_embed
  int pos_col_num_embed = 50;    // .positional_encoding.col_num_embed
  // .bbox_coder (NMSFreeCoder); the head denormalizes box centres with the coder's pc_range.
  std::array<double, 6> pc_range = {-51.2, -51.2, -5.0, 51.2, 51.2, 3.0};  // .bbox_coder.pc_range
  std::optional<std::array<double, 6>> post_center_range;  // .bbox_coder.post_center_range
  int max_num = 100;                                       // .bbox_coder.max_num
  std::optional<double> score_threshold;                   // .bbox_coder.score_threshold
};

struct ModelConfig {
  std::string name;              // preset name, or the JSON path it was loaded from
  BackboneConfig backbone;       // model.img_backbone
  NeckConfig neck;               // model.img_neck
  ImageConfig image;             // img_norm_cfg + test_pipeline
  TransformerConfig transformer; // model.pts_bbox_head.transformer
  HeadConfig head;               // model.pts_bbox_head
  std::vector<std::string> class_names;  // class_names (label index order)
  bool video_test_mode = false;  // model.video_test_mode (keep prev_bev between frames)
};

// The nuScenes detection classes every official config uses, in label order.
const std::vector<std::string>& nuscenes_class_names();

std::vector<std::string> config_preset_names();  // {"tiny", "small", "base"}
// Throws Error(kNotFound) naming the presets when `name` is none of them.
ModelConfig config_preset(std::string_view name);

// Reads an upstream-style config: either {"model": {...}, optional top-level "img_norm_cfg",
// "class_names", "point_cloud_range", "test_pipeline", "shift_ref_2d_alias" and a golden-set
// "effective" section}, or the model dict itself. Errors name `where` and the key path.
// When the effective section restates a value, it must agree with what the model dict gives.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& where);

// A preset name, or the path of a JSON config file.
ModelConfig load_config(const std::string& preset_or_json_path);

// Checks values and their relations (channel chains, level counts, heads dividing embed_dims,
// supported options); config_preset and config_from_json call it, call it again after editing a
// config. Errors read "<where>: <key_prefix>.img_neck.num_outs: ...".
void validate_config(const ModelConfig& cfg, const std::string& where = "config",
                     const std::string& key_prefix = "model");

nlohmann::json to_json(const ModelConfig& cfg);  // readable summary with our field names
std::string config_summary(const ModelConfig& cfg);  // a few lines for the CLI

}  // namespace bev
