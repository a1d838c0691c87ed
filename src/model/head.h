// BEVFormerHead's branches (spec §2.13): per decoder layer a classification branch
// (num_reg_fcs x [Linear, LayerNorm, ReLU], Linear -> classes) and a regression branch
// (num_reg_fcs x [Linear, ReLU], Linear -> code_size); the box-centre denormalization.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace bev {

// pts_bbox_head.cls_branches.{l}
struct ClsBranchWeights {
  std::vector<PreparedWeights> fc;       // .{3j} (hidden Linear)
  std::vector<LayerNormWeights> norm;    // .{3j+1}
  PreparedWeights out;                   // .{3*num_reg_fcs}
};

// pts_bbox_head.reg_branches.{l}
struct RegBranchWeights {
  std::vector<PreparedWeights> fc;  // .{2j} (hidden Linear + ReLU)
  PreparedWeights out;              // .{2*num_reg_fcs}
};

struct HeadWeights {
  std::vector<ClsBranchWeights> cls;  // one per decoder layer (aliases of one module without box refine)
  std::vector<RegBranchWeights> reg;
};

HeadWeights load_head(Ops& ops, const WeightSource& w, const ModelConfig& cfg);

Tensor cls_branch_forward(Ops& ops, const ClsBranchWeights& w, const Tensor& x, const std::string& label);  // [Q, classes]
Tensor reg_branch_forward(Ops& ops, const RegBranchWeights& w, const Tensor& x, const std::string& label);  // [Q, code]

// pc_range -> channels 0, 1, 4 = refined * (max - min) + min (upstream multiplies a float32
// tensor by the Python float difference, i.e. by its float32 rounding).
BboxDenormalizeAttrs bbox_denormalize_attrs(const std::array<double, 6>& pc_range);

}  // namespace bev
