// The engine's public face: a BEVFormer model (a config plus official weights, or seeded random
// weights that say so) with its streams. Frames go in as the frame JSON of DESIGN §4 (images by
// path or base64, calibration, ego pose, stream id); detections come out as plain structs and as
// the detections JSON document. One Model serves many streams from several threads: each
// stream's history (previous BEV, pose, timestamp) is kept apart, and bounded.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bevformer/engine_knobs.h"
#include "bevformer/error.h"
#include "bevformer/frame.h"

namespace bev {

// The engine's knobs (backend, device, threads, precision, calibration: bevformer/engine_knobs.h)
// and the model's.
struct Knobs : EngineKnobs {
  uint64_t seed = 2026;            // weights of the untrained model when no weights are given
  size_t max_streams = 64;         // streams kept; past it the least recently used is dropped
  double stream_ttl_seconds = 600; // a stream idle this long is dropped
  double max_gap_seconds = 10;     // a frame this much later than its stream's last one starts fresh
  bool replay = true;              // record each stage once and replay it (false: eager every frame)
  // Two frames in flight: the image stage of one frame (another stream's, from another thread)
  // runs while the bev stage of the other runs. Same results; the plans exist once per lane.
  bool pipeline = false;
  // The most frames of distinct streams one batch runs (Model::detect_batch, the server's batching).
  int max_batch = 8;
  // Ops run through the profiler's backend decorator, so that a profiler can be attached around
  // any calls (bevformer/runner.h). Detached it costs one pointer test per op.
  bool profiling = false;
};

// One detected box. LiDAR (BEV) frame: x right, y forward, z up; `center` is the bottom centre
// (mmdet3d's LiDARInstance3DBoxes), `size` is (w, l, h) as nuScenes orders it.
struct Box {
  std::array<double, 3> center{};
  std::array<double, 3> size{};
  double yaw = 0;                       // rad
  std::array<double, 2> velocity{};     // m/s
  double score = 0;
  int label = 0;
  std::string class_name;
  int64_t query = 0;                    // the decoder query it came from
};

// A rendered picture in memory: rows of BGR bytes, top to bottom (what OpenCV's writers take).
struct Picture {
  int width = 0, height = 0;
  std::vector<uint8_t> bgr;  // width * height * 3
};

struct Detections {
  std::string stream;
  double timestamp = 0;
  std::string scene;
  bool untrained = false;       // random weights: the boxes are meaningless
  bool used_history = false;    // the previous BEV of the stream was used
  std::string history_reset;    // why the stream's history was dropped before this frame ("" if not)
  std::vector<Box> boxes;       // by descending score
  int64_t frame_index = 0;      // frames this stream completed before this one
  std::string json;             // the detections JSON document (docs/FORMATS.md), world frame included when posed
  std::string sample_token;     // the frame's "token" ("" when it has none)
  std::string nuscenes_json;    // this frame's boxes for results_nusc.json (a JSON array; "" without a pose or token)
  Picture picture;              // DetectOptions::render_picture: the frame as render_png draws it
  double seconds = 0;           // wall time of the frame (prepare + model)
  // Its parts (seconds): parsing the JSON and decoding/resizing the images; the host geometry;
  // the `image` and `bev` stages; decoding the boxes and writing the JSON.
  double prepare_seconds = 0, geometry_seconds = 0, image_seconds = 0, bev_seconds = 0, output_seconds = 0;
};

struct DetectOptions {
  std::string render_png;       // write the picture of this frame here: PNG, or JPEG for .jpg/.jpeg ("" for none)
  bool render_picture = false;  // also return the picture in Detections::picture (a video's frame)
  std::string ground_truth_info;  // an mmdet3d info file whose matching entry's boxes are drawn too
  // Write every stage's tensors as <dir>/<stream>_<k>.safetensors (golden-set names), k the
  // frame's index in its stream (Detections::frame_index), the stream id made file-safe.
  std::string dump_dir;
};

// Frames (by their streams, in order) into batches: each stream's frames in order, one per
// batch, a frame in the earliest batch after its stream's previous one that has room for it
// (at most max_batch frames). Returns the frames' indices per batch: how Model::detect_batch
// groups them, and how a caller that reads frames lazily (the CLI) can read one batch at a time.
std::vector<std::vector<size_t>> batch_rounds(const std::vector<std::string>& streams, int max_batch);

// One frame's outcome in Model::detect_batch: its detections, or the error it failed with (its
// stream's history then as it was).
struct FrameOutcome {
  std::optional<Detections> detections;
  std::optional<Error> error;
  int batch_size = 0;  // frames that ran in its batch, its own included (0: it failed before running)
};

struct StreamStatus {
  std::string id;
  uint64_t frames = 0;
  double last_timestamp = 0;
  double idle_seconds = 0;
  bool has_history = false;
  bool busy = false;
};

// Totals of the streams and their frames since the model was loaded (the server's metrics).
struct StreamTotals {
  size_t active = 0;
  uint64_t created = 0, evicted_lru = 0, evicted_ttl = 0, dropped = 0;
  uint64_t resets_gap = 0, resets_backwards = 0, resets_scene = 0;
  uint64_t frames_nonfinite = 0;  // frames refused because a stage produced NaN or infinite values
};

// Where a model runs (Model::device_info, describe, bench, /v1/model).
struct DeviceInfo {
  std::string backend;    // "cpu", "foreign", "cuda"
  std::string device;     // the CPU model or GPU name
  std::string isa;        // e.g. "avx512_core_bf16"
  int threads = 0;
  std::string precision;
  // What runs in floating point: the precision itself in f32 and bf16; in int8 "bf16" on a CPU
  // with AMX, else "f32" (everything but the int8 convolutions).
  std::string float_precision;
};

// The backends this binary was built with ("cpu", "foreign" and, with CUDA, "cuda").
std::vector<std::string> available_backends();
// Throws the error Model::load would for a backend this binary cannot run here (not built,
// no device: Error(kUnsupported); no such name: kInvalidInput), without loading anything.
void require_backend(const std::string& backend);

// Camera images sent beside a frame instead of as files (an HTTP multipart body): a camera whose
// "image" is a string names an entry here. The bytes (JPEG or PNG) belong to the caller and are
// only read during the call.
using AttachedImages = std::map<std::string, std::string_view, std::less<>>;

// results_nusc.json (the nuScenes detection submission) for frames detected with a sample token
// and an ego pose, samples in the order given (as mmdet3d writes them); throws
// Error(kInvalidInput) naming a frame without them, or a token seen twice.
std::string nuscenes_results_json(const std::vector<Detections>& frames);

// Writes seeded random weights in the official checkpoint layout of `config` as safetensors (the
// weights Model::load uses when given none and the same seed); returns the tensor count.
size_t write_random_weights(const std::string& config, uint64_t seed, const std::string& path);

struct FrameResult;  // the engine's (runtime/engine.h)

class Model {
 public:
  // config: "tiny" | "small" | "base" | path to an upstream-style JSON config. weights: a .pth or
  // .safetensors checkpoint, or "" for seeded random weights (every output then says
  // untrained). Errors name what does not fit.
  static std::unique_ptr<Model> load(const std::string& config, const std::string& weights, const Knobs& knobs = {});
  ~Model();

  // A frame JSON document; relative image paths resolve against base_dir.
  Detections detect(const std::string& frame_json, const std::string& base_dir, const DetectOptions& options = {});
  Detections detect_file(const std::string& frame_json_path, const DetectOptions& options = {});
  // A frame JSON document whose string "image" fields name entries of `images` (never files:
  // nothing is read from disk). Inline base64 images work as usually. A name with no entry, or
  // an entry no camera names, is Error(kInvalidInput).
  Detections detect(const std::string& frame_json, const AttachedImages& images, const DetectOptions& options = {});
  // A frame as it is (bevformer/frame.h): parsed already, or filled by the caller. Relative image
  // paths resolve against base_dir; with base_dir "" no file is read and every camera must carry
  // its image_bytes (what a server passes on, without copying them).
  Detections detect(const Frame& frame, const std::string& base_dir, const DetectOptions& options = {});
  // Frames of several streams (vehicles) in one call, batched: frames of distinct streams run
  // together through the recorded stages, each exactly as if run alone; each stream's frames in
  // the order given, at most max_batch per batch (<= 0: Knobs::max_batch). One outcome per
  // frame, in order; a frame that fails fails alone. With options.dump_dir the frames run one
  // at a time; options.render_png is not per frame here and must be empty.
  std::vector<FrameOutcome> detect_batch(const std::vector<Frame>& frames, const std::string& base_dir,
                                         const DetectOptions& options = {}, int max_batch = 0);

  std::vector<StreamStatus> streams() const;
  bool drop_stream(const std::string& id);
  StreamTotals stream_totals() const;

  // History handoff between the servers of a fleet (docs/DEPLOY.md; src/api/handoff_api.cpp).
  // The model's identity, hashed at load: its config, every weight's bytes, backend and precision.
  const std::string& fingerprint() const;
  // Stream `id`'s history as self-checking bytes (the previous BEV as the backend holds it, the
  // CAN-bus state, frames, last timestamp, scene, this fingerprint), taken between two of its
  // frames; nullopt when there is no such stream or it holds no history yet.
  std::optional<std::string> export_stream(const std::string& id);
  // Installs export_stream's bytes as a stream of this model: the next frame of that stream uses
  // the handed-over BEV bit for bit. Returns the stream's id and whether it was installed (false:
  // the stream already ran frames here, and its newer history is kept). Error(kInvalidInput):
  // corrupt or truncated bytes, a BEV of another shape; Error(kUnsupported): another format
  // version or another model fingerprint. `accept_id`, when given, sees the stream's id once the
  // bytes are read and before anything is installed: what it throws leaves every stream as it
  // was (a server refuses ids it would not take from a client).
  std::pair<std::string, bool> import_stream(std::string_view bytes,
                                             const std::function<void(const std::string&)>& accept_id = {});

  bool untrained() const;
  DeviceInfo device_info() const;
  // The recorded stages: per stage its ops (stage, name, shapes), where each output lives in the
  // arena, the arena size against the sum without reuse, and the weight bytes. Records them first
  // on two synthetic frames (a first frame and one with history) when nothing ran yet.
  std::string describe();
  std::string config_summary() const;      // a few lines: backbone, image, BEV, layers
  std::vector<std::string> class_names() const;

 private:
  Model();
  Detections detect_text(const std::string& text, const std::string& base_dir, const std::string& where,
                         const DetectOptions& options, const AttachedImages* images = nullptr);
  Detections detect_frame(const Frame& frame, const std::string& base_dir, const std::string& where,
                          const DetectOptions& options, double parse_seconds);
  // A finished frame as Detections (document, results, dump, picture).
  Detections frame_detections(FrameResult& r, const DetectOptions& options, double parse_seconds,
                              double started_seconds_ago);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  friend struct ModelInternals;  // src/api/model_impl.h: the api/ files beside model_api.cpp reach impl_
};

}  // namespace bev
