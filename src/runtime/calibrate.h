// Measuring int8 precision's calibration (model/calibration.h): a model run in f32, eagerly and
// conv by conv, through a backend decorator that widens each conv's input and output ranges as
// the op runs.
// Engine::create inserts it when EngineOptions::record_calibration is set; `bevformer calibrate`
// (api/calibrate_api.cpp) drives frames through such an engine and saves what it saw.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/forwarding_backend.h"
#include "io/checkpoint.h"
#include "model/calibration.h"
#include "model/config.h"

namespace bev {

class CalibratingBackend final : public ForwardingBackend {
 public:
  // Input and output ranges go into *sink, under each conv2d's op label.
  CalibratingBackend(Backend& inner, Calibration* sink) : ForwardingBackend(inner), sink_(sink) {}

  // Never: a fused block would hide the inputs of its conv2 and conv3.
  bool fuses_bottleneck(const Shape&, const BottleneckAttrs&) const override { return false; }
  void run(const OpNode& node) override;

 private:
  Calibration* sink_;
};

class Engine;
struct EngineOptions;

// Frames through an f32 model of cfg and checkpoint that records each conv's input and output
// range: run_frame(engine, k) runs frame k (k = 0, 1, ...) with the engine's streams (so with
// history) and returns false when there is none left. options: backend and threads (precision,
// replay and profiling are set here). Error(kInvalidInput) when no frame ran.
Calibration measure_calibration(const ModelConfig& cfg, const Checkpoint& checkpoint, const EngineOptions& options,
                                const std::function<bool(Engine&, int64_t)>& run_frame);

// What a calibration file records as "model": the config and every weight's bytes (not the
// backend or precision: one calibration serves them all).
std::string calibration_model_id(const ModelConfig& cfg, const Checkpoint& checkpoint);

// The calibration file at `path` for int8 precision, checked against the model: Error(kInvalidInput)
// when it was measured on another config or other weights, and when a path is given for another
// precision (it would be silently ignored).
std::shared_ptr<const Calibration> load_calibration_for(const std::string& path, Precision precision,
                                                        const ModelConfig& cfg, const Checkpoint& checkpoint);

}  // namespace bev
