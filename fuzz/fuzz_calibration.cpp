// libFuzzer target: the int8 calibration file reader (model/calibration.h). A file that parses
// must come back equal from its own text, and every input and output range must give a usable
// int8 step.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "bevformer/error.h"
#include "model/calibration.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bev::Calibration c;
  try {
    c = bev::Calibration::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const bev::Error&) {
    return 0;
  }
  const bev::Calibration again = bev::Calibration::parse(c.dump(), "fuzz.json (rewritten)");
  if (again.dump() != c.dump() || again.ranges.size() != c.ranges.size() || again.outputs.size() != c.outputs.size()) {
    __builtin_trap();
  }
  for (const auto& [label, r] : c.ranges) {
    const bev::Conv2dAttrs a = c.quantized(label, {}, "fuzz.json");
    if (!(a.int8_step >= FLT_MIN) || !std::isfinite(1.0f / a.int8_step) || a.int8_unsigned != (r.min >= 0)) {
      __builtin_trap();
    }
  }
  for (const auto& [label, r] : c.outputs) {
    for (const bool relu : {false, true}) {
      const float step = c.output_step(label, relu, "fuzz.json");
      if (!(step >= FLT_MIN) || !std::isfinite(1.0f / step)) __builtin_trap();
    }
  }
  return 0;
}
