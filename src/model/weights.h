// Binding a checkpoint to the model: every tensor the config expects is checked once (all
// missing, unexpected and mismatched names reported together), then handed out by upstream name
// as contiguous f32, and prepared for the backend (BN folded, weights packed) by the helpers
// below, which each stand for one torch module.
#pragma once

#include <string>

#include "backend/ops.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "model/calibration.h"
#include "model/config.h"

namespace bev {

class WeightSource {
 public:
  // Throws Error(kInvalidInput) with the validation report when the checkpoint does not fit cfg.
  // `calibration` (int8 precision): the input and output ranges of the convs int8 runs, read from
  // `calibration_source` (named in errors).
  WeightSource(const ModelConfig& cfg, const Checkpoint& checkpoint, const Calibration* calibration = nullptr,
               std::string calibration_source = {});

  // The tensor as contiguous f32 (converted from f16/bf16/f64); throws kNotFound naming it.
  Tensor get(const std::string& name) const;

  // The attributes of conv `label` (its op label) as `ops`' backend runs it: in int8 precision
  // with the calibrated input step; otherwise unchanged. Error(kInvalidInput) in int8 precision
  // without a calibration or without a range for `label`.
  Conv2dAttrs int8_input(Ops& ops, const std::string& label, Conv2dAttrs attrs) const;
  // In int8 precision the step of conv `label`'s output as int8 codes (Calibration::output_step),
  // else 0; the same errors.
  float int8_output_step(Ops& ops, const std::string& label, bool relu) const;

 private:
  const Calibration& calibration() const;

  const Checkpoint& checkpoint_;
  const Calibration* calibration_;
  std::string calibration_source_;
};

// nn.LayerNorm: `<prefix>.weight`, `<prefix>.bias`.
struct LayerNormWeights {
  Tensor weight, bias;
};
// Uploaded to the backend through ops.constant.
LayerNormWeights load_layer_norm(Ops& ops, const WeightSource& w, const std::string& prefix);
Tensor layer_norm_forward(Ops& ops, const LayerNormWeights& ln, const Tensor& x, const std::string& label);
// norm(identity + branch): a transformer layer's residual (the brick's output added to its input,
// as upstream's bricks add it themselves) and the norm that follows, as one op.
Tensor add_norm_forward(Ops& ops, const LayerNormWeights& ln, const Tensor& identity, const Tensor& branch,
                        const std::string& label);

// nn.Linear: `<prefix>.weight` [out, in], `<prefix>.bias` [out]; ReLU fused when `relu`.
PreparedWeights load_linear(Ops& ops, const WeightSource& w, const std::string& prefix, bool relu = false);

// nn.Conv2d `<conv>.weight` (no bias) followed by eval-mode nn.BatchNorm2d `<bn>.*`, folded.
// int8_label: the conv's op label, when int8 precision runs it in int8 (WeightSource::int8_input).
PreparedWeights load_conv_bn(Ops& ops, const WeightSource& w, const std::string& conv, const std::string& bn,
                             double eps, Conv2dAttrs attrs, const std::string& int8_label = {});

}  // namespace bev
