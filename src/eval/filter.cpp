#include "eval/filter.h"

#include <cmath>
#include <string_view>

#include "eval/box_geometry.h"

namespace bev::eval {

namespace {

bool is_cycle(int detection) {
  const std::string_view n = detection_names()[static_cast<size_t>(detection)];
  return n == "bicycle" || n == "motorcycle";
}

// The three filters on one sample's boxes, in place, counting as filter_eval_boxes does.
void filter_sample(std::vector<EvalBox>& boxes, const GtSample& sample, const DetectionConfig& cfg,
                   FilterCounts& counts) {
  counts.total += boxes.size();
  std::erase_if(boxes, [&](EvalBox& b) {
    b.ego_dist = ego_distance(b, sample);
    return !(b.ego_dist < cfg.class_range[static_cast<size_t>(b.detection)]);
  });
  counts.after_distance += boxes.size();
  std::erase_if(boxes, [](const EvalBox& b) { return b.num_pts == 0; });
  counts.after_points += boxes.size();
  if (!sample.bike_racks.empty()) {
    std::erase_if(boxes, [&](const EvalBox& b) { return is_cycle(b.detection) && in_any_bike_rack(b, sample); });
  }
  counts.after_bike_racks += boxes.size();
  for (const EvalBox& b : boxes) ++counts.per_class[static_cast<size_t>(b.detection)];
}

}  // namespace

double ego_distance(const EvalBox& box, const GtSample& sample) {
  const double dx = box.translation[0] - sample.ego_translation[0];
  const double dy = box.translation[1] - sample.ego_translation[1];
  return std::sqrt(dx * dx + dy * dy);
}

bool in_any_bike_rack(const EvalBox& box, const GtSample& sample) {
  for (const BikeRack& r : sample.bike_racks) {
    if (point_in_box(box.translation, r.translation, r.size, r.rotation)) return true;
  }
  return false;
}

FilteredSet filter_ground_truth(const GroundTruth& gt, const DetectionConfig& cfg) {
  FilteredSet out;
  out.samples.reserve(gt.samples.size());
  for (size_t s = 0; s < gt.samples.size(); ++s) {
    out.samples.push_back(gt.samples[s].boxes);
    out.gt_sample.push_back(static_cast<uint32_t>(s));
    filter_sample(out.samples.back(), gt.samples[s], cfg, out.counts);
  }
  return out;
}

FilteredSet filter_predictions(const Results& results, const GroundTruth& gt, const DetectionConfig& cfg) {
  check_same_samples(results, gt);
  FilteredSet out;
  out.samples.reserve(results.samples.size());
  for (const ResultSample& rs : results.samples) {
    const size_t g = gt.index.at(rs.token);
    std::vector<EvalBox> boxes = rs.boxes;
    for (EvalBox& b : boxes) b.match_sample = static_cast<int32_t>(g);
    for (const auto& [i, token] : rs.own_tokens) {
      const auto it = gt.index.find(token);
      boxes[i].match_sample = it == gt.index.end() ? -1 : static_cast<int32_t>(it->second);
    }
    filter_sample(boxes, gt.samples[g], cfg, out.counts);
    out.samples.push_back(std::move(boxes));
    out.gt_sample.push_back(static_cast<uint32_t>(g));
  }
  return out;
}

}  // namespace bev::eval
