// StageRunner's inside, shared by its two files: stage_runner.cpp (single frames, the public
// calls) and stage_runner_batch.cpp (batches of frames of distinct streams).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/recorded_stage.h"
#include "bevformer/error.h"
#include "runtime/batch_inputs.h"
#include "runtime/lane_pool.h"
#include "runtime/rig_cache.h"
#include "runtime/stage_cache.h"
#include "runtime/stage_runner.h"

namespace bev {
namespace runner_detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline constexpr const char* kImageWhat = "the flattened camera features";
inline constexpr const char* kBevWhat = "the new BEV (bev_embed)";

// A stage's numbers blew up (weights or inputs at float32's limits): the frame fails, naming the
// stage, before anything of it is answered or kept as history.
inline Error nonfinite_error(int64_t n, const char* stage, const char* what) {
  return Error(ErrorKind::kInvalidInput, std::string("the ") + stage + " stage produced " + std::to_string(n) +
                                             " non-finite value(s) in " + what)
      .where("frame")
      .hint("the stream's history is unchanged; inputs or weights at the limits of float32 do this");
}

// The frame's non-finite counts (read with its results), as the error of the first stage whose
// count is not zero; null when both are sound.
inline std::exception_ptr nonfinite(int64_t image_count, int64_t bev_count, std::atomic<uint64_t>& failures) {
  if (image_count == 0 && bev_count == 0) return nullptr;
  ++failures;
  return std::make_exception_ptr(image_count != 0 ? nonfinite_error(image_count, "image", kImageWhat)
                                                  : nonfinite_error(bev_count, "bev", kBevWhat));
}

// `t` read through `binding`: a view of the bound slot addresses the binding's target instead
// (after an execution the slot is unbound again, and its own memory holds nothing of the frame).
inline Tensor through(const Tensor& t, const StageBinding& binding) {
  if (!t.defined() || t.storage() != binding.slot.storage()) return t;
  return Tensor::view_of(binding.target.storage(), t.dtype(), t.shape(), t.strides(),
                         t.offset() + binding.target.offset());
}

}  // namespace runner_detail

struct StagedFrame::State {
  LanePool* lanes = nullptr;  // the runner's; the lane goes back when this is destroyed
  int lane = -1;
  // The frame given to run_image, so that run_bev takes only that frame (it was checked once).
  Shape img_shape;
  DType img_dtype = DType::kF32;
  std::vector<std::array<double, 16>> lidar2img;
  std::array<double, 18> can_bus{};
  std::string scene_token;
  std::vector<ScaInputs> sca;  // eager: the image stage's outputs (replay: in the lane's stage)
  Tensor nonfinite;            // the image stage's count, read with the frame's results
  int host_waits = 0;          // so far: a replaced recording's, taps
  std::chrono::steady_clock::time_point started;
  double image_seconds = 0;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (lanes && lane >= 0) lanes->release(lane);
  }
};

// Locks: each stage runs one frame at a time. image_mu guards the lanes' image stages while they
// are recorded or executed; bev_mu the single bev stages, the default history and spare_bev.
// Batches and everything outside frames (replays, describers) hold Quiet: every lane and both
// locks. The rig cache and the batch timings lock themselves.
struct StageRunner::Impl {
  const BevFormer& model;
  const ModelConfig& cfg;
  Backend& backend;
  bool replay = true;  // record each stage once, execute it after (false: eager every frame)
  LanePool lanes;      // frames in flight between their stages (1, or 2 when pipelined)
  std::mutex image_mu, bev_mu;
  StreamHistory default_history;
  // The buffer the next single bev stage writes its new BEV into; on success it becomes the
  // stream's history and the stream's old buffer becomes the spare, so a failed frame leaves the
  // history as it was and no frame copies a BEV.
  Tensor spare_bev;
  std::atomic<uint64_t> nonfinite_frames{0};
  RigCache rigs;
  StageCache stages;
  bool adaptive = false;
  BatchTimings timings;

  Impl(const BevFormer& m, Backend& b, bool replay_stages, bool pipelined)
      : model(m),
        cfg(m.config()),
        backend(b),
        replay(replay_stages),
        lanes(pipelined ? 2 : 1),
        rigs(m, b),
        stages(m, b, pipelined ? 2 : 1) {}
  ~Impl() {
    // A frame that failed between its stages may have left an execution issued: the stages go
    // with this runner, so it must have run.
    try {
      backend.synchronize();
    } catch (...) {
      // Its error belonged to that failed frame, which has been answered.
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  int64_t bev_cells() const { return int64_t{cfg.head.bev_h} * cfg.head.bev_w; }

  // Every lane (no frame in flight) and both stages' locks.
  struct Quiet {
    explicit Quiet(Impl& m) : held(m.lanes), lock(m.image_mu, m.bev_mu) {}
    LanePool::All held;
    std::scoped_lock<std::mutex, std::mutex> lock;
  };

  // Host copies of `refs` (resolved in `stage`, read through `bindings`) into `out`.
  // Returns how often it waited for the backend.
  int read_taps(const Taps& refs, const RecordedStage* stage, std::span<const StageBinding> bindings, Taps& out) {
    int waits = 0;
    for (const auto& [name, t] : refs.all()) {
      Tensor v = stage ? stage->resolve(t) : t;
      for (const StageBinding& b : bindings) v = runner_detail::through(v, b);
      // Host-side geometry is host memory already; everything else is the backend's.
      const bool host = v.device() == Device::kCpu && v.storage()->device() == Device::kCpu;
      out.put(name, host ? v.clone() : backend.read(v));
      waits += host ? 0 : 1;
    }
    return waits;
  }

  // What leaves the engine of a bev stage's execution, in one wait: the non-finite counts of the
  // image stage (`image_nonfinite`) and the bev stage, each sample's boxes and top-k, and what
  // `reads` asks for (the heads' outputs; the new BEV `new_bev`, [B*HW, C], a sample's rows each).
  struct Results {
    std::vector<int64_t> image_nonfinite, bev_nonfinite;  // per sample
    Tensor last_preds, all_cls, all_preds;
    std::vector<Tensor> top_scores, top_index, bev_embed;  // per sample
  };
  Results read_results(const Tensor& image_nonfinite, const BevOutputs& bev, const Tensor& new_bev, int64_t batch,
                       const FrameReads& reads) {
    const int64_t hw = bev_cells();
    std::vector<Tensor> srcs = {image_nonfinite, bev.nonfinite, bev.last_preds};
    srcs.insert(srcs.end(), bev.top_scores.begin(), bev.top_scores.end());
    srcs.insert(srcs.end(), bev.top_index.begin(), bev.top_index.end());
    const bool heads = reads.heads || reads.taps;
    if (heads) {
      srcs.push_back(bev.all_cls);
      srcs.push_back(bev.all_preds);
    }
    const bool bev_embed = reads.bev_embed || reads.taps;
    for (int64_t b = 0; bev_embed && b < batch; ++b) srcs.push_back(new_bev.slice(0, b * hw, (b + 1) * hw));
    std::vector<Tensor> got = backend.read_all(srcs);
    Results r;
    size_t k = 0;
    const Tensor image_counts = std::move(got[k++]), bev_counts = std::move(got[k++]);
    r.image_nonfinite.assign(image_counts.data<int64_t>(), image_counts.data<int64_t>() + batch);
    r.bev_nonfinite.assign(bev_counts.data<int64_t>(), bev_counts.data<int64_t>() + batch);
    r.last_preds = std::move(got[k++]);
    for (int64_t b = 0; b < batch; ++b) r.top_scores.push_back(std::move(got[k++]));
    for (int64_t b = 0; b < batch; ++b) r.top_index.push_back(std::move(got[k++]));
    if (heads) {
      r.all_cls = std::move(got[k++]);
      r.all_preds = std::move(got[k++]);
    }
    for (int64_t b = 0; bev_embed && b < batch; ++b) r.bev_embed.push_back(std::move(got[k++]));
    return r;
  }

  void check_history(const StreamHistory& history) const {
    const int64_t hw = bev_cells(), c = cfg.transformer.embed_dims;
    if (!history.prev_bev.defined() || history.prev_bev.shape() != Shape{hw, c} ||
        history.prev_bev.device() != backend.device()) {
      throw Error(ErrorKind::kInternal, "the stream's history has no previous BEV of this runner (" +
                                            (history.prev_bev.defined() ? history.prev_bev.describe() : "none") + ")");
    }
  }

  void note_timing(int64_t batch, double seconds) {
    if (replay) timings.note(batch, seconds);
  }
  int64_t chosen_batch(int64_t n) const { return adaptive && replay ? timings.chosen(n) : n; }

  // ---- the two stages of a frame, apart (stage_runner.cpp) ----
  std::unique_ptr<StagedFrame::State> run_image(const FrameInput& f, const FrameReads& reads);
  FrameOutput run_bev(const FrameInput& f, std::unique_ptr<StagedFrame::State> st, StreamHistory& history,
                      const FrameReads& reads);
  FrameOutput forward(const FrameInput& f, StreamHistory& history, const FrameReads& reads);
  // A bev stage outside a frame: it reads the last frame's new BEV as the previous one and
  // writes its own output buffer, so no stream changes.
  void execute_outside_frame(const BevRecording& s);
  std::string describe() const;

  // ---- batches of frames of distinct streams (stage_runner_batch.cpp) ----
  std::vector<BatchRow> batch_rows(std::span<const BatchSample> samples, const std::vector<size_t>& group,
                                   std::vector<SampleOutput>& results);
  void run_batch(std::span<const BatchSample> samples, const std::vector<BatchRow>& rows, const FrameReads& reads,
                 std::vector<SampleOutput>& results);
  std::vector<SampleOutput> forward_batch(std::span<const BatchSample> samples, const FrameReads& reads);
};

}  // namespace bev
