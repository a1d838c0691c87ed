#include "eval/metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/log.h"

namespace bev::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Python's round() of 100 * min_recall (half to even, as nearbyint in the default mode).
size_t first_bin(double min_recall) { return static_cast<size_t>(std::nearbyint(100 * min_recall)) + 1; }

// printf as Python's % operator: "nan" whatever the NaN's sign bit (glibc would print "-nan").
std::string fmt(const char* spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), spec, std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v);
  return buf;
}

}  // namespace

double calc_ap(const MetricData& md, double min_recall, double min_precision) {
  std::vector<double> prec;
  for (size_t i = first_bin(min_recall); i < kCurvePoints; ++i) {
    double p = md.precision[i] - min_precision;
    if (p < 0) p = 0;
    prec.push_back(p);
  }
  return numpy_mean(prec) / (1.0 - min_precision);
}

double calc_tp(const MetricData& md, double min_recall, TpMetric metric) {
  const size_t first = first_bin(min_recall);
  const size_t last = md.max_recall_ind();
  if (last < first) return 1.0;
  const Curve& c = md.tp[static_cast<size_t>(metric)];
  return numpy_mean(std::span<const double>(c.data() + first, last + 1 - first));
}

std::array<double, kNumDetectionClasses> DetectionMetrics::mean_dist_aps() const {
  std::array<double, kNumDetectionClasses> out{};
  for (int c : cfg.classes) out[static_cast<size_t>(c)] = numpy_mean(label_aps[static_cast<size_t>(c)]);
  return out;
}

double DetectionMetrics::mean_ap() const {
  const auto means = mean_dist_aps();
  std::vector<double> v;
  for (int c : cfg.classes) v.push_back(means[static_cast<size_t>(c)]);
  return numpy_mean(v);
}

std::array<double, kNumTpMetrics> DetectionMetrics::tp_errors() const {
  std::array<double, kNumTpMetrics> out{};
  for (size_t m = 0; m < kNumTpMetrics; ++m) {
    // np.nanmean: NaNs become 0 in the (pairwise) sum, and the count skips them.
    std::vector<double> v;
    double count = 0;
    for (int c : cfg.classes) {
      const double e = label_tp_errors[static_cast<size_t>(c)][m];
      v.push_back(std::isnan(e) ? 0.0 : e);
      if (!std::isnan(e)) count += 1;
    }
    out[m] = numpy_sum(v) / count;
  }
  return out;
}

std::array<double, kNumTpMetrics> DetectionMetrics::tp_scores() const {
  std::array<double, kNumTpMetrics> out{};
  const auto errors = tp_errors();
  for (size_t m = 0; m < kNumTpMetrics; ++m) {
    const double score = 1.0 - errors[m];
    out[m] = score > 0.0 ? score : 0.0;  // Python's max(0.0, score): NaN gives 0.0
  }
  return out;
}

double DetectionMetrics::nd_score() const {
  const auto scores = tp_scores();
  const double total = cfg.mean_ap_weight * mean_ap() + numpy_sum(scores);
  return total / (cfg.mean_ap_weight + static_cast<double>(kNumTpMetrics));
}

Evaluation evaluate(const GroundTruth& gt, const Results& results, const DetectionConfig& cfg) {
  // The devkit stops on these (filter_eval_boxes finds no box to read the class field from);
  // every AP is 0 and every TP error 1 here, which is what such input deserves.
  if (results.num_boxes() == 0) log_warn(results.source, ": no box in any sample (the devkit refuses this)");
  size_t gt_boxes = 0;
  for (const GtSample& s : gt.samples) gt_boxes += s.boxes.size();
  if (gt_boxes == 0) log_warn(gt.source, ": no ground-truth box in any sample (the devkit refuses this)");
  const FilteredSet pred = filter_predictions(results, gt, cfg);
  const FilteredSet truth = filter_ground_truth(gt, cfg);
  const auto t0 = std::chrono::steady_clock::now();
  Evaluation e;
  e.metrics.cfg = cfg;
  e.gt_counts = truth.counts;
  e.pred_counts = pred.counts;
  for (int c : cfg.classes) {
    for (double th : cfg.dist_ths) e.details.push_back(accumulate(truth, pred, gt, results, c, th));
  }
  for (size_t i = 0; i < cfg.classes.size(); ++i) {
    const int c = cfg.classes[i];
    auto& aps = e.metrics.label_aps[static_cast<size_t>(c)];
    for (size_t t = 0; t < cfg.dist_ths.size(); ++t) aps.push_back(calc_ap(e.data(i, t), cfg.min_recall, cfg.min_precision));
    for (size_t m = 0; m < kNumTpMetrics; ++m) {
      const auto metric = static_cast<TpMetric>(m);
      e.metrics.label_tp_errors[static_cast<size_t>(c)][m] =
          tp_metric_is_nan(c, metric) ? kNaN : calc_tp(e.data(i, cfg.dist_th_tp_index), cfg.min_recall, metric);
    }
  }
  e.metrics.eval_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return e;
}

ojson metrics_summary_json(const DetectionMetrics& m, const ojson& meta) {
  const auto& names = detection_names();
  const auto& metrics = tp_metric_names();
  auto name = [&](int c) { return std::string(names[static_cast<size_t>(c)]); };
  ojson label_aps = ojson::object(), mean_dist = ojson::object(), label_tp = ojson::object();
  const auto means = m.mean_dist_aps();
  for (int c : m.cfg.classes) {
    ojson aps = ojson::object();
    for (size_t t = 0; t < m.cfg.dist_ths.size(); ++t) aps[m.cfg.dist_th_keys[t]] = m.label_aps[static_cast<size_t>(c)][t];
    label_aps[name(c)] = std::move(aps);
    mean_dist[name(c)] = means[static_cast<size_t>(c)];
    ojson tps = ojson::object();
    for (size_t k = 0; k < kNumTpMetrics; ++k) tps[std::string(metrics[k])] = m.label_tp_errors[static_cast<size_t>(c)][k];
    label_tp[name(c)] = std::move(tps);
  }
  ojson tp_errors = ojson::object(), tp_scores = ojson::object();
  const auto errors = m.tp_errors();
  const auto scores = m.tp_scores();
  for (size_t k = 0; k < kNumTpMetrics; ++k) {
    tp_errors[std::string(metrics[k])] = errors[k];
    tp_scores[std::string(metrics[k])] = scores[k];
  }
  ojson out = ojson::object();
  out["label_aps"] = std::move(label_aps);
  out["mean_dist_aps"] = std::move(mean_dist);
  out["mean_ap"] = m.mean_ap();
  out["label_tp_errors"] = std::move(label_tp);
  out["tp_errors"] = std::move(tp_errors);
  out["tp_scores"] = std::move(tp_scores);
  out["nd_score"] = m.nd_score();
  out["eval_time"] = m.eval_time;
  out["cfg"] = m.cfg.serialized;
  out["meta"] = meta;
  return out;
}

ojson metrics_details_json(const Evaluation& e) {
  const DetectionConfig& cfg = e.metrics.cfg;
  ojson out = ojson::object();
  for (size_t i = 0; i < cfg.classes.size(); ++i) {
    for (size_t t = 0; t < cfg.dist_ths.size(); ++t) {
      const MetricData& md = e.data(i, t);
      auto tp = [&](TpMetric m) { return md.tp[static_cast<size_t>(m)]; };
      ojson j = ojson::object();
      j["recall"] = md.recall;
      j["precision"] = md.precision;
      j["confidence"] = md.confidence;
      j["trans_err"] = tp(TpMetric::kTrans);
      j["vel_err"] = tp(TpMetric::kVel);
      j["scale_err"] = tp(TpMetric::kScale);
      j["orient_err"] = tp(TpMetric::kOrient);
      j["attr_err"] = tp(TpMetric::kAttr);
      out[std::string(detection_names()[static_cast<size_t>(cfg.classes[i])]) + ":" + cfg.dist_th_keys[t]] = std::move(j);
    }
  }
  return out;
}

std::string text_summary(const DetectionMetrics& m) {
  static const char* kShort[kNumTpMetrics] = {"mATE", "mASE", "mAOE", "mAVE", "mAAE"};
  std::string s = "mAP: " + fmt("%.4f", m.mean_ap()) + "\n";
  const auto errors = m.tp_errors();
  for (size_t k = 0; k < kNumTpMetrics; ++k) s += std::string(kShort[k]) + ": " + fmt("%.4f", errors[k]) + "\n";
  s += "NDS: " + fmt("%.4f", m.nd_score()) + "\n";
  s += "Eval time: " + fmt("%.1f", m.eval_time) + "s\n\nPer-class results:\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-20s\t%-6s\t%-6s\t%-6s\t%-6s\t%-6s\t%-6s\n", "Object Class", "AP", "ATE", "ASE",
                "AOE", "AVE", "AAE");
  s += line;
  const auto means = m.mean_dist_aps();
  for (int c : m.cfg.classes) {
    const auto& e = m.label_tp_errors[static_cast<size_t>(c)];
    std::snprintf(line, sizeof(line), "%-20s\t", std::string(detection_names()[static_cast<size_t>(c)]).c_str());
    s += line;
    // Table order: ATE, ASE, AOE, AVE, AAE = TpMetric order.
    s += fmt("%-6.3f", means[static_cast<size_t>(c)]);
    for (size_t k = 0; k < kNumTpMetrics; ++k) s += "\t" + fmt("%-6.3f", e[k]);
    s += "\n";
  }
  return s;
}

}  // namespace bev::eval
