#include "eval/accumulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "bevformer/error.h"
#include "eval/box_geometry.h"

namespace bev::eval {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

void check_sizes(const EvalBox& gt, const EvalBox& pred, const GroundTruth& truth, const Results& results) {
  for (const auto* b : {&gt, &pred}) {
    if (b->size[0] > 0 && b->size[1] > 0 && b->size[2] > 0) continue;
    const bool is_gt = b == &gt;
    const std::string token = is_gt ? truth.samples[b->sample].token : results.samples[b->sample].token;
    throw Error(ErrorKind::kInvalidInput, std::string(is_gt ? "ground-truth" : "predicted") + " box " +
                                              std::to_string(b->index) + " of sample '" + token +
                                              "' is matched but has a size that is not > 0")
        .where(is_gt ? truth.source : results.source)
        .expected("every size > 0 (the devkit's scale_iou asserts it)");
  }
}

}  // namespace

MetricData MetricData::no_predictions() {
  MetricData md;
  md.recall = recall_grid();
  for (Curve& c : md.tp) c.fill(1.0);
  return md;
}

size_t MetricData::max_recall_ind() const {
  for (size_t i = kCurvePoints; i-- > 0;) {
    if (confidence[i] != 0) return i;
  }
  return 0;
}

const Curve& recall_grid() {
  static const Curve grid = [] {
    Curve g{};
    for (size_t i = 0; i < kCurvePoints; ++i) g[i] = static_cast<double>(i) * 0.01;
    g[kCurvePoints - 1] = 1.0;
    return g;
  }();
  return grid;
}

double numpy_interp(double x, std::span<const double> xp, std::span<const double> fp, double left, double right) {
  const size_t n = xp.size();
  if (n == 1) return x < xp[0] ? left : (x > xp[0] ? right : fp[0]);
  if (std::isnan(x)) return x;
  if (x > xp[n - 1]) return right;
  if (x < xp[0]) return left;
  const size_t j = static_cast<size_t>(std::upper_bound(xp.begin(), xp.end(), x) - xp.begin()) - 1;
  if (j == n - 1 || xp[j] == x) return fp[j];
  const double slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
  double r = slope * (x - xp[j]) + fp[j];
  if (std::isnan(r)) {  // numpy retries from the right end, then takes an equal pair's value
    r = slope * (x - xp[j + 1]) + fp[j + 1];
    if (std::isnan(r) && fp[j] == fp[j + 1]) r = fp[j];
  }
  return r;
}

std::vector<double> cummean(std::span<const double> x) {
  const bool all_nan = std::all_of(x.begin(), x.end(), [](double v) { return std::isnan(v); });
  if (all_nan) return std::vector<double>(x.size(), 1.0);
  std::vector<double> out(x.size());
  double sum = 0;
  double count = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    if (!std::isnan(x[k])) {
      sum += x[k];
      count += 1;
    }
    out[k] = count != 0 ? sum / count : 0.0;
  }
  return out;
}

double numpy_sum(std::span<const double> x) { return 0.0 + pairwise_sum(x.data(), x.size()); }

double numpy_mean(std::span<const double> x) {
  return numpy_sum(x) / static_cast<double>(x.size());  // 0/0 = NaN for an empty slice, as numpy
}

MetricData accumulate(const FilteredSet& gt, const FilteredSet& pred, const GroundTruth& truth,
                      const Results& results, int detection, double dist_th) {
  const size_t npos = gt.counts.per_class[static_cast<size_t>(detection)];
  if (npos == 0) return MetricData::no_predictions();

  // The class's predictions flattened in file order; sorted((score, i))[::-1] is descending by
  // score and, among equal scores, by position (the later box first). The keys are distinct.
  std::vector<const EvalBox*> boxes;
  for (const std::vector<EvalBox>& s : pred.samples) {
    for (const EvalBox& b : s) {
      if (b.detection == detection) boxes.push_back(&b);
    }
  }
  std::vector<uint32_t> order(boxes.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const double sa = boxes[a]->score, sb = boxes[b]->score;
    return sa != sb ? sa > sb : a > b;
  });

  // The class's GT per sample, in list order (equal distances go to the first), and taken flags.
  std::vector<std::vector<uint32_t>> candidates(gt.samples.size());
  std::vector<std::vector<char>> taken(gt.samples.size());
  for (size_t s = 0; s < gt.samples.size(); ++s) {
    for (uint32_t i = 0; i < gt.samples[s].size(); ++i) {
      if (gt.samples[s][i].detection == detection) candidates[s].push_back(i);
    }
    taken[s].assign(gt.samples[s].size(), 0);
  }

  const double period = detection_names()[static_cast<size_t>(detection)] == "barrier" ? std::numbers::pi
                                                                                      : 2 * std::numbers::pi;
  std::vector<double> tp, fp, conf;
  std::array<std::vector<double>, kNumTpMetrics> errors;
  std::vector<double> match_conf;
  double tp_sum = 0, fp_sum = 0;
  for (uint32_t k : order) {
    const EvalBox& p = *boxes[k];
    double min_dist = kInf;
    const EvalBox* match = nullptr;
    size_t match_index = 0;
    if (p.match_sample >= 0) {
      const auto s = static_cast<size_t>(p.match_sample);
      for (uint32_t i : candidates[s]) {
        if (taken[s][i]) continue;
        const double d = center_distance(gt.samples[s][i], p);
        if (d < min_dist) {
          min_dist = d;
          match = &gt.samples[s][i];
          match_index = i;
        }
      }
    }
    if (match != nullptr && min_dist < dist_th) {
      taken[static_cast<size_t>(p.match_sample)][match_index] = 1;
      tp_sum += 1;
      check_sizes(*match, p, truth, results);
      errors[static_cast<size_t>(TpMetric::kTrans)].push_back(center_distance(*match, p));
      errors[static_cast<size_t>(TpMetric::kVel)].push_back(velocity_l2(*match, p));
      errors[static_cast<size_t>(TpMetric::kScale)].push_back(1 - scale_iou(*match, p));
      errors[static_cast<size_t>(TpMetric::kOrient)].push_back(yaw_diff(*match, p, period));
      errors[static_cast<size_t>(TpMetric::kAttr)].push_back(attr_error(*match, p));
      match_conf.push_back(p.score);
    } else {
      fp_sum += 1;
    }
    tp.push_back(tp_sum);
    fp.push_back(fp_sum);
    conf.push_back(p.score);
  }
  if (match_conf.empty()) return MetricData::no_predictions();

  std::vector<double> prec(tp.size()), rec(tp.size());
  for (size_t i = 0; i < tp.size(); ++i) {
    prec[i] = tp[i] / (fp[i] + tp[i]);
    rec[i] = tp[i] / static_cast<double>(npos);
  }
  MetricData md;
  md.recall = recall_grid();
  for (size_t i = 0; i < kCurvePoints; ++i) {
    md.precision[i] = numpy_interp(md.recall[i], rec, prec, prec.front(), 0.0);
    md.confidence[i] = numpy_interp(md.recall[i], rec, conf, conf.front(), 0.0);
  }
  // Each error's cumulative mean, looked up at each grid confidence among the match scores
  // (both reversed: numpy.interp wants ascending abscissae).
  std::vector<double> xp(match_conf.rbegin(), match_conf.rend());
  for (size_t m = 0; m < kNumTpMetrics; ++m) {
    const std::vector<double> cm = cummean(errors[m]);
    const std::vector<double> fp_rev(cm.rbegin(), cm.rend());
    for (size_t i = 0; i < kCurvePoints; ++i) {
      const double x = md.confidence[kCurvePoints - 1 - i];
      md.tp[m][kCurvePoints - 1 - i] = numpy_interp(x, xp, fp_rev, fp_rev.front(), fp_rev.back());
    }
  }
  return md;
}

}  // namespace bev::eval
