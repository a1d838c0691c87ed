#include "runtime/stage_runner.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>

#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "bevformer/error.h"
#include "runtime/batch_inputs.h"
#include "runtime/lane_pool.h"
#include "runtime/rig_cache.h"
#include "runtime/stage_cache.h"

namespace bev {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr const char* kImageWhat = "the flattened camera features";
constexpr const char* kBevWhat = "the new BEV (bev_embed)";

// A stage's numbers blew up (weights or inputs at float32's limits): the frame fails, naming the
// stage, before anything of it is answered or kept as history.
Error nonfinite_error(int64_t n, const char* stage, const char* what) {
  return Error(ErrorKind::kInvalidInput, std::string("the ") + stage + " stage produced " + std::to_string(n) +
                                             " non-finite value(s) in " + what)
      .where("frame")
      .hint("the stream's history is unchanged; inputs or weights at the limits of float32 do this");
}

// The frame's non-finite counts (read with its results), as the error of the first stage whose
// count is not zero; null when both are sound.
std::exception_ptr nonfinite(int64_t image_count, int64_t bev_count, std::atomic<uint64_t>& failures) {
  if (image_count == 0 && bev_count == 0) return nullptr;
  ++failures;
  return std::make_exception_ptr(image_count != 0 ? nonfinite_error(image_count, "image", kImageWhat)
                                                  : nonfinite_error(bev_count, "bev", kBevWhat));
}

// `t` read through `binding`: a view of the bound slot addresses the binding's target instead
// (after an execution the slot is unbound again, and its own memory holds nothing of the frame).
Tensor through(const Tensor& t, const StageBinding& binding) {
  if (!t.defined() || t.storage() != binding.slot.storage()) return t;
  return Tensor::view_of(binding.target.storage(), t.dtype(), t.shape(), t.strides(),
                         t.offset() + binding.target.offset());
}

}  // namespace

struct StagedFrame::State {
  LanePool* lanes = nullptr;  // the runner's; the lane goes back when this is destroyed
  int lane = -1;
  // The frame given to run_image, so that run_bev takes only that frame (it was checked once).
  Shape img_shape;
  std::vector<std::array<double, 16>> lidar2img;
  std::array<double, 18> can_bus{};
  std::string scene_token;
  std::vector<ScaInputs> sca;  // eager: the image stage's outputs (replay: in the lane's stage)
  Tensor nonfinite;            // the image stage's count, read with the frame's results
  int host_waits = 0;          // so far: a replaced recording's, taps
  Clock::time_point started;
  double image_seconds = 0;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (lanes && lane >= 0) lanes->release(lane);
  }
};

StagedFrame::StagedFrame() = default;
StagedFrame::~StagedFrame() = default;
StagedFrame::StagedFrame(StagedFrame&&) noexcept = default;
StagedFrame& StagedFrame::operator=(StagedFrame&&) noexcept = default;
std::chrono::steady_clock::time_point StagedFrame::started() const { return s_ ? s_->started : Clock::time_point{}; }
double StagedFrame::image_seconds() const { return s_ ? s_->image_seconds : 0; }

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
      for (const StageBinding& b : bindings) v = through(v, b);
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

  // ---- the two stages of a frame, apart ----

  std::unique_ptr<StagedFrame::State> run_image(const FrameInput& f, const FrameReads& reads) {
    model.check_frame(f);
    auto st = std::make_unique<StagedFrame::State>();
    st->lane = lanes.acquire();  // released when st is destroyed (by run_bev, or on a throw)
    st->lanes = &lanes;
    st->img_shape = f.img.shape();
    st->lidar2img = f.lidar2img;
    st->can_bus = f.can_bus;
    st->scene_token = f.scene_token;
    const std::lock_guard<std::mutex> lock(image_mu);
    st->started = Clock::now();
    if (replay) {
      ImageRecording& s = stages.image(st->lane, f.img.shape(), reads.taps != nullptr, st->host_waits);
      backend.write(s.img, f.img);
      backend.execute(s.stage);
      st->nonfinite = s.out.nonfinite;
      if (reads.taps) st->host_waits += read_taps(s.taps, &s.stage, {}, *reads.taps);
    } else {
      Ops eager(backend);
      Taps taps;
      ImageOutputs out = model.image_stage(eager, backend.upload(f.img), reads.taps ? &taps : nullptr);
      st->nonfinite = out.nonfinite;
      st->sca = std::move(out.sca);
      if (reads.taps) st->host_waits += read_taps(taps, nullptr, {}, *reads.taps);
    }
    st->image_seconds = seconds_since(st->started);
    return st;
  }

  FrameOutput run_bev(const FrameInput& f, std::unique_ptr<StagedFrame::State> st, StreamHistory& history,
                      const FrameReads& reads) {
    if (!st || st->lanes != &lanes) {
      throw Error(ErrorKind::kInvalidInput, st ? "a frame staged by another runner" : "an empty staged frame")
          .where("run_bev")
          .expected("the result of this runner's run_image for the same frame");
    }
    if (f.img.shape() != st->img_shape || f.lidar2img != st->lidar2img || f.can_bus != st->can_bus ||
        f.scene_token != st->scene_token) {
      throw Error(ErrorKind::kInvalidInput, "the frame differs from the one staged (img " + f.img.describe() +
                                                ", staged " + shape_str(st->img_shape) + ")")
          .where("run_bev")
          .expected("the frame given to run_image");
    }
    const std::lock_guard<std::mutex> lock(bev_mu);
    FrameOutput out;
    out.image_seconds = st->image_seconds;
    auto t_part = Clock::now();
    // The history changes only when the frame completes: a failure leaves it as it was.
    TemporalState next_state = history.state;
    const BevStepInputs step = model.forward_test_step(next_state, f);
    const bool use_prev = step.step.use_prev_bev;
    if (use_prev) check_history(history);
    const std::shared_ptr<const Rig> rig = rigs.rig(f);
    if (reads.taps) model.tap_geometry(step, rig->geometry, *reads.taps);
    out.geometry_seconds = seconds_since(t_part);

    t_part = Clock::now();
    out.host_waits = st->host_waits;
    Results res;
    Tensor history_bev;  // eager: the new BEV, in the eager run's memory
    if (replay) {
      const ScaQueryLists& lists = rig->geometry.queries;
      BevRecording& s = stages.bev(st->lane, use_prev, reads.taps != nullptr, lists.max_len, lists.reference.size(2),
                                   out.host_waits);
      s.last_lists = rigs.lists(*rig, s.capacity);
      backend.write(s.in.can_bus, step.can_bus);
      backend.write(s.in.tsa_reference, step.tsa_reference);
      if (use_prev) backend.write(s.in.rotation_index, step.rotation_index);
      if (!spare_bev.defined()) spare_bev = backend.empty({bev_cells(), cfg.transformer.embed_dims}, DType::kF32);
      BevBindings bound;
      const std::span<const StageBinding> bindings = bev_bindings(bound, s, spare_bev, s.last_lists, history.prev_bev);
      backend.execute(s.stage, bindings);
      s.last_bev = spare_bev;
      res = read_results(st->nonfinite, s.out, spare_bev, 1, reads);
      ++out.host_waits;
      if (const std::exception_ptr e = nonfinite(res.image_nonfinite[0], res.bev_nonfinite[0], nonfinite_frames)) {
        std::rethrow_exception(e);
      }
      if (reads.taps) out.host_waits += read_taps(s.taps, &s.stage, bindings, *reads.taps);
    } else {
      EncoderInputs in;
      in.can_bus = backend.upload(step.can_bus);
      in.tsa_reference = backend.upload(step.tsa_reference);
      if (use_prev) {
        in.prev_bev = history.prev_bev;
        in.rotation_index = backend.upload(step.rotation_index);
      }
      // The rig's lists as computed: what a replayed stage recorded first for this rig holds,
      // so that both run the same ops and the profiler carries labels across.
      const RigLists lists = rigs.lists(*rig, rig->geometry.queries.max_len);
      in.sca = std::move(st->sca);
      for (ScaInputs& s : in.sca) {
        s.query_index = lists.query_index;
        s.reference = lists.reference;
        s.inv_count = lists.inv_count;
      }
      Ops eager(backend);
      Taps taps;
      const BevOutputs r = model.bev_stage(eager, in, reads.taps ? &taps : nullptr);
      res = read_results(st->nonfinite, r, r.bev_embed, 1, reads);
      ++out.host_waits;
      if (const std::exception_ptr e = nonfinite(res.image_nonfinite[0], res.bev_nonfinite[0], nonfinite_frames)) {
        std::rethrow_exception(e);
      }
      if (reads.taps) out.host_waits += read_taps(taps, nullptr, {}, *reads.taps);
      history_bev = r.bev_embed;
    }
    out.all_cls_scores = std::move(res.all_cls);
    out.all_bbox_preds = std::move(res.all_preds);
    if (!res.bev_embed.empty()) out.bev_embed = std::move(res.bev_embed[0]);
    st.reset();  // the lane's outputs are read: the next frame's image stage may take it
    out.bev_seconds = seconds_since(t_part);

    t_part = Clock::now();
    out.detections = model.decode(res.top_scores[0], res.top_index[0], res.last_preds);
    out.decode_seconds = seconds_since(t_part);
    out.used_history = use_prev;

    next_state.has_prev_bev = true;
    history.state = std::move(next_state);
    if (replay) {
      std::swap(history.prev_bev, spare_bev);  // the old history is the next frame's output buffer
    } else {
      history.prev_bev = history_bev;
    }
    return out;
  }

  FrameOutput forward(const FrameInput& f, StreamHistory& history, const FrameReads& reads) {
    FrameOutput out = run_bev(f, run_image(f, reads), history, reads);
    if (!reads.taps) note_timing(1, out.image_seconds + out.bev_seconds);
    return out;
  }

  // ---- batches of frames of distinct streams ----

  // The samples' host steps; a sample that fails fails alone (its error in results).
  std::vector<BatchRow> batch_rows(std::span<const BatchSample> samples, const std::vector<size_t>& group,
                                   std::vector<SampleOutput>& results) {
    std::vector<BatchRow> rows;
    for (const size_t i : group) {
      try {
        const auto t0 = Clock::now();
        const FrameInput& f = *samples[i].frame;
        const StreamHistory& history = *samples[i].history;
        BatchRow r;
        r.index = i;
        r.next_state = history.state;
        r.step = model.forward_test_step(r.next_state, f);
        if (r.step.step.use_prev_bev) check_history(history);
        r.rig = rigs.rig(f);
        r.geometry_seconds = seconds_since(t0);
        rows.push_back(std::move(r));
      } catch (...) {
        results[i].error = std::current_exception();
      }
    }
    return rows;
  }
  // One group of samples with images of one size, as one batch (at least two samples).
  void run_batch(std::span<const BatchSample> samples, const std::vector<BatchRow>& rows, const FrameReads& reads,
                 std::vector<SampleOutput>& results) {
    const int64_t batch = static_cast<int64_t>(rows.size()), hw = bev_cells(), c = cfg.transformer.embed_dims;
    const int64_t cams = cfg.transformer.num_cams;
    int64_t longest = 1;
    for (const BatchRow& r : rows) longest = std::max(longest, r.rig->geometry.queries.max_len);
    const int64_t anchors = rows[0].rig->geometry.queries.reference.size(2);
    Shape img_shape = samples[rows[0].index].frame->img.shape();
    img_shape[0] *= batch;

    const Quiet quiet(*this);
    auto t_part = Clock::now();
    ImageOutputs eager_image;
    BevOutputs eager_bev;
    Tensor img_nonfinite;
    BatchRecording* st = nullptr;
    int waits = 0;  // the batch's, its samples share them
    if (replay) {
      st = &stages.batch(batch, img_shape, longest, anchors, waits);
      for (int64_t b = 0; b < batch; ++b) {
        backend.write(st->image->img.slice(0, b * cams, (b + 1) * cams), samples[rows[static_cast<size_t>(b)].index].frame->img);
      }
      backend.execute(st->image->stage);
      img_nonfinite = st->image->out.nonfinite;
    } else {
      Tensor img = Tensor::empty(img_shape, DType::kF32);
      const size_t per = static_cast<size_t>(img.nbytes() / static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        std::memcpy(static_cast<char*>(img.raw_data()) + static_cast<size_t>(b) * per,
                    samples[rows[static_cast<size_t>(b)].index].frame->img.raw_data(), per);
      }
      Ops eager(backend);
      eager_image = model.image_stage(eager, backend.upload(img), nullptr);
      img_nonfinite = eager_image.nonfinite;
    }
    const double image_seconds = seconds_since(t_part);

    t_part = Clock::now();
    const int64_t capacity = st ? st->capacity : sca_capacity_for(hw, longest);
    const BatchHostInputs host = batch_host_inputs(cfg, rows, capacity);
    const BevOutputs* out = nullptr;
    if (replay) {
      backend.write(st->bev->in.can_bus, host.can_bus);
      backend.write(st->bev->in.tsa_reference, host.tsa_reference);
      backend.write(st->bev->in.value_index, host.value_index);
      backend.write(st->bev->in.value0_index, host.value0_index);
      backend.write(st->bev->in.sca[0].query_index, host.query_index);
      backend.write(st->bev->in.sca[0].reference, host.reference);
      backend.write(st->bev->in.sca[0].inv_count, host.inv_count);
      std::vector<StageBinding> bindings;
      for (int64_t b = 0; b < batch; ++b) {
        const BatchRow& r = rows[static_cast<size_t>(b)];
        if (r.step.step.use_prev_bev) bindings.push_back({st->bev->in.prev_bevs[static_cast<size_t>(b)], samples[r.index].history->prev_bev});
      }
      backend.execute(st->bev->stage, bindings);
      out = &st->bev->out;
    } else {
      EncoderInputs in;
      in.batch = batch;
      in.can_bus = backend.upload(host.can_bus);
      in.tsa_reference = backend.upload(host.tsa_reference);
      in.value_index = backend.upload(host.value_index);
      in.value0_index = backend.upload(host.value0_index);
      const Tensor unread = backend.empty({1, c}, DType::kF32);  // a first frame's previous BEV: no index reads it
      for (const BatchRow& r : rows) {
        in.prev_bevs.push_back(r.step.step.use_prev_bev ? samples[r.index].history->prev_bev : unread);
      }
      const Tensor query_index = backend.upload(host.query_index), reference = backend.upload(host.reference),
                   inv_count = backend.upload(host.inv_count);
      in.sca = std::move(eager_image.sca);
      for (ScaInputs& v : in.sca) {
        v.query_index = query_index;
        v.reference = reference;
        v.inv_count = inv_count;
      }
      Ops eager(backend);
      eager_bev = model.bev_stage(eager, in, nullptr);
      out = &eager_bev;
    }
    // The new BEVs are read from the stage's output (what the histories get a copy of).
    const Results res = read_results(img_nonfinite, *out, out->bev_embed, batch, reads);
    const int64_t queries = res.last_preds.size(0) / batch;
    const double bev_seconds = seconds_since(t_part);
    note_timing(batch, image_seconds + bev_seconds);

    for (int64_t b = 0; b < batch; ++b) {
      const BatchRow& r = rows[static_cast<size_t>(b)];
      SampleOutput& result = results[r.index];
      result.batch_size = batch;
      result.output.host_waits = 1 + waits;
      const size_t k = static_cast<size_t>(b);
      if (std::exception_ptr e = nonfinite(res.image_nonfinite[k], res.bev_nonfinite[k], nonfinite_frames)) {
        result.error = std::move(e);
        continue;
      }
      StreamHistory& history = *samples[r.index].history;
      // The new BEV into the stream's own buffer (the bev stage has read the old one).
      if (!history.prev_bev.defined() || history.prev_bev.shape() != Shape{hw, c} ||
          history.prev_bev.device() != backend.device()) {
        history.prev_bev = backend.empty({hw, c}, DType::kF32);
      }
      backend.copy(history.prev_bev, out->bev_embed.slice(0, b * hw, (b + 1) * hw));
      FrameOutput& o = result.output;
      o.geometry_seconds = r.geometry_seconds;
      o.image_seconds = image_seconds;
      o.bev_seconds = bev_seconds;
      o.used_history = r.step.step.use_prev_bev;
      if (res.all_cls.defined()) {
        o.all_cls_scores = res.all_cls.slice(1, b * queries, (b + 1) * queries).contiguous();
        o.all_bbox_preds = res.all_preds.slice(1, b * queries, (b + 1) * queries).contiguous();
      }
      if (!res.bev_embed.empty()) o.bev_embed = res.bev_embed[k];
      const auto t_decode = Clock::now();
      o.detections = model.decode(res.top_scores[k], res.top_index[k],
                                  res.last_preds.slice(0, b * queries, (b + 1) * queries).contiguous());
      o.decode_seconds = seconds_since(t_decode);
      history.state = r.next_state;
      history.state.has_prev_bev = true;
    }
  }

  std::vector<SampleOutput> forward_batch(std::span<const BatchSample> samples, const FrameReads& reads) {
    if (reads.taps && samples.size() > 1) {
      throw Error(ErrorKind::kInvalidInput, "a batch of " + std::to_string(samples.size()) + " frames asked for taps")
          .where("forward_batch")
          .expected("batch size 1 to read a frame's stage tensors");
    }
    for (size_t i = 0; i < samples.size(); ++i) {
      if (!samples[i].frame || !samples[i].history) throw Error(ErrorKind::kInternal, "a batch sample without its frame or history");
      for (size_t j = 0; j < i; ++j) {
        if (samples[i].history == samples[j].history) {
          throw Error(ErrorKind::kInvalidInput, "samples " + std::to_string(j) + " and " + std::to_string(i) +
                                                    " of a batch are frames of one stream")
              .where("forward_batch")
              .expected("frames of distinct streams (one stream's frames run in order, one per batch)");
        }
      }
    }
    std::vector<SampleOutput> results(samples.size());
    std::vector<size_t> pending;
    for (size_t i = 0; i < samples.size(); ++i) {
      try {
        model.check_frame(*samples[i].frame);
        pending.push_back(i);
      } catch (...) {
        results[i].error = std::current_exception();
      }
    }
    // Groups of one image size, in order of their first sample.
    while (!pending.empty()) {
      const Shape shape = samples[pending[0]].frame->img.shape();
      std::vector<size_t> group, rest;
      for (const size_t i : pending) (samples[i].frame->img.shape() == shape ? group : rest).push_back(i);
      pending = std::move(rest);
      const std::vector<BatchRow> rows = batch_rows(samples, group, results);
      const size_t chunk = static_cast<size_t>(chosen_batch(static_cast<int64_t>(rows.size())));
      for (size_t first = 0; first < rows.size(); first += chunk) {
        const std::vector<BatchRow> part(rows.begin() + static_cast<std::ptrdiff_t>(first),
                                         rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), first + chunk)));
        if (part.size() == 1) {
          const size_t i = part[0].index;
          try {
            results[i].output = forward(*samples[i].frame, *samples[i].history, reads);
          } catch (...) {
            results[i].error = std::current_exception();
          }
          continue;
        }
        try {
          run_batch(samples, part, reads, results);
        } catch (...) {
          // The batch as a whole failed (no memory, a backend fault): every sample of it did,
          // before any history changed.
          for (const BatchRow& r : part) results[r.index].error = std::current_exception();
        }
      }
    }
    return results;
  }

  // A bev stage outside a frame: it reads the last frame's new BEV as the previous one and
  // writes its own output buffer, so no stream changes.
  void execute_outside_frame(const BevRecording& s) {
    // A stage whose first frame failed before it executed has no rig or previous BEV to read.
    if (!s.last_lists.query_index.defined() || (s.use_prev && !s.last_bev.defined())) return;
    // The last frame's rig and previous BEV; the new BEV into the stage's own output buffer.
    BevBindings bound;
    std::span<const StageBinding> bindings = bev_bindings(bound, s, s.out.bev_embed, s.last_lists, s.last_bev);
    backend.execute(s.stage, bindings.subspan(1));
  }

  std::string describe() const {
    std::string out;
    stages.for_each([&out](const RecordedStage& s) { out += s.describe(); });
    return out;
  }
};

StageRunner::StageRunner(const BevFormer& model, Backend& backend, bool replay, bool pipelined)
    : impl_(std::make_unique<Impl>(model, backend, replay, pipelined)) {}
StageRunner::~StageRunner() = default;

const BevFormer& StageRunner::model() const { return impl_->model; }
Backend& StageRunner::backend() { return impl_->backend; }

FrameOutput StageRunner::forward(const FrameInput& frame, StreamHistory& history, const FrameReads& reads) {
  return impl_->forward(frame, history, reads);
}

FrameOutput StageRunner::forward(const FrameInput& frame, const FrameReads& reads) {
  return impl_->forward(frame, impl_->default_history, reads);
}

void StageRunner::reset_history() {
  const std::lock_guard<std::mutex> lock(impl_->bev_mu);  // run_bev reads and writes it
  impl_->default_history = StreamHistory{};
}

StagedFrame StageRunner::run_image(const FrameInput& frame, const FrameReads& reads) {
  StagedFrame staged;
  staged.s_ = impl_->run_image(frame, reads);
  return staged;
}

FrameOutput StageRunner::run_bev(const FrameInput& frame, StagedFrame staged, StreamHistory& history,
                                 const FrameReads& reads) {
  return impl_->run_bev(frame, std::move(staged.s_), history, reads);
}

FrameOutput StageRunner::run_bev(const FrameInput& frame, StagedFrame staged, const FrameReads& reads) {
  return impl_->run_bev(frame, std::move(staged.s_), impl_->default_history, reads);
}

int StageRunner::lanes() const { return impl_->lanes.size(); }

void StageRunner::replay_recorded_stages() {
  const Impl::Quiet quiet(*impl_);
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    if (const ImageRecording* p = impl_->stages.image_of_lane(lane)) impl_->backend.execute(p->stage);
  }
  for (const auto& p : impl_->stages.bev_stages()) impl_->execute_outside_frame(*p);
  // Batches: their previous BEVs unbound (each slot's own memory; the outputs go nowhere).
  for (const auto& p : impl_->stages.batches()) {
    impl_->backend.execute(p->image->stage);
    impl_->backend.execute(p->bev->stage);
  }
  impl_->backend.synchronize();  // returns when they have run (a device's queue may lag)
}

bool StageRunner::replay_image_stage() {
  const Impl::Quiet quiet(*impl_);
  const ImageRecording* p = impl_->stages.image_of_lane(0);
  if (!p) return false;
  impl_->backend.execute(p->stage);
  impl_->backend.synchronize();
  return true;
}

bool StageRunner::replay_bev_stage(bool with_history) {
  const Impl::Quiet quiet(*impl_);
  // Lane 0's stage, the one a plain runner has (a pipelined runner's lane 2 may hold another
  // frame's inputs), with the last frame's rig.
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->stages.bev_stages()) {
      if (p->lane == lane && p->use_prev == with_history && !p->tapped) {
        impl_->execute_outside_frame(*p);
        impl_->backend.synchronize();
        return true;
      }
    }
  }
  return false;
}

const RecordedStage* StageRunner::image_stage() const {
  const ImageRecording* p = impl_->stages.image_of_lane(0);
  return p ? &p->stage : nullptr;
}

const RecordedStage* StageRunner::bev_stage(bool with_history) const {
  // The stage replay_bev_stage runs: the first lane that has one, untapped.
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->stages.bev_stages()) {
      if (p->lane == lane && p->use_prev == with_history && !p->tapped) return &p->stage;
    }
  }
  return nullptr;
}

std::vector<StageRunner::StageInfo> StageRunner::stage_info() const {
  const Impl::Quiet quiet(*impl_);
  std::vector<StageInfo> out;
  auto add = [&out](const RecordedStage& s) {
    out.push_back({s.name(), s.nodes().size(), s.buffers(), s.arena_bytes(), s.no_reuse_bytes(), s.describe()});
  };
  impl_->stages.for_each(add);
  return out;
}

void StageRunner::set_adaptive_batching(bool on) { impl_->adaptive = on; }

int64_t StageRunner::chosen_batch(int64_t n) const { return impl_->chosen_batch(n); }

void StageRunner::seed_batch_timing(int64_t batch, double seconds_per_frame) {
  impl_->timings.seed(batch, seconds_per_frame);
}

int64_t StageRunner::batch_capacity(int64_t batch) const {
  const Impl::Quiet quiet(*impl_);
  const BatchRecording* p = impl_->stages.batch_of(batch);
  return p ? p->capacity : 0;
}

std::vector<SampleOutput> StageRunner::forward_batch(std::span<const BatchSample> samples, const FrameReads& reads) {
  return impl_->forward_batch(samples, reads);
}

uint64_t StageRunner::bev_recordings() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->stages.bev_recordings();
}

size_t StageRunner::rigs_seen() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->rigs.computed();
}

uint64_t StageRunner::nonfinite_frames() const { return impl_->nonfinite_frames.load(); }

std::string StageRunner::describe() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->describe();
}

}  // namespace bev
