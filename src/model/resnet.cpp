#include "model/resnet.h"

#include <algorithm>
#include <string>

#include "backend/batch_norm.h"
#include "bevformer/error.h"

namespace bev {
namespace {

// The dtype of activations only convolutions read: bf16 in bf16 precision (half the bytes, and no
// rounding of an f32 copy in every conv), else f32.
DType conv_activations(Ops& ops) { return ops.backend().precision() == Precision::kBF16 ? DType::kBF16 : DType::kF32; }

Conv2dAttrs conv_attrs(int stride, int pad, bool relu, bool residual = false) {
  Conv2dAttrs a;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = pad;
  a.relu = relu;
  a.residual = residual;
  return a;
}

BottleneckWeights load_bottleneck(Ops& ops, const WeightSource& w, const BackboneConfig& cfg, const std::string& p,
                                  int stride, bool dcn, bool downsample) {
  // pytorch style strides the 3x3, caffe style the first 1x1 (mmdet Bottleneck.conv1_stride).
  const int s1 = cfg.style == ResNetStyle::kCaffe ? stride : 1;
  const int s2 = cfg.style == ResNetStyle::kCaffe ? 1 : stride;
  BottleneckWeights b;
  b.dcn = dcn;
  b.has_downsample = downsample;
  // int8 precision runs every conv but DCNv2's offsets and sampling (f32 kernels of ours) in int8,
  // each on its calibrated input step (the labels are those bottleneck_forward gives the ops, the
  // calibration's keys); conv1 and conv2 then write u8 codes of the next conv's step, so the
  // chain stays int8 inside the block and t1, t2 take a quarter of f32's bytes.
  Conv2dAttrs a1 = w.int8_input(ops, p + ".conv1", conv_attrs(s1, 0, true));
  Conv2dAttrs a2 = dcn ? conv_attrs(s2, 1, true) : w.int8_input(ops, p + ".conv2", conv_attrs(s2, 1, true));
  const Conv2dAttrs a3 = w.int8_input(ops, p + ".conv3", conv_attrs(1, 0, true, true));
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
    b.downsample = load_conv_bn(ops, w, p + ".downsample.0", p + ".downsample.1", cfg.norm_eps,
                                conv_attrs(stride, 0, false), p + ".downsample");
  }
  if (!dcn && Ops::bottleneck_fusable(b.conv1, b.conv2, b.conv3, downsample ? &b.downsample : nullptr)) {
    b.fused = ops.prepare_bottleneck(b.conv1, b.conv2, b.conv3, downsample ? &b.downsample : nullptr, b.inner);
  }
  return b;
}

// out: the block output's dtype (b.inner is its t1's and t2's). x_is_private: nothing reads x
// after this block (it is the previous block's output inside a stage), so conv3 may write over it.
Tensor bottleneck_forward(Ops& ops, const BottleneckWeights& b, const Tensor& x, const std::string& p, DType out,
                          bool x_is_private) {
  const DType act = b.inner;
  // Depth-first where the backend says it pays (on the CPU: layer1 and layer2, whose maps are
  // far larger than the caches).
  if (b.fused.state && ops.backend().fuses_bottleneck(x.shape(), std::get<BottleneckAttrs>(b.fused.attrs))) {
    const bool over_input = !b.has_downsample && x_is_private && x.dtype() == out;
    return ops.bottleneck(x, b.fused, out, over_input, p);
  }
  const Tensor identity = b.has_downsample ? ops.conv2d(x, b.downsample, nullptr, p + ".downsample", out) : x;
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
  // private block input of the output's dtype.
  if (identity.dtype() == out && (b.has_downsample || x_is_private)) {
    return ops.conv2d_over_residual(out2, b.conv3, identity, p + ".conv3");
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
  // In int8 precision the stem reads s8 pixels: a camera's 8-bit pixels, normalized, are about as
  // fine as max|x| / 127 (tiny: 45 -> 32 ms, its error against f32 unchanged at the neck).
  r.stem = load_conv_bn(ops, w, "img_backbone.conv1", "img_backbone.bn1", cfg.norm_eps, conv_attrs(2, 3, true),
                        "img_backbone.conv1");
  const std::vector<int> blocks = resnet_stage_blocks(cfg);
  for (int s = 0; s < cfg.num_stages; ++s) {
    std::vector<BottleneckWeights> stage;
    for (int b = 0; b < blocks[static_cast<size_t>(s)]; ++b) {
      const std::string p = "img_backbone.layer" + std::to_string(s + 1) + "." + std::to_string(b);
      const int stride = b == 0 ? cfg.strides[static_cast<size_t>(s)] : 1;
      stage.push_back(load_bottleneck(ops, w, cfg, p, stride, resnet_stage_has_dcn(cfg, s), b == 0));
    }
    r.stages.push_back(std::move(stage));
  }
  return r;
}

std::vector<Tensor> resnet_forward(Ops& ops, const ResNetWeights& w, const BackboneConfig& cfg, const Tensor& x) {
  const DType act = conv_activations(ops);
  ops.set_stage("img.stem");
  // In bf16 the pool reads and writes half the bytes, and its bf16 output is exactly what layer1's
  // convs would round the f32 pool output to (the max commutes with rounding).
  Tensor h = ops.max_pool2d(ops.conv2d(x, w.stem, nullptr, "img_backbone.conv1", act), "img_backbone.maxpool");
  std::vector<Tensor> outs;
  const int last = *std::max_element(cfg.out_indices.begin(), cfg.out_indices.end());
  for (int s = 0; s <= last; ++s) {
    const std::string layer = "layer" + std::to_string(s + 1);
    ops.set_stage("img." + layer);
    const auto& stage = w.stages[static_cast<size_t>(s)];
    // The stages the neck reads end in f32 (the neck and the taps see what they always saw).
    const bool is_output = std::find(cfg.out_indices.begin(), cfg.out_indices.end(), s) != cfg.out_indices.end();
    for (size_t b = 0; b < stage.size(); ++b) {
      const DType out = is_output && b + 1 == stage.size() ? DType::kF32 : act;
      h = bottleneck_forward(ops, stage[b], h, "img_backbone." + layer + "." + std::to_string(b), out,
                             /*x_is_private=*/b > 0);
    }
    if (is_output) outs.push_back(h);
  }
  return outs;
}

}  // namespace bev
