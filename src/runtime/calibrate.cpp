#include "runtime/calibrate.h"

#include <algorithm>
#include <cmath>

#include "bevformer/error.h"
#include "runtime/engine.h"
#include "runtime/stream_handoff.h"

namespace bev {

void CalibratingBackend::run(const OpNode& node) {
  inner_.run(node);
  if (node.kind != OpKind::conv2d || node.inputs.empty()) return;
  // Host memory (the CPU backend's) is read where it is; any other backend's through a copy.
  const Tensor& in = node.inputs[0];
  const Tensor x = in.device() == Device::kCpu && in.is_contiguous() ? in : inner_.read(in);
  if (x.dtype() != DType::kF32) {
    throw Error(ErrorKind::kInternal, "calibrating conv '" + node.label + "' on a " + dtype_name(x.dtype()) + " input")
        .expected("an f32 model");
  }
  const float* p = x.data<float>();
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    throw Error(ErrorKind::kInvalidInput, "the input of conv '" + node.label + "' is not finite")
        .expected("frames whose activations stay within float32");
  }
  sink_->observe(node.label, lo, hi);
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
