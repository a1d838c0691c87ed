// mmdet FPN (spec §2.3): 1x1 laterals, nearest top-down sums, 3x3 output convs, then extra
// stride-2 convs ('on_input' / 'on_lateral' / 'on_output'); ReLU only before the 2nd and later
// extra convs when relu_before_extra_convs. No norm, no activation otherwise. NHWC.
#pragma once

#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace bev {

// img_neck
struct FpnWeights {
  std::vector<PreparedWeights> lateral;  // .lateral_convs.{i}.conv (1x1, bias)
  std::vector<PreparedWeights> output;   // .fpn_convs.{i}.conv (3x3; the extra levels stride 2)
};

FpnWeights load_fpn(Ops& ops, const WeightSource& w, const NeckConfig& cfg);

// inputs: the backbone outputs, NHWC -> num_outs levels, NHWC, finest first.
std::vector<Tensor> fpn_forward(Ops& ops, const FpnWeights& w, const NeckConfig& cfg, const std::vector<Tensor>& inputs);

}  // namespace bev
