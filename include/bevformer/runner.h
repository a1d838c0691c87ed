// Tools around a loaded Model's engine, for profiling flows and bindings (the Python package's
// `model.runner` and `bevformer.profiling` are these): the two recorded stages replayed or run
// eagerly on the last frame's inputs and described, and a profiler attached around any calls.
//
// Neither is for use while frames run on the model from other threads: replays wait for frames
// in flight, but an eager run shares the backend with them, and the profiler records from one
// thread at a time (the Python package serializes both against its frames).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "bevformer/frame.h"
#include "bevformer/model.h"
#include "bevformer/profile.h"

namespace bev {

// One run of a stage outside a frame.
struct StageRun {
  std::string variant;   // "image", "bev", "bev_first"
  std::string stage;     // the recorded stage's name ("bev (with history)"), or "eager"
  double seconds = 0;    // wall time of the stage (for run_eager, without the unprofiled set-up)
};

// A recorded stage as numbers: its ops, buffers, and arena against the same buffers without reuse.
struct RecordedStageInfo {
  std::string name;  // "image", "bev (first frame)", "bev (with history)", ...
  size_t ops = 0, buffers = 0;
  size_t arena_bytes = 0, no_reuse_bytes = 0;
};

// The model's stage runner. Variants: "image"; "bev", the bev stage with history (a stream's
// steady state); "bev_first", the bev stage of a stream's first frame.
class StageRunnerHandle {
 public:
  explicit StageRunnerHandle(Model& model);  // `model` outlives the handle
  ~StageRunnerHandle();
  StageRunnerHandle(const StageRunnerHandle&) = delete;
  StageRunnerHandle& operator=(const StageRunnerHandle&) = delete;

  // The frame a caller last ran through Model::detect (with the base_dir it was given), kept for
  // run_eager: its images are shared, not copied, and it is prepared again only when run_eager
  // needs it.
  void set_last_frame(const Frame& frame, const std::string& base_dir);
  bool has_last_frame() const;

  // Executes the recorded stage once on the inputs it holds, which are the last frame's (a bev
  // replay reads the last frame's new BEV as its previous one and changes no stream).
  // Error(kInvalidInput) for an unknown variant; Error(kNotFound) when that stage is not
  // recorded yet ("bev" needs a second frame of a stream, since the first has no history).
  StageRun replay(const std::string& variant);

  // Runs the stage eagerly (every op built and run as the model code goes, no plan) on the last
  // frame's inputs, on a second runner of the same model and backend. "bev" needs a history and
  // image features: the eager runner first runs the last frame once (first-frame variant) as its
  // history, and takes the image features of the preceding run_eager("image") of the same frame,
  // else computes them; that set-up runs with any attached profiler detached, so a profile holds
  // exactly the variant's ops. Repeated runs compute the same thing. Error(kNotFound) before any
  // set_last_frame.
  StageRun run_eager(const std::string& variant);
  // run_eager's set-up now (the last frame prepared, the eager history primed), so that a
  // profile's eager range holds only the variants' own work.
  void prepare_eager();

  // The recorded stages: per stage its ops (stage, name, shapes), where each output lives in the
  // arena, the arena size against the sum without reuse ("" when nothing is recorded yet).
  std::string describe() const;
  std::vector<RecordedStageInfo> stages() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One op the profiler recorded.
struct ProfiledOp {
  size_t index = 0;  // in recording order
  std::string name;  // the op kind, "conv2d"
  std::string stage;            // "img.layer1", ...
  std::string label;            // upstream module path
  std::string inputs, outputs;  // "f32[6, 64, 120, 200] ..."
  double start_ms = 0;          // since the session was created
  double ms = 0;
  double gflop = 0, gbyte = 0;  // from the shapes (docs/PROFILING.md)
};

struct ProfiledSignpost {
  std::string name;
  double t_ms = 0;  // since the session was created
};

// What ProfileSession::report adds to the recording.
struct SessionReportOptions {
  // Measure this machine's matmul and copy peaks (seconds on a large CPU) for the "% of peak"
  // columns; without them those are 0.
  bool measure_peaks = true;
  // Replay the image and bev stages detached as many times as there are rounds, for the
  // profiler's measured cost (as `bevformer profile` does); without it that cost is not reported.
  bool measure_unprofiled = true;
  double forward_ms = 0;  // the last frame's forward() (host geometry and both stages), if known
};

// A profiler on a model loaded with Knobs::profiling: while started, every op the model runs is
// recorded; signposts mark ranges ("x" opens, "x_end" closes). report() reads the recording as
// `bevformer profile` reads its own: round k is the k-th image..image_end and bev..bev_end
// ranges, the eager frame the eager..eager_end range; write() writes the same files.
class ProfileSession {
 public:
  // Error(kUnsupported) unless the model was loaded with Knobs::profiling.
  explicit ProfileSession(Model& model);  // `model` outlives the session
  ~ProfileSession();                      // detaches
  ProfileSession(const ProfileSession&) = delete;
  ProfileSession& operator=(const ProfileSession&) = delete;

  // Attaches (Error(kInvalidInput) when another session of the model is attached); idempotent.
  void start();
  void stop();
  bool running() const;
  void signpost(const std::string& name);

  std::vector<ProfiledOp> ops() const;
  std::vector<ProfiledSignpost> signposts() const;
  size_t op_count() const;

  // The report of the recording so far. Error(kInvalidInput) when it holds no round (no closed
  // image and bev ranges) or its rounds ran different ops.
  ProfileReport report(const SessionReportOptions& options = {});
  // trace.json, summary.json, summary.md, memory.json in `dir` (created); returns their paths.
  std::vector<std::string> write(const std::string& dir, ProfileReport& report, int top_ops = 15) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bev
