// Ground truth from the nuScenes database itself (DATAROOT/VERSION/*.json, the v1.0 schema), as
// the devkit's load_gt builds it for a split: the split's samples in sample-table order, their
// annotations in sample_annotation-table order; category -> detection class (others dropped);
// the single attribute's name or ""; num_pts = num_lidar_pts + num_radar_pts; velocity from the
// neighbouring annotations (NuScenes.box_velocity); the ego pose of the sample's LIDAR_TOP key
// frame; and the sample's static_object.bicycle_rack annotations as bike racks.
//
// The tables are streamed record by record and only what load_gt needs is kept, so v1.0-trainval
// (a 1.2 M-record sample_annotation.json) loads in bounded memory.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/eval_boxes.h"

namespace bev::eval {

struct NuscenesDbOptions {
  std::string dataroot;  // the folder that holds VERSION/
  std::string version;   // v1.0-trainval, v1.0-mini, v1.0-test
  std::string split;     // val, mini_val, ... (default_split(version) when empty)
};

// The devkit's detection class of a nuScenes category (category_to_detection_name); nullopt for
// categories outside the detection task.
std::optional<std::string_view> category_to_detection_name(std::string_view category);
// val for *trainval, mini_val for *mini, test for *test; "" otherwise.
std::string default_split(std::string_view version);

// One annotation as box_velocity sees it.
struct AnnotationTrack {
  std::array<double, 3> translation{};
  int64_t timestamp = 0;  // of its sample, microseconds
  std::string prev;       // sample_annotation tokens, "" at the ends of the track
  std::string next;
};
// NuScenes.box_velocity(...)[:2]: centred difference between the previous and next annotations
// (a one-sided one at either end of the track), NaN for a lone annotation or when the two are
// more than max_time_diff apart (twice that for a centred difference).
std::array<double, 2> box_velocity(const AnnotationTrack& current, const AnnotationTrack* prev,
                                   const AnnotationTrack* next, double max_time_diff = 1.5);

// load_gt(nusc, split): Error(kNotFound) for a missing table, kInvalidInput for a split the
// version does not hold (as the devkit asserts), an unknown split, broken references or an
// annotation with more than one attribute.
GroundTruth load_nuscenes_gt(const NuscenesDbOptions& options);

}  // namespace bev::eval
