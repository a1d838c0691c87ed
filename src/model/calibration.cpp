#include "model/calibration.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "io/byte_source.h"

namespace bev {
namespace {

constexpr const char* kFormat = "bevformer-calibration-v1";
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

}  // namespace

void Calibration::observe(const std::string& label, double min, double max) {
  auto [it, fresh] = ranges.try_emplace(label, ActivationRange{min, max});
  if (!fresh) {
    it->second.min = std::min(it->second.min, min);
    it->second.max = std::max(it->second.max, max);
  }
}

Conv2dAttrs Calibration::quantized(const std::string& label, Conv2dAttrs attrs, const std::string& source) const {
  const auto it = ranges.find(label);
  if (it == ranges.end()) {
    throw Error(ErrorKind::kInvalidInput, "no range for conv '" + label + "'")
        .where(source)
        .expected("a calibration of this model's config (every backbone conv)")
        .hint("make one for these weights with `bevformer calibrate`");
  }
  const ActivationRange& r = it->second;
  attrs.int8_unsigned = r.min >= 0;
  const double top = attrs.int8_unsigned ? r.max : std::max(std::fabs(r.min), std::fabs(r.max));
  // An input that was always 0 (or below 1e-30, far under any activation's resolution) quantizes
  // to 0 at any step; 1 keeps the step, its inverse and the bias over it normal float32s.
  const double step = top >= 1e-30 ? top / (attrs.int8_unsigned ? 255.0 : 127.0) : 1.0;
  attrs.int8_step = static_cast<float>(step);
  return attrs;
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
  const nlohmann::json& ranges = field("ranges");
  if (!ranges.is_object() || ranges.empty()) bad(source, "\"ranges\" is not an object of conv ranges");
  if (ranges.size() > kMaxRanges) bad(source, std::to_string(ranges.size()) + " ranges");
  for (const auto& [label, r] : ranges.items()) {
    if (!r.is_object()) bad(source, "the range of '" + label + "' is not an object");
    const double lo = finite_number(r.contains("min") ? r["min"] : nlohmann::json(), source, label + ".min");
    const double hi = finite_number(r.contains("max") ? r["max"] : nlohmann::json(), source, label + ".max");
    if (lo > hi) bad(source, label + " has min " + r["min"].dump() + " above max " + r["max"].dump());
    c.ranges[label] = {lo, hi};
  }
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
  nlohmann::ordered_json r = nlohmann::ordered_json::object();
  for (const auto& [label, range] : ranges) r[label] = {{"min", range.min}, {"max", range.max}};
  j["ranges"] = std::move(r);
  return j.dump(1) + "\n";
}

void Calibration::save(const std::string& path) const { write_file_atomically(path, dump()); }

}  // namespace bev
