// What the engine says about a frame, written down: one frame's detections as JSON (docs/FORMATS.md
// "Detections"), and nuScenes `results_nusc.json` for evaluation (docs/bevformer-spec.md §7).
//
// Box convention (bev::Detection, as BEVFormer's get_bboxes gives it: mmdet3d 0.17
// LiDARInstance3DBoxes, origin (0.5, 0.5, 0)): box = [x, y, z_bottom, w, l, h, yaw, vx, vy] in the
// LiDAR (BEV) frame, x right, y forward, z up. (w, l, h) are nuScenes' width, length, height. The
// box's heading (the direction its length and its front face point, counter-clockwise from +x) is
// box_heading() = -yaw - pi/2, because training targets were yaw = -yaw_nus - pi/2. The gravity
// centre is (x, y, z_bottom + h/2).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/detection.h"

namespace bev {

using Box9 = std::array<float, 9>;  // x, y, z_bottom, w, l, h, yaw, vx, vy (LiDAR frame)

// Heading of the box's front, counter-clockwise from the LiDAR +x axis, in (-pi, pi]: -yaw - pi/2.
double box_heading(const Box9& box);
// (x, y, z_bottom + h/2).
std::array<double, 3> box_gravity_center(const Box9& box);
// A box from an mmdetection3d >= 1.0 info file's LiDAR `bbox_3d` [x, y, z, dx = l, dy = w, dz = h,
// yaw_v1] and `velocity`: z is the GRAVITY centre (the converter writes nuScenes' box.center; the
// dataset loads it with origin (0.5, 0.5, 0.5)) and yaw_v1 is the heading. Hence w = dy, l = dx,
// z_bottom = z - h/2, yaw = -yaw_v1 - pi/2. (nuscenes-demo/README.md calls that z "z_bottom": its
// own cam_instances say otherwise; see tests/test_render.cpp DemoProjection.MatchesCamInstances.)
Box9 box_from_mmdet3d_info(const std::array<double, 7>& bbox_3d, double vx, double vy);

// The poses of one frame, 4x4 row-major: T_world_from_ego (nuScenes ego2global) and
// T_ego_from_lidar (lidar2ego; identity when the rig has no separate BEV frame).
struct FramePoses {
  std::array<double, 16> world_from_ego{};
  std::array<double, 16> ego_from_lidar{};
};
std::array<double, 16> identity_pose();

struct DetectionsMeta {
  std::string stream;                      // stream id
  double timestamp = 0;                    // seconds, as the frame gave it
  int64_t frame_index = 0;                 // frames seen on this stream before this one
  std::optional<std::string> sample_token; // nuScenes sample token / frame token when known
  std::string model;                       // preset or config name
  bool untrained = false;                  // weights were random: the boxes are meaningless
  std::optional<float> score_threshold;    // a threshold applied before writing, if any
};

// One frame's detections as JSON (docs/FORMATS.md "Detections"). Every box has the LiDAR-frame
// fields at top level (`center` = gravity centre, `size` [w, l, h], `yaw` as the model gives it,
// `heading`, `velocity` [vx, vy]) plus `score`, `label`, `class`, `query`; when `poses` are given
// also `world`: centre, heading in the world xy plane, rotation quaternion [w, x, y, z] and
// velocity [vx, vy] in the world frame. A label outside class_names is an Error (kInvalidInput).
nlohmann::json detections_to_json(const std::vector<Detection>& detections,
                                  const std::vector<std::string>& class_names,
                                  const std::optional<FramePoses>& poses, const DetectionsMeta& meta);

// ---------------------------------------------------------------------------------------------
// nuScenes results (spec §7)

// Detection range in the ego frame (metres) of a nuScenes detection class; nullopt for a name that
// is not one of the 10 nuScenes detection classes.
std::optional<double> nusc_class_range(std::string_view class_name);
// The attribute rule of mmdet3d's _format_bbox, from the box's global speed ‖v_xy‖ (m/s).
std::string nusc_attribute(std::string_view class_name, double speed);

struct NuscBox {
  std::array<double, 3> translation{};  // global, gravity centre
  std::array<double, 3> size{};         // [w, l, h]
  std::array<double, 4> rotation{};     // global quaternion [w, x, y, z], w >= 0
  std::array<double, 2> velocity{};     // global [vx, vy]
  std::string detection_name;
  double detection_score = 0;
  std::string attribute_name;
};
nlohmann::json to_json(const NuscBox& box);

// One box through output_to_nusc_box and lidar_nusc_box_to_global: gravity centre, yaw_nus = -yaw -
// pi/2 about z, lidar -> ego, the class-range test in the ego frame (nullopt: dropped), ego ->
// global. Throws Error(kInvalidInput) for a class that is not a nuScenes detection class.
std::optional<NuscBox> to_nusc_box(const Detection& detection, const std::string& class_name, const FramePoses& poses);

// results_nusc.json accumulated over samples: {"meta": {...}, "results": {token: [box, ...]}}.
class NuscResults {
 public:
  static constexpr size_t kMaxBoxesPerSample = 500;

  // Converts and keeps one sample's boxes (the kMaxBoxesPerSample best by score, in descending
  // score order). Adding a token twice is an Error (kInvalidInput).
  void add_sample(const std::string& sample_token, const std::vector<Detection>& detections,
                  const std::vector<std::string>& class_names, const FramePoses& poses);
  size_t num_samples() const { return results_.size(); }
  const std::vector<NuscBox>& sample(const std::string& sample_token) const;  // throws kNotFound
  // One sample's list as results_nusc.json holds it (each box with its sample_token).
  nlohmann::json sample_json(const std::string& sample_token) const;
  nlohmann::json to_json() const;

 private:
  std::map<std::string, std::vector<NuscBox>> results_;
};

}  // namespace bev
