// The golden micro set's frames as frame JSON documents (docs/FORMATS.md): the raw PNGs by path
// relative to the set's folder, K + extrinsics, the ego pose and the raw CAN fields. Shared by
// the tests that drive the frame path (frames, Model API, server) and those that read the set's
// config and metadata (config, geometry).
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace bev::testing {

inline const std::string kMicroDir = std::string(BEV_SHARED_DIR) + "/golden/micro";

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

// Golden frame k of the micro set as a frame JSON, on stream "micro".
inline nlohmann::json micro_frame_json(int k) {
  const nlohmann::json meta = read_json_file(kMicroDir + "/frame" + std::to_string(k) + "_meta.json");
  nlohmann::json f;
  f["stream"] = "micro";
  f["timestamp"] = meta["timestamp"];
  f["scene"] = meta["scene_token"];
  f["T_world_from_ego"] = meta["ego2global"];
  f["T_ego_from_lidar"] = meta["lidar2ego"];
  f["can_bus"] = meta["can_bus"];
  for (const nlohmann::json& c : meta["cameras"]) {
    f["cameras"].push_back({{"name", c["name"]},
                            {"image", meta["img_filenames"][c["index"].get<size_t>()]},
                            {"K", c["cam2img"]},
                            {"T_ego_from_cam", c["cam2ego"]}});
  }
  return f;
}

}  // namespace bev::testing
