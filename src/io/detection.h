// One detected box as the engine hands it on: the box code in the LiDAR (BEV) frame, its score,
// class and decoder query. The model's coder (model/coder.h) makes these; io/ writes them
// (detections JSON, nuScenes results) and the API turns them into its Box.
#pragma once

#include <array>
#include <cstdint>

namespace bev {

struct Detection {
  std::array<float, 9> box{};  // x, y, z_bottom, w, l, h, yaw, vx, vy (LiDAR frame)
  float score = 0;             // sigmoid score
  int label = 0;               // class index
  int64_t query = 0;           // the decoder query it came from
};

}  // namespace bev
