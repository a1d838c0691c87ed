#include "model/head.h"

namespace bev {

HeadWeights load_head(Ops& ops, const WeightSource& w, const ModelConfig& cfg) {
  HeadWeights h;
  const int fcs = cfg.head.num_reg_fcs;
  for (int l = 0; l < cfg.transformer.decoder_layers; ++l) {
    const std::string cls = "pts_bbox_head.cls_branches." + std::to_string(l);
    const std::string reg = "pts_bbox_head.reg_branches." + std::to_string(l);
    ClsBranchWeights c;
    RegBranchWeights r;
    for (int j = 0; j < fcs; ++j) {
      c.fc.push_back(load_linear(ops, w, cls + "." + std::to_string(3 * j)));
      c.norm.push_back(load_layer_norm(ops, w, cls + "." + std::to_string(3 * j + 1)));
      r.fc.push_back(load_linear(ops, w, reg + "." + std::to_string(2 * j), /*relu=*/true));
    }
    c.out = load_linear(ops, w, cls + "." + std::to_string(3 * fcs));
    r.out = load_linear(ops, w, reg + "." + std::to_string(2 * fcs));
    h.cls.push_back(std::move(c));
    h.reg.push_back(std::move(r));
  }
  return h;
}

Tensor cls_branch_forward(Ops& ops, const ClsBranchWeights& w, const Tensor& x, const std::string& label) {
  Tensor h = x;
  for (size_t j = 0; j < w.fc.size(); ++j) {
    const std::string p = label + "." + std::to_string(3 * j);
    h = ops.linear(h, w.fc[j], p);
    h = ops.relu(layer_norm_forward(ops, w.norm[j], h, label + "." + std::to_string(3 * j + 1)),
                 label + "." + std::to_string(3 * j + 2));
  }
  return ops.linear(h, w.out, label + "." + std::to_string(3 * w.fc.size()));
}

Tensor reg_branch_forward(Ops& ops, const RegBranchWeights& w, const Tensor& x, const std::string& label) {
  Tensor h = x;
  for (size_t j = 0; j < w.fc.size(); ++j) h = ops.linear(h, w.fc[j], label + "." + std::to_string(2 * j));
  return ops.linear(h, w.out, label + "." + std::to_string(2 * w.fc.size()));
}

BboxDenormalizeAttrs bbox_denormalize_attrs(const std::array<double, 6>& pc) {
  BboxDenormalizeAttrs a;
  for (int k = 0; k < 3; ++k) {
    a.scale[k] = static_cast<float>(pc[static_cast<size_t>(k + 3)] - pc[static_cast<size_t>(k)]);
    a.offset[k] = static_cast<float>(pc[static_cast<size_t>(k)]);
  }
  return a;
}

}  // namespace bev
