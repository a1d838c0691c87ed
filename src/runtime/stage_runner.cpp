#include "runtime/stage_runner.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
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
Error nonfinite_error(int64_t n, const char* stage, const char* what) {
  return Error(ErrorKind::kInvalidInput, std::string("the ") + stage + " stage produced " + std::to_string(n) +
                                             " non-finite value(s) in " + what)
      .where("frame")
      .hint("the stream's history is unchanged; inputs or weights at the limits of float32 do this");
}

void check_finite(Backend& backend, const Tensor& count, const char* stage, const char* what,
                  std::atomic<uint64_t>& failures) {
  const int64_t n = backend.read(count).data<int64_t>()[0];
  if (n == 0) return;
  ++failures;
  throw nonfinite_error(n, stage, what);
}

constexpr const char* kImageWhat = "the flattened camera features";
constexpr const char* kBevWhat = "the new BEV (bev_embed)";

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
  // bev_mu: the rig cache, the bev stages and spare_bev.
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
    int64_t capacity = 0;           // SCA slots per camera: rigs whose longest list fits replay it
    // can_bus, tsa_reference, rotation_index: written per frame; prev_bev and the SCA lists
    // (query_index, reference, inv_count): bound to the stream's buffer and the frame's rig's
    EncoderInputs in;
    BevOutputs out;     // out.bev_embed: bound to the frame's new history buffer
    Taps taps;
    RecordedStage stage;
    Tensor last_bev;    // the buffer the last frame's new BEV went to (what replays read as previous)
    Tensor last_query_index, last_reference, last_inv_count;  // the last frame's rig's lists (ditto)
  };
  // One image stage per lane (a frame in flight between its stages). Lane k's stage belongs to
  // the frame holding lane k: its image stage records or executes it (under image_mu), then its
  // bev stage reads the outputs (under bev_mu); no other frame touches it meanwhile.
  std::vector<std::unique_ptr<ImageStage>> image_stages;
  uint64_t image_recordings = 0;  // under image_mu

  // A rig's geometry (host) and its SCA query lists in backend memory, padded to a bev stage's
  // capacity. The bev stages do not depend on the rig (its lists are bound inputs), so a vehicle
  // whose rig left this cache costs its geometry again (ms), never a recording.
  struct RigEntry {
    size_t id = 0;  // 1 for the first rig this runner saw, 2 for the next new one...
    RigGeometry geometry;
    Tensor inv_count;  // geometry.queries', uploaded
    struct Padded {
      int64_t capacity = 0;
      Tensor query_index, reference;
    };
    // Its lists at each capacity a stage asked for (a tapped stage, a second lane or the other
    // history variant may hold another): uploaded once per rig and capacity, the last few kept.
    std::vector<Padded> padded;
  };
  static constexpr size_t kMaxRigs = 16;
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
      e->inv_count = backend.upload(e->geometry.queries.inv_count);
      e->id = ++rigs_computed;
      if (rigs.size() == kMaxRigs) rigs.pop_back();
      rigs.insert(rigs.begin(), std::move(e));
    } else {
      std::rotate(rigs.begin(), it, it + 1);
    }
    return *rigs.front();
  }

  // An eager frame's SCA lists: its rig's as computed (what a replayed stage recorded first for
  // this rig holds, so that both run the same ops and the profiler carries labels across).
  void add_rig(std::vector<ScaInputs>& sca, RigEntry& rig) {
    const RigEntry::Padded& lists = pad_rig(rig, rig.geometry.queries.max_len);
    for (ScaInputs& s : sca) {
      s.query_index = lists.query_index;
      s.reference = lists.reference;
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

  // The bev stages of single frames (one per history variant, tap setting and lane), most
  // recently recorded last; under bev_mu.
  std::vector<std::unique_ptr<BevStage>> bev_stages;
  uint64_t bev_recordings = 0;  // under bev_mu

  // The SCA lists of `rig` padded to `capacity` slots per camera (the rest -1 and zeros: the
  // padding gathers zeros and scatters nowhere), uploaded once per rig and capacity.
  const RigEntry::Padded& pad_rig(RigEntry& rig, int64_t capacity) {
    for (const RigEntry::Padded& p : rig.padded) {
      if (p.capacity == capacity) return p;
    }
    const ScaQueryLists& q = rig.geometry.queries;
    const int64_t cams = cfg.transformer.num_cams, anchors = q.reference.size(2), ref_floats = anchors * 2;
    Tensor qi = Tensor::empty({cams * capacity}, DType::kI64);
    Tensor ref = Tensor::zeros({cams * capacity, 1, anchors, 2}, DType::kF32);
    for (int64_t n = 0; n < cams; ++n) {
      int64_t* dst = qi.data<int64_t>() + n * capacity;
      const int64_t* src = q.query_index.data<int64_t>() + n * q.max_len;
      for (int64_t k = 0; k < capacity; ++k) dst[k] = k < q.max_len ? src[k] : -1;
      std::copy_n(q.reference.data<float>() + n * q.max_len * ref_floats, q.max_len * ref_floats,
                  ref.data<float>() + n * capacity * ref_floats);
    }
    constexpr size_t kMaxCapacities = 4;
    if (rig.padded.size() == kMaxCapacities) rig.padded.erase(rig.padded.begin());
    rig.padded.push_back({capacity, backend.upload(qi), backend.upload(ref)});
    return rig.padded.back();
  }

  // The bev stage for a frame of this lane and variant whose rig's longest SCA list is `longest`
  // (pillar anchors `anchors`): the recorded one, or recorded now. The first recording holds
  // exactly the first rig's lists (one vehicle, or a fleet of one calibration, pays no padding);
  // a rig with a longer list re-records it at the batches' capacity rule, so rigs alike fit from
  // then on (a larger capacity replaces a smaller one).
  BevStage& bev_recorded(int lane, bool use_prev, bool tapped, int64_t longest, int64_t anchors) {
    const ImageStage& image = *image_stages[static_cast<size_t>(lane)];
    // Stages that read an earlier recording of this lane's image stage would run on its stale
    // outputs (which they keep alive: for base about 1.1 GB each).
    std::erase_if(bev_stages, [&](const std::unique_ptr<BevStage>& p) {
      return p->lane == lane && p->image_generation != image.generation;
    });
    int64_t capacity = longest;
    for (auto it = bev_stages.begin(); it != bev_stages.end(); ++it) {
      BevStage& p = **it;
      if (p.use_prev != use_prev || p.tapped != tapped || p.lane != lane) continue;
      if (p.capacity >= longest && p.in.sca.front().reference.size(2) == anchors) return p;
      capacity = std::max(capacity_for(longest), p.capacity);
      bev_stages.erase(it);
      break;
    }
    const int64_t hw = bev_cells(), cams = cfg.transformer.num_cams;
    ++bev_recordings;
    auto p = std::make_unique<BevStage>();
    p->use_prev = use_prev;
    p->tapped = tapped;
    p->lane = lane;
    p->image_generation = image.generation;
    p->capacity = capacity;
    p->in.can_bus = backend.empty({1, 18}, DType::kF32);
    p->in.tsa_reference = backend.empty({hw, 2, 1, 2}, DType::kF32);
    if (use_prev) {
      p->in.prev_bev = backend.empty({hw, cfg.transformer.embed_dims}, DType::kF32);
      p->in.rotation_index = backend.empty({hw}, DType::kI64);
    }
    const Tensor query_index = backend.empty({cams * capacity}, DType::kI64);
    const Tensor reference = backend.empty({cams * capacity, 1, anchors, 2}, DType::kF32);
    const Tensor inv_count = backend.empty({hw, 1}, DType::kF32);
    p->in.sca = image.out.sca;
    for (ScaInputs& v : p->in.sca) {
      v.query_index = query_index;
      v.reference = reference;
      v.inv_count = inv_count;
    }
    Ops rec(backend, Ops::Mode::kPlan);  // computed by the first execution, as the image stage
    p->out = model.bev_stage(rec, p->in, tapped ? &p->taps : nullptr);
    std::vector<Tensor> keep = tap_tensors(p->taps);
    for (const Tensor& t : {p->out.bev_embed, p->out.all_cls, p->out.all_preds, p->out.last_preds, p->out.nonfinite}) {
      keep.push_back(t);
    }
    keep.insert(keep.end(), p->out.top_scores.begin(), p->out.top_scores.end());
    keep.insert(keep.end(), p->out.top_index.begin(), p->out.top_index.end());
    std::string name = use_prev ? "bev (with history" : "bev (first frame";
    if (lane > 0) name += ", lane " + std::to_string(lane + 1);
    p->stage = RecordedStage(name + ")", rec.take_nodes(), keep, backend,
                             {p->in.prev_bev, p->out.bev_embed, query_index, reference, inv_count});
    bev_stages.push_back(std::move(p));
    return *bev_stages.back();
  }

  // The bindings of a bev stage's execution: its new BEV, its rig's lists and (with history) the
  // previous BEV. On the caller's stack: a frame's execution allocates nothing.
  using BevBindings = std::array<StageBinding, 5>;
  static std::span<const StageBinding> bev_bindings(BevBindings& b, const BevStage& s, const Tensor& new_bev,
                                                   const Tensor& prev_bev) {
    const ScaInputs& sca = s.in.sca.front();
    b = {StageBinding{s.out.bev_embed, new_bev}, StageBinding{sca.query_index, s.last_query_index},
         StageBinding{sca.reference, s.last_reference}, StageBinding{sca.inv_count, s.last_inv_count},
         StageBinding{s.in.prev_bev, prev_bev}};
    return std::span<const StageBinding>(b.data(), s.use_prev ? 5 : 4);
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
      check_finite(backend, s.out.nonfinite, "image", kImageWhat, nonfinite_frames);
      if (reads.taps) read_taps(s.taps, &s.stage, {}, *reads.taps);
    } else {
      Ops eager(backend);
      Taps taps;
      ImageOutputs out = model.image_stage(eager, backend.upload(f.img), reads.taps ? &taps : nullptr);
      check_finite(backend, out.nonfinite, "image", kImageWhat, nonfinite_frames);
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
      const ScaQueryLists& lists = rig.geometry.queries;
      BevStage& s = bev_recorded(st->lane, use_prev, reads.taps != nullptr, lists.max_len, lists.reference.size(2));
      const RigEntry::Padded& padded = pad_rig(rig, s.capacity);
      s.last_query_index = padded.query_index;
      s.last_reference = padded.reference;
      s.last_inv_count = rig.inv_count;
      backend.write(s.in.can_bus, step.can_bus);
      backend.write(s.in.tsa_reference, step.tsa_reference);
      if (use_prev) backend.write(s.in.rotation_index, step.rotation_index);
      if (!spare_bev.defined()) spare_bev = backend.empty({hw, c}, DType::kF32);
      BevBindings bound;
      const std::span<const StageBinding> bindings = bev_bindings(bound, s, spare_bev, history.prev_bev);
      backend.execute(s.stage, bindings);
      check_finite(backend, s.out.nonfinite, "bev", kBevWhat, nonfinite_frames);
      s.last_bev = spare_bev;
      new_bev = spare_bev;
      out.all_cls_scores = backend.read(s.out.all_cls);
      out.all_bbox_preds = backend.read(s.out.all_preds);
      last_preds = backend.read(s.out.last_preds);
      top_scores = backend.read(s.out.top_scores[0]);
      top_index = backend.read(s.out.top_index[0]);
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
      check_finite(backend, r.nonfinite, "bev", kBevWhat, nonfinite_frames);
      new_bev = r.bev_embed;
      out.all_cls_scores = backend.read(r.all_cls);
      out.all_bbox_preds = backend.read(r.all_preds);
      last_preds = backend.read(r.last_preds);
      top_scores = backend.read(r.top_scores[0]);
      top_index = backend.read(r.top_index[0]);
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
    FrameOutput out = run_bev(f, run_image(f, reads), history, reads);
    if (!reads.taps) note_timing(1, out.image_seconds + out.bev_seconds);
    return out;
  }

  // Every lane (no frame in flight) and both stages' locks: for executions outside frames, for
  // reading the stages, and for batches (which run alone).
  struct Quiet {
    explicit Quiet(Impl& m) : held(m.lanes), lock(m.image_mu, m.bev_mu) {}
    LanePool::All held;
    std::scoped_lock<std::mutex, std::mutex> lock;
  };

  // ---- batches of frames of distinct streams ----

  // A batch size's recorded stages: the image stage over B frames' cameras and the bev stage over
  // B samples. The SCA lists, TSA's value indices and every sample's previous BEV (bound to its
  // stream's buffer) are inputs, so one recording serves any mix of rigs, first frames and
  // frames with history.
  struct BatchStages {
    int64_t batch = 0;
    Shape img_shape;       // [B*N, H, W, 3]
    int64_t capacity = 0;  // SCA slots per camera
    Tensor img;
    ImageOutputs image_out;
    RecordedStage image;
    EncoderInputs in;
    BevOutputs out;
    RecordedStage bev;
  };
  // One per batch size, most recently used first; the last kMaxBatchSizes sizes stay recorded
  // (their arenas grow with the batch: tiny's image stage alone is ~280 MiB per sample). Under Quiet.
  static constexpr size_t kMaxBatchSizes = 3;
  std::vector<std::unique_ptr<BatchStages>> batch_stages;

  // How fast each batch size ran (replayed), per frame: what `adaptive` chooses by. The first run
  // of a size (it records the stages) is not counted.
  struct BatchTiming {
    int runs = 0;
    double per_frame = 0;  // seconds, exponentially averaged
  };
  bool adaptive = false;
  std::mutex timing_mu;
  std::map<int64_t, BatchTiming> timings;

  void note_timing(int64_t batch, double seconds) {
    if (!replay) return;
    const std::lock_guard<std::mutex> lock(timing_mu);
    BatchTiming& t = timings[batch];
    const double per_frame = seconds / static_cast<double>(batch);
    if (t.runs == 1) t.per_frame = per_frame;
    if (t.runs > 1) t.per_frame = 0.7 * t.per_frame + 0.3 * per_frame;
    ++t.runs;
  }

  // The batch size to run n samples at: n until it has been measured, then the measured size of
  // at most n that took the least time per frame (3% in n's favour), so batching never costs a
  // machine throughput where a smaller batch (or none) is faster.
  int64_t chosen_batch(int64_t n) {
    if (!adaptive || !replay) return n;
    const std::lock_guard<std::mutex> lock(timing_mu);
    const auto it = timings.find(n);
    if (it == timings.end() || it->second.runs < 2) return n;
    int64_t best = n;
    double best_time = it->second.per_frame;
    for (const auto& [b, t] : timings) {
      if (b < n && t.runs >= 2 && t.per_frame < 0.97 * best_time) {
        best = b;
        best_time = t.per_frame;
      }
    }
    return best;
  }

  // The host geometry of the rigs batches saw (batches keep their own: the single-frame cache
  // above holds uploaded lists too).
  static constexpr size_t kMaxBatchRigs = 64;
  std::mutex batch_rig_mu;
  std::vector<std::shared_ptr<const RigGeometry>> batch_rigs;  // most recently used first

  std::shared_ptr<const RigGeometry> batch_rig(const FrameInput& f) {
    const int pad_h = static_cast<int>(f.img.size(1)), pad_w = static_cast<int>(f.img.size(2));
    const std::lock_guard<std::mutex> lock(batch_rig_mu);
    auto it = std::find_if(batch_rigs.begin(), batch_rigs.end(), [&](const auto& r) {
      return r->lidar2img == f.lidar2img && r->pad_w == pad_w && r->pad_h == pad_h;
    });
    if (it != batch_rigs.end()) {
      std::rotate(batch_rigs.begin(), it, it + 1);
      return batch_rigs.front();
    }
    auto g = std::make_shared<const RigGeometry>(model.rig_geometry(f));
    if (batch_rigs.size() == kMaxBatchRigs) batch_rigs.pop_back();
    batch_rigs.insert(batch_rigs.begin(), g);
    return g;
  }

  int64_t bev_cells() const { return int64_t{cfg.head.bev_h} * cfg.head.bev_w; }

  // The capacity rule: the longest list rounded up to a multiple of ceil(HW / 8), at most HW.
  int64_t capacity_for(int64_t longest) const {
    const int64_t hw = bev_cells(), step = (hw + 7) / 8;
    return std::min(hw, (longest + step - 1) / step * step);
  }

  // The batched stages of `batch` samples of images `img_shape` with room for lists of `longest`
  // slots: the recorded ones, or recorded now (a larger capacity replaces a smaller one).
  BatchStages& batch_recorded(int64_t batch, const Shape& img_shape, int64_t longest, int64_t anchors) {
    auto it = std::find_if(batch_stages.begin(), batch_stages.end(), [&](const auto& p) { return p->batch == batch; });
    int64_t capacity = capacity_for(longest);
    if (it != batch_stages.end()) {
      std::rotate(batch_stages.begin(), it, it + 1);
      BatchStages& front = *batch_stages.front();
      if (front.img_shape == img_shape && front.capacity >= longest) return front;
      if (front.img_shape == img_shape) capacity = std::max(capacity, front.capacity);
      batch_stages.erase(batch_stages.begin());
    }
    if (batch_stages.size() >= kMaxBatchSizes) batch_stages.pop_back();
    const int64_t hw = bev_cells(), c = cfg.transformer.embed_dims, cams = cfg.transformer.num_cams;
    const int64_t slots = batch * cams * capacity;
    auto p = std::make_unique<BatchStages>();
    p->batch = batch;
    p->img_shape = img_shape;
    p->capacity = capacity;
    const std::string name = " (batch " + std::to_string(batch) + ")";
    p->img = backend.empty(img_shape, DType::kF32);
    {
      Ops rec(backend, Ops::Mode::kPlan);
      p->image_out = model.image_stage(rec, p->img, nullptr);
      std::vector<Tensor> keep = {p->image_out.nonfinite};
      for (const ScaInputs& v : p->image_out.sca) keep.push_back(v.value);
      p->image = RecordedStage("image" + name, rec.take_nodes(), keep, backend);
    }
    EncoderInputs& in = p->in;
    in.batch = batch;
    in.can_bus = backend.empty({batch, 18}, DType::kF32);
    in.tsa_reference = backend.empty({batch * hw, 2, 1, 2}, DType::kF32);
    for (int64_t b = 0; b < batch; ++b) in.prev_bevs.push_back(backend.empty({hw, c}, DType::kF32));
    in.value_index = backend.empty({batch * 2 * hw}, DType::kI64);
    in.value0_index = backend.empty({batch * hw}, DType::kI64);
    const Tensor query_index = backend.empty({slots}, DType::kI64);
    const Tensor reference = backend.empty({slots, 1, anchors, 2}, DType::kF32);
    const Tensor inv_count = backend.empty({batch * hw, 1}, DType::kF32);
    in.sca = p->image_out.sca;
    for (ScaInputs& v : in.sca) {
      v.query_index = query_index;
      v.reference = reference;
      v.inv_count = inv_count;
    }
    Ops rec(backend, Ops::Mode::kPlan);
    p->out = model.bev_stage(rec, in, nullptr);
    std::vector<Tensor> keep = {p->out.bev_embed, p->out.all_cls, p->out.all_preds, p->out.last_preds, p->out.nonfinite};
    keep.insert(keep.end(), p->out.top_scores.begin(), p->out.top_scores.end());
    keep.insert(keep.end(), p->out.top_index.begin(), p->out.top_index.end());
    p->bev = RecordedStage("bev" + name, rec.take_nodes(), keep, backend, in.prev_bevs);
    batch_stages.insert(batch_stages.begin(), std::move(p));
    return *batch_stages.front();
  }

  // A sample of a batch after its host step (forward_test steps 1-3 on a copy of its state).
  struct BatchRow {
    size_t index = 0;  // into the caller's samples
    TemporalState next_state;
    BevStepInputs step;
    std::shared_ptr<const RigGeometry> rig;
    double geometry_seconds = 0;
  };

  // The bev stage's per-sample inputs of a batch, on the host. TSA's value rows index the
  // sources [prev_bevs[0..B), the encoder's input query (B), the layer input (B+1)]: a sample
  // with history reads its own previous BEV (rotated) and the queries, a first frame the layer
  // input twice, as forward() does for each alone. The SCA lists are each sample's own,
  // re-padded to `capacity` slots per camera and offset to its rows.
  struct BatchHostInputs {
    Tensor can_bus, tsa_reference, value_index, value0_index, query_index, reference, inv_count;
  };
  BatchHostInputs batch_host_inputs(const std::vector<BatchRow>& rows, int64_t capacity) const {
    const int64_t batch = static_cast<int64_t>(rows.size()), hw = bev_cells(), cams = cfg.transformer.num_cams;
    const int64_t anchors = rows[0].rig->queries.reference.size(2);
    BatchHostInputs h;
    h.can_bus = Tensor::empty({batch, 18}, DType::kF32);
    h.tsa_reference = Tensor::empty({batch * hw, 2, 1, 2}, DType::kF32);
    h.value_index = Tensor::empty({batch * 2 * hw}, DType::kI64);
    h.value0_index = Tensor::empty({batch * hw}, DType::kI64);
    h.query_index = Tensor::empty({batch * cams * capacity}, DType::kI64);
    h.reference = Tensor::zeros({batch * cams * capacity, 1, anchors, 2}, DType::kF32);
    h.inv_count = Tensor::empty({batch * hw, 1}, DType::kF32);
    const int64_t ref_floats = anchors * 2;
    for (int64_t b = 0; b < batch; ++b) {
      const BatchRow& r = rows[static_cast<size_t>(b)];
      std::copy_n(r.step.can_bus.data<float>(), 18, h.can_bus.data<float>() + b * 18);
      std::copy_n(r.step.tsa_reference.data<float>(), hw * 4, h.tsa_reference.data<float>() + b * hw * 4);
      int64_t* v0 = h.value0_index.data<int64_t>() + b * hw;
      int64_t* stack = h.value_index.data<int64_t>() + b * 2 * hw;
      for (int64_t i = 0; i < hw; ++i) {
        if (!r.step.step.use_prev_bev) {
          v0[i] = stack[i] = stack[hw + i] = gather_multi_index(batch + 1, b * hw + i);
          continue;
        }
        int64_t src_row = i;
        if (cfg.transformer.rotate_prev_bev) src_row = r.step.rotation_index.data<int64_t>()[i];
        v0[i] = stack[i] = src_row < 0 ? -1 : gather_multi_index(b, src_row);
        stack[hw + i] = gather_multi_index(batch, b * hw + i);
      }
      const ScaQueryLists& q = r.rig->queries;
      if (q.reference.size(2) != anchors) {
        throw Error(ErrorKind::kInternal, "rigs of one batch with different pillar anchors");
      }
      for (int64_t n = 0; n < cams; ++n) {
        int64_t* qi = h.query_index.data<int64_t>() + (b * cams + n) * capacity;
        float* ref = h.reference.data<float>() + (b * cams + n) * capacity * ref_floats;
        const int64_t* src_qi = q.query_index.data<int64_t>() + n * q.max_len;
        const float* src_ref = q.reference.data<float>() + n * q.max_len * ref_floats;
        for (int64_t k = 0; k < capacity; ++k) qi[k] = k < q.max_len && src_qi[k] >= 0 ? src_qi[k] + b * hw : -1;
        std::copy_n(src_ref, q.max_len * ref_floats, ref);  // the rest stays zero, as the rig's own padding
      }
      std::copy_n(q.inv_count.data<float>(), hw, h.inv_count.data<float>() + b * hw);
    }
    return h;
  }

  // The samples' host steps; a sample that fails fails alone (its error in results).
  std::vector<BatchRow> batch_rows(std::span<const BatchSample> samples, const std::vector<size_t>& group,
                                   std::vector<SampleOutput>& results) {
    const int64_t hw = bev_cells(), c = cfg.transformer.embed_dims;
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
        if (r.step.step.use_prev_bev && (!history.prev_bev.defined() || history.prev_bev.shape() != Shape{hw, c} ||
                                         history.prev_bev.device() != backend.device())) {
          throw Error(ErrorKind::kInternal, "the stream's history has no previous BEV of this runner");
        }
        r.rig = batch_rig(f);
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
    for (const BatchRow& r : rows) longest = std::max(longest, r.rig->queries.max_len);
    const int64_t anchors = rows[0].rig->queries.reference.size(2);
    Shape img_shape = samples[rows[0].index].frame->img.shape();
    img_shape[0] *= batch;

    const Quiet quiet(*this);
    auto t_part = Clock::now();
    ImageOutputs eager_image;
    BevOutputs eager_bev;
    Tensor img_nonfinite;
    BatchStages* st = nullptr;
    if (replay) {
      st = &batch_recorded(batch, img_shape, longest, anchors);
      for (int64_t b = 0; b < batch; ++b) {
        backend.write(st->img.slice(0, b * cams, (b + 1) * cams), samples[rows[static_cast<size_t>(b)].index].frame->img);
      }
      backend.execute(st->image);
      img_nonfinite = backend.read(st->image_out.nonfinite);
    } else {
      Tensor img = Tensor::empty(img_shape, DType::kF32);
      const size_t per = static_cast<size_t>(img.nbytes() / static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        std::memcpy(static_cast<char*>(img.raw_data()) + static_cast<size_t>(b) * per,
                    samples[rows[static_cast<size_t>(b)].index].frame->img.raw_data(), per);
      }
      Ops eager(backend);
      eager_image = model.image_stage(eager, backend.upload(img), nullptr);
      img_nonfinite = backend.read(eager_image.nonfinite);
    }
    const double image_seconds = seconds_since(t_part);

    t_part = Clock::now();
    const int64_t capacity = st ? st->capacity : capacity_for(longest);
    const BatchHostInputs host = batch_host_inputs(rows, capacity);
    const BevOutputs* out = nullptr;
    if (replay) {
      backend.write(st->in.can_bus, host.can_bus);
      backend.write(st->in.tsa_reference, host.tsa_reference);
      backend.write(st->in.value_index, host.value_index);
      backend.write(st->in.value0_index, host.value0_index);
      backend.write(st->in.sca[0].query_index, host.query_index);
      backend.write(st->in.sca[0].reference, host.reference);
      backend.write(st->in.sca[0].inv_count, host.inv_count);
      std::vector<StageBinding> bindings;
      for (int64_t b = 0; b < batch; ++b) {
        const BatchRow& r = rows[static_cast<size_t>(b)];
        if (r.step.step.use_prev_bev) bindings.push_back({st->in.prev_bevs[static_cast<size_t>(b)], samples[r.index].history->prev_bev});
      }
      backend.execute(st->bev, bindings);
      out = &st->out;
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
    const Tensor bev_nonfinite = backend.read(out->nonfinite);
    const Tensor all_cls = backend.read(out->all_cls), all_preds = backend.read(out->all_preds);
    const Tensor last_preds = backend.read(out->last_preds);
    const int64_t queries = last_preds.size(0) / batch;
    std::vector<Tensor> top_scores, top_index;
    for (int64_t b = 0; b < batch; ++b) {
      top_scores.push_back(backend.read(out->top_scores[static_cast<size_t>(b)]));
      top_index.push_back(backend.read(out->top_index[static_cast<size_t>(b)]));
    }
    const double bev_seconds = seconds_since(t_part);
    note_timing(batch, image_seconds + bev_seconds);

    for (int64_t b = 0; b < batch; ++b) {
      const BatchRow& r = rows[static_cast<size_t>(b)];
      SampleOutput& result = results[r.index];
      result.batch_size = batch;
      if (const int64_t n = img_nonfinite.data<int64_t>()[b]; n != 0) {
        ++nonfinite_frames;
        result.error = std::make_exception_ptr(nonfinite_error(n, "image", kImageWhat));
        continue;
      }
      if (const int64_t n = bev_nonfinite.data<int64_t>()[b]; n != 0) {
        ++nonfinite_frames;
        result.error = std::make_exception_ptr(nonfinite_error(n, "bev", kBevWhat));
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
      o.all_cls_scores = all_cls.slice(1, b * queries, (b + 1) * queries).contiguous();
      o.all_bbox_preds = all_preds.slice(1, b * queries, (b + 1) * queries).contiguous();
      if (reads.bev_embed) o.bev_embed = backend.read(history.prev_bev);
      const auto t_decode = Clock::now();
      o.detections = model.decode(top_scores[static_cast<size_t>(b)], top_index[static_cast<size_t>(b)],
                                  last_preds.slice(0, b * queries, (b + 1) * queries).contiguous());
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
  void execute_outside_frame(BevStage& s) {
    // A stage whose first frame failed before it executed has no rig or previous BEV to read.
    if (!s.last_query_index.defined() || (s.use_prev && !s.last_bev.defined())) return;
    // The last frame's rig and previous BEV; the new BEV into the stage's own output buffer.
    BevBindings bound;
    std::span<const StageBinding> bindings = bev_bindings(bound, s, s.out.bev_embed, s.last_bev);
    backend.execute(s.stage, bindings.subspan(1));
  }

  std::string describe() const {
    std::string out;
    for (const auto& p : image_stages) {
      if (p) out += p->stage.describe();
    }
    for (const auto& p : bev_stages) out += p->stage.describe();
    for (const auto& p : batch_stages) out += p->image.describe() + p->bev.describe();
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
  for (const auto& p : impl_->bev_stages) impl_->execute_outside_frame(*p);
  // Batches: their previous BEVs unbound (each slot's own memory; the outputs go nowhere).
  for (const auto& p : impl_->batch_stages) {
    impl_->backend.execute(p->image);
    impl_->backend.execute(p->bev);
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
  // Lane 0's stage, the one a plain runner has (a pipelined runner's lane 2 may hold another
  // frame's inputs), with the last frame's rig.
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->bev_stages) {
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
  // The stage replay_bev_stage runs: the first lane that has one, untapped.
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->bev_stages) {
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
  for (const auto& p : impl_->bev_stages) add(p->stage);
  for (const auto& p : impl_->batch_stages) {
    add(p->image);
    add(p->bev);
  }
  return out;
}

void StageRunner::set_adaptive_batching(bool on) { impl_->adaptive = on; }

int64_t StageRunner::chosen_batch(int64_t n) const { return impl_->chosen_batch(n); }

void StageRunner::seed_batch_timing(int64_t batch, double seconds_per_frame) {
  const std::lock_guard<std::mutex> lock(impl_->timing_mu);
  Impl::BatchTiming& t = impl_->timings[batch];
  t.runs = std::max(t.runs, 2);
  t.per_frame = seconds_per_frame;
}

int64_t StageRunner::batch_capacity(int64_t batch) const {
  const Impl::Quiet quiet(*impl_);
  for (const auto& p : impl_->batch_stages) {
    if (p->batch == batch) return p->capacity;
  }
  return 0;
}

std::vector<SampleOutput> StageRunner::forward_batch(std::span<const BatchSample> samples, const FrameReads& reads) {
  return impl_->forward_batch(samples, reads);
}

uint64_t StageRunner::bev_recordings() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->bev_recordings;
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
