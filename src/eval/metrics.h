// From accumulated curves to the nuScenes numbers (DetectionEval.evaluate and DetectionMetrics):
// AP per class and threshold, the five TP errors per class, mAP, mATE..mAAE, NDS; and the two
// ways the devkit reports them, metrics_summary.json and its printed summary.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "eval/accumulate.h"
#include "eval/detection_config.h"
#include "eval/eval_boxes.h"
#include "eval/filter.h"

namespace bev::eval {

// Mean of max(precision - min_precision, 0) from the bin after min_recall, over 1 - min_precision.
double calc_ap(const MetricData& md, double min_recall, double min_precision);
// Mean of a TP error curve from the bin after min_recall up to max_recall_ind (inclusive); 1.0
// when the maximum recall does not get past min_recall.
double calc_tp(const MetricData& md, double min_recall, TpMetric metric);

struct DetectionMetrics {
  DetectionConfig cfg;
  // By class index (not cfg order); label_aps[c][t] is at cfg.dist_ths[t].
  std::array<std::vector<double>, kNumDetectionClasses> label_aps;
  std::array<std::array<double, kNumTpMetrics>, kNumDetectionClasses> label_tp_errors{};
  double eval_time = 0;  // seconds spent in accumulate + metrics (the devkit's eval_time)

  std::array<double, kNumDetectionClasses> mean_dist_aps() const;
  double mean_ap() const;
  std::array<double, kNumTpMetrics> tp_errors() const;  // mean over classes, NaN ignored
  std::array<double, kNumTpMetrics> tp_scores() const;  // max(0, 1 - error)
  double nd_score() const;
};

struct Evaluation {
  DetectionMetrics metrics;
  std::vector<MetricData> details;  // for class cfg.classes[i], threshold cfg.dist_ths[t]: i * |ths| + t
  FilterCounts gt_counts;
  FilterCounts pred_counts;

  const MetricData& data(size_t class_pos, size_t threshold) const {
    return details[class_pos * metrics.cfg.dist_ths.size() + threshold];
  }
};

// The whole evaluation of results against ground truth: sample check, filtering, accumulation
// per class and threshold, metrics. Input errors are Error(kInvalidInput).
Evaluation evaluate(const GroundTruth& gt, const Results& results, const DetectionConfig& cfg);

// metrics_summary.json's object, keys in the devkit's order; `meta` is the results' meta.
ojson metrics_summary_json(const DetectionMetrics& m, const ojson& meta);
// metrics_details.json: {"car:0.5": {"recall": [...], "precision": [...], ...}, ...}.
ojson metrics_details_json(const Evaluation& e);
// What DetectionEval.main() prints: mAP, the five mean TP errors, NDS, eval time, and the
// per-class table.
std::string text_summary(const DetectionMetrics& m);

}  // namespace bev::eval
