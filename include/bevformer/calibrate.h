// Calibration for int8 precision, the public face of `bevformer calibrate`: frames run through
// the model in f32 (eager, conv by conv, with history as a stream runs them) while every conv's
// input and output ranges are recorded; the ranges are saved to a file that `--precision int8
// --calibration FILE` reads (docs/PERF.md "int8"). The file names the config and weights it was
// measured on, and a model of other weights refuses it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bevformer/engine_knobs.h"

namespace bev {

// Calibration measures in f32 (EngineKnobs::precision "f32", no calibration file of its own).
struct CalibrateOptions : EngineKnobs {
  std::string config = "tiny";  // preset (tiny | small | base) or upstream-style config JSON
  std::string weights;          // checkpoint (.pth / .safetensors); "" for seeded random weights
  uint64_t seed = 2026;         // random weights and the synthetic drive
  // Frame JSON files (bevformer/frame.h), run in the order given: each stream's frames in its
  // order, with history. Empty: `synthetic` frames of the synthetic drive (seed).
  std::vector<std::string> frames;
  int synthetic = 8;
  std::string output;           // the calibration file written (required)
};

struct CalibrateReport {
  std::string output, config, weights;
  std::string model;   // the fingerprint of config and weights the file records
  int64_t frames = 0;  // frames observed
  size_t convs = 0;    // convs with a range
  double seconds = 0;
};

// Runs the frames and writes options.output (atomically). Error(kInvalidInput) for bad options
// or frames, as `detect` would give them (checked, with the output's folder, before the model
// loads); Error(kUnsupported) where the CPU has no exact int8 dot product is not raised here:
// calibration runs in f32 anywhere.
CalibrateReport run_calibrate(const CalibrateOptions& options);

// A few lines for the terminal.
std::string format_calibrate(const CalibrateReport& report);

}  // namespace bev
