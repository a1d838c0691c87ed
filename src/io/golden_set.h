// Golden sets (../shared/golden/<set>/, layout in each set's README): finding the files, reading
// a frame (its tensors and meta JSON, validated), and comparing what a model produced with it —
// tensors by relative L2 (core/compare.h) or exactly, detections as a set keyed by (query, label).
// Nothing here runs a model: the comparisons take plain tensors and detection records.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/golden.h"
#include "core/tensor.h"
#include "io/checkpoint.h"

namespace bev {

struct GoldenSetFiles {
  std::string dir;
  std::string config_path;      // <dir>/config.json
  std::string checkpoint_path;  // <dir>/checkpoint.pth, else <dir>/weights.safetensors
  std::string summary_path;     // <dir>/golden.json, "" when absent
  std::vector<std::string> frame_tensor_paths;  // <dir>/frame<k>.safetensors, k = 0, 1, ... until one is missing
  std::vector<std::string> frame_meta_paths;    // <dir>/frame<k>_meta.json
  size_t num_frames() const { return frame_tensor_paths.size(); }
};

// Throws Error(kNotFound) naming the missing file (directory, config.json, checkpoint, frame0,
// a frame's meta) and Error(kInvalidInput) when golden.json is present but malformed or lists
// another number of frames.
GoldenSetFiles find_golden_set(const std::string& dir);

// One detection as the set stores it (det.boxes_3d, det.scores_3d, det.labels_3d, det.query_index).
struct DetectionRecord {
  std::array<double, 9> box{};  // x, y, z_bottom, w, l, h, yaw, vx, vy
  double score = 0;
  int64_t label = 0;
  int64_t query = 0;
};

struct GoldenFrame {
  size_t index = 0;
  std::string tensors_path;
  std::string meta_path;
  Checkpoint tensors;    // every tensor of frame<k>.safetensors under its golden name
  nlohmann::json meta;   // frame<k>_meta.json

  // Parsed from the above and checked for shape.
  Tensor img;                                    // f32 [N, 3, H_pad, W_pad] ("img")
  std::vector<std::array<double, 16>> lidar2img; // meta "lidar2img": N row-major 4x4
  std::array<double, 18> can_bus{};              // meta "can_bus": raw, before the test-time delta
  std::string scene_token;                       // meta "scene_token"
  bool has_detections = false;                   // the frame has the det.* tensors
  std::vector<DetectionRecord> detections;       // in the set's order (by score, descending)
};

// Reads frame k of the set. Errors name the file and the key: bad JSON, a missing or mistyped
// meta key, a tensor of the wrong dtype or shape (img, det.*), lidar2img not N x 4 x 4.
GoldenFrame load_golden_frame(const GoldenSetFiles& set, size_t k);

// Tensors whose values must be equal (integer and boolean dtypes).
bool golden_tensor_is_exact(DType dtype);

// One tensor: `got` (the model's tap, any dtype convertible to f64) against `want` (golden).
// Float tensors pass with relative L2 <= tolerance, integer ones when every value is equal.
GoldenTensorResult compare_golden_tensor(const std::string& name, const Tensor& got, const Tensor& want,
                                         double tolerance);

// Every tensor of the golden frame except the det.* ones (compared as detections) against the
// taps of the same name, in pipeline order; golden tensors without a tap are kNotProduced, taps
// the set lacks are ignored.
std::vector<GoldenTensorResult> compare_golden_tensors(const Checkpoint& golden,
                                                       const std::vector<std::pair<std::string, Tensor>>& taps,
                                                       double tolerance);

// Sort key of a golden tensor name in pipeline order (img, backbone, neck, geometry, encoder,
// decoder, heads, detections; unknown names last).
int golden_pipeline_rank(const std::string& name);

// `ours` against `golden` (the set's ranking, by score, descending), as a set keyed by
// (query, label); see DetectionTolerance.
GoldenDetectionResult compare_detections(const std::vector<DetectionRecord>& ours,
                                         const std::vector<DetectionRecord>& golden,
                                         const DetectionTolerance& tolerance = {});

// The detections as the set stores them: det.boxes_3d f32 [K, 9], det.scores_3d f32 [K],
// det.labels_3d i64 [K], det.query_index i64 [K].
std::vector<std::pair<std::string, Tensor>> detection_tensors(const std::vector<DetectionRecord>& detections);

}  // namespace bev
