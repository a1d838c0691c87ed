// StageRunner: runs BEVFormer's two stages (DESIGN §1) on a backend, frame by frame, as
// forward_test does, with the temporal history. Each stage is recorded once per shape into a
// RecordedStage (its activations in one arena of backend memory) and executed by the backend
// every frame after (bit-identical to running it eagerly). The runner moves data across the host
// boundary only through the backend: per-frame inputs are written into the recorded input
// tensors, the top-k and boxes are read back, and a stream's previous BEV never leaves backend
// memory: the stream owns one buffer, bound to the bev stage as both its previous-BEV input and
// its new-BEV output (the stage reads the old one before it writes the new one).
//
// Lanes: a frame between its two stages holds an image lane (the image stage whose outputs
// carry it); a plain runner has one lane, a pipelined one two, so that the image stage of one
// frame runs while the bev stage of another does. Each stage runs one frame at a time.
// Rigs: the bev stages read a rig's SCA query lists as bound inputs with a capacity, so one
// recording serves every rig whose lists fit (a longer one re-records it once, with room to
// spare); the last sixteen rigs' geometry stays cached.
#pragma once

#include <array>
#include <chrono>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/bevformer.h"
#include "model/geometry.h"
#include "model/taps.h"

namespace bev {

// What a frame reads back to the host beyond its detections.
struct FrameReads {
  Taps* taps = nullptr;    // every golden-set tensor the frame produces, as host copies
  bool bev_embed = false;  // FrameOutput::bev_embed (a copy of the new history)
  bool heads = false;      // FrameOutput::all_cls_scores and all_bbox_preds (every decoder layer's)
};

struct FrameOutput {
  std::vector<Detection> detections;  // NMSFreeCoder output of the last layer, by score
  bool used_history = false;          // TSA saw the previous BEV
  Tensor all_cls_scores;  // host f32 [layers, Q, classes]: logits, when FrameReads::heads or taps asked
  Tensor all_bbox_preds;  // host f32 [layers, Q, code_size]: centres in metres (spec §2.13), likewise
  Tensor bev_embed;       // host f32 [HW, C], when FrameReads::bev_embed or taps asked for it
  // How often the host waited for the backend during this frame (a batch's samples share their
  // batch's waits): 1, where its results left the engine, unless taps asked for more.
  int host_waits = 0;
  // Wall time of the parts of this frame (seconds): host geometry, the two stages (inputs
  // written, executed, outputs read back), and decoding the boxes.
  double geometry_seconds = 0, image_seconds = 0, bev_seconds = 0, decode_seconds = 0;
};

// One stream's history (forward_test's prev_frame_info): the previous BEV, in the runner's
// backend memory, and the raw pose of the previous frame. Streams own theirs; the runner keeps
// one default history for single-stream use.
struct StreamHistory {
  TemporalState state;
  Tensor prev_bev;  // [HW, C]: the last frame's bev_embed (replayed runners keep one buffer for life)
};

// One sample of a batch: a frame and its stream's history (distinct streams in one batch).
struct BatchSample {
  const FrameInput* frame = nullptr;
  StreamHistory* history = nullptr;
};

// A sample's outcome: its output, or why it failed (its history then unchanged; the batch's
// other samples are not affected).
struct SampleOutput {
  FrameOutput output;
  std::exception_ptr error;
  int64_t batch_size = 1;  // how many samples ran together with it (1: alone)
};

// A frame between its two stages: what StageRunner::run_image made, for run_bev of the same
// frame. It holds one of the runner's image lanes until run_bev has read the lane's outputs, or
// until it is destroyed. Move-only; it must not outlive its runner.
class StagedFrame {
 public:
  StagedFrame();
  ~StagedFrame();
  StagedFrame(StagedFrame&&) noexcept;
  StagedFrame& operator=(StagedFrame&&) noexcept;

  bool empty() const { return s_ == nullptr; }
  // When the image stage began its work (after waiting for a lane), and how long it took.
  std::chrono::steady_clock::time_point started() const;
  double image_seconds() const;

 private:
  friend class StageRunner;
  struct State;
  std::unique_ptr<State> s_;
};

class StageRunner {
 public:
  // replay: each stage is recorded once per input shape (and history variant) and executed by
  // the backend after (bit-identical to eager); false runs every frame eagerly (debugging).
  // pipelined: two image lanes (see above). `model` and `backend` outlive the runner, and
  // `model` was loaded on `backend`.
  StageRunner(const BevFormer& model, Backend& backend, bool replay = true, bool pipelined = false);
  ~StageRunner();
  StageRunner(const StageRunner&) = delete;
  StageRunner& operator=(const StageRunner&) = delete;

  const BevFormer& model() const;
  Backend& backend();

  // Runs one frame (both stages) and carries `history` to the next call, exactly as
  // BEVFormer.forward_test. A frame that fails its checks throws before the history changes.
  FrameOutput forward(const FrameInput& frame, StreamHistory& history, const FrameReads& reads = {});
  // The same with the runner's own default history.
  FrameOutput forward(const FrameInput& frame, const FrameReads& reads = {});
  void reset_history();

  // Frames of distinct streams as one batch: the image stage over all their cameras at once, the
  // bev stage with each sample's own history (first frames and frames with history mix), rig
  // (its own SCA query lists) and CAN-bus step, a top-k and decode per sample. Every sample's
  // output is that of forward() on it alone (docs/PERF.md says where it is bit-identical). A
  // sample that fails its checks fails alone. Samples whose images differ in size run in
  // separate batches; one sample runs through forward(). Taps need a batch of one.
  //
  // Plans: one recorded image and bev stage per batch size (the last three sizes used stay
  // recorded), replayed for any mix of rigs and history. The SCA query lists are inputs of a fixed capacity per camera: the batch's longest
  // list rounded up to a multiple of ceil(HW / 8). A batch that needs more re-records that
  // batch size's bev stage at the larger capacity (it never shrinks; HW bounds it, since a
  // camera sees at most every cell).
  std::vector<SampleOutput> forward_batch(std::span<const BatchSample> samples, const FrameReads& reads = {});
  // Adaptive batching (off by default; the Engine turns it on): forward_batch runs n samples at
  // the batch size of at most n that this runner measured fastest per frame (replayed; every size
  // is run as given until it has been measured), so batching never lowers throughput where a
  // smaller batch, or none, is faster. The results are the same either way.
  void set_adaptive_batching(bool on);
  // The batch size adaptive batching would run n samples at now (n when it is off).
  int64_t chosen_batch(int64_t n) const;
  // A measurement made elsewhere (a bench run on this machine): `batch` frames take
  // seconds_per_frame each, as if measured here; later runs of that size update it.
  void seed_batch_timing(int64_t batch, double seconds_per_frame);

  // forward() is run_bev(frame, run_image(frame)). Apart, they pipeline: run_image of frame t+1
  // on one thread runs while run_bev of frame t runs on another, with results identical to
  // forward(). The image stage needs no history, so frames of one stream may be staged ahead;
  // run_bev must see them in stream order. run_image waits for a free lane: a thread must not
  // hold more unfinished StagedFrames than lanes() (it would wait for itself). A frame that fails
  // its checks throws from run_image; run_bev takes only the frame that was staged.
  StagedFrame run_image(const FrameInput& frame, const FrameReads& reads = {});
  FrameOutput run_bev(const FrameInput& frame, StagedFrame staged, StreamHistory& history,
                      const FrameReads& reads = {});
  FrameOutput run_bev(const FrameInput& frame, StagedFrame staged, const FrameReads& reads = {});
  int lanes() const;  // frames in flight at once: 2 when pipelined, else 1

  // The recorded stages so far: per stage its ops, shapes, buffer offsets and arena size.
  std::string describe() const;
  // Executes every recorded stage once on the inputs it holds, with no host work around it (the
  // allocation test and benchmarks time exactly the execution); returns when they have run.
  void replay_recorded_stages();
  // The profiler's replays: one recorded stage on the inputs it holds, the image stage or the
  // (untapped) bev stage of one history variant; false when it has not been recorded. A bev
  // replay reads the last stream's current BEV as its previous one and writes the stage's own
  // buffer: it never changes a stream. These and the describers wait until no frame is in flight.
  bool replay_image_stage();
  bool replay_bev_stage(bool with_history);
  // The recorded stages those replays run, to read (the profiler's graph report); null when not
  // recorded. Valid until the runner records or drops a stage; not while frames run.
  const RecordedStage* image_stage() const;
  const RecordedStage* bev_stage(bool with_history) const;

  // The recorded stages as numbers (the profiler's memory report).
  struct StageInfo {
    std::string name;  // "image", "bev (with history)", ...
    size_t ops = 0, buffers = 0;
    size_t arena_bytes = 0;     // the activations, laid out by lifetime
    size_t no_reuse_bytes = 0;  // the same buffers without sharing
    std::string description;    // RecordedStage::describe(): every op with its shapes and arena offset
  };
  std::vector<StageInfo> stage_info() const;
  // The SCA slot capacity per camera of the batched bev stage of `batch` samples (0: none recorded).
  int64_t batch_capacity(int64_t batch) const;
  // How many rigs (lidar2img and padded size) needed their geometry computed: the last sixteen
  // stay cached (a rig that comes back after that is computed again; stages are not re-recorded).
  size_t rigs_seen() const;
  // How many single-frame bev stages were recorded (per history variant, tap setting and lane,
  // and again when a rig's lists outgrow a stage's capacity).
  uint64_t bev_recordings() const;
  // Frames refused because a stage produced NaN or infinite values (their history unchanged).
  uint64_t nonfinite_frames() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bev
