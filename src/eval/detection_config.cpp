#include "eval/detection_config.h"

#include <algorithm>
#include <cmath>

#include "bevformer/error.h"

namespace bev::eval {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& problem,
                      const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where(where + ": " + key).expected(expected);
}

const ojson& field(const ojson& j, const std::string& key, const std::string& where) {
  if (!j.contains(key)) bad(where, key, "is missing", "the devkit's DetectionConfig keys");
  return j.at(key);
}

double number(const ojson& j, const std::string& key, const std::string& where) {
  const ojson& v = field(j, key, where);
  if (!v.is_number() || !std::isfinite(v.get<double>())) bad(where, key, "is " + v.dump(), "a finite number");
  return v.get<double>();
}

// A threshold as json.dump writes a dict key holding it: str(float) or str(int).
std::string python_key(const ojson& v) {
  return v.is_number_float() ? python_float_repr(v.get<double>()) : v.dump();
}

}  // namespace

const std::array<std::string_view, kNumDetectionClasses>& detection_names() {
  static const std::array<std::string_view, kNumDetectionClasses> names = {
      "car", "truck", "bus", "trailer", "construction_vehicle", "pedestrian", "motorcycle", "bicycle",
      "traffic_cone", "barrier"};
  return names;
}

const std::array<std::string_view, kNumAttributes>& attribute_names() {
  static const std::array<std::string_view, kNumAttributes> names = {
      "pedestrian.moving", "pedestrian.sitting_lying_down", "pedestrian.standing", "cycle.with_rider",
      "cycle.without_rider", "vehicle.moving", "vehicle.parked", "vehicle.stopped"};
  return names;
}

const std::array<std::string_view, kNumTpMetrics>& tp_metric_names() {
  static const std::array<std::string_view, kNumTpMetrics> names = {"trans_err", "scale_err", "orient_err",
                                                                     "vel_err", "attr_err"};
  return names;
}

std::optional<int> detection_index(std::string_view name) {
  const auto& n = detection_names();
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end()) return std::nullopt;
  return static_cast<int>(it - n.begin());
}

std::optional<int> attribute_index(std::string_view name) {
  if (name.empty()) return -1;
  const auto& n = attribute_names();
  const auto it = std::find(n.begin(), n.end(), name);
  if (it == n.end()) return std::nullopt;
  return static_cast<int>(it - n.begin());
}

std::string detection_names_text() {
  std::string s;
  for (std::string_view n : detection_names()) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

bool tp_metric_is_nan(int detection, TpMetric metric) {
  const std::string_view name = detection_names()[static_cast<size_t>(detection)];
  if (name == "traffic_cone") {
    return metric == TpMetric::kAttr || metric == TpMetric::kVel || metric == TpMetric::kOrient;
  }
  if (name == "barrier") return metric == TpMetric::kAttr || metric == TpMetric::kVel;
  return false;
}

DetectionConfig detection_cvpr_2019() {
  static const char* kText = R"({
  "class_range": {"car": 50, "truck": 50, "bus": 50, "trailer": 50, "construction_vehicle": 50,
                  "pedestrian": 40, "motorcycle": 40, "bicycle": 40, "traffic_cone": 30, "barrier": 30},
  "dist_fcn": "center_distance",
  "dist_ths": [0.5, 1.0, 2.0, 4.0],
  "dist_th_tp": 2.0,
  "min_recall": 0.1,
  "min_precision": 0.1,
  "max_boxes_per_sample": 500,
  "mean_ap_weight": 5
})";
  return detection_config_from_json(ojson::parse(kText), "detection_cvpr_2019");
}

DetectionConfig detection_config_from_json(const ojson& j, const std::string& where) {
  if (!j.is_object()) bad(where, "(top level)", "is not an object", "a DetectionConfig JSON object");
  DetectionConfig c;
  const ojson& ranges = field(j, "class_range", where);
  if (!ranges.is_object()) bad(where, "class_range", "is not an object", "{class: range in metres}");
  std::array<bool, kNumDetectionClasses> seen{};
  for (const auto& [name, range] : ranges.items()) {
    const std::optional<int> k = detection_index(name);
    if (!k) bad(where, "class_range." + name, "is not a detection class", detection_names_text());
    if (!range.is_number() || !(range.get<double>() >= 0)) {
      bad(where, "class_range." + name, "is " + range.dump(), "a range in metres >= 0");
    }
    seen[static_cast<size_t>(*k)] = true;
    c.classes.push_back(*k);
    c.class_range[static_cast<size_t>(*k)] = range.get<double>();
  }
  if (std::count(seen.begin(), seen.end(), true) != kNumDetectionClasses) {
    bad(where, "class_range", "does not name every class", "a range for each of " + detection_names_text());
  }
  const ojson& fcn = field(j, "dist_fcn", where);
  if (fcn != "center_distance") {
    throw Error(ErrorKind::kUnsupported, "dist_fcn " + fcn.dump() + " is not supported")
        .where(where + ": dist_fcn")
        .expected("\"center_distance\" (the only distance of the nuScenes detection task)");
  }
  const ojson& ths = field(j, "dist_ths", where);
  if (!ths.is_array() || ths.empty()) bad(where, "dist_ths", "is " + ths.dump(), "a non-empty list of metres");
  for (const ojson& t : ths) {
    if (!t.is_number() || !(t.get<double>() > 0) || !std::isfinite(t.get<double>())) {
      bad(where, "dist_ths", "holds " + t.dump(), "distances in metres > 0");
    }
    c.dist_ths.push_back(t.get<double>());
    c.dist_th_keys.push_back(python_key(t));
  }
  const double tp = number(j, "dist_th_tp", where);
  const auto it = std::find(c.dist_ths.begin(), c.dist_ths.end(), tp);
  if (it == c.dist_ths.end()) bad(where, "dist_th_tp", "is not one of dist_ths", "one of dist_ths");
  c.dist_th_tp_index = static_cast<size_t>(it - c.dist_ths.begin());
  c.min_recall = number(j, "min_recall", where);
  if (c.min_recall < 0 || c.min_recall > 1) bad(where, "min_recall", "is out of range", "0 <= min_recall <= 1");
  c.min_precision = number(j, "min_precision", where);
  if (c.min_precision < 0 || c.min_precision >= 1) {
    bad(where, "min_precision", "is out of range", "0 <= min_precision < 1");
  }
  const ojson& mb = field(j, "max_boxes_per_sample", where);
  if (!mb.is_number_integer() || mb.get<int64_t>() < 0) bad(where, "max_boxes_per_sample", "is " + mb.dump(), "an integer >= 0");
  c.max_boxes_per_sample = mb.get<int64_t>();
  c.mean_ap_weight = number(j, "mean_ap_weight", where);
  c.serialized = ojson::object();
  for (const char* key : {"class_range", "dist_fcn", "dist_ths", "dist_th_tp", "min_recall", "min_precision",
                          "max_boxes_per_sample", "mean_ap_weight"}) {
    c.serialized[key] = j.at(key);
  }
  return c;
}

DetectionConfig read_detection_config(const std::string& path) {
  return detection_config_from_json(parse_python_json(read_text_file(path), path), path);
}

}  // namespace bev::eval
