// Ground truth from an mmdetection3d info file (format v1.1 as JSON, e.g. data/nuscenes-demo/info.json)
// for when the nuScenes database is not at hand. An approximation of load_gt, stated plainly:
// - boxes: `instances` whose label names a detection class (label -1 is dropped); bbox_3d
//   [x, y, z (gravity centre), l, w, h, yaw] taken from the LIDAR_TOP frame to the global frame
//   through lidar2ego and ego2global; size [w, l, h];
// - velocity: the info's LiDAR-frame `velocity` rotated to the global frame ([null, null] stays
//   unknown — the converter writes NaN where nuScenes has no neighbour);
// - num_pts: num_lidar_pts + num_radar_pts (0 drops the box, as in the devkit);
// - attributes: the info has none. kUnknown writes "" (the devkit then skips the attribute error
//   of those matches: AAE is 1.0 for a class with only such GT), kFromSpeed labels each GT box
//   with mmdet3d's speed rule for predictions (nusc_attribute), which makes AAE measure agreement
//   with that rule, not with annotators;
// - no bike racks (the info does not carry them), so no bike-rack filtering.
#pragma once

#include <string>

#include "eval/eval_boxes.h"

namespace bev::eval {

enum class InfoAttributes { kUnknown, kFromSpeed };

// One GT sample per data_list entry, in data_list order, keyed by the entry's `token`.
// Error(kInvalidInput) naming the key path for anything malformed.
GroundTruth ground_truth_from_info(const std::string& info_path, InfoAttributes attributes);

// The unit quaternion [w, x, y, z] of a rotation matrix (row-major 3x3 block of a 4x4).
std::array<double, 4> quaternion_from_rotation(const std::array<double, 16>& m);

}  // namespace bev::eval
