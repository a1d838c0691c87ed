#include "model/weights.h"

#include <utility>
#include <vector>

#include "backend/batch_norm.h"
#include "bevformer/error.h"
#include "model/param_spec.h"

namespace bev {

WeightSource::WeightSource(const ModelConfig& cfg, const Checkpoint& checkpoint, const Calibration* calibration,
                           std::string calibration_source)
    : checkpoint_(checkpoint), calibration_(calibration), calibration_source_(std::move(calibration_source)) {
  std::vector<std::pair<std::string, TensorMeta>> metas;
  metas.reserve(checkpoint.size());
  for (const auto& [name, t] : checkpoint.tensors()) metas.push_back({name, {t.dtype(), t.shape()}});
  const ValidationReport report = validate_state_dict(expected_params(cfg), metas);
  if (!report.ok()) {
    throw Error(ErrorKind::kInvalidInput, "the checkpoint does not fit the config:\n" + format_report(report, 20))
        .where(checkpoint.path.empty() ? std::string("checkpoint") : checkpoint.path)
        .hint("pass the config the checkpoint was trained with (--config)");
  }
}

Tensor WeightSource::get(const std::string& name) const {
  const Tensor* t = checkpoint_.find(name);
  if (t == nullptr) throw Error(ErrorKind::kNotFound, "no tensor '" + name + "'").where(checkpoint_.path);
  return t->dtype() == DType::kF32 ? t->contiguous() : t->to(DType::kF32);
}

const Calibration& WeightSource::calibration() const {
  if (calibration_ == nullptr) {
    throw Error(ErrorKind::kInvalidInput, "int8 precision without a calibration")
        .expected("the activation ranges of these weights (--calibration FILE)")
        .hint("make the file once with `bevformer calibrate --config C --weights W -o FILE`");
  }
  return *calibration_;
}

Conv2dAttrs WeightSource::int8_input(Ops& ops, const std::string& label, Conv2dAttrs attrs) const {
  if (ops.backend().precision() != Precision::kInt8) return attrs;
  return calibration().quantized(label, attrs, calibration_source_.empty() ? "calibration" : calibration_source_);
}

float WeightSource::int8_output_step(Ops& ops, const std::string& label, bool relu) const {
  if (ops.backend().precision() != Precision::kInt8) return 0;
  return calibration().output_step(label, relu, calibration_source_.empty() ? "calibration" : calibration_source_);
}

LayerNormWeights load_layer_norm(Ops& ops, const WeightSource& w, const std::string& prefix) {
  return {ops.constant(w.get(prefix + ".weight")), ops.constant(w.get(prefix + ".bias"))};
}

Tensor layer_norm_forward(Ops& ops, const LayerNormWeights& ln, const Tensor& x, const std::string& label) {
  return ops.layer_norm(x, ln.weight, ln.bias, 1e-5f, label);
}

Tensor add_norm_forward(Ops& ops, const LayerNormWeights& ln, const Tensor& identity, const Tensor& branch,
                        const std::string& label) {
  return ops.add_layer_norm(identity, branch, ln.weight, ln.bias, 1e-5f, label);
}

PreparedWeights load_linear(Ops& ops, const WeightSource& w, const std::string& prefix, bool relu) {
  const Tensor bias = w.get(prefix + ".bias");
  return ops.prepare_linear(w.get(prefix + ".weight"), &bias, {.relu = relu});
}

PreparedWeights load_conv_bn(Ops& ops, const WeightSource& w, const std::string& conv, const std::string& bn,
                             double eps, Conv2dAttrs attrs, const std::string& int8_label) {
  if (!int8_label.empty()) attrs = w.int8_input(ops, int8_label, attrs);
  Tensor folded_w, folded_b;
  fold_batch_norm(w.get(conv + ".weight"), nullptr, w.get(bn + ".weight"), w.get(bn + ".bias"),
                  w.get(bn + ".running_mean"), w.get(bn + ".running_var"), static_cast<float>(eps), &folded_w,
                  &folded_b);
  return ops.prepare_conv2d(folded_w, &folded_b, attrs);
}

}  // namespace bev
