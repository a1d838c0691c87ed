// The devkit's add_center_dist and filter_eval_boxes, applied alike to GT and predictions:
// per sample and in this order, keep boxes closer to the ego than their class range (strict),
// drop boxes with num_pts == 0 (GT only in practice: predictions carry -1), and drop bicycles and
// motorcycles whose centre is inside one of the sample's bike racks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "eval/detection_config.h"
#include "eval/eval_boxes.h"

namespace bev::eval {

struct FilterCounts {  // filter_eval_boxes' verbose counters, summed over samples
  size_t total = 0;
  size_t after_distance = 0;
  size_t after_points = 0;
  size_t after_bike_racks = 0;
  std::array<size_t, kNumDetectionClasses> per_class{};  // after all filters
};

struct FilteredSet {
  // Per sample of the source, in its order: the boxes kept, in their order, with ego_dist set;
  // for predictions also match_sample.
  std::vector<std::vector<EvalBox>> samples;
  std::vector<uint32_t> gt_sample;  // the GT sample each entry of `samples` belongs to
  FilterCounts counts;
};

// The ego distance the devkit uses: the xy distance in the GLOBAL frame between the box centre
// and the ego pose's translation (the ego rotation does not enter).
double ego_distance(const EvalBox& box, const GtSample& sample);
bool in_any_bike_rack(const EvalBox& box, const GtSample& sample);

FilteredSet filter_ground_truth(const GroundTruth& gt, const DetectionConfig& cfg);
// Predictions take the ego pose and bike racks of the sample they are listed under; the results
// must hold exactly the GT's samples (check_same_samples) — kInvalidInput otherwise.
FilteredSet filter_predictions(const Results& results, const GroundTruth& gt, const DetectionConfig& cfg);

}  // namespace bev::eval
