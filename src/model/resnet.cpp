#include "model/resnet.h"

#include <algorithm>
#include <string>

#include "backend/batch_norm.h"
#include "bevformer/error.h"

namespace bev {
namespace {

// The dtype of float activations only convolutions read: bf16 where the float arithmetic is
// bf16 (bf16 precision, and int8's floats on AMX and AMD: half the bytes, and no rounding of an f32 copy
// in every conv; int8 convs quantize and dequantize bf16 as they do f32), else f32.
DType conv_activations(Ops& ops) {
  return ops.backend().float_precision() == Precision::kBF16 ? DType::kBF16 : DType::kF32;
}

Conv2dAttrs conv_attrs(int stride, int pad, bool relu, bool residual = false) {
  Conv2dAttrs a;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = pad;
  a.relu = relu;
  a.residual = residual;
  return a;
}

// Whether stage s's output feeds the neck (cfg.out_indices).
bool is_output_stage(const BackboneConfig& cfg, int s) {
  return std::find(cfg.out_indices.begin(), cfg.out_indices.end(), s) != cfg.out_indices.end();
}

// In int8 precision, the step of block `p`'s input as u8 codes: its conv1's calibrated input step
// (the input follows a ReLU, so it is u8), which its downsample's must equal (the same tensor).
// 0 in other precisions.
float block_input_step(Ops& ops, const WeightSource& w, const std::string& p, bool downsample) {
  if (ops.backend().precision() != Precision::kInt8) return 0;
  const Conv2dAttrs a1 = w.int8_input(ops, p + ".conv1", {});
  if (!a1.int8_unsigned) return 0;
  const Conv2dAttrs ads = downsample ? w.int8_input(ops, p + ".downsample", {}) : a1;
  if (ads.int8_step != a1.int8_step || ads.int8_unsigned != a1.int8_unsigned) {
    throw Error(ErrorKind::kInvalidInput, "the calibration gives " + p + ".conv1 and " + p +
                                              ".downsample different ranges of their one input")
        .expected("a calibration file as `bevformer calibrate` writes it")
        .hint("make it again with `bevformer calibrate`");
  }
  return a1.int8_step;
}

// in_step: the step of the block input's u8 codes (0: a float input). out_step: the step of the
// output's u8 codes, the next block's input (0: a float output, in `float_out`).
BottleneckWeights load_bottleneck(Ops& ops, const WeightSource& w, const BackboneConfig& cfg, const std::string& p,
                                  int stride, bool dcn, bool downsample, float in_step, float out_step,
                                  DType float_out) {
  // pytorch style strides the 3x3, caffe style the first 1x1 (mmdet Bottleneck.conv1_stride).
  const int s1 = cfg.style == ResNetStyle::kCaffe ? stride : 1;
  const int s2 = cfg.style == ResNetStyle::kCaffe ? 1 : stride;
  BottleneckWeights b;
  b.dcn = dcn;
  b.has_downsample = downsample;
  // int8 precision runs every conv but DCNv2's offsets and sampling (our kernels, in the float
  // arithmetic: Backend::float_precision) in int8,
  // each on its calibrated input step (the labels are those bottleneck_forward gives the ops, the
  // calibration's keys); conv1 and conv2 then write u8 codes of the next conv's step, so the
  // chain stays int8 inside the block and t1, t2 take a quarter of f32's bytes.
  Conv2dAttrs a1 = w.int8_input(ops, p + ".conv1", conv_attrs(s1, 0, true));
  Conv2dAttrs a2 = dcn ? conv_attrs(s2, 1, true) : w.int8_input(ops, p + ".conv2", conv_attrs(s2, 1, true));
  Conv2dAttrs a3 = w.int8_input(ops, p + ".conv3", conv_attrs(1, 0, true, true));
  Conv2dAttrs ads = conv_attrs(stride, 0, false);
  if (downsample) ads = w.int8_input(ops, p + ".downsample", ads);
  // Between blocks int8 precision keeps u8 codes too: conv3 writes the next block's input codes
  // and adds the identity as codes, the block's own u8 input or the downsample's s8 output (the
  // sum of oneDNN's int8 convolution reads them from the output buffer, in place). An identity
  // that is float (a float block input without a downsample) keeps the output float.
  if (!downsample && in_step == 0) out_step = 0;
  a3.int8_out_step = out_step;
  if (downsample && out_step > 0) {
    ads.int8_out_step = w.int8_output_step(ops, p + ".downsample", /*relu=*/false);
    a3.int8_residual_step = ads.int8_out_step;
  } else if (!downsample && in_step > 0) {
    a3.int8_residual_step = in_step;
    a3.int8_residual_unsigned = true;
  }
  // What conv3 and the downsample write: their int8 codes, else float_out.
  const auto written = [float_out](const Conv2dAttrs& a) {
    const DType codes = conv2d_int8_output(a);
    return codes == DType::kF32 ? float_out : codes;
  };
  b.out = written(a3);
  b.identity = written(ads);
  b.inner = conv_activations(ops);
  if (!dcn && a1.int8_step > 0 && a2.int8_step > 0 && a2.int8_unsigned && a3.int8_step > 0 && a3.int8_unsigned) {
    a1.int8_out_step = a2.int8_step;
    a2.int8_out_step = a3.int8_step;
    b.inner = DType::kU8;
  }
  b.conv1 = load_conv_bn(ops, w, p + ".conv1", p + ".bn1", cfg.norm_eps, a1);
  if (dcn) {
    const Tensor off_b = w.get(p + ".conv2.conv_offset.bias");
    b.conv2_offset = ops.prepare_conv2d(w.get(p + ".conv2.conv_offset.weight"), &off_b, conv_attrs(s2, 1, false));
    Tensor fw, fb;
    fold_batch_norm(w.get(p + ".conv2.weight"), nullptr, w.get(p + ".bn2.weight"), w.get(p + ".bn2.bias"),
                    w.get(p + ".bn2.running_mean"), w.get(p + ".bn2.running_var"), static_cast<float>(cfg.norm_eps),
                    &fw, &fb);
    b.conv2 = ops.prepare_deform_conv2d(fw, &fb, {.stride = s2, .pad = 1, .dilation = 1, .relu = true});
  } else {
    b.conv2 = load_conv_bn(ops, w, p + ".conv2", p + ".bn2", cfg.norm_eps, a2);
  }
  b.conv3 = load_conv_bn(ops, w, p + ".conv3", p + ".bn3", cfg.norm_eps, a3);
  if (downsample) {
    b.downsample = load_conv_bn(ops, w, p + ".downsample.0", p + ".downsample.1", cfg.norm_eps, ads);
  }
  // The fused block reads a float input: a block whose input arrives as codes runs conv by conv,
  // and so does an int8 block whose float edges are bf16 (the fused op keeps int8 members' edges
  // f32: Ops::bottleneck).
  const bool int8_bf16_edges = a1.int8_step > 0 && float_out == DType::kBF16;
  if (!dcn && in_step == 0 && !int8_bf16_edges &&
      Ops::bottleneck_fusable(b.conv1, b.conv2, b.conv3, downsample ? &b.downsample : nullptr)) {
    b.fused = ops.prepare_bottleneck(b.conv1, b.conv2, b.conv3, downsample ? &b.downsample : nullptr, b.inner);
  }
  return b;
}

// x_is_private: nothing reads x after this block (it is the previous block's output inside a
// stage), so conv3 may write over it.
Tensor bottleneck_forward(Ops& ops, const BottleneckWeights& b, const Tensor& x, const std::string& p,
                          bool x_is_private) {
  const DType act = b.inner, out = b.out;
  // Depth-first where the backend says it pays (on the CPU: layer1 and layer2, whose maps are
  // far larger than the caches).
  if (b.fused.state && ops.backend().fuses_bottleneck(x.shape(), std::get<BottleneckAttrs>(b.fused.attrs))) {
    const bool over_input = !b.has_downsample && x_is_private && x.dtype() == out;
    return ops.bottleneck(x, b.fused, out, over_input, p);
  }
  const Tensor identity = b.has_downsample ? ops.conv2d(x, b.downsample, nullptr, p + ".downsample", b.identity) : x;
  const Tensor out1 = ops.conv2d(x, b.conv1, nullptr, p + ".conv1", act);
  Tensor out2;
  if (b.dcn) {
    const Tensor offset_mask = ops.conv2d(out1, b.conv2_offset, nullptr, p + ".conv2.conv_offset");
    // DCNv2 and its offset conv read conv1's output in the activation dtype, as conv2 does; the
    // ReLU is fused into its matmul, and its output (conv3 reads it) is in the activation dtype.
    out2 = ops.deform_conv2d(out1, offset_mask, b.conv2, p + ".conv2", act);
  } else {
    out2 = ops.conv2d(out1, b.conv2, nullptr, p + ".conv2", act);
  }
  // conv3 adds the identity in place when it is dead afterwards: the downsample's output, or a
  // private block input, of the output's dtype (or both int8 codes: u8 over the s8 identity).
  const bool codes = dtype_size(identity.dtype()) == 1 && dtype_size(out) == 1;
  if ((identity.dtype() == out || codes) && (b.has_downsample || x_is_private)) {
    return ops.conv2d_over_residual(out2, b.conv3, identity, p + ".conv3", out);
  }
  return ops.conv2d(out2, b.conv3, &identity, p + ".conv3", out);
}

}  // namespace

ResNetWeights load_resnet(Ops& ops, const WeightSource& w, const BackboneConfig& cfg) {
  if (cfg.in_channels != 3) {
    throw Error(ErrorKind::kUnsupported, "img_backbone.in_channels is " + std::to_string(cfg.in_channels))
        .expected("3 (camera images)");
  }
  ResNetWeights r;
  const std::vector<int> blocks = resnet_stage_blocks(cfg);
  const auto block_label = [](int s, int b) { return "img_backbone.layer" + std::to_string(s + 1) + "." + std::to_string(b); };
  // In int8 precision the stem reads s8 pixels: a camera's 8-bit pixels, normalized, are about as
  // fine as max|x| / 127 (tiny: 45 -> 32 ms, its error against f32 unchanged at the neck). It
  // writes layer1's u8 input codes, which the max pool keeps (the max of codes is the code of the
  // max).
  float in_step = cfg.num_stages > 0 && blocks[0] > 0 ? block_input_step(ops, w, block_label(0, 0), true) : 0;
  Conv2dAttrs stem = conv_attrs(2, 3, true);
  stem.int8_out_step = in_step;
  r.stem_out = in_step > 0 ? DType::kU8 : conv_activations(ops);
  r.stem = load_conv_bn(ops, w, "img_backbone.conv1", "img_backbone.bn1", cfg.norm_eps, stem, "img_backbone.conv1");
  for (int s = 0; s < cfg.num_stages; ++s) {
    std::vector<BottleneckWeights> stage;
    const int n = blocks[static_cast<size_t>(s)];
    for (int b = 0; b < n; ++b) {
      const int stride = b == 0 ? cfg.strides[static_cast<size_t>(s)] : 1;
      // Every block output is the next block's input or the neck's, in the activations' dtype:
      // u8 codes of its step in int8, except where the neck reads it (floats there); floats are
      // bf16 where the arithmetic is, which the neck's convs would round an f32 map to anyway
      // (the same rounding once: in bf16 precision the neck's outputs are the same bits; tiny's
      // layer4 conv3 took 4.8 ms writing f32 against 2.3 ms for the other blocks' bf16).
      const bool feeds_neck = b + 1 == n && is_output_stage(cfg, s);
      float out_step = 0;
      if (!feeds_neck && b + 1 < n) out_step = block_input_step(ops, w, block_label(s, b + 1), false);
      if (!feeds_neck && b + 1 == n && s + 1 < cfg.num_stages && blocks[static_cast<size_t>(s) + 1] > 0) {
        out_step = block_input_step(ops, w, block_label(s + 1, 0), true);
      }
      stage.push_back(load_bottleneck(ops, w, cfg, block_label(s, b), stride, resnet_stage_has_dcn(cfg, s), b == 0,
                                      in_step, out_step, conv_activations(ops)));
      in_step = stage.back().out == DType::kU8 ? out_step : 0;
    }
    r.stages.push_back(std::move(stage));
  }
  return r;
}

std::vector<Tensor> resnet_forward(Ops& ops, const ResNetWeights& w, const BackboneConfig& cfg, const Tensor& x) {
  ops.set_stage("img.stem");
  // In bf16 the pool reads and writes half the bytes, and its bf16 output is exactly what layer1's
  // convs would round the f32 pool output to (the max commutes with rounding).
  Tensor h = ops.max_pool2d(ops.conv2d(x, w.stem, nullptr, "img_backbone.conv1", w.stem_out), "img_backbone.maxpool");
  std::vector<Tensor> outs;
  const int last = *std::max_element(cfg.out_indices.begin(), cfg.out_indices.end());
  for (int s = 0; s <= last; ++s) {
    const std::string layer = "layer" + std::to_string(s + 1);
    ops.set_stage("img." + layer);
    const auto& stage = w.stages[static_cast<size_t>(s)];
    for (size_t b = 0; b < stage.size(); ++b) {
      h = bottleneck_forward(ops, stage[b], h, "img_backbone." + layer + "." + std::to_string(b), /*x_is_private=*/b > 0);
    }
    if (is_output_stage(cfg, s)) outs.push_back(h);
  }
  return outs;
}

}  // namespace bev
