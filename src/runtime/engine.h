// The engine behind every surface (the Model API, golden, bench, profile, the server): one
// BEVFormer loaded on one backend (from the registry, by name), the StageRunner that records and
// executes its stages, the streams with their histories, and the frame loop — a parsed frame
// prepared on the host, its stream leased, both stages run, the stream's history carried on.
// Built only through Engine::create.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "bevformer/model.h"
#include "io/detections_json.h"
#include "io/frame_json.h"
#include "model/bevformer.h"
#include "model/taps.h"
#include "runtime/prepare.h"
#include "runtime/stage_runner.h"
#include "runtime/streams.h"

namespace bev {

class ProfilingBackend;
class ThreadPool;

struct EngineOptions {
  std::string backend = "cpu";  // a name from available_backends()
  BackendOptions backend_options;
  bool replay = true;      // record each stage once and execute it after (false: eager every frame)
  bool pipelined = false;  // two frames in flight (StageRunner's lanes)
  bool profiling = false;  // run ops through a ProfilingBackend (bench, profile)
  // detect_batch runs the batch size measured fastest per frame (StageRunner::set_adaptive_batching).
  bool adaptive_batching = true;
  StreamLimits streams;
  // int8 precision: the calibration file (model/calibration.h), checked against the weights, or
  // one already measured (calibration_data; `calibration` then only names it in errors).
  std::string calibration;
  std::shared_ptr<const Calibration> calibration_data;
  // Calibrating: every conv's input and output range is widened into *record_calibration as it
  // runs (an f32 model, eager and conv by conv: runtime/calibrate.h). Not with profiling.
  Calibration* record_calibration = nullptr;
};

// The engine options a caller's knobs give (backend, device, threads, precision parsed, calibration
// file); the rest at their defaults. `where` names the knobs in an error ("knobs", "bench options").
EngineOptions engine_options(const EngineKnobs& knobs, const std::string& where);

// What a frame's caller wants beyond its detections.
struct DetectRequest {
  bool taps = false;         // every stage's tensors, as host copies in golden-set names (--dump)
  bool keep_images = false;  // the decoded camera images and their lidar2img (rendering)
};

// One frame's outcome, as plain data; the surfaces write it as JSON, results, pictures.
struct FrameResult {
  std::string stream;
  double timestamp = 0;
  std::string scene;                  // the frame's "scene" ("" when absent)
  std::optional<std::string> token;   // the frame's sample token
  int64_t frame_index = 0;            // frames this stream completed before this one
  bool used_history = false;
  std::string history_reset;          // why the stream's history was dropped before this frame ("" if not)
  std::vector<Detection> detections;  // by descending score, LiDAR frame
  std::optional<FramePoses> poses;    // when the frame has an ego pose
  Taps taps;                          // DetectRequest::taps
  // DetectRequest::keep_images: per camera in slot order.
  std::vector<std::string> camera_names;
  std::vector<Tensor> images;         // u8 [H, W, 3] BGR, as decoded
  std::vector<Mat4> lidar2img;        // at the image's own resolution
  // Wall time (seconds): decoding and preprocessing, host geometry, the two stages, decoding boxes.
  double prepare_seconds = 0, geometry_seconds = 0, image_seconds = 0, bev_seconds = 0, decode_seconds = 0;
};

class Engine {
 public:
  // The one factory: the backend by name (Error(kUnsupported) naming what is missing), the
  // checkpoint's weights prepared and uploaded on it, a runner, the streams. The checkpoint need
  // not outlive the engine.
  static std::unique_ptr<Engine> create(const ModelConfig& cfg, const Checkpoint& checkpoint,
                                        const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const;
  const BevFormer& model() const;
  // Where the ops run: the backend, or the profiling decorator over it when options.profiling.
  Backend& backend();
  ProfilingBackend* profiling();  // the decorator, or null
  BackendInfo backend_info() const;
  StageRunner& runner();
  StreamRegistry& streams();
  const EngineOptions& options() const;
  // The int8 calibration the model was built with (null in other precisions).
  const Calibration* calibration() const;

  // A frame's model input as detect makes it: each camera decoded once (image paths relative to
  // base_dir) into the backend's staging memory where it wants that (Backend::wants_staging).
  PreparedFrame prepare(const Frame& spec, const std::string& base_dir);

  // One frame of a stream: images decoded (image paths relative to base_dir) and preprocessed in the image stage,
  // the stream's history reset where its rules say, both stages run, the history carried on.
  // Frames of one stream run one at a time in the order they lease it; frames of different
  // streams may run concurrently (each stage one frame at a time).
  FrameResult detect(const Frame& spec, const std::string& base_dir, const DetectRequest& request = {});

  // Frames of several streams, batched (StageRunner::forward_batch): each stream's frames run
  // in the order given, one per batch; a batch takes the earliest frames of distinct streams,
  // at most max_batch of them. One outcome per frame, in the order given: a frame that fails
  // (bad input, a stage's non-finite numbers) has its error and leaves its stream's history as
  // it was; the others are answered. Taps (request.taps) run the frames one at a time.
  struct Outcome {
    FrameResult result;
    std::exception_ptr error;
    int64_t batch_size = 0;  // frames that ran in its batch (0: it failed before running)
  };
  std::vector<Outcome> detect_batch(const std::vector<const Frame*>& frames, const std::string& base_dir,
                                    const DetectRequest& request, int max_batch);

 private:
  Engine();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bev
