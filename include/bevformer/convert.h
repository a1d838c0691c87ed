// Datasets to frame JSONs. mmdetection3d info files (format v1.1: metainfo + data_list, as
// ../shared/data/nuscenes-demo/info.json) to frame JSONs (docs/FORMATS.md "Frames"): one per data_list entry, in timestamp
// order, images referenced by path, lidar2img from the info's time-compensated lidar2cam.
#pragma once

#include <string>
#include <vector>

namespace bev {

struct ConvertInfoRequest {
  std::string info_path;
  std::string out_dir;     // created if missing; gets frame_<k>.json
  std::string stream;      // stream id of every frame; "" = the info file's stem
  std::string scene;       // scene token of every frame; "" = the entry's, else log name + run counter
  std::string images_dir;  // where img_path is looked up; "" = the info file's folder
};

// Returns the written paths. Errors name the entry and field.
std::vector<std::string> convert_nuscenes_info(const ConvertInfoRequest& request);

// A PandaSet sequence in the devkit's layout (camera/<name>/NN.jpg, intrinsics.json, poses.json,
// timestamps.json per camera; lidar/poses.json, lidar/timestamps.json) to frame JSONs
// frame_<k>.json, one per lidar frame: stream and scene the sequence's folder name, token
// "<sequence>/NN", the ego pose from the lidar pose, each camera's K and pose in the ego frame in
// the conventions a nuScenes-trained checkpoint expects (docs/FORMATS.md "From PandaSet").
struct ConvertPandasetRequest {
  std::string sequence_dir;
  std::string out_dir;  // created if missing
  std::string stream;   // "" = the sequence folder's name
  // The images' size in the frames: written to OUT/images/ resized, K scaled (default: the
  // nuScenes presets' 1600x900); 0 x 0 references the originals.
  int width = 1600, height = 900;
};

std::vector<std::string> convert_pandaset(const ConvertPandasetRequest& request);

}  // namespace bev
