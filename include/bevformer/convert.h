// mmdetection3d info files (format v1.1: metainfo + data_list, as ../shared/data/nuscenes-demo/
// info.json) to frame JSONs (docs/FORMATS.md "Frames"): one per data_list entry, in timestamp
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

}  // namespace bev
