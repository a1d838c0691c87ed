// The one list of ops. BEV_OPS generates the OpKind enum and the names the profiler, tests and
// benchmarks print; every backend dispatches on OpKind in a single switch compiled with
// -Werror=switch, so an op without a kernel is a compile error, not a runtime surprise.
//
// An OpNode is one call: kind, attributes, input and output tensors, and the backend's prepared
// state (packed weights, cached primitives). Eager execution runs a node as soon as it is built;
// recording keeps the nodes so a plan can replay them on the same buffers every frame.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/tensor.h"

namespace bev {

#define BEV_OPS(X)          \
  X(image_preprocess)       \
  X(conv2d)                 \
  X(bottleneck)             \
  X(deform_conv2d)          \
  X(linear)                 \
  X(ffn_norm)               \
  X(batched_matmul)         \
  X(attention)              \
  X(layer_norm)             \
  X(softmax)                \
  X(relu)                   \
  X(sigmoid)                \
  X(inverse_sigmoid)        \
  X(add)                    \
  X(mul)                    \
  X(add_rows)               \
  X(feat_flatten)           \
  X(zeros)                  \
  X(max_pool2d)             \
  X(upsample_nearest_add)   \
  X(sampling_locations)     \
  X(msda)                   \
  X(deformable_attention)   \
  X(spatial_cross_attention)\
  X(reference_refine)       \
  X(bbox_denormalize)       \
  X(topk)                   \
  X(gather_rows)            \
  X(gather_rows_multi)      \
  X(scatter_add_rows)       \
  X(scatter_mean_rows)      \
  X(concat)                 \
  X(permute)                \
  X(count_nonfinite)

enum class OpKind : uint8_t {
#define BEV_OP_ENUM(name) name,
  BEV_OPS(BEV_OP_ENUM)
#undef BEV_OP_ENUM
};

inline constexpr OpKind kAllOps[] = {
#define BEV_OP_ALL(name) OpKind::name,
    BEV_OPS(BEV_OP_ALL)
#undef BEV_OP_ALL
};

const char* op_name(OpKind kind);

// kInt8: the convolutions the model prepared with a calibrated input step (Conv2dAttrs::int8_step:
// the backbone's, docs/PERF.md "int8 precision") multiply int8 inputs by int8 weights; everything
// else runs in the backend's float arithmetic (Backend::float_precision: bf16 on AMX and AMD, else f32).
enum class Precision : uint8_t { kF32, kBF16, kInt8 };
const char* precision_name(Precision p);
// "f32" | "bf16" | "int8" -> Precision; anything else throws Error(kInvalidInput) naming `where`.
Precision parse_precision(const std::string& name, const std::string& where);

// ---- attributes, one struct per op that has any ----

struct Conv2dAttrs {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;
  bool relu = false;
  bool residual = false;  // y = act(conv(x) + bias + residual)
  // int8 precision: the f32 value of one integer step of the input (from calibration: the input's
  // largest magnitude / 255 or / 127), and whether the input is u8 (it follows a ReLU, so it is
  // never negative) or s8. 0: the conv runs in f32.
  float int8_step = 0;
  bool int8_unsigned = false;
  // int8 precision: the output as int8 codes of this step (the next conv's input step), so that
  // a chain of convs stays int8: u8 after a ReLU, else s8 (the downsample's identity). 0: f32.
  float int8_out_step = 0;
  // int8 precision, with `residual`: the residual is int8 codes of this step, u8 or s8 as
  // int8_residual_unsigned says (a block's u8 input, or the downsample's s8 output). 0: the
  // residual is f32.
  float int8_residual_step = 0;
  bool int8_residual_unsigned = false;
};

// Conv2dAttrs' geometry, the one rule Ops and every backend's convolutions share: stride,
// dilation and groups >= 1, padding >= 0; the text names them for errors ("stride 2x2, pad 3x3,
// dilation 1x1, groups 1").
bool conv2d_geometry_valid(const Conv2dAttrs& a);
std::string conv2d_geometry_str(const Conv2dAttrs& a);
// The dtypes of a conv's int8 codes, the one rule Ops and every backend's convolutions share:
// the input's (int8_step: u8 if int8_unsigned, else s8), the output's (int8_out_step: u8 after a
// ReLU, else s8) and the residual's (int8_residual_step: u8 if int8_residual_unsigned, else s8);
// kF32 where that tensor is not int8.
DType conv2d_int8_input(const Conv2dAttrs& a);
DType conv2d_int8_output(const Conv2dAttrs& a);
DType conv2d_int8_residual(const Conv2dAttrs& a);
// PyTorch's output extent (floor) of a convolution along one axis; oneDNN accepts the same floor
// with symmetric padding.
int64_t conv_out_extent(int64_t in, int64_t k, int stride, int pad, int dilation);

// A stride-1 ResNet bottleneck as one op (see Ops::bottleneck): the members' prepared convs, in
// the order conv1, conv2, conv3 and, for block 0, the downsample; their OIHW weight shapes (FLOP
// counts); and the dtype of conv1's and conv2's outputs.
struct BottleneckAttrs {
  std::vector<std::shared_ptr<const void>> members;
  std::vector<Shape> weight_shapes;
  DType act = DType::kF32;
  bool int8 = false;  // the members run int8 (calibrated steps): the block reads and writes f32
};

// The attributes of a stride-1 bottleneck's convs (kernels 1, 3, 1 and a 1x1 downsample): conv1
// and conv2 with ReLU, conv3 with residual and ReLU, the downsample with neither; stride and
// dilation 1, groups 1, padding k / 2. The one rule Ops::bottleneck_fusable and the CPU kernel
// share.
bool bottleneck_attrs_fusable(const Conv2dAttrs& conv1, const Conv2dAttrs& conv2, const Conv2dAttrs& conv3,
                              const Conv2dAttrs* downsample);

struct DeformConv2dAttrs {
  int stride = 1, pad = 1, dilation = 1;
  bool relu = false;  // y = relu(deform_conv(x) + bias), fused into the output
};

struct LinearAttrs {
  bool relu = false;
};

// A post-norm transformer layer's FFN with its residual and norm as one op (Ops::ffn_norm):
// layer_norm(x + fc2(relu(fc1(x)))) with the model's own prepared linears, run chunk by chunk
// so that the hidden rows stay in cache.
struct FfnNormAttrs {
  std::shared_ptr<const void> fc1, fc2;  // prepared linears (fc1 with its ReLU)
  Shape fc1_weight_shape, fc2_weight_shape;  // [out, in] (FLOP counts)
  DType hidden = DType::kF32;  // fc1's output as the ops one by one keep it (bf16 in bf16 arithmetic)
  float eps = 1e-5f;
};

struct BatchedMatmulAttrs {
  bool transpose_b = false;
  float scale = 1.0f;
};

// Scaled dot-product attention: per sample and head, softmax(scale * q k^T) v over the head's
// C / heads columns (q [B, Q, C], k and v [B, K, C] -> [B, Q, C]).
struct AttentionAttrs {
  int heads = 1;
  float scale = 1.0f;
};

struct LayerNormAttrs {
  float eps = 1e-5f;
};

struct InverseSigmoidAttrs {
  float eps = 1e-5f;
};

struct MsdaAttrs {
  std::vector<std::pair<int64_t, int64_t>> spatial_shapes;  // (H, W) per level
  std::vector<int64_t> level_start;                         // first value row of each level
};

// Deformable attention from the query on (Ops::deformable_attention): the query's
// sampling_offsets and attention_weights linears, the softmax of the weights, the sampling
// locations and msda, as one op, so that the projections of a chunk of queries are consumed
// while they are in cache instead of going through memory four times. The linears are the
// model's own prepared ones (PreparedWeights::state), shared with the unfused path. Also the
// attributes of Ops::spatial_cross_attention, which runs the same steps per camera of a cell.
struct DeformableAttentionAttrs {
  MsdaAttrs msda;           // the value's levels
  int64_t points = 0;       // sampling points per head and level
  // The softmax's rows: the points of one level (TSA, whose two "levels" are its queue entries,
  // each normalized on its own: spec §5.2), or all levels x points of a head (SCA, decoder).
  bool softmax_per_level = false;
  std::shared_ptr<const void> sampling_offsets, attention_weights;  // prepared linears
  Shape offsets_weight_shape, weights_weight_shape;                  // their [out, in] (FLOP counts)
  // spatial_cross_attention only: the dtype the query's rows are rounded to before the
  // projections (the rebatch's: bf16 in bf16 precision).
  DType query_dtype = DType::kF32;
};

// Deformable attention's sampling locations (spec §2.9, §2.11, §2.12): per level l the offsets
// are divided by the level's (W_l, H_l) and added to a reference point.
struct SamplingLocationsAttrs {
  std::vector<std::pair<int64_t, int64_t>> spatial_shapes;  // (H, W) per level
};

// The head's box centre denormalization: code channels 0, 1 and 4 become
// ref[:, k] * scale[k] + offset[k] (k = x, y, z), scale = pc_range max - min, offset = min.
struct BboxDenormalizeAttrs {
  float scale[3] = {1, 1, 1};
  float offset[3] = {0, 0, 0};
};

struct TopkAttrs {
  int64_t k = 0;
};

struct ConcatAttrs {
  int64_t axis = 0;
};

struct PermuteAttrs {
  std::vector<int64_t> order;
};

// gather_rows_multi's index encoding: source s, row r as (s << 32) | r; -1 is a zero row.
inline constexpr int64_t gather_multi_index(int64_t source, int64_t row) { return (source << 32) | row; }

// The image stage's flattening of the neck's levels into the value rows (upstream
// PerceptionTransformer.get_bev_features' feat_flatten): per level, its maps plus the camera's
// cams_embeds row (when used) plus the level's level_embeds row, levels one after another.
struct FeatFlattenAttrs {
  int64_t levels = 0;        // inputs: the levels' maps, then their level_embeds rows, then cams_embeds
  bool cams_embeds = false;  // whether cams_embeds is an input (use_cams_embeds)
};

// Upstream's test-time image pipeline on decoded camera pixels (mmdet3d NormalizeMultiviewImage,
// RandomScaleImageMultiViewImage, PadMultiViewImage; docs/bevformer-spec.md §2.1): u8 BGR
// [N, H, W, 3] -> float32; BGR->RGB when to_rgb; (x - mean) * (1 / std) at full resolution, as
// mmcv.imnormalize_ (OpenCV's subtract, then multiply, channel order after to_rgb); the
// normalized image resized bilinearly (mmcv.imresize: cv2.resize INTER_LINEAR on float32) when
// the resized size differs from H x W; zeros at the bottom and right up to the padded size.
// f32 [N, padded_height, padded_width, 3], NHWC (the backbone's layout).
struct ImagePreprocessAttrs {
  double mean[3] = {0, 0, 0};
  double std[3] = {1, 1, 1};
  bool to_rgb = false;
  int64_t resized_height = 0, resized_width = 0;  // H x W itself: no resize
  int64_t padded_height = 0, padded_width = 0;    // >= resized
};

struct CountNonfiniteAttrs {
  int64_t groups = 1;  // x as [groups, rest]: one count per group (per sample of a batch)
};

using OpAttrs = std::variant<std::monostate, Conv2dAttrs, BottleneckAttrs, DeformConv2dAttrs, LinearAttrs, FfnNormAttrs,
                             BatchedMatmulAttrs,
                             AttentionAttrs, LayerNormAttrs, InverseSigmoidAttrs, MsdaAttrs, DeformableAttentionAttrs,
                             SamplingLocationsAttrs,
                             BboxDenormalizeAttrs, TopkAttrs, ConcatAttrs, PermuteAttrs, FeatFlattenAttrs,
                             CountNonfiniteAttrs, ImagePreprocessAttrs>;

struct OpNode {
  OpKind kind = OpKind::relu;
  std::string label;                      // the tensor's name, e.g. "img.layer1.0.conv1"
  OpAttrs attrs;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::shared_ptr<const void> prepared;  // backend state for weighted ops (see Backend::prepare_*)
  std::string stage = {};                 // the stage signpost (DESIGN §3), e.g. "img.layer1"; set by Ops
  Shape weight_shape = {};                // weighted ops: OIHW or [out, in] (FLOP counts, descriptions)
};

}  // namespace bev
