// BEVFormer: the weights of a checkpoint bound to a backend, and one frame's forward in the two
// stages of DESIGN §1 — `image` (backbone, neck, SCA value projections) and `bev` (encoder,
// decoder, heads, top-k) — with the temporal history (previous BEV, pose) of forward_test.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "model/coder.h"
#include "model/config.h"
#include "model/geometry.h"
#include "model/taps.h"

namespace bev {

// One frame as upstream's forward_test receives it (after the test pipeline).
struct FrameInput {
  Tensor img;  // f32 [N, 3, H_pad, W_pad]: normalized, padded network input (NCHW, as upstream)
  std::vector<std::array<double, 16>> lidar2img;  // per camera, row-major 4x4 at the padded image's scale
  std::array<double, 18> can_bus{};                // absolute, BEFORE the test-time delta (spec §3)
  std::string scene_token;                         // a change drops the history
};

struct FrameOutput {
  Tensor bev_embed;       // f32 [HW, C]: the encoder output (the next frame's prev_bev)
  Tensor all_cls_scores;  // f32 [layers, Q, classes]: logits
  Tensor all_bbox_preds;  // f32 [layers, Q, code_size]: centres in metres (spec §2.13)
  std::vector<Detection> detections;  // NMSFreeCoder output of the last layer, by score
  bool used_history = false;          // TSA saw the previous BEV
  // Wall time of the parts of this frame (seconds): host geometry and the two stages of DESIGN §1
  // (replay or eager), and decoding the boxes.
  double geometry_seconds = 0, image_seconds = 0, bev_seconds = 0, decode_seconds = 0;
};

// One stream's history (forward_test's prev_frame_info): the previous BEV and the raw pose of the
// previous frame. Streams own theirs; the model keeps one default history for single-stream use.
struct StreamHistory {
  TemporalState state;
  Tensor prev_bev;  // [HW, C], the last frame's bev_embed
};

// A frame between its two stages (DESIGN §1): what BevFormer::run_image made, for run_bev of
// the same frame. It holds one of the model's image lanes (the image plan whose outputs carry
// this frame) until run_bev has read them, or until it is destroyed. Move-only; it must not
// outlive its model.
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
  friend class BevFormer;
  struct State;
  std::unique_ptr<State> s_;
};

class BevFormer {
 public:
  // Binds and validates every weight the config needs (all problems reported at once) and
  // prepares them on `backend` (BN folded, weights packed). The checkpoint's tensors are
  // copied where prepared; it need not outlive the model.
  // replay: each stage is recorded once per input shape (and history variant) into a plan with
  // its activations in one arena, then replayed (bit-identical to eager); false runs every
  // frame eagerly (debugging).
  // pipelined: two image lanes, so the image stage of one frame can run while the bev stage of
  // the frame before it runs (run_image / run_bev on two threads, or forward() from several);
  // the image plan (with its outputs) and the bev plans exist once per lane. Otherwise one frame
  // is in flight at a time.
  BevFormer(ModelConfig cfg, const Checkpoint& checkpoint, Backend& backend, bool replay = true,
            bool pipelined = false);
  ~BevFormer();
  BevFormer(const BevFormer&) = delete;
  BevFormer& operator=(const BevFormer&) = delete;

  const ModelConfig& config() const;

  // Runs one frame (both stages, eagerly) and carries `history` to the next call, exactly as
  // BEVFormer.forward_test. `taps` receives every golden-set tensor name it can produce. A frame
  // that fails its checks throws before the history changes. Calls serialize on the model.
  FrameOutput forward(const FrameInput& frame, StreamHistory& history, Taps* taps = nullptr);
  // The same with the model's own default history.
  FrameOutput forward(const FrameInput& frame, Taps* taps = nullptr);
  void reset_history();

  // forward() is run_bev(frame, run_image(frame)). Apart, they pipeline: run_image of frame t+1
  // on one thread runs while run_bev of frame t runs on another, each stage one frame at a
  // time, with results identical to forward(). The image stage needs no history, so frames of
  // one stream may be staged ahead; run_bev must see them in stream order. run_image waits for a
  // free lane: a thread must not hold more unfinished StagedFrames than lanes() (it would wait
  // for itself). A frame that fails its checks throws from run_image.
  StagedFrame run_image(const FrameInput& frame, Taps* taps = nullptr);
  FrameOutput run_bev(const FrameInput& frame, StagedFrame staged, StreamHistory& history, Taps* taps = nullptr);
  FrameOutput run_bev(const FrameInput& frame, StagedFrame staged, Taps* taps = nullptr);
  int lanes() const;  // frames in flight at once: 2 when pipelined, else 1

  // The recorded plans so far: per stage its ops, shapes, buffer offsets and arena size.
  std::string describe() const;
  // Replays every recorded stage once on the inputs it holds, with no host work around it (the
  // allocation test and benchmarks time exactly the replay).
  void replay_recorded_stages();
  // The profiler's replays: one recorded stage on the inputs it holds, the image plan or the
  // (untapped) bev plan of one history variant. False when that stage has not been recorded.
  // These, replay_recorded_stages and the describers wait until no frame is in flight.
  bool replay_image_stage();
  bool replay_bev_stage(bool with_history);

  // The recorded plans as numbers (the profiler's memory report).
  struct PlanInfo {
    std::string name;  // "image", "bev (with history)", ...
    size_t ops = 0, buffers = 0;
    size_t arena_bytes = 0;     // the activations, laid out by lifetime
    size_t no_reuse_bytes = 0;  // the same buffers without sharing
  };
  std::vector<PlanInfo> plan_info() const;
  // How many rigs (lidar2img and padded size) needed their geometry computed: the last four
  // stay cached with their bev plans, so vehicles with different rigs do not re-record.
  size_t rigs_seen() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bev
