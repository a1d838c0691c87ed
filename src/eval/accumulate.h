// The devkit's accumulate() (nuscenes/eval/detection/algo.py) for one class and one distance
// threshold: greedy matching in score order, precision and confidence on the 101-point recall
// grid, and the five TP error curves; plus the numpy primitives it leans on, reproduced with
// their exact edge behaviour (numpy.interp on repeated abscissae, nancumsum, pairwise sums).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "eval/detection_config.h"
#include "eval/filter.h"

namespace bev::eval {

inline constexpr size_t kCurvePoints = 101;  // DetectionMetricData.nelem
using Curve = std::array<double, kCurvePoints>;

// DetectionMetricData. tp holds the error curves in TpMetric order (trans, scale, orient, vel, attr).
struct MetricData {
  Curve recall{};
  Curve precision{};
  Curve confidence{};
  std::array<Curve, kNumTpMetrics> tp{};

  // precision and confidence 0, every error curve 1: no GT of the class, or no match at all.
  static MetricData no_predictions();
  // The index of the last non-zero confidence (0 when there is none): the maximum recall reached.
  size_t max_recall_ind() const;
};

// np.linspace(0, 1, 101): exactly i * 0.01 for i < 100 and 1.0 at 100 (so 0.7000000000000001).
const Curve& recall_grid();

// numpy.interp(x, xp, fp, left, right) for non-decreasing xp that may repeat: the value at the
// LAST of equal abscissae <= x, linear in between, left/right outside; numpy's NaN fallbacks.
double numpy_interp(double x, std::span<const double> xp, std::span<const double> fp, double left, double right);
// The devkit's cummean: all NaN gives all 1.0; otherwise the mean of the non-NaN values so far,
// 0.0 before the first one.
std::vector<double> cummean(std::span<const double> x);
// np.sum / np.mean of float64: numpy's pairwise summation (8 accumulators, blocks of 128), so
// that the last bits agree with the devkit's.
double numpy_sum(std::span<const double> x);
double numpy_mean(std::span<const double> x);

// accumulate(gt_boxes, pred_boxes, class, center_distance, dist_th). `gt` is filter_ground_truth's
// output (one entry per GT sample, in GT order), `pred` filter_predictions'. A matched pair with a
// size that is not > 0 is Error(kInvalidInput) (the devkit asserts it), naming both boxes.
MetricData accumulate(const FilteredSet& gt, const FilteredSet& pred, const GroundTruth& truth,
                      const Results& results, int detection, double dist_th);

}  // namespace bev::eval
