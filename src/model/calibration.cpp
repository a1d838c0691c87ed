#include "model/calibration.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "io/byte_source.h"

namespace bev {
namespace {

constexpr const char* kFormat = "bevformer-calibration-v2";
// The first format, without output ranges: still recognised, to say what to do with it.
constexpr const char* kFormatV1 = "bevformer-calibration-v1";
// ResNet-101 with every FPN conv has under 120 convs; a file far larger is not a calibration.
constexpr uint64_t kMaxFileBytes = 16 << 20;
constexpr size_t kMaxRanges = 10000;

[[noreturn]] void bad(const std::string& source, const std::string& problem) {
  throw Error(ErrorKind::kInvalidInput, problem)
      .where(source)
      .expected(std::string("a calibration file (") + kFormat + ") as `bevformer calibrate` writes it");
}

double finite_number(const nlohmann::json& v, const std::string& source, const std::string& what) {
  if (!v.is_number()) bad(source, what + " is " + (v.is_null() ? "missing" : v.dump()) + ", not a number");
  const double d = v.get<double>();
  // float32 must hold it too: the step is stored as one.
  if (!std::isfinite(d) || std::fabs(d) > 3.0e38) bad(source, what + " is " + v.dump() + ", not a finite float32");
  return d;
}

void widen(std::map<std::string, ActivationRange>& m, const std::string& label, double min, double max) {
  auto [it, fresh] = m.try_emplace(label, ActivationRange{min, max});
  if (!fresh) {
    it->second.min = std::min(it->second.min, min);
    it->second.max = std::max(it->second.max, max);
  }
}

const ActivationRange& find_range(const std::map<std::string, ActivationRange>& m, const std::string& label,
                                  const char* what, const std::string& source) {
  const auto it = m.find(label);
  if (it == m.end()) {
    throw Error(ErrorKind::kInvalidInput, std::string("no ") + what + " range for conv '" + label + "'")
        .where(source)
        .expected("a calibration of this model's config (every backbone conv)")
        .hint("make one for these weights with `bevformer calibrate`");
  }
  return it->second;
}

// The step of codes over [0, 255] (`codes_unsigned`) or [-127, 127] that cover r. A range that
// was always 0 (or below 1e-30, far under any activation's resolution) quantizes to 0 at any
// step; 1 keeps the step, its inverse and a bias over it normal float32s.
double step_of(const ActivationRange& r, bool codes_unsigned) {
  const double top = codes_unsigned ? r.max : std::max(std::fabs(r.min), std::fabs(r.max));
  return top >= 1e-30 ? top / (codes_unsigned ? 255.0 : 127.0) : 1.0;
}

}  // namespace

void Calibration::observe(const std::string& label, double min, double max) { widen(ranges, label, min, max); }

void Calibration::observe_output(const std::string& label, double min, double max) { widen(outputs, label, min, max); }

Conv2dAttrs Calibration::quantized(const std::string& label, Conv2dAttrs attrs, const std::string& source) const {
  const ActivationRange& r = find_range(ranges, label, "input", source);
  attrs.int8_unsigned = r.min >= 0;
  attrs.int8_step = static_cast<float>(step_of(r, attrs.int8_unsigned));
  return attrs;
}

float Calibration::output_step(const std::string& label, bool relu, const std::string& source) const {
  // After a ReLU the codes are u8 whatever the range says (the ReLU's output is never negative).
  return static_cast<float>(step_of(find_range(outputs, label, "output", source), relu));
}

Calibration Calibration::parse(std::string_view text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    bad(source, std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) bad(source, "the top level is not an object");
  const auto field = [&](const char* key) -> const nlohmann::json& {
    const auto it = j.find(key);
    if (it == j.end()) bad(source, std::string("no \"") + key + "\"");
    return *it;
  };
  if (field("format") == kFormatV1) {
    throw Error(ErrorKind::kInvalidInput, std::string("format is ") + kFormatV1 + ", which has no conv output ranges")
        .where(source)
        .expected(std::string("a calibration file (") + kFormat + ")")
        .hint("run `bevformer calibrate` again for these weights: int8 now keeps activations int8 between ResNet blocks");
  }
  if (field("format") != kFormat) bad(source, "format is " + field("format").dump());
  Calibration c;
  for (const char* key : {"model", "config"}) {
    if (!field(key).is_string()) bad(source, std::string("\"") + key + "\" is not a string");
  }
  c.model = field("model").get<std::string>();
  c.config = field("config").get<std::string>();
  const nlohmann::json& frames = field("frames");
  if (!frames.is_number_integer() || frames.get<int64_t>() < 1) bad(source, "frames is " + frames.dump() + ", not a count >= 1");
  c.frames = frames.get<int64_t>();
  const auto read_ranges = [&](const char* key, std::map<std::string, ActivationRange>& into) {
    const nlohmann::json& listed = field(key);
    if (!listed.is_object() || listed.empty()) bad(source, std::string("\"") + key + "\" is not an object of conv ranges");
    if (listed.size() > kMaxRanges) bad(source, std::to_string(listed.size()) + " " + key);
    for (const auto& [label, r] : listed.items()) {
      if (!r.is_object()) bad(source, std::string("the ") + key + " range of '" + label + "' is not an object");
      const double lo = finite_number(r.contains("min") ? r["min"] : nlohmann::json(), source, label + ".min");
      const double hi = finite_number(r.contains("max") ? r["max"] : nlohmann::json(), source, label + ".max");
      if (lo > hi) bad(source, label + " has min " + r["min"].dump() + " above max " + r["max"].dump());
      into[label] = {lo, hi};
    }
  };
  read_ranges("ranges", c.ranges);
  read_ranges("outputs", c.outputs);
  return c;
}

Calibration Calibration::load(const std::string& path) {
  return parse(read_regular_file(path, kMaxFileBytes, "calibration file"), path);
}

std::string Calibration::dump() const {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["model"] = model;
  j["config"] = config;
  j["frames"] = frames;
  for (const auto& [key, m] : {std::pair<const char*, const std::map<std::string, ActivationRange>*>{"ranges", &ranges},
                               {"outputs", &outputs}}) {
    nlohmann::ordered_json r = nlohmann::ordered_json::object();
    for (const auto& [label, range] : *m) r[label] = {{"min", range.min}, {"max", range.max}};
    j[key] = std::move(r);
  }
  return j.dump(1) + "\n";
}

void Calibration::save(const std::string& path) const { write_file_atomically(path, dump()); }

}  // namespace bev
