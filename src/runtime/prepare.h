// prepare_frame: a parsed frame (io/frame_json.h) becomes the model's input (FrameInput), on the
// host (docs/bevformer-spec.md §2.1, §3, §4): every camera image decoded once, its BGR u8 pixels
// side by side in slot order (the image stage runs upstream's test pipeline on them, on the
// backend: Ops::image_preprocess); lidar2img per camera (given, or [K 0; 0 1] @
// inv(T_ego_from_cam) @ T_ego_from_lidar in float64), then diag(s, s, 1, 1) @ lidar2img. The
// absolute CAN-bus vector from the ego pose as get_data_info does; the per-stream delta is the
// model's (temporal_step).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "io/frame_json.h"
#include "model/bevformer.h"  // FrameInput
#include "model/config.h"

namespace bev {

struct PreparedFrame {
  FrameInput input;  // img u8 [N, H, W, 3] BGR, lidar2img at the network's scale, absolute can_bus, scene_token
  std::string stream;
  double timestamp = 0;
  std::string scene;  // the frame's "scene", "" when absent (input.scene_token is then the stream id)
  std::vector<std::string> camera_names;      // slot order
  std::vector<Tensor> images;                 // u8 [H, W, 3] BGR, as decoded (for rendering): views of input.img
  std::vector<Mat4> lidar2img_original;       // per camera, at the image's own resolution
  std::optional<Mat4> T_world_from_ego;
  Mat4 T_ego_from_lidar = mat4_identity();
};

// Decodes and checks every camera (count = cfg.transformer.num_cams, size = cfg.image width x
// height, nuScenes names in nuScenes slot order) and builds the model input. Image paths are
// resolved against `base_dir` (the frame file's folder) unless absolute. Errors are
// Error(kInvalidInput) naming the camera (kNotFound for a missing image file). Cameras are
// decoded in parallel on `pool` when given. With `staging` (the backend the frame runs on), the
// pixels land in its staging memory when it wants that (Backend::wants_staging), so they cross
// to the device without another copy.
PreparedFrame prepare_frame(const Frame& spec, const ModelConfig& cfg, const std::string& base_dir,
                            ThreadPool* pool = nullptr, Backend* staging = nullptr);

// lidar2img of one camera at its image's resolution: the given one, or
// [K 0; 0 1] @ inv(T_ego_from_cam) @ T_ego_from_lidar.
Mat4 camera_lidar2img(const Camera& cam, const Mat4& T_ego_from_lidar);
// diag(s, s, 1, 1) @ m (RandomScaleImageMultiViewImage).
Mat4 scale_lidar2img(const Mat4& m, double s);

// The unit quaternion (w, x, y, z) of T's rotation, with w >= 0 (a matrix does not fix the sign).
std::array<double, 4> rotation_quaternion_wxyz(const Mat4& T);
// The absolute 18-value CAN-bus vector of a frame (spec §3): with T_world_from_ego, [0:3] its
// translation, [3:7] its quaternion, [16]/[17] the patch angle (yaw of the ego x axis in the world
// xy-plane) in rad in [0, 2π) / deg in [0, 360), computed as get_data_info does, and [7:16] from
// the frame's can_bus when given, else 0; without a pose, the frame's can_bus as it is.
std::array<double, 18> absolute_can_bus(const Frame& spec);

}  // namespace bev
