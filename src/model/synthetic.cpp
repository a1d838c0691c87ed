#include "model/synthetic.h"

#include <cmath>
#include <numbers>
#include <random>
#include <string>

#include "core/mat4.h"
#include "model/param_spec.h"

namespace bev {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One generator per tensor, seeded from (seed, name), so adding a key elsewhere never changes
// the others.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

void fill(Tensor& t, const ParamSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(tensor_seed(seed, spec.name));
  float* p = t.data<float>();
  const int64_t n = t.numel();
  const std::string& name = spec.name;
  auto normal = [&](double mean, double std) {
    std::normal_distribution<double> d(mean, std);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(d(rng));
  };
  auto uniform = [&](double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(d(rng));
  };
  const bool batch_norm = name.find(".bn") != std::string::npos || name.find("downsample.1") != std::string::npos;
  if (ends_with(name, "running_var")) return uniform(0.5, 1.5);
  if (ends_with(name, "running_mean")) return normal(0.0, 0.1);
  if (spec.shape.size() == 1 && ends_with(name, ".weight")) return normal(batch_norm ? 0.5 : 1.0, 0.1);  // BN / LN gamma
  if (ends_with(name, "bias")) return normal(0.0, 0.05);
  if (name.find("embed") != std::string::npos || name.find("query_embedding") != std::string::npos) {
    return normal(0.0, 1.0);
  }
  int64_t fan_in = 1;
  for (size_t d = 1; d < spec.shape.size(); ++d) fan_in *= spec.shape[d];
  normal(0.0, 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1))));
}

}  // namespace

Checkpoint random_checkpoint(const ModelConfig& cfg, uint64_t seed) {
  Checkpoint ck;
  ck.path = "random weights (seed " + std::to_string(seed) + ")";
  ck.format = CheckpointFormat::kSafetensors;
  for (const ParamSpec& spec : expected_params(cfg)) {
    if (!spec.alias_of.empty()) continue;
    if (spec.dtype == DType::kI64) {
      ck.add(spec.name, Tensor::zeros(spec.shape, DType::kI64));
      continue;
    }
    Tensor t = Tensor::empty(spec.shape, DType::kF32);
    fill(t, spec, seed);
    ck.add(spec.name, std::move(t));
  }
  // Aliases (one module under several names) carry the same values.
  for (const ParamSpec& spec : expected_params(cfg)) {
    if (!spec.alias_of.empty()) ck.add(spec.name, *ck.find(spec.alias_of));
  }
  return ck;
}

std::vector<std::array<double, 16>> synthetic_rig(const ModelConfig& cfg) {
  const ImageSize img = image_resized_size(cfg.image);
  const double fx = img.width / 2.0 / std::tan(35.0 * std::numbers::pi / 180.0);
  const double yaws_deg[] = {0, -55, 55, 180, 110, -110};  // CCW from lidar +y (forward)
  std::vector<std::array<double, 16>> out;
  for (int i = 0; i < cfg.transformer.num_cams; ++i) {
    const double th = yaws_deg[i % 6] * std::numbers::pi / 180.0;
    // Camera axes in the lidar frame (x right, y forward, z up): x_cam right, y_cam down, z_cam
    // along the viewing direction; the camera sits 0.3 m below the lidar.
    const double xc[3] = {std::cos(th), std::sin(th), 0}, yc[3] = {0, 0, -1}, zc[3] = {-std::sin(th), std::cos(th), 0};
    const double t[3] = {0, 0, -0.3};
    std::array<double, 16> cam_from_lidar{};
    const double* axes[3] = {xc, yc, zc};
    for (int r = 0; r < 3; ++r) {
      double dot = 0;
      for (int k = 0; k < 3; ++k) {
        cam_from_lidar[static_cast<size_t>(r * 4 + k)] = axes[r][k];
        dot += axes[r][k] * t[k];
      }
      cam_from_lidar[static_cast<size_t>(r * 4 + 3)] = -dot;
    }
    cam_from_lidar[15] = 1;
    std::array<double, 16> k{};
    k[0] = fx;
    k[2] = img.width / 2.0;
    k[5] = fx;
    k[6] = img.height / 2.0;
    k[10] = 1;
    k[15] = 1;
    out.push_back(mat4_mul(k, cam_from_lidar));
  }
  return out;
}

FrameInput synthetic_frame(const ModelConfig& cfg, uint64_t seed, int index) {
  const ImageSize pad = image_padded_size(cfg.image), img = image_resized_size(cfg.image);
  FrameInput f;
  f.img = Tensor::zeros({cfg.transformer.num_cams, pad.height, pad.width, 3}, DType::kF32);
  std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(index));
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = f.img.data<float>();
  // Drawn plane by plane (camera, channel), the order the values have always had, into NHWC.
  for (int64_t cam = 0; cam < cfg.transformer.num_cams; ++cam) {
    for (int64_t ch = 0; ch < 3; ++ch) {
      for (int y = 0; y < img.height; ++y) {
        for (int x = 0; x < img.width; ++x) p[((cam * pad.height + y) * pad.width + x) * 3 + ch] = d(rng);
      }
    }
  }
  f.lidar2img = synthetic_rig(cfg);
  const double yaw_deg = 30.0 + 2.0 * index, yaw = yaw_deg * std::numbers::pi / 180.0;
  f.can_bus[0] = 100.0 + index * std::cos(yaw);
  f.can_bus[1] = 200.0 + index * std::sin(yaw);
  f.can_bus[3] = std::cos(yaw / 2);  // quaternion (w, x, y, z) of a yaw rotation
  f.can_bus[6] = std::sin(yaw / 2);
  f.can_bus[16] = yaw;
  f.can_bus[17] = yaw_deg;
  f.scene_token = "synthetic-" + std::to_string(seed);
  return f;
}

}  // namespace bev
