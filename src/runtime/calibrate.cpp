#include "runtime/calibrate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "bevformer/error.h"
#include "runtime/engine.h"
#include "runtime/stream_handoff.h"

namespace bev {

namespace {

// [min, max] of an f32 tensor the backend holds (host memory read where it is, any other
// backend's through a copy); Error(kInvalidInput) when a value is not finite.
std::pair<float, float> range_of(Backend& backend, const Tensor& t, const std::string& label, const char* what) {
  const Tensor x = t.device() == Device::kCpu && t.is_contiguous() ? t : backend.read(t);
  if (x.dtype() != DType::kF32) {
    throw Error(ErrorKind::kInternal, "calibrating conv '" + label + "' on a " + dtype_name(x.dtype()) + " " + what)
        .expected("an f32 model");
  }
  const float* p = x.data<float>();
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    throw Error(ErrorKind::kInvalidInput, "the " + std::string(what) + " of conv '" + label + "' is not finite")
        .expected("frames whose activations stay within float32");
  }
  return {lo, hi};
}

}  // namespace

void CalibratingBackend::run(const OpNode& node) {
  inner_.run(node);
  if (node.kind != OpKind::conv2d || node.inputs.empty() || node.outputs.empty()) return;
  const auto [in_lo, in_hi] = range_of(inner_, node.inputs[0], node.label, "input");
  const auto [out_lo, out_hi] = range_of(inner_, node.outputs[0], node.label, "output");
  sink_->observe(node.label, in_lo, in_hi);
  sink_->observe_output(node.label, out_lo, out_hi);
}

Calibration measure_calibration(const ModelConfig& cfg, const Checkpoint& checkpoint, const EngineOptions& options,
                                const std::function<bool(Engine&, int64_t)>& run_frame) {
  Calibration c;
  EngineOptions o = options;
  o.backend_options.precision = Precision::kF32;
  o.profiling = false;
  o.replay = false;
  o.pipelined = false;  // one frame at a time: the decorator's ranges are not locked
  o.calibration.clear();
  o.calibration_data = nullptr;
  o.record_calibration = &c;
  const std::unique_ptr<Engine> engine = Engine::create(cfg, checkpoint, o);
  while (run_frame(*engine, c.frames)) ++c.frames;
  if (c.frames == 0 || c.ranges.empty()) {
    throw Error(ErrorKind::kInvalidInput, "no frame to calibrate on").expected("at least one frame");
  }
  c.model = calibration_model_id(cfg, checkpoint);
  c.config = cfg.name;
  return c;
}

std::string calibration_model_id(const ModelConfig& cfg, const Checkpoint& checkpoint) {
  return model_fingerprint(cfg, checkpoint, "any", "f32");
}

std::shared_ptr<const Calibration> load_calibration_for(const std::string& path, Precision precision,
                                                        const ModelConfig& cfg, const Checkpoint& checkpoint) {
  if (precision != Precision::kInt8) {
    if (path.empty()) return nullptr;
    throw Error(ErrorKind::kInvalidInput, std::string("a calibration file in ") + precision_name(precision) + " precision")
        .where(path)
        .expected("--calibration only with --precision int8");
  }
  if (path.empty()) {
    throw Error(ErrorKind::kInvalidInput, "int8 precision without a calibration file")
        .expected("--calibration FILE: the activation ranges of these weights")
        .hint("make it once with `bevformer calibrate --config C --weights W -o FILE`");
  }
  auto c = std::make_shared<Calibration>(Calibration::load(path));
  const std::string id = calibration_model_id(cfg, checkpoint);
  if (c->model != id) {
    throw Error(ErrorKind::kInvalidInput, "the calibration was measured on model " + c->model + " (config " + c->config +
                                              "), this is " + id + " (config " + cfg.name + ")")
        .where(path)
        .expected("a calibration of these weights and this config")
        .hint("make one with `bevformer calibrate` for these weights");
  }
  return c;
}

}  // namespace bev
