#include "model/fpn.h"

#include <string>

#include "bevformer/error.h"

namespace bev {
namespace {

// The neck is not int8 in int8 precision (it runs in the float arithmetic: bf16 on AMX and AMD, else
// f32, Backend::float_precision): in int8 it tripled the neck's error (tiny's synthetic
// drive: neck.0 4.6e-3 -> 1.4e-2 relative L2 against f32, bev_embed 4.5e-4 -> 1.4e-3; golden
// micro alike) to save 7 of tiny's 740 ms (docs/PERF.md "int8 precision").
PreparedWeights load_conv(Ops& ops, const WeightSource& w, const std::string& p, int k, int stride) {
  Conv2dAttrs a;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = k / 2;
  const Tensor bias = w.get(p + ".bias");
  return ops.prepare_conv2d(w.get(p + ".weight"), &bias, a);
}

int used_levels(const NeckConfig& cfg) { return fpn_backbone_end_level(cfg) - cfg.start_level; }

}  // namespace

FpnWeights load_fpn(Ops& ops, const WeightSource& w, const NeckConfig& cfg) {
  const int extra = fpn_num_extra_levels(cfg);
  if (extra > 0 && cfg.add_extra_convs == ExtraConvs::kOff) {
    throw Error(ErrorKind::kUnsupported, "img_neck adds " + std::to_string(extra) + " max-pooled level(s)")
        .expected("add_extra_convs set (every BEVFormer config uses 'on_output')");
  }
  FpnWeights f;
  const int used = used_levels(cfg);
  for (int i = 0; i < used; ++i) {
    f.lateral.push_back(load_conv(ops, w, "img_neck.lateral_convs." + std::to_string(i) + ".conv", 1, 1));
    f.output.push_back(load_conv(ops, w, "img_neck.fpn_convs." + std::to_string(i) + ".conv", 3, 1));
  }
  for (int i = 0; i < extra; ++i) {
    f.output.push_back(load_conv(ops, w, "img_neck.fpn_convs." + std::to_string(used + i) + ".conv", 3, 2));
  }
  return f;
}

std::vector<Tensor> fpn_forward(Ops& ops, const FpnWeights& w, const NeckConfig& cfg, const std::vector<Tensor>& inputs) {
  ops.set_stage("img.neck");
  const int used = used_levels(cfg);
  if (static_cast<int>(inputs.size()) < fpn_backbone_end_level(cfg)) {
    throw Error(ErrorKind::kInternal, "FPN got " + std::to_string(inputs.size()) + " backbone outputs");
  }
  std::vector<Tensor> lat;
  for (int i = 0; i < used; ++i) {
    lat.push_back(ops.conv2d(inputs[static_cast<size_t>(i + cfg.start_level)], w.lateral[static_cast<size_t>(i)],
                             nullptr, "img_neck.lateral_convs." + std::to_string(i)));
  }
  for (int i = used - 1; i > 0; --i) {
    lat[static_cast<size_t>(i - 1)] = ops.upsample_nearest_add(lat[static_cast<size_t>(i)], lat[static_cast<size_t>(i - 1)],
                                                               "img_neck.top_down." + std::to_string(i - 1));
  }
  std::vector<Tensor> outs;
  for (int i = 0; i < used; ++i) {
    outs.push_back(ops.conv2d(lat[static_cast<size_t>(i)], w.output[static_cast<size_t>(i)], nullptr,
                              "img_neck.fpn_convs." + std::to_string(i)));
  }
  for (int i = used; i < cfg.num_outs; ++i) {
    Tensor src;
    if (i == used) {
      switch (cfg.add_extra_convs) {
        case ExtraConvs::kOnInput: src = inputs[static_cast<size_t>(fpn_backbone_end_level(cfg) - 1)]; break;
        case ExtraConvs::kOnLateral: src = lat.back(); break;
        case ExtraConvs::kOnOutput: src = outs.back(); break;
        case ExtraConvs::kOff: throw Error(ErrorKind::kInternal, "FPN extra level without extra convs");
      }
    } else {
      src = cfg.relu_before_extra_convs ? ops.relu(outs.back(), "img_neck.extra_relu." + std::to_string(i)) : outs.back();
    }
    outs.push_back(ops.conv2d(src, w.output[static_cast<size_t>(i)], nullptr, "img_neck.fpn_convs." + std::to_string(i)));
  }
  return outs;
}

}  // namespace bev
