// The nuScenes detection task's names and the evaluation config (the devkit's DetectionConfig):
// `detection_cvpr_2019` built in, or any config JSON of the same schema (`--config`).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/python_json.h"

namespace bev::eval {

inline constexpr int kNumDetectionClasses = 10;
inline constexpr int kNumAttributes = 8;
inline constexpr int kNumTpMetrics = 5;

// DETECTION_NAMES, ATTRIBUTE_NAMES and TP_METRICS of nuscenes/eval/detection/constants.py, in
// their order (class indices below index these arrays).
const std::array<std::string_view, kNumDetectionClasses>& detection_names();
const std::array<std::string_view, kNumAttributes>& attribute_names();
enum class TpMetric : uint8_t { kTrans, kScale, kOrient, kVel, kAttr };
const std::array<std::string_view, kNumTpMetrics>& tp_metric_names();  // trans_err, scale_err, ...

std::optional<int> detection_index(std::string_view name);
// -1 for "" (no attribute); nullopt for an unknown name.
std::optional<int> attribute_index(std::string_view name);
// "car, truck, ..." for messages.
std::string detection_names_text();

// The devkit fixes these TP metrics to NaN for a class whatever the data: cones have no
// orientation, neither cones nor barriers move or have attributes.
bool tp_metric_is_nan(int detection, TpMetric metric);

struct DetectionConfig {
  std::vector<int> classes;                       // class_range's key order (the order of every output)
  std::array<double, kNumDetectionClasses> class_range{};  // metres, by class index
  std::vector<double> dist_ths;
  std::vector<std::string> dist_th_keys;          // each threshold as Python writes it: "0.5", "1.0"
  size_t dist_th_tp_index = 0;                    // which of dist_ths is dist_th_tp
  double min_recall = 0.1;
  double min_precision = 0.1;
  int64_t max_boxes_per_sample = 500;
  double mean_ap_weight = 5;
  ojson serialized;                               // the config as metrics_summary.json's "cfg" writes it

  double dist_th_tp() const { return dist_ths[dist_th_tp_index]; }
};

// nuscenes/eval/detection/configs/detection_cvpr_2019.json.
DetectionConfig detection_cvpr_2019();
// The devkit's DetectionConfig.deserialize, with its checks (every class has a range, dist_th_tp
// is one of dist_ths) and ours (dist_fcn is center_distance, the numbers are in range).
DetectionConfig detection_config_from_json(const ojson& j, const std::string& where);
DetectionConfig read_detection_config(const std::string& path);

}  // namespace bev::eval
