// Binding a checkpoint to the model: every tensor the config expects is checked once (all
// missing, unexpected and mismatched names reported together), then handed out by upstream name
// as contiguous f32, and prepared for the backend (BN folded, weights packed) by the helpers
// below, which each stand for one torch module.
#pragma once

#include <string>

#include "backend/ops.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "model/config.h"

namespace bev {

class WeightSource {
 public:
  // Throws Error(kInvalidInput) with the validation report when the checkpoint does not fit cfg.
  WeightSource(const ModelConfig& cfg, const Checkpoint& checkpoint);

  // The tensor as contiguous f32 (converted from f16/bf16/f64); throws kNotFound naming it.
  Tensor get(const std::string& name) const;

 private:
  const Checkpoint& checkpoint_;
};

// nn.LayerNorm: `<prefix>.weight`, `<prefix>.bias`.
struct LayerNormWeights {
  Tensor weight, bias;
};
// Uploaded to the backend through ops.constant.
LayerNormWeights load_layer_norm(Ops& ops, const WeightSource& w, const std::string& prefix);
Tensor layer_norm_forward(Ops& ops, const LayerNormWeights& ln, const Tensor& x, const std::string& label);

// nn.Linear: `<prefix>.weight` [out, in], `<prefix>.bias` [out]; ReLU fused when `relu`.
PreparedWeights load_linear(Ops& ops, const WeightSource& w, const std::string& prefix, bool relu = false);

// nn.Conv2d `<conv>.weight` (no bias) followed by eval-mode nn.BatchNorm2d `<bn>.*`, folded.
PreparedWeights load_conv_bn(Ops& ops, const WeightSource& w, const std::string& conv, const std::string& bn,
                             double eps, Conv2dAttrs attrs);

}  // namespace bev
