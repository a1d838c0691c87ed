#include "runtime/stage_runner.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "bevformer/error.h"

namespace bev {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The runner's image lanes: which are held by a frame between its two stages. A lane's image
// stage (or, eager, nothing) belongs to the frame holding it, so a frame's image outputs stay
// intact until its bev stage has read them.
class LanePool {
 public:
  explicit LanePool(int lanes) : busy_(static_cast<size_t>(lanes), false) {}
  int size() const { return static_cast<int>(busy_.size()); }

  int acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    size_t k = 0;
    cv_.wait(lock, [&] {
      for (k = 0; k < busy_.size(); ++k) {
        if (!busy_[k]) return true;
      }
      return false;
    });
    busy_[k] = true;
    return static_cast<int>(k);
  }
  void release(int lane) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      busy_[static_cast<size_t>(lane)] = false;
    }
    cv_.notify_all();
  }

  // Every lane, taken in order (so two callers cannot each hold half), released on destruction.
  class All {
   public:
    explicit All(LanePool& p) : pool_(p) {
      std::unique_lock<std::mutex> lock(p.mu_);
      for (size_t k = 0; k < p.busy_.size(); ++k) {
        p.cv_.wait(lock, [&] { return !p.busy_[k]; });
        p.busy_[k] = true;
      }
    }
    ~All() {
      for (int k = 0; k < pool_.size(); ++k) pool_.release(k);
    }
    All(const All&) = delete;
    All& operator=(const All&) = delete;

   private:
    LanePool& pool_;
  };

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
};

// A stage's numbers blew up (weights or inputs at float32's limits): the frame fails, naming the
// stage, before anything of it is answered or kept as history.
void check_finite(Backend& backend, const Tensor& count, const char* stage, const char* what,
                  std::atomic<uint64_t>& failures) {
  const int64_t n = backend.read(count).data<int64_t>()[0];
  if (n == 0) return;
  ++failures;
  throw Error(ErrorKind::kInvalidInput, std::string("the ") + stage + " stage produced " + std::to_string(n) +
                                            " non-finite value(s) in " + what)
      .where("frame")
      .hint("the stream's history is unchanged; inputs or weights at the limits of float32 do this");
}

std::vector<Tensor> tap_tensors(const Taps& t) {
  std::vector<Tensor> v;
  for (const auto& [name, tensor] : t.all()) v.push_back(tensor);
  return v;
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

struct StageRunner::Impl {
  const BevFormer& model;
  const ModelConfig& cfg;
  Backend& backend;
  bool replay = true;  // record each stage once, execute it after (false: eager every frame)
  LanePool lanes;      // frames in flight between their stages (1, or 2 when pipelined)
  // Each stage runs one frame at a time. image_mu: the image stages being recorded or executed;
  // bev_mu: the rig cache, its bev stages and spare_bev.
  std::mutex image_mu, bev_mu;
  StreamHistory default_history;
  // The buffer the next bev stage writes its new BEV into; on success it becomes the stream's
  // history and the stream's old buffer becomes the spare, so a failed frame leaves the history
  // as it was and no frame copies a BEV.
  Tensor spare_bev;
  std::atomic<uint64_t> nonfinite_frames{0};

  Impl(const BevFormer& m, Backend& b, bool replay_stages, bool pipelined)
      : model(m), cfg(m.config()), backend(b), replay(replay_stages), lanes(pipelined ? 2 : 1) {
    image_stages.resize(static_cast<size_t>(lanes.size()));
  }

  // ---- recorded stages ----

  struct ImageStage {
    Shape shape;
    bool tapped = false;
    uint64_t generation = 0;     // which recording: bev stages read the outputs of one
    Tensor img;                  // the input, written every frame
    ImageOutputs out;            // kept out of the arena
    Taps taps;
    RecordedStage stage;
  };
  struct BevStage {
    bool use_prev = false;
    bool tapped = false;
    int lane = 0;                   // whose image outputs it reads...
    uint64_t image_generation = 0;  // ...as that lane's stage was recorded then
    EncoderInputs in;   // can_bus, tsa_reference, rotation_index: written per frame; prev_bev: bound
    BevOutputs out;     // out.bev_embed: bound to the frame's new history buffer
    Taps taps;
    RecordedStage stage;
    Tensor last_bev;    // the buffer the last frame's new BEV went to (what replays read as previous)
  };
  // One image stage per lane (a frame in flight between its stages). Lane k's stage belongs to
  // the frame holding lane k: its image stage records or executes it (under image_mu), then its
  // bev stage reads the outputs (under bev_mu); no other frame touches it meanwhile.
  std::vector<std::unique_ptr<ImageStage>> image_stages;
  uint64_t image_recordings = 0;  // under image_mu

  // A rig's geometry (host), its SCA query lists in backend memory, and its bev stages (one per
  // history variant, tap setting and lane). The last kMaxRigs rigs stay recorded.
  struct RigEntry {
    size_t id = 0;  // 1 for the first rig this runner saw, 2 for the next new one...
    RigGeometry geometry;
    Tensor query_index, reference, inv_count;  // geometry.queries, uploaded
    std::vector<std::unique_ptr<BevStage>> bev_stages;
  };
  static constexpr size_t kMaxRigs = 4;
  std::vector<std::unique_ptr<RigEntry>> rigs;  // most recently used first; under bev_mu
  size_t rigs_computed = 0;

  // The frame's rig, moved to the front; computed (and the oldest dropped) when it is new.
  RigEntry& rig_entry(const FrameInput& f) {
    const int pad_h = static_cast<int>(f.img.size(1)), pad_w = static_cast<int>(f.img.size(2));
    auto it = std::find_if(rigs.begin(), rigs.end(), [&](const std::unique_ptr<RigEntry>& r) {
      return r->geometry.lidar2img == f.lidar2img && r->geometry.pad_w == pad_w && r->geometry.pad_h == pad_h;
    });
    if (it == rigs.end()) {
      auto e = std::make_unique<RigEntry>();
      e->geometry = model.rig_geometry(f);
      e->query_index = backend.upload(e->geometry.queries.query_index);
      e->reference = backend.upload(e->geometry.queries.reference);
      e->inv_count = backend.upload(e->geometry.queries.inv_count);
      e->id = ++rigs_computed;
      if (rigs.size() == kMaxRigs) rigs.pop_back();
      rigs.insert(rigs.begin(), std::move(e));
    } else {
      std::rotate(rigs.begin(), it, it + 1);
    }
    return *rigs.front();
  }

  static void add_rig(std::vector<ScaInputs>& sca, const RigEntry& rig) {
    for (ScaInputs& s : sca) {
      s.query_index = rig.query_index;
      s.reference = rig.reference;
      s.inv_count = rig.inv_count;
    }
  }

  // Host copies of `refs` (resolved in `stage`, read through `bindings`) into `out`.
  void read_taps(const Taps& refs, const RecordedStage* stage, std::span<const StageBinding> bindings, Taps& out) {
    for (const auto& [name, t] : refs.all()) {
      Tensor v = stage ? stage->resolve(t) : t;
      for (const StageBinding& b : bindings) v = through(v, b);
      // Host-side geometry is host memory already; everything else is the backend's.
      out.put(name, v.device() == Device::kCpu && v.storage()->device() == Device::kCpu ? v.clone() : backend.read(v));
    }
  }

  ImageStage& image_recorded(int lane, const Tensor& img, bool tapped) {
    std::unique_ptr<ImageStage>& s = image_stages[static_cast<size_t>(lane)];
    if (s && s->shape == img.shape() && s->tapped == tapped) return *s;
    auto p = std::make_unique<ImageStage>();
    p->shape = img.shape();
    p->tapped = tapped;
    p->generation = ++image_recordings;  // this lane's bev stages read the old outputs: stale now
    p->img = backend.empty(img.shape(), img.dtype());
    // Recorded without running (each intermediate would otherwise hold its own memory until the
    // stage exists: tiny 1050 MiB against a 281 MiB arena), then computed by the first execution.
    Ops rec(backend, Ops::Mode::kPlan);
    p->out = model.image_stage(rec, p->img, tapped ? &p->taps : nullptr);
    std::vector<Tensor> keep = tap_tensors(p->taps);
    for (const ScaInputs& v : p->out.sca) keep.push_back(v.value);
    keep.push_back(p->out.nonfinite);
    p->stage = RecordedStage(lane == 0 ? "image" : "image (lane " + std::to_string(lane + 1) + ")", rec.take_nodes(),
                             keep, backend);
    s = std::move(p);
    return *s;
  }

  BevStage& bev_recorded(RigEntry& rig, int lane, bool use_prev, bool tapped) {
    const ImageStage& image = *image_stages[static_cast<size_t>(lane)];
    // Stages that read an earlier recording of this lane's image stage would run on its stale
    // outputs (which they keep alive: for base about 1.1 GB each). Every rig's go, not only this
    // one's: a new image size is also a new rig, so the old rig's stages would otherwise linger.
    for (auto& r : rigs) {
      std::erase_if(r->bev_stages, [&](const std::unique_ptr<BevStage>& p) {
        return p->lane == lane && p->image_generation != image.generation;
      });
    }
    for (auto& p : rig.bev_stages) {
      if (p->use_prev == use_prev && p->tapped == tapped && p->lane == lane) return *p;
    }
    const int64_t hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w;
    auto p = std::make_unique<BevStage>();
    p->use_prev = use_prev;
    p->tapped = tapped;
    p->lane = lane;
    p->image_generation = image.generation;
    p->in.can_bus = backend.empty({1, 18}, DType::kF32);
    p->in.tsa_reference = backend.empty({hw, 2, 1, 2}, DType::kF32);
    if (use_prev) {
      p->in.prev_bev = backend.empty({hw, cfg.transformer.embed_dims}, DType::kF32);
      p->in.rotation_index = backend.empty({hw}, DType::kI64);
    }
    p->in.sca = image.out.sca;
    add_rig(p->in.sca, rig);
    Ops rec(backend, Ops::Mode::kPlan);  // computed by the first execution, as the image stage
    p->out = model.bev_stage(rec, p->in, tapped ? &p->taps : nullptr);
    std::vector<Tensor> keep = tap_tensors(p->taps);
    for (const Tensor& t : {p->out.bev_embed, p->out.all_cls, p->out.all_preds, p->out.last_preds, p->out.top_scores,
                            p->out.top_index, p->out.nonfinite}) {
      keep.push_back(t);
    }
    std::string name = use_prev ? "bev (with history" : "bev (first frame";
    if (rig.id > 1) name += ", rig " + std::to_string(rig.id);
    if (lane > 0) name += ", lane " + std::to_string(lane + 1);
    p->stage = RecordedStage(name + ")", rec.take_nodes(), keep, backend, {p->in.prev_bev, p->out.bev_embed});
    rig.bev_stages.push_back(std::move(p));
    return *rig.bev_stages.back();
  }

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
      ImageStage& s = image_recorded(st->lane, f.img, reads.taps != nullptr);
      backend.write(s.img, f.img);
      backend.execute(s.stage);
      check_finite(backend, s.out.nonfinite, "image", "the flattened camera features", nonfinite_frames);
      if (reads.taps) read_taps(s.taps, &s.stage, {}, *reads.taps);
    } else {
      Ops eager(backend);
      Taps taps;
      ImageOutputs out = model.image_stage(eager, backend.upload(f.img), reads.taps ? &taps : nullptr);
      check_finite(backend, out.nonfinite, "image", "the flattened camera features", nonfinite_frames);
      st->sca = std::move(out.sca);
      if (reads.taps) read_taps(taps, nullptr, {}, *reads.taps);
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
    const int64_t hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w, c = cfg.transformer.embed_dims;
    if (use_prev && (!history.prev_bev.defined() || history.prev_bev.shape() != Shape{hw, c} ||
                     history.prev_bev.device() != backend.device())) {
      throw Error(ErrorKind::kInternal, "the stream's history has no previous BEV of this runner (" +
                                            (history.prev_bev.defined() ? history.prev_bev.describe() : "none") + ")");
    }
    RigEntry& rig = rig_entry(f);
    if (reads.taps) model.tap_geometry(step, rig.geometry, *reads.taps);
    out.geometry_seconds = seconds_since(t_part);

    t_part = Clock::now();
    Tensor new_bev, last_preds, top_scores, top_index;
    if (replay) {
      BevStage& s = bev_recorded(rig, st->lane, use_prev, reads.taps != nullptr);
      backend.write(s.in.can_bus, step.can_bus);
      backend.write(s.in.tsa_reference, step.tsa_reference);
      if (use_prev) backend.write(s.in.rotation_index, step.rotation_index);
      if (!spare_bev.defined()) spare_bev = backend.empty({hw, c}, DType::kF32);
      // On the stack: a frame's execution allocates nothing.
      const std::array<StageBinding, 2> bound = {StageBinding{s.out.bev_embed, spare_bev},
                                                 StageBinding{s.in.prev_bev, history.prev_bev}};
      const std::span<const StageBinding> bindings(bound.data(), use_prev ? 2 : 1);
      backend.execute(s.stage, bindings);
      check_finite(backend, s.out.nonfinite, "bev", "the new BEV (bev_embed)", nonfinite_frames);
      s.last_bev = spare_bev;
      new_bev = spare_bev;
      out.all_cls_scores = backend.read(s.out.all_cls);
      out.all_bbox_preds = backend.read(s.out.all_preds);
      last_preds = backend.read(s.out.last_preds);
      top_scores = backend.read(s.out.top_scores);
      top_index = backend.read(s.out.top_index);
      if (reads.taps) read_taps(s.taps, &s.stage, bindings, *reads.taps);
    } else {
      EncoderInputs in;
      in.can_bus = backend.upload(step.can_bus);
      in.tsa_reference = backend.upload(step.tsa_reference);
      if (use_prev) {
        in.prev_bev = history.prev_bev;
        in.rotation_index = backend.upload(step.rotation_index);
      }
      in.sca = std::move(st->sca);
      add_rig(in.sca, rig);
      Ops eager(backend);
      Taps taps;
      const BevOutputs r = model.bev_stage(eager, in, reads.taps ? &taps : nullptr);
      check_finite(backend, r.nonfinite, "bev", "the new BEV (bev_embed)", nonfinite_frames);
      new_bev = r.bev_embed;
      out.all_cls_scores = backend.read(r.all_cls);
      out.all_bbox_preds = backend.read(r.all_preds);
      last_preds = backend.read(r.last_preds);
      top_scores = backend.read(r.top_scores);
      top_index = backend.read(r.top_index);
      if (reads.taps) read_taps(taps, nullptr, {}, *reads.taps);
    }
    if (reads.bev_embed || reads.taps) out.bev_embed = backend.read(new_bev);
    st.reset();  // the lane's outputs are read: the next frame's image stage may take it
    out.bev_seconds = seconds_since(t_part);

    t_part = Clock::now();
    out.detections = model.decode(top_scores, top_index, last_preds);
    out.decode_seconds = seconds_since(t_part);
    out.used_history = use_prev;

    next_state.has_prev_bev = true;
    history.state = std::move(next_state);
    if (replay) {
      std::swap(history.prev_bev, spare_bev);  // the old history is the next frame's output buffer
    } else {
      history.prev_bev = new_bev;
    }
    return out;
  }

  FrameOutput forward(const FrameInput& f, StreamHistory& history, const FrameReads& reads) {
    return run_bev(f, run_image(f, reads), history, reads);
  }

  // Every lane (no frame in flight) and both stages' locks: for executions outside frames and
  // for reading the stages.
  struct Quiet {
    explicit Quiet(Impl& m) : held(m.lanes), lock(m.image_mu, m.bev_mu) {}
    LanePool::All held;
    std::scoped_lock<std::mutex, std::mutex> lock;
  };

  // A bev stage outside a frame: it reads the last frame's new BEV as the previous one and
  // writes its own output buffer, so no stream changes.
  void execute_outside_frame(BevStage& s) {
    const StageBinding prev{s.in.prev_bev, s.last_bev};  // on the stack: replays allocate nothing
    backend.execute(s.stage, std::span<const StageBinding>(&prev, s.use_prev ? 1 : 0));
  }

  std::string describe() const {
    std::string out;
    for (const auto& p : image_stages) {
      if (p) out += p->stage.describe();
    }
    for (const auto& r : rigs) {
      for (const auto& p : r->bev_stages) out += p->stage.describe();
    }
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
  for (const auto& p : impl_->image_stages) {
    if (p) impl_->backend.execute(p->stage);
  }
  for (const auto& r : impl_->rigs) {
    for (const auto& p : r->bev_stages) impl_->execute_outside_frame(*p);
  }
}

bool StageRunner::replay_image_stage() {
  const Impl::Quiet quiet(*impl_);
  const auto& p = impl_->image_stages.front();
  if (!p) return false;
  impl_->backend.execute(p->stage);
  return true;
}

bool StageRunner::replay_bev_stage(bool with_history) {
  const Impl::Quiet quiet(*impl_);
  if (impl_->rigs.empty()) return false;
  // The last frame's rig; lane 0's stage, the one a plain runner has (a pipelined runner's lane
  // 2 may hold another frame's inputs).
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->rigs.front()->bev_stages) {
      if (p->lane == lane && p->use_prev == with_history && !p->tapped) {
        impl_->execute_outside_frame(*p);
        return true;
      }
    }
  }
  return false;
}

const RecordedStage* StageRunner::image_stage() const {
  const auto& p = impl_->image_stages.front();
  return p ? &p->stage : nullptr;
}

const RecordedStage* StageRunner::bev_stage(bool with_history) const {
  if (impl_->rigs.empty()) return nullptr;
  // The stage replay_bev_stage runs: the last frame's rig, the first lane that has one, untapped.
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->rigs.front()->bev_stages) {
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
  for (const auto& p : impl_->image_stages) {
    if (p) add(p->stage);
  }
  for (const auto& r : impl_->rigs) {
    for (const auto& p : r->bev_stages) add(p->stage);
  }
  return out;
}

size_t StageRunner::rigs_seen() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->rigs_computed;
}

uint64_t StageRunner::nonfinite_frames() const { return impl_->nonfinite_frames.load(); }

std::string StageRunner::describe() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->describe();
}

}  // namespace bev
