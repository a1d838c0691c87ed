// Calibration for --precision int8: the range each convolution's input took over a drive of
// frames with history, as `bevformer calibrate` measured it (runtime/calibrate.h), kept in a
// JSON file so that every later int8 run of the same weights uses the same steps.
//
// An int8 conv's input step is its range over the int8 codes: an input that is never negative
// (it follows a ReLU) is u8 with step max / 255, any other s8 with step max|x| / 127. The whole
// observed range is kept (no clipping): calibration drives are short, and a clipped outlier in a
// backbone activation is an error no later stage can undo.
//
// Each conv's output range is kept too: a conv whose output stays int8 (a ResNet block's
// downsample, whose s8 identity the block's conv3 adds to its u8 output) takes its output step
// from it, max|y| / 127 without a ReLU.
//
// The file (format "bevformer-calibration-v2"; v1, which had no output ranges, is refused with a
// hint to calibrate again):
//   {"format": "bevformer-calibration-v2", "model": "<fingerprint of config and weights>",
//    "config": "tiny", "frames": 8,
//    "ranges": {"img_backbone.layer1.0.conv1": {"min": 0, "max": 7.25}, ...},
//    "outputs": {"img_backbone.layer1.0.conv1": {"min": 0, "max": 3.5}, ...}}
// keyed by the op label of each conv (the names `profile` shows).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "backend/op.h"

namespace bev {

struct ActivationRange {
  double min = 0, max = 0;
};

struct Calibration {
  std::string model;   // model_fingerprint of the config and weights it was measured on (f32, any backend)
  std::string config;  // the config's name, for people reading the file
  int64_t frames = 0;  // frames observed
  std::map<std::string, ActivationRange> ranges;   // each conv's input
  std::map<std::string, ActivationRange> outputs;  // each conv's output

  // Widens `label`'s input (or output) range by [min, max] (the first observation sets it).
  void observe(const std::string& label, double min, double max);
  void observe_output(const std::string& label, double min, double max);

  // attrs with int8_step and int8_unsigned set from `label`'s range; Error(kInvalidInput) naming
  // the label and `source` when the file has no range for it.
  Conv2dAttrs quantized(const std::string& label, Conv2dAttrs attrs, const std::string& source) const;
  // The step of `label`'s output as int8 codes: max / 255 after a ReLU (`relu`: u8), else
  // max|y| / 127 (s8); Error(kInvalidInput) as quantized() when the file has no output range.
  float output_step(const std::string& label, bool relu, const std::string& source) const;

  // Error(kInvalidInput) naming `source` and what is wrong (not JSON, another format, a range
  // that is not finite or has min > max, no frames).
  static Calibration parse(std::string_view json, const std::string& source);
  static Calibration load(const std::string& path);  // kNotFound for a missing file
  std::string dump() const;
  // Written to path + ".tmp" and renamed over `path`: a reader never sees half a file.
  void save(const std::string& path) const;
};

}  // namespace bev
