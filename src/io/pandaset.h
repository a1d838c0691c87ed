// PandaSet sequences (the devkit's layout) to frame JSONs (docs/FORMATS.md "From PandaSet"):
//
//   SEQ/camera/<name>/NN.jpg, intrinsics.json {fx, fy, cx, cy}, poses.json [{position, heading}],
//       timestamps.json [seconds]          for the six cameras front_camera ... right_camera
//   SEQ/lidar/poses.json, lidar/timestamps.json
//
// Poses are sensor-to-world (position x, y, z; heading the unit quaternion w, x, y, z), as the
// devkit composes them. The main lidar's body frame (x right, y forward, z up) is the BEV frame;
// the ego frame is the same point turned to x forward, y left, z up (rigid on the vehicle, as
// nuScenes' LIDAR_TOP sits in its ego frame); cameras (x right, y down, z forward, the devkit's
// projection) are placed in the ego frame of their frame's lidar pose, so their own timestamps'
// motion is compensated as nuScenes' lidar2cam is. Nothing here decodes images except to resize.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/mat4.h"

namespace bev {

struct PandasetOptions {
  std::string stream;  // "" = the sequence folder's name
  // Images are written at this size with K scaled to it (nuScenes presets take 1600x900, which is
  // PandaSet's 1920x1080 times 5/6); 0 x 0 references the originals at their own size.
  int width = 1600, height = 900;
};

// PandaSet's camera folders in the model's slot order (CAM_FRONT, CAM_FRONT_RIGHT,
// CAM_FRONT_LEFT, CAM_BACK, CAM_BACK_LEFT, CAM_BACK_RIGHT), and the names the frames give them.
inline constexpr const char* kPandasetCameras[6] = {"front_camera", "front_right_camera", "front_left_camera",
                                                    "back_camera",  "left_camera",        "right_camera"};
inline constexpr const char* kPandasetSlotNames[6] = {"CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                                      "CAM_BACK",  "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};

// The BEV (main lidar) frame in the ego frame: p_ego = T p_lidar, x_ego = y_lidar, y_ego = -x_lidar.
Mat4 pandaset_ego_from_lidar();
// A devkit pose (position, heading w x y z) as sensor-to-world; the quaternion is normalized.
Mat4 pandaset_pose(double x, double y, double z, double qw, double qx, double qy, double qz);

// The devkit's JSON files, parsed from their bytes (fuzz_pandaset); `where` names the file in
// errors (kInvalidInput, naming the entry). poses.json: a list of {position {x, y, z}, heading
// {w, x, y, z}} (finite, the heading a unit quaternion within 1e-3); timestamps.json: a list of
// finite numbers; intrinsics.json: {fx, fy, cx, cy}, finite, fx and fy positive.
std::vector<Mat4> parse_pandaset_poses(std::string_view text, const std::string& where);
std::vector<double> parse_pandaset_timestamps(std::string_view text, const std::string& where);
Mat3 parse_pandaset_intrinsics(std::string_view text, const std::string& where);

// Writes OUT/frame_NNNN.json per lidar frame (and OUT/images/<camera>/NN.jpg when resizing);
// returns their paths in time order. Errors (kInvalidInput / kNotFound) name the file and entry.
std::vector<std::string> convert_pandaset_sequence(const std::string& seq_dir, const std::string& out_dir,
                                                   const PandasetOptions& options);

}  // namespace bev
