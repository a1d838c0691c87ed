// mmdetection3d info files (format v1.1: {"metainfo": ..., "data_list": [...]}, as JSON — e.g.
// ../shared/data/nuscenes-demo/info.json): the samples' calibration and poses turned into frame
// JSONs (bevformer convert-info), and their ground-truth boxes for rendering and checks.
// Each camera gets `lidar2img` = [cam2img 0; 0 1] @ lidar2cam, with the info's lidar2cam (time-
// compensated between the camera's and the lidar's exposure: exactly what upstream consumes).
// K + T_ego_from_cam are not written: they would describe the same camera without the time
// compensation, and a frame camera gives one calibration or the other.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/frame_json.h"

namespace bev {

// JSON as Python's json.dump writes it: a bare NaN outside strings reads as null (the published
// demo info has NaN velocities). Errors (kInvalidInput) name `where`.
nlohmann::json parse_python_json(std::string_view text, const std::string& where);

// nuScenes camera slot order (the order of cams_embeds in every BEVFormer checkpoint).
const std::vector<std::string>& nuscenes_camera_names();

struct InfoCamera {
  std::string name;      // CAM_FRONT, ...
  std::string img_path;  // as written in the info
  Mat4 cam2img{};        // [K 0; 0 1] at the original resolution (a 3x3 cam2img is padded)
  Mat4 cam2ego{};        // T_ego_from_cam
  Mat4 lidar2cam{};      // T_cam_from_lidar, time-compensated
  double timestamp = 0;  // seconds
};

struct InfoSample {
  size_t index = 0;                        // position in data_list
  std::string token;                       // sample token ("" when absent)
  double timestamp = 0;                    // seconds
  std::optional<std::string> scene_token;  // only in infos that carry one (BEVFormer's own converter)
  std::string lidar_path;                  // lidar_points.lidar_path ("" when absent)
  Mat4 ego2global{};                       // T_world_from_ego
  Mat4 lidar2ego{};                        // T_ego_from_lidar
  std::vector<InfoCamera> cameras;         // nuScenes slot order
};

struct NuScenesInfo {
  std::string path;
  std::vector<std::string> categories;  // class name by the info's label index (metainfo.categories)
  std::vector<InfoSample> samples;      // data_list order
};

// Reads the info file; errors (kInvalidInput) name the file and the key path
// ("info.json: data_list[0].images.CAM_FRONT.cam2img[2]"); unknown keys are ignored.
NuScenesInfo read_nuscenes_info(const std::string& path);

struct ConvertInfoOptions {
  std::string stream;                // the frames' stream id; "" = the info file's stem
  std::optional<std::string> scene;  // one scene for every frame; else see info_to_frames
  std::string images_dir;            // where img_path is looked up; "" = the info file's folder
};

// One frame per data_list entry, in timestamp order, with image paths relative to `out_dir`.
// An image is looked up as images_dir/img_path, then images_dir/samples/<CAM>/img_path (the
// nuScenes tree); kNotFound when neither exists. Scene of each frame: options.scene; else the
// entry's scene_token; else the nuScenes log name of its files ("<log>__CAM_FRONT__<t>.jpg"),
// with "/<k>" counting the runs of entries less than 2 s apart within the log (nuScenes
// keyframes are 0.5 s apart; scenes of one log are separated in time); else none.
std::vector<Frame> info_to_frames(const NuScenesInfo& info, const std::string& out_dir,
                                      const ConvertInfoOptions& options);

// info_to_frames, then writes OUT/frame_<k>.json (k zero-padded to 4+ digits, timestamp order)
// after re-parsing each one as a reader would. Returns the written paths.
std::vector<std::string> convert_info(const std::string& info_path, const std::string& out_dir,
                                      const ConvertInfoOptions& options);

// One ground-truth object of an info entry, its values as the info stores them (bbox_3d).
struct GtBox {
  // x, y, z, l (dx), w (dy), h (dz), yaw in the LIDAR_TOP frame, mmdetection3d 1.x info layout
  // (box_from_mmdet3d_info in io/detections_json.h converts it to the model's convention). z is
  // the box's GRAVITY centre: the demo README says z_bottom, but cam_instances (computed from
  // nuScenes' centre) coincide with (x, y, z) through lidar2cam to 1e-6 m.
  std::array<double, 7> box{};
  std::string class_name;            // metainfo.categories name of bbox_label_3d
  std::array<double, 2> velocity{};  // vx, vy (m/s, LIDAR_TOP frame); NaN when the info has none
  int64_t num_lidar_pts = 0;
  bool valid = true;                 // bbox_3d_isvalid
  // Cameras whose cam_instances hold this box (matched by label and the centre through the
  // camera's lidar2cam, within 1 cm), in slot order; empty when the entry has no cam_instances.
  std::vector<std::string> cameras;
};

// The ground truth of data_list[entry]. Objects whose label is -1 (not one of the detection
// classes) are left out. kNotFound when entry is out of range.
std::vector<GtBox> read_info_ground_truth(const std::string& info_path, size_t entry);

}  // namespace bev
