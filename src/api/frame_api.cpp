// The public frame helpers of bevformer/frame.h beyond the JSON (io/frame_json.cpp): camera images
// decoded into owning pixels, and the synthetic drive the Python package and examples use.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "bevformer/frame.h"
#include "core/tensor.h"
#include "io/image.h"
#include "model/config.h"
#include "model/synthetic.h"

namespace bev {
namespace {

ImagePixels pixels_of(const Tensor& bgr) {
  ImagePixels p;
  p.owner = std::make_shared<Tensor>(bgr);  // the tensor's storage lives as long as the pixels
  p.data = bgr.data<uint8_t>();
  p.height = bgr.size(0);
  p.width = bgr.size(1);
  return p;
}

constexpr const char* kNuScenesCameras[] = {"CAM_FRONT",      "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                            "CAM_BACK",       "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};

}  // namespace

ImagePixels decode_image_pixels(std::span<const uint8_t> bytes, const std::string& name) {
  return pixels_of(decode_image(bytes, name).contiguous());
}

ImagePixels read_image_pixels(const std::string& path) { return pixels_of(read_image(path).contiguous()); }

Frame synthetic_camera_frame(const std::string& config, uint64_t seed, int index) {
  const ModelConfig cfg = load_config(config);
  const int n = cfg.transformer.num_cams;
  const int64_t h = cfg.image.height, w = cfg.image.width;
  // synthetic_rig is at the network input's scale; a frame's lidar2img is at the image's.
  const std::vector<std::array<double, 16>> rig = synthetic_rig(cfg);
  Frame f;
  f.stream = "synthetic-" + std::to_string(seed);
  f.scene = f.stream;
  f.timestamp = 1.6e9 + 0.5 * index;
  // The drive of model/synthetic.h's frames: 1 m forward and 2 degrees left per frame.
  const double yaw = (30.0 + 2.0 * index) * std::numbers::pi / 180.0;
  f.T_world_from_ego = Mat4{std::cos(yaw), -std::sin(yaw), 0, 100.0 + index * std::cos(yaw),
                            std::sin(yaw), std::cos(yaw),  0, 200.0 + index * std::sin(yaw),
                            0,             0,              1, 0,
                            0,             0,              0, 1};
  // Pixels: a smooth pattern per camera (structure for the convolutions to respond to) plus
  // seeded noise.
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(index));
  for (int c = 0; c < n; ++c) {
    Camera cam;
    cam.name = n == 6 ? std::string(kNuScenesCameras[c]) : "CAM_" + std::to_string(c);
    Mat4 m = rig[static_cast<size_t>(c)];
    for (int k = 0; k < 8; ++k) m[static_cast<size_t>(k)] /= cfg.image.resize_scale;
    cam.lidar2img = m;
    Tensor img = Tensor::empty({h, w, 3}, DType::kU8);
    uint8_t* p = img.data<uint8_t>();
    const double phase = static_cast<double>(rng() % 1000) / 100.0;
    std::vector<double> col(static_cast<size_t>(w * 3)), row(static_cast<size_t>(h));
    for (int64_t x = 0; x < w; ++x) {
      for (int ch = 0; ch < 3; ++ch) {
        col[static_cast<size_t>(x * 3 + ch)] = 60 * std::sin(0.013 * static_cast<double>(x) * (ch + 1) + phase);
      }
    }
    for (int64_t y = 0; y < h; ++y) row[static_cast<size_t>(y)] = 127.5 + 40 * std::cos(0.021 * static_cast<double>(y) + c);
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const uint64_t r = rng();
        for (int ch = 0; ch < 3; ++ch) {
          const double v = row[static_cast<size_t>(y)] + col[static_cast<size_t>(x * 3 + ch)];
          const int noise = static_cast<int>((r >> (ch * 8)) & 0x3f) - 32;
          p[(y * w + x) * 3 + ch] = static_cast<uint8_t>(std::clamp(static_cast<int>(v) + noise, 0, 255));
        }
      }
    }
    cam.pixels = pixels_of(img);
    f.cameras.push_back(std::move(cam));
  }
  return f;
}

}  // namespace bev
