// Seeded stand-ins for what a user brings: a checkpoint of random weights in the official
// layout of any config (every key and shape of expected_params), and synthetic frames on a
// nuScenes-like six-camera rig. They let every preset run at full size without a download (tests,
// benchmarks, and the untrained-model path of the CLI); nothing they produce is a detection.
#pragma once

#include <cstdint>

#include "io/checkpoint.h"
#include "model/bevformer.h"
#include "model/config.h"

namespace bev {

// Weights ~ N(0, 1/fan_in) for Linear/Conv (so activations keep their scale through depth),
// small biases, BatchNorm with gamma ~ 1, var in [0.5, 1.5], LayerNorm gamma ~ 1, embeddings
// ~ N(0, 1). The same (cfg, seed) gives the same bytes on every machine.
Checkpoint random_checkpoint(const ModelConfig& cfg, uint64_t seed);

// lidar2img (row-major 4x4, at the network input's scale) of six cameras looking front,
// front-right, front-left, back, back-left, back-right (nuScenes slot order), 1.5 m above the
// ground, with a 70-degree-wide pinhole on the config's resized image.
std::vector<std::array<double, 16>> synthetic_rig(const ModelConfig& cfg);

// Frame `index` of a drive: N(0, 1) pixels in the unpadded area (zero padding), the synthetic
// rig, the ego moving 1 m forward and turning 2 degrees left per frame, one scene.
FrameInput synthetic_frame(const ModelConfig& cfg, uint64_t seed, int index);

}  // namespace bev
