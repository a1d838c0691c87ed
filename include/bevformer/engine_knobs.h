// Where and how a model runs, declared once: the part of every options struct that builds an
// engine (Knobs for Model::load, ProfileOptions, BenchOptions, GoldenOptions, CalibrateOptions),
// and of every CLI command that runs a model (--backend, --device, --threads, --precision,
// --calibration).
#pragma once

#include <string>

namespace bev {

struct EngineKnobs {
  std::string backend = "cpu";    // where the model runs: available_backends() (bevformer/model.h)
  int device = 0;                 // which GPU, for a device backend
  int threads = 0;                // CPU threads for the kernels; <= 0: one per hardware thread
  std::string precision = "f32";  // "f32" | "bf16" (convolutions and matmuls in bf16) | "int8" (see calibration)
  // int8: the calibration file `bevformer calibrate` made for these weights (the activation
  // ranges of the backbone's convs, which then run in int8; docs/PERF.md "int8 precision").
  std::string calibration;
};

}  // namespace bev
