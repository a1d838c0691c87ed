// The case tables' switch over OpKind, the input generators, and the image-stage ops (NHWC).
// tiny's shapes are its recorded stages' (`bevformer describe --config tiny`), base's are
// config_preset("base")'s: ResNet-101 caffe (stride on conv1) with DCN in layer3-4, 6 cameras of
// 1600x900 padded to 1600x928, FPN on layer2-4 plus one extra level.
#include <cmath>
#include <cstring>
#include <utility>

#include "backend_ops.h"
#include "model/bevformer.h"

namespace bev::op_harness {

const char* set_name(ShapeSet s) {
  switch (s) {
    case ShapeSet::kAwkward: return "awkward";
    case ShapeSet::kTiny: return "tiny";
    case ShapeSet::kBase: return "base";
  }
  return "?";
}

std::vector<OpCase> make_cases(OpKind op, ShapeSet set, Precision precision) {
  CaseList l(op, set, precision);
  switch (op) {
    case OpKind::image_preprocess: image_preprocess_cases(l); break;
    case OpKind::conv2d: conv2d_cases(l); break;
    case OpKind::bottleneck: bottleneck_cases(l); break;
    case OpKind::deform_conv2d: deform_conv2d_cases(l); break;
    case OpKind::linear: linear_cases(l); break;
    case OpKind::ffn_norm: ffn_norm_cases(l); break;
    case OpKind::batched_matmul: batched_matmul_cases(l); break;
    case OpKind::attention: attention_cases(l); break;
    case OpKind::layer_norm: layer_norm_cases(l); break;
    case OpKind::softmax: softmax_cases(l); break;
    case OpKind::relu:
    case OpKind::sigmoid:
    case OpKind::inverse_sigmoid: unary_cases(l); break;
    case OpKind::add:
    case OpKind::mul: binary_cases(l); break;
    case OpKind::add_rows: add_rows_cases(l); break;
    case OpKind::feat_flatten: feat_flatten_cases(l); break;
    case OpKind::zeros: zeros_cases(l); break;
    case OpKind::max_pool2d: max_pool2d_cases(l); break;
    case OpKind::upsample_nearest_add: upsample_nearest_add_cases(l); break;
    case OpKind::sampling_locations: sampling_locations_cases(l); break;
    case OpKind::msda: msda_cases(l); break;
    case OpKind::deformable_attention: deformable_attention_cases(l); break;
    case OpKind::spatial_cross_attention: spatial_cross_attention_cases(l); break;
    case OpKind::reference_refine:
    case OpKind::bbox_denormalize: head_cases(l); break;
    case OpKind::topk: topk_cases(l); break;
    case OpKind::gather_rows: gather_rows_cases(l); break;
    case OpKind::scatter_add_rows: scatter_add_rows_cases(l); break;
    case OpKind::scatter_mean_rows: scatter_mean_rows_cases(l); break;
    case OpKind::concat: concat_cases(l); break;
    case OpKind::permute: permute_cases(l); break;
    case OpKind::count_nonfinite: count_nonfinite_cases(l); break;
    case OpKind::gather_rows_multi: gather_rows_multi_cases(l); break;
  }
  return l.take();
}

void CaseList::add(std::string tag, std::function<void(Ops&, uint64_t)> fn) {
  const uint64_t seed = (uint64_t{static_cast<uint8_t>(op_)} << 32) ^ (uint64_t{static_cast<uint8_t>(set_)} << 24) ^
                        (cases_.size() * 1000003u) ^ 0x5eed;
  cases_.push_back({op_, set_, std::move(tag), [fn = std::move(fn), seed](Ops& ops) { fn(ops, seed); }});
}

// ---- generators ----

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

float unit_value(uint64_t seed, int64_t i) {
  const uint64_t h = mix(mix(seed) + static_cast<uint64_t>(i));
  // (2k + 1) / 2^24 - 1 for k < 2^24: odd over even, so never 0; symmetric around it.
  return static_cast<float>(static_cast<double>(2 * (h >> 40) + 1) / 16777216.0 - 1.0);
}

Tensor uniform(const Shape& s, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(s, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * 0.5f * (unit_value(seed, i) + 1.0f);
  return t;
}

Tensor values(const Shape& s, uint64_t seed, float scale, float large) {
  Tensor t = Tensor::empty(s, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const bool big = large != 1.0f && mix(seed ^ (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dull)) % 13 == 0;
    p[i] = scale * unit_value(seed, i) * (big ? large : 1.0f);
  }
  return t;
}

Tensor weight(const Shape& s, uint64_t seed, int64_t fan_in) {
  // Uniform on (-a, a) has variance a^2 / 3.
  const float a = std::sqrt(3.0f / static_cast<float>(fan_in));
  return values(s, seed, a);
}

Tensor indices(int64_t count, int64_t rows, uint64_t seed, int pad_every) {
  Tensor t = Tensor::empty({count}, DType::kI64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    p[i] = pad_every > 0 && i % pad_every == pad_every - 1 ? -1
                                                         : static_cast<int64_t>(mix(seed + static_cast<uint64_t>(i)) %
                                                                                static_cast<uint64_t>(rows));
  }
  return t;
}

Tensor index_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

Tensor to_bf16(const Tensor& t) { return t.to(DType::kBF16); }

// ---- image ops ----

namespace {

int64_t conv_out(int64_t in, int64_t k, int stride, int pad, int dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

enum class Residual : uint8_t { kNone, kSeparate, kOver };

struct ConvSpec {
  Shape x, w;  // NHWC, OIHW
  Conv2dAttrs a = {};
  DType in = DType::kF32, out = DType::kF32;
  Residual residual = Residual::kNone;
  bool bias = true;  // BN folded into the conv (every ResNet conv) or FPN's own bias
  float large = 1.0f;  // awkward inputs: every 13th element this much larger
};

void add_conv(CaseList& l, std::string tag, ConvSpec s) {
  s.a.residual = s.residual != Residual::kNone;
  l.add(std::move(tag), [s](Ops& ops, uint64_t seed) {
    const Tensor b = values({s.w[0]}, seed + 1, 0.5f);
    const PreparedWeights w =
        ops.prepare_conv2d(weight(s.w, seed + 2, s.w[1] * s.w[2] * s.w[3]), s.bias ? &b : nullptr, s.a);
    Tensor xh = values(s.x, seed + 3, 1.0f, s.large);
    if (s.in == DType::kBF16) xh = to_bf16(xh);
    const Tensor x = ops.backend().upload(xh);
    const Shape y = {s.x[0], conv_out(s.x[1], s.w[2], s.a.stride_h, s.a.pad_h, s.a.dilation_h),
                     conv_out(s.x[2], s.w[3], s.a.stride_w, s.a.pad_w, s.a.dilation_w), s.w[0]};
    if (s.residual == Residual::kNone) {
      ops.conv2d(x, w, nullptr, "x", s.out);
      return;
    }
    Tensor rh = values(y, seed + 4, 1.0f, s.large);
    if (s.out == DType::kBF16 || s.in == DType::kBF16) rh = to_bf16(rh);
    const Tensor r = ops.backend().upload(rh);
    if (s.residual == Residual::kOver) {
      ops.conv2d_over_residual(x, w, r, "x");
    } else {
      ops.conv2d(x, w, &r, "x", s.out);
    }
  });
}

Conv2dAttrs attrs(int stride, int pad, bool relu) {
  return {.stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad, .relu = relu};
}

// A ResNet block's conv by conv members at one stage (conv1, conv2, conv3 and, for block 0, the
// downsample), with the model's stride placement: pytorch style strides conv2, caffe conv1.
void add_block_convs(CaseList& l, const std::string& p, Shape x, int64_t planes, int stride, bool caffe,
                     bool block0, bool dcn, DType out) {
  const DType act = l.act();
  const int64_t c = x[3], e = planes * 4;
  const int s1 = caffe ? stride : 1, s2 = caffe ? 1 : stride;
  const Shape x2 = {x[0], conv_out(x[1], 1, s1, 0, 1), conv_out(x[2], 1, s1, 0, 1), planes};
  const Shape x3 = {x[0], conv_out(x2[1], 3, s2, 1, 1), conv_out(x2[2], 3, s2, 1, 1), planes};
  if (block0) add_conv(l, p + ".downsample", {.x = x, .w = {e, c, 1, 1}, .a = attrs(stride, 0, false), .in = act, .out = out});
  add_conv(l, p + ".conv1", {.x = x, .w = {planes, c, 1, 1}, .a = attrs(s1, 0, true), .in = act, .out = dcn ? DType::kF32 : act});
  if (dcn) {
    add_conv(l, p + ".conv2.conv_offset", {.x = x2, .w = {27, planes, 3, 3}, .a = attrs(s2, 1, false)});
  } else {
    add_conv(l, p + ".conv2", {.x = x2, .w = {planes, planes, 3, 3}, .a = attrs(s2, 1, true), .in = act, .out = act});
  }
  // conv3 adds the identity in place when the identity has the output's dtype (resnet.cpp).
  const DType c3_in = dcn ? DType::kF32 : act;
  const bool over = block0 || out == act;
  add_conv(l, p + ".conv3", {.x = x3, .w = {e, planes, 1, 1}, .a = attrs(1, 0, true), .in = c3_in, .out = out,
                             .residual = over ? Residual::kOver : Residual::kSeparate});
}

}  // namespace

void conv2d_cases(CaseList& l) {
  const DType act = l.act();
  switch (l.set()) {
    case ShapeSet::kAwkward: {
      add_conv(l, "1 pixel 1x1", {.x = {1, 1, 1, 5}, .w = {3, 5, 1, 1}, .large = 100});
      add_conv(l, "3x3 p1 relu odd map", {.x = {2, 9, 11, 5}, .w = {7, 5, 3, 3}, .a = attrs(1, 1, true), .large = 100});
      add_conv(l, "3x3 s2 residual", {.x = {1, 13, 17, 19}, .w = {33, 19, 3, 3}, .a = attrs(2, 1, true),
                                      .residual = Residual::kSeparate, .large = 100});
      add_conv(l, "7x7 s2 p3 stem-like", {.x = {1, 31, 45, 3}, .w = {64, 3, 7, 7}, .a = attrs(2, 3, true)});
      add_conv(l, "3x3 dilation 2", {.x = {1, 10, 10, 17}, .w = {15, 17, 3, 3},
                                     .a = {.pad_h = 2, .pad_w = 2, .dilation_h = 2, .dilation_w = 2}, .bias = false});
      add_conv(l, "3x3 groups 3", {.x = {1, 7, 9, 12}, .w = {6, 4, 3, 3}, .a = {.pad_h = 1, .pad_w = 1, .groups = 3}});
      add_conv(l, "3x3 stride 1x2 pad 0x1", {.x = {1, 6, 9, 8}, .w = {8, 8, 3, 3},
                                             .a = {.stride_h = 1, .stride_w = 2, .pad_h = 0, .pad_w = 1}});
      // A direct-kernel 1x1 (64 in, 128 out) on 35 pixels: a row count no vector width divides.
      add_conv(l, "1x1 64->128 35 px", {.x = {1, 5, 7, 64}, .w = {128, 64, 1, 1}, .large = 100});
      add_conv(l, "1x1 over residual", {.x = {1, 9, 11, 16}, .w = {16, 16, 1, 1}, .a = attrs(1, 0, true),
                                        .residual = Residual::kOver});
      add_conv(l, "1 row 1x3", {.x = {1, 1, 17, 4}, .w = {5, 4, 1, 3}, .a = {.pad_w = 1}});
      if (l.bf16()) {
        add_conv(l, "bf16 3x3 -> bf16", {.x = {1, 9, 11, 24}, .w = {24, 24, 3, 3}, .a = attrs(1, 1, true),
                                         .in = DType::kBF16, .out = DType::kBF16});
        add_conv(l, "f32 -> bf16 s2", {.x = {1, 13, 15, 3}, .w = {16, 3, 7, 7}, .a = attrs(2, 3, true),
                                       .out = DType::kBF16});
        add_conv(l, "bf16 + bf16 res -> f32", {.x = {1, 5, 7, 16}, .w = {24, 16, 1, 1}, .a = attrs(1, 0, true),
                                               .in = DType::kBF16, .residual = Residual::kSeparate});
        add_conv(l, "bf16 over bf16 res", {.x = {1, 5, 7, 16}, .w = {16, 16, 1, 1}, .a = attrs(1, 0, true),
                                           .in = DType::kBF16, .out = DType::kBF16, .residual = Residual::kOver});
      }
      return;
    }
    case ShapeSet::kTiny: {
      // ResNet-50 pytorch style at 6x480x800; layer1 and layer2's stride-1 blocks run fused
      // (bottleneck cases), block 0 of layer2-4 and layer3-4's other blocks conv by conv.
      add_conv(l, "img.stem", {.x = {6, 480, 800, 3}, .w = {64, 3, 7, 7}, .a = attrs(2, 3, true), .out = act});
      add_block_convs(l, "img.layer2.0", {6, 120, 200, 256}, 128, 2, false, true, false, act);
      add_block_convs(l, "img.layer3.0", {6, 60, 100, 512}, 256, 2, false, true, false, act);
      add_block_convs(l, "img.layer3.1", {6, 30, 50, 1024}, 256, 1, false, false, false, act);
      add_block_convs(l, "img.layer4.0", {6, 30, 50, 1024}, 512, 2, false, true, false, act);
      add_block_convs(l, "img.layer4.1", {6, 15, 25, 2048}, 512, 1, false, false, false, act);
      // The stage's last conv3 writes f32 for the neck: over its residual in f32 (as layer4.1's),
      // beside a bf16 residual in bf16.
      if (l.bf16()) {
        add_conv(l, "img.layer4.2.conv3", {.x = {6, 15, 25, 512}, .w = {2048, 512, 1, 1}, .a = attrs(1, 0, true),
                                       .in = act, .residual = Residual::kSeparate});
      }
      add_conv(l, "img.neck.lateral", {.x = {6, 15, 25, 2048}, .w = {256, 2048, 1, 1}});
      add_conv(l, "img.neck.fpn_conv", {.x = {6, 15, 25, 256}, .w = {256, 256, 3, 3}, .a = attrs(1, 1, false)});
      return;
    }
    case ShapeSet::kBase: {
      // ResNet-101 caffe at 6x928x1600: the stem, a block 0 of layer2 (its stride on conv1), a
      // DCN block of layer3 (its offset conv; the deform conv itself is a deform_conv2d case),
      // and the FPN on layer2-4 with its extra stride-2 level.
      add_conv(l, "img.stem", {.x = {6, 928, 1600, 3}, .w = {64, 3, 7, 7}, .a = attrs(2, 3, true), .out = act});
      add_block_convs(l, "img.layer2.0", {6, 232, 400, 256}, 128, 2, true, true, false, act);
      // Base's layer2 runs conv by conv (at 116x200 a strip of rows is too narrow to fuse).
      add_conv(l, "img.layer2.1.conv1", {.x = {6, 116, 200, 512}, .w = {128, 512, 1, 1}, .a = attrs(1, 0, true),
                                         .in = act, .out = act});
      add_block_convs(l, "img.layer3.1", {6, 58, 100, 1024}, 256, 1, true, false, true, act);
      add_block_convs(l, "img.layer4.1", {6, 29, 50, 2048}, 512, 1, true, false, true, act);
      const Shape levels[] = {{6, 116, 200, 512}, {6, 58, 100, 1024}, {6, 29, 50, 2048}};
      for (int i = 0; i < 3; ++i) {
        const Shape& x = levels[i];
        add_conv(l, "img.neck.lateral." + std::to_string(i), {.x = x, .w = {256, x[3], 1, 1}});
        add_conv(l, "img.neck.fpn_conv." + std::to_string(i), {.x = {6, x[1], x[2], 256}, .w = {256, 256, 3, 3},
                                                            .a = attrs(1, 1, false)});
      }
      add_conv(l, "img.neck.fpn_conv.3 (extra)", {.x = {6, 29, 50, 256}, .w = {256, 256, 3, 3}, .a = attrs(2, 1, false)});
      return;
    }
  }
}

namespace {

struct BlockSpec {
  Shape x;  // NHWC, channels C
  int64_t planes = 0, out = 0;
  bool downsample = false, over_input = false;
  DType act = DType::kF32, in = DType::kF32, y = DType::kF32;
};

void add_block(CaseList& l, std::string tag, BlockSpec s) {
  l.add(std::move(tag), [s](Ops& ops, uint64_t seed) {
    const int64_t c = s.x[3], p = s.planes, e = s.out;
    auto conv = [&](const Shape& w, const Conv2dAttrs& a, uint64_t k) {
      const Tensor b = values({w[0]}, seed + 10 * k, 0.5f);
      return ops.prepare_conv2d(weight(w, seed + 10 * k + 1, w[1] * w[2] * w[3]), &b, a);
    };
    const PreparedWeights c1 = conv({p, c, 1, 1}, {.relu = true}, 1);
    const PreparedWeights c2 = conv({p, p, 3, 3}, {.pad_h = 1, .pad_w = 1, .relu = true}, 2);
    const PreparedWeights c3 = conv({e, p, 1, 1}, {.relu = true, .residual = true}, 3);
    PreparedWeights ds;
    if (s.downsample) ds = conv({e, c, 1, 1}, {}, 4);
    const PreparedWeights block = ops.prepare_bottleneck(c1, c2, c3, s.downsample ? &ds : nullptr, s.act);
    Tensor xh = values(s.x, seed + 5);
    if (s.in == DType::kBF16) xh = to_bf16(xh);
    ops.bottleneck(ops.backend().upload(xh), block, s.y, s.over_input, "x");
  });
}

}  // namespace

void bottleneck_cases(CaseList& l) {
  const DType act = l.act();
  switch (l.set()) {
    case ShapeSet::kAwkward:
      add_block(l, "6->3->6 odd map", {.x = {2, 9, 11, 6}, .planes = 3, .out = 6});
      add_block(l, "downsample 10->16", {.x = {1, 7, 13, 10}, .planes = 4, .out = 16, .downsample = true});
      add_block(l, "over input", {.x = {2, 5, 3, 8}, .planes = 4, .out = 8, .over_input = true});
      add_block(l, "1 row", {.x = {1, 1, 17, 16}, .planes = 8, .out = 16});
      add_block(l, "1 pixel", {.x = {1, 1, 1, 8}, .planes = 5, .out = 8});
      if (l.bf16()) {
        add_block(l, "bf16 act f32 out", {.x = {1, 9, 11, 16}, .planes = 8, .out = 16, .act = DType::kBF16,
                                          .in = DType::kBF16});
        add_block(l, "bf16 over input", {.x = {1, 6, 5, 16}, .planes = 8, .out = 16, .over_input = true,
                                         .act = DType::kBF16, .in = DType::kBF16, .y = DType::kBF16});
      }
      return;
    case ShapeSet::kTiny:
      add_block(l, "img.layer1.0", {.x = {6, 120, 200, 64}, .planes = 64, .out = 256, .downsample = true, .act = act,
                                    .in = act, .y = act});
      add_block(l, "img.layer1.1", {.x = {6, 120, 200, 256}, .planes = 64, .out = 256, .over_input = true, .act = act,
                                    .in = act, .y = act});
      add_block(l, "img.layer2.1", {.x = {6, 60, 100, 512}, .planes = 128, .out = 512, .over_input = true,
                                    .act = act, .in = act, .y = act});
      return;
    case ShapeSet::kBase:
      add_block(l, "img.layer1.0", {.x = {6, 232, 400, 64}, .planes = 64, .out = 256, .downsample = true, .act = act,
                                    .in = act, .y = act});
      add_block(l, "img.layer1.1", {.x = {6, 232, 400, 256}, .planes = 64, .out = 256, .over_input = true, .act = act,
                                    .in = act, .y = act});
      return;
  }
}

namespace {

struct DcnSpec {
  Shape x, w;
  DeformConv2dAttrs a = {};
  bool bias = true;
  float offset = 2.0f;  // offsets and mask logits uniform in +-offset
  DType in = DType::kF32, y = DType::kF32;  // bf16 only in bf16 precision (the model's: act)
};

void add_dcn(CaseList& l, std::string tag, DcnSpec s) {
  l.add(std::move(tag), [s](Ops& ops, uint64_t seed) {
    const Tensor b = values({s.w[0]}, seed + 1, 0.5f);
    const PreparedWeights w =
        ops.prepare_deform_conv2d(weight(s.w, seed + 2, s.w[1] * s.w[2] * s.w[3]), s.bias ? &b : nullptr, s.a);
    const int64_t ho = conv_out(s.x[1], s.w[2], s.a.stride, s.a.pad, s.a.dilation);
    const int64_t wo = conv_out(s.x[2], s.w[3], s.a.stride, s.a.pad, s.a.dilation);
    const Tensor xs = values(s.x, seed + 3);
    const Tensor x = ops.backend().upload(s.in == DType::kBF16 ? to_bf16(xs) : xs);
    const Tensor om = ops.backend().upload(values({s.x[0], ho, wo, 3 * s.w[2] * s.w[3]}, seed + 4, s.offset));
    ops.deform_conv2d(x, om, w, "x", s.y);
  });
}

}  // namespace

void deform_conv2d_cases(CaseList& l) {
  switch (l.set()) {
    case ShapeSet::kAwkward:
      add_dcn(l, "3x3 odd map", {.x = {1, 9, 11, 6}, .w = {7, 6, 3, 3}});
      add_dcn(l, "stride 2", {.x = {2, 13, 17, 10}, .w = {12, 10, 3, 3}, .a = {.stride = 2}});
      add_dcn(l, "dilation 2 no bias", {.x = {1, 8, 8, 5}, .w = {3, 5, 3, 3}, .a = {.pad = 2, .dilation = 2},
                                        .bias = false});
      add_dcn(l, "1 pixel", {.x = {1, 1, 1, 4}, .w = {5, 4, 3, 3}});
      // Offsets of up to 12 pixels: most taps land outside the map and read zeros.
      add_dcn(l, "far offsets", {.x = {1, 6, 7, 9}, .w = {8, 9, 3, 3}, .offset = 12.0f});
      add_dcn(l, "ReLU, 17 channels", {.x = {1, 9, 11, 17}, .w = {7, 17, 3, 3}, .a = {.relu = true}});
      if (l.bf16()) {
        add_dcn(l, "bf16 x and y, ReLU, 17 channels",
                {.x = {1, 9, 11, 17}, .w = {7, 17, 3, 3}, .a = {.relu = true}, .in = DType::kBF16, .y = DType::kBF16});
      }
      return;
    case ShapeSet::kTiny:
      // tiny's ResNet-50 has no DCN: a stand-in at tiny's layer3 scale.
      add_dcn(l, "layer3 scale (no DCN in tiny)", {.x = {6, 30, 50, 256}, .w = {256, 256, 3, 3}, .a = {.relu = true},
                                                   .in = l.act(), .y = l.act()});
      return;
    case ShapeSet::kBase:
      // As the model runs them: ReLU fused, x and y in the activation dtype.
      add_dcn(l, "img.layer3.1.conv2", {.x = {6, 58, 100, 256}, .w = {256, 256, 3, 3}, .a = {.relu = true},
                                        .in = l.act(), .y = l.act()});
      add_dcn(l, "img.layer4.1.conv2", {.x = {6, 29, 50, 512}, .w = {512, 512, 3, 3}, .a = {.relu = true},
                                        .in = l.act(), .y = l.act()});
      return;
  }
}

namespace {

void add_pool(CaseList& l, std::string tag, Shape x, DType dtype, float large = 1.0f, float shift = 0.0f) {
  l.add(std::move(tag), [x, dtype, large, shift](Ops& ops, uint64_t seed) {
    Tensor h = values(x, seed, 1.0f, large);
    float* p = h.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i) p[i] += shift;
    if (dtype == DType::kBF16) h = to_bf16(h);
    ops.max_pool2d(ops.backend().upload(h), "x");
  });
}

void add_upsample(CaseList& l, std::string tag, Shape coarse, Shape fine) {
  l.add(std::move(tag), [coarse, fine](Ops& ops, uint64_t seed) {
    const Tensor c = ops.backend().upload(values(coarse, seed, 1.0f, 100.0f));
    const Tensor f = ops.backend().upload(values(fine, seed + 1, 1.0f, 100.0f));
    ops.upsample_nearest_add(c, f, "x");
  });
}

}  // namespace

void max_pool2d_cases(CaseList& l) {
  switch (l.set()) {
    case ShapeSet::kAwkward:
      add_pool(l, "1 pixel", {1, 1, 1, 3}, DType::kF32);
      add_pool(l, "odd map", {2, 9, 11, 5}, DType::kF32, 100.0f);
      // All negative: a padding read as 0 instead of -inf would win every border window.
      add_pool(l, "all negative", {1, 6, 7, 17}, DType::kF32, 1.0f, -5.0f);
      add_pool(l, "2x2 map 64 ch", {1, 2, 2, 64}, DType::kF32);
      add_pool(l, "bf16 odd map", {1, 7, 5, 33}, DType::kBF16, 100.0f);
      return;
    case ShapeSet::kTiny: add_pool(l, "img.maxpool", {6, 240, 400, 64}, l.act()); return;
    case ShapeSet::kBase: add_pool(l, "img.maxpool", {6, 464, 800, 64}, l.act()); return;
  }
}

void upsample_nearest_add_cases(CaseList& l) {
  switch (l.set()) {
    case ShapeSet::kAwkward:
      add_upsample(l, "1 pixel to 2x2", {1, 1, 1, 3}, {1, 2, 2, 3});
      add_upsample(l, "not 2x: 5x6 to 9x11", {2, 5, 6, 7}, {2, 9, 11, 7});
      add_upsample(l, "2x 16 ch", {1, 4, 5, 16}, {1, 8, 10, 16});
      add_upsample(l, "same size", {1, 3, 3, 5}, {1, 3, 3, 5});
      return;
    case ShapeSet::kTiny:
      // tiny's FPN has one level, so no top-down sum: tiny's layer3-to-layer2 scale stands in.
      add_upsample(l, "30x50 to 60x100 (not in tiny)", {6, 30, 50, 256}, {6, 60, 100, 256});
      return;
    case ShapeSet::kBase:
      add_upsample(l, "img.neck.top_down.1", {6, 29, 50, 256}, {6, 58, 100, 256});
      add_upsample(l, "img.neck.top_down.0", {6, 58, 100, 256}, {6, 116, 200, 256});
      return;
  }
}

// The image stage's first op on camera pixels: no resize (base), upstream's halving (tiny), a
// scale that lands between pixels (small's 0.8), odd sizes, either channel order.
void image_preprocess_cases(CaseList& l) {
  auto add = [&](std::string tag, int64_t n, int64_t h, int64_t w, double scale, bool to_rgb) {
    l.add(std::move(tag), [=](Ops& ops, uint64_t seed) {
      Tensor px = Tensor::empty({n, h, w, 3}, DType::kU8);
      uint8_t* p = px.data<uint8_t>();
      for (int64_t i = 0; i < px.numel(); ++i) p[i] = static_cast<uint8_t>(mix(seed + static_cast<uint64_t>(i)) >> 56);
      // The model's own settings (model/bevformer.h): upstream's img_norm_cfg, this scale, /32.
      ImageConfig ic;
      ic.to_rgb = to_rgb;
      ic.resize_scale = scale;
      ic.size_divisor = 32;
      const ImagePreprocessAttrs a = image_preprocess_attrs(ic, h, w);
      ops.image_preprocess(up(ops, px), a, "img");
    });
  };
  if (l.set() == ShapeSet::kAwkward) {
    add("1 camera 33x47, no resize", 1, 33, 47, 1.0, true);
    add("2 cameras 37x61 halved, BGR kept", 2, 37, 61, 0.5, false);
    add("3 cameras 45x70 at 0.8", 3, 45, 70, 0.8, true);
    add("1 camera 64x96 at 1.3 (enlarged)", 1, 64, 96, 1.3, true);
    return;
  }
  // nuScenes' 1600x900 cameras: tiny halves them (800x450 padded to 800x480), base pads them.
  add(l.set() == ShapeSet::kTiny ? "img (tiny: 0.5)" : "img (base: no resize)", 6, 900, 1600,
      l.set() == ShapeSet::kTiny ? 0.5 : 1.0, true);
}

}  // namespace bev::op_harness
