// Ops: what model code calls. Tensor handles in, tensor handles out; shapes are checked and
// output shapes inferred here, once, for every backend. In eager mode each call runs at once on
// memory the backend allocates. In plan mode the calls are only kept as OpNodes, their outputs
// deferred (sized, without memory): a RecordedStage then places them in one arena and the
// backend executes the stage every frame on the same memory, with the frame's inputs written
// into the recorded input tensors through the backend.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/op.h"

namespace bev {

// Weights of a conv2d / deform_conv2d / linear, prepared once by the backend.
struct PreparedWeights {
  OpKind kind = OpKind::linear;
  OpAttrs attrs;
  Shape weight_shape;  // OIHW or [out, in]
  std::shared_ptr<const void> state;
  const Backend* backend = nullptr;  // the backend that prepared `state`; only it may run it
};

class Ops {
 public:
  // kPlan keeps the ops without running them: outputs get deferred storage (no memory), which a
  // RecordedStage then places in its arena, so recording a stage never holds every intermediate
  // at once; the stage's first execution computes the values.
  enum class Mode { kEager, kPlan };

  explicit Ops(Backend& backend, Mode mode = Mode::kEager) : backend_(backend), mode_(mode) {}

  Backend& backend() { return backend_; }
  Mode mode() const { return mode_; }

  // The stage signpost (DESIGN §3) stamped on every following op, e.g. "enc0.tsa". An eager run
  // also tells the backend it entered the stage (the profiler's signposts: Backend::enter_stage).
  void set_stage(std::string stage) {
    stage_ = std::move(stage);
    if (mode_ == Mode::kEager) backend_.enter_stage(stage_);
  }
  const std::string& stage() const { return stage_; }

  // A host tensor as a backend tensor an op may read (every constant the model uses: layer-norm
  // weights, embeddings, queries, scalars).
  Tensor constant(const Tensor& host) { return backend_.upload(host); }

  PreparedWeights prepare_conv2d(const Tensor& weight_oihw, const Tensor* bias, const Conv2dAttrs& attrs);
  PreparedWeights prepare_deform_conv2d(const Tensor& weight_oihw, const Tensor* bias,
                                        const DeformConv2dAttrs& attrs);
  PreparedWeights prepare_linear(const Tensor& weight_out_in, const Tensor* bias, const LinearAttrs& attrs);
  // A stride-1 ResNet bottleneck from its prepared convs (downsample: block 0's, or null); `act`
  // is the dtype of conv1's and conv2's outputs. Throws kInvalidInput unless bottleneck_fusable.
  PreparedWeights prepare_bottleneck(const PreparedWeights& conv1, const PreparedWeights& conv2,
                                     const PreparedWeights& conv3, const PreparedWeights* downsample, DType act);
  // conv1: 1x1 + ReLU; conv2: 3x3, pad 1, + ReLU; conv3: 1x1 + residual + ReLU; downsample: 1x1;
  // all stride 1, dilation 1, groups 1.
  static bool bottleneck_fusable(const PreparedWeights& conv1, const PreparedWeights& conv2,
                                 const PreparedWeights& conv3, const PreparedWeights* downsample);

  // Image tensors are NHWC [N, H, W, C].
  // The test-time pipeline on decoded pixels (ImagePreprocessAttrs): bgr u8 [N, H, W, 3] -> f32
  // [N, padded_height, padded_width, 3], the backbone's input. The first op of an image stage fed
  // camera pixels, so a device uploads bytes (a quarter of the floats) and preprocesses itself.
  Tensor image_preprocess(const Tensor& bgr, const ImagePreprocessAttrs& attrs, std::string label = {});
  // x and the residual are f32, or bf16 when the backend runs in bf16; `out` is the output's
  // dtype (bf16 keeps activations bf16 between convolutions in bf16 precision).
  Tensor conv2d(const Tensor& x, const PreparedWeights& w, const Tensor* residual = nullptr, std::string label = {},
                DType out = DType::kF32);
  // The same with the output written over the residual (which must have the output's dtype and
  // not be read afterwards): the sum post-op then adds in place instead of copying the residual
  // into a fresh output first (5-35% of a ResNet expand conv's time). `out`, when given, may
  // differ from an int8 residual's dtype in signedness only (int8 codes: u8 over s8).
  Tensor conv2d_over_residual(const Tensor& x, const PreparedWeights& w, const Tensor& residual, std::string label,
                              std::optional<DType> out = std::nullopt);
  // x and `out` (y's dtype): f32, or bf16 when the backend runs in bf16 (conv1's output, which the
  // offset conv also reads; conv3 reads y). offset_mask is f32.
  Tensor deform_conv2d(const Tensor& x, const Tensor& offset_mask, const PreparedWeights& w, std::string label = {},
                       DType out = DType::kF32);
  // The block y = relu(conv3(conv2(conv1(x))) + identity), identity = downsample(x) or x, as one
  // op: the backend may run it depth-first (the CPU does, in strips of rows: docs/PERF.md), with
  // the results of the convs run one by one. `out`: y's dtype. over_input: y is written over x
  // (x is dead afterwards; no downsample; x has dtype `out`). Use it where
  // backend().fuses_bottleneck says it pays; conv by conv otherwise.
  Tensor bottleneck(const Tensor& x, const PreparedWeights& block, DType out, bool over_input, std::string label);
  Tensor max_pool2d(const Tensor& x, std::string label = {});  // 3x3, stride 2, padding 1
  // fine += nearest-upsampled coarse, in place; returns `fine`.
  Tensor upsample_nearest_add(const Tensor& coarse, const Tensor& fine, std::string label = {});

  // Rows are the leading dimensions flattened: [..., in] -> [..., out]. x is f32, or bf16 when the
  // backend runs in bf16; `out` is the output's dtype, bf16 likewise only in bf16 (for tensors
  // only linears and msda read: half the bytes, and no conversion in the reader).
  Tensor linear(const Tensor& x, const PreparedWeights& w, std::string label = {}, DType out = DType::kF32);
  // A post-norm layer's FFN, residual and norm as one op where backend().fuses_ffn() says so:
  // layer_norm(x + fc2(relu(fc1(x)))) with the bits of those ops one by one, fc1's output kept in
  // `hidden` (f32, or bf16 when the backend runs in bf16) as linear(..., hidden) keeps it. x f32
  // [M, C]; fc1 C -> H with ReLU, fc2 H -> C without; gamma, beta [C] -> [M, C] f32.
  Tensor ffn_norm(const Tensor& x, const PreparedWeights& fc1, const PreparedWeights& fc2, const Tensor& gamma,
                  const Tensor& beta, float eps, DType hidden, std::string label = {});
  Tensor batched_matmul(const Tensor& a, const Tensor& b, const BatchedMatmulAttrs& attrs, std::string label = {});
  // Per sample and head: softmax(scale * q k^T) v over the head's C / heads columns;
  // q [B, Q, C], k and v [B, K, C] -> [B, Q, C].
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionAttrs& attrs, std::string label = {});
  Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps = 1e-5f,
                    std::string label = {});
  // layer_norm(x + residual) as one op (a post-norm transformer layer's residual sum and norm;
  // the sum is never written): residual f32 with x's shape.
  Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta,
                        float eps = 1e-5f, std::string label = {});
  Tensor softmax(const Tensor& x, std::string label = {});  // over the last dimension
  Tensor relu(const Tensor& x, std::string label = {});
  Tensor sigmoid(const Tensor& x, std::string label = {});
  Tensor inverse_sigmoid(const Tensor& x, float eps = 1e-5f, std::string label = {});
  // Elementwise a + b and a * b; b has a's rank and each extent equal to a's or 1 (broadcast).
  // add's `out`: bf16 only when the backend runs in bf16 (a sum only linears read, rounded once).
  Tensor add(const Tensor& a, const Tensor& b, std::string label = {}, DType out = DType::kF32);
  Tensor mul(const Tensor& a, const Tensor& b, std::string label = {});
  // A new f32 tensor of zeros (zeroed again on every replay).
  Tensor zeros(const Shape& shape, std::string label = {});
  // a [..., C] + row [C]; `out` bf16 only when the backend runs in bf16 (the image features the
  // value projections read).
  Tensor add_rows(const Tensor& a, const Tensor& row, std::string label = {}, DType out = DType::kF32);
  // Upstream's feat_flatten as one op: levels[l] [images, hw_l, C] f32 (images = samples x cams),
  // level_rows[l] [C] f32, cams_embeds [cams, C] f32 or undefined (use_cams_embeds false) ->
  // [images, sum hw_l, C], level l's rows from sum_{k<l} hw_k on, each value
  // (x + cams_embeds[image % cams]) + level_rows[l] in f32 (upstream's order), rounded once to
  // `out`: bf16 only when the backend runs in bf16 (only the value projections read it). The
  // adds and the concat one by one wrote and read the maps three more times (base: 95 MB each).
  Tensor feat_flatten(const std::vector<Tensor>& levels, const std::vector<Tensor>& level_rows,
                      const Tensor& cams_embeds, std::string label = {}, DType out = DType::kF32);

  // value [bs, Lv, heads, hd] (f32 or bf16), locations [bs, Lq, heads, L, P, 2], weights
  // [bs, Lq, heads, L, P] -> [bs, Lq, heads * hd] f32
  Tensor msda(const Tensor& value, const Tensor& locations, const Tensor& weights, const MsdaAttrs& attrs,
              std::string label = {});

  // The same from the query on, as one op where backend().fuses_deformable_attention() says so:
  //   msda(value, sampling_locations(linear(query, sampling_offsets), reference),
  //        softmax(linear(query, attention_weights)))
  // with the results of those ops run one by one (the softmax per level or over a head's levels
  // and points, as attrs say). query [bs * Lq, C] (f32, or bf16 when the backend runs in bf16),
  // reference [bs * Lq, Lr, R, D] f32 (as sampling_locations'), value [bs, Lv, heads, hd];
  // sampling_offsets: a linear C -> heads * L * P * 2, attention_weights: C -> heads * L * P,
  // neither with ReLU -> [bs * Lq, heads * hd] f32.
  Tensor deformable_attention(const Tensor& query, const Tensor& reference, const Tensor& value,
                              const PreparedWeights& sampling_offsets, const PreparedWeights& attention_weights,
                              const MsdaAttrs& levels, bool softmax_per_level, std::string label = {});

  // SpatialCrossAttention's sampling and mean over cameras, as one op where
  // backend().fuses_spatial_cross_attention() says so, with the bits of
  //   scatter_mean_rows(deformable_attention(gather_rows(query, query_index, query_dtype),
  //                                          reference, value, ...), query_index, inv_count, out)
  // (the softmax over a head's levels and points): the projections run once per cell instead of
  // once per slot. query [cells, C] (f32, or bf16), query_index i64 [N * max_len] (slot -> cell,
  // camera-major, -1 padding), reference [N * max_len, Lr, R, D] f32, inv_count [cells, 1] f32,
  // value [N, Lv, heads, hd] (f32 or bf16), the projections as deformable_attention's ->
  // [cells, heads * hd] in `out` (bf16 only when the backend runs in bf16).
  Tensor spatial_cross_attention(const Tensor& query, const Tensor& query_index, const Tensor& reference,
                                 const Tensor& inv_count, const Tensor& value, const PreparedWeights& sampling_offsets,
                                 const PreparedWeights& attention_weights, const MsdaAttrs& levels, DType query_dtype,
                                 std::string label = {}, DType out = DType::kF32);

  // offsets [M, heads, L, P, 2], reference [M, Lr, R, D] (Lr = 1 or L, D >= 2; point p of level l
  // uses reference[m, Lr == 1 ? 0 : l, p % R, 0:2]) -> locations [M, heads, L, P, 2] =
  // reference + offset / (W_l, H_l).
  Tensor sampling_locations(const Tensor& offsets, const Tensor& reference, const SamplingLocationsAttrs& attrs,
                            std::string label = {});
  // Box refinement (spec §2.11): reg [M, code >= 5], reference [M, 3] (sigmoid space) ->
  // [M, 3] = sigmoid(reg[:, {0, 1, 4}] + inverse_sigmoid(reference)).
  Tensor reference_refine(const Tensor& reg, const Tensor& reference, std::string label = {});
  // The head's boxes (spec §2.13): reg [M, code] with channels 0, 1, 4 replaced by the refined
  // reference [M, 3] denormalized to metres.
  Tensor bbox_denormalize(const Tensor& reg, const Tensor& refined, const BboxDenormalizeAttrs& attrs,
                          std::string label = {});

  std::pair<Tensor, Tensor> topk(const Tensor& scores, int64_t k, std::string label = {});  // values, i64 indices
  // out[i] = src[index[i]]; index -1 gives a row of zeros (padding). `out`: the output's dtype,
  // src's when unset, or bf16 for an f32 src when the backend runs in bf16 (rows only linears
  // read; see Ops::linear).
  Tensor gather_rows(const Tensor& src, const Tensor& index, std::string label = {},
                     std::optional<DType> out = std::nullopt);
  // out[i] = srcs[s][r] for index[i] = gather_multi_index(s, r), a zero row for -1: rows taken
  // from several tensors (one per sample of a batch, each its own buffer) without first copying
  // them into one. Every source [N_s, C] of one dtype; out [index, C].
  Tensor gather_rows_multi(const std::vector<Tensor>& srcs, const Tensor& index, std::string label = {});
  // dst[index[i]] += src[i], in place; index -1 skips the row (padding); returns `dst`.
  Tensor scatter_add_rows(const Tensor& src, const Tensor& index, const Tensor& dst, std::string label = {});
  // out[q] = scale[q] * (the sum of src[i] over index[i] = q, in increasing i, from +0): SCA's
  // mean over the cameras that see a cell (zeros, scatter_add_rows and mul by scale, as one op
  // with their bits). src [M, C] f32, index [M] i64 (-1 skips a row), scale [N, 1] f32 ->
  // [N, C] f32.
  // `out`: bf16 only when the backend runs in bf16 (SCA's mean, which only output_proj reads).
  Tensor scatter_mean_rows(const Tensor& src, const Tensor& index, const Tensor& scale, std::string label = {},
                           DType out = DType::kF32);
  // `out` as gather_rows': the parts' dtype when unset, or bf16 for f32 parts in bf16 precision.
  Tensor concat(const std::vector<Tensor>& parts, int64_t axis, std::string label = {},
                std::optional<DType> out = std::nullopt);
  Tensor permute(const Tensor& x, const std::vector<int64_t>& order, std::string label = {});  // contiguous copy
  // i64 [groups]: how many values of each of x's `groups` equal parts (x as [groups, rest]; f32 or
  // bf16) are NaN or infinite. A stage ends with one over what it hands on, a group per sample,
  // so that a frame whose numbers blew up fails, naming the stage, instead of being answered
  // (and kept as history).
  Tensor count_nonfinite(const Tensor& x, int64_t groups = 1, std::string label = {});

  const std::vector<OpNode>& nodes() const { return nodes_; }
  // Hands the recorded nodes over (to a RecordedStage) and starts a new recording.
  std::vector<OpNode> take_nodes() { return std::exchange(nodes_, {}); }

 private:
  Tensor output(const Shape& shape, DType dtype = DType::kF32);
  Tensor emit(OpNode node);  // runs (and records) the node; returns its first output
  // f32, or bf16 when the backend runs in bf16; otherwise throws kInvalidInput naming `what`.
  void expect_float_dtype(const char* op, const std::string& label, const char* what, DType dtype) const;
  // A copying op's output dtype (gather_rows, concat): `from`, or bf16 from f32 in bf16 precision.
  DType copy_dtype(const char* op, const std::string& label, DType from, std::optional<DType> out) const;
  PreparedWeights prepare(OpKind kind, OpAttrs attrs, const Tensor& weight, const Tensor* bias);

  Tensor conv2d_impl(const Tensor& x, const PreparedWeights& w, const Tensor* residual, std::string label, DType out,
                     bool over_residual);
  Backend& backend_;
  Mode mode_;
  std::string stage_;
  std::vector<OpNode> nodes_;
};

}  // namespace bev
