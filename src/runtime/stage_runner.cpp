#include "runtime/stage_runner.h"

#include <algorithm>
#include <utility>

#include "backend/ops.h"
#include "runtime/stage_runner_impl.h"

namespace bev {

using runner_detail::Clock;
using runner_detail::nonfinite;
using runner_detail::seconds_since;


StagedFrame::StagedFrame() = default;
StagedFrame::~StagedFrame() = default;
StagedFrame::StagedFrame(StagedFrame&&) noexcept = default;
StagedFrame& StagedFrame::operator=(StagedFrame&&) noexcept = default;
std::chrono::steady_clock::time_point StagedFrame::started() const { return s_ ? s_->started : Clock::time_point{}; }
double StagedFrame::image_seconds() const { return s_ ? s_->image_seconds : 0; }

std::unique_ptr<StagedFrame::State> StageRunner::Impl::run_image(const FrameInput& f, const FrameReads& reads) {
  model.check_frame(f);
  auto st = std::make_unique<StagedFrame::State>();
  st->lane = lanes.acquire();  // released when st is destroyed (by run_bev, or on a throw)
  st->lanes = &lanes;
  st->img_shape = f.img.shape();
  st->img_dtype = f.img.dtype();
  st->lidar2img = f.lidar2img;
  st->can_bus = f.can_bus;
  st->scene_token = f.scene_token;
  const std::lock_guard<std::mutex> lock(image_mu);
  st->started = Clock::now();
  if (replay) {
    ImageRecording& s = stages.image(st->lane, f.img.shape(), f.img.dtype(), reads.taps != nullptr, st->host_waits);
    s.staging.write(backend, s.img, f.img);
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

FrameOutput StageRunner::Impl::run_bev(const FrameInput& f, std::unique_ptr<StagedFrame::State> st,
                                       StreamHistory& history, const FrameReads& reads) {
  if (!st || st->lanes != &lanes) {
    throw Error(ErrorKind::kInvalidInput, st ? "a frame staged by another runner" : "an empty staged frame")
        .where("run_bev")
        .expected("the result of this runner's run_image for the same frame");
  }
  if (f.img.shape() != st->img_shape || f.img.dtype() != st->img_dtype || f.lidar2img != st->lidar2img || f.can_bus != st->can_bus ||
      f.scene_token != st->scene_token) {
    throw Error(ErrorKind::kInvalidInput, "the frame differs from the one staged (img " + f.img.describe() +
                                              ", staged " + dtype_name(st->img_dtype) + shape_str(st->img_shape) + ")")
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
    s.staging.write(backend, s.in.can_bus, step.can_bus);
    s.staging.write(backend, s.in.tsa_reference, step.tsa_reference);
    if (use_prev) s.staging.write(backend, s.in.rotation_index, step.rotation_index);
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

FrameOutput StageRunner::Impl::forward(const FrameInput& f, StreamHistory& history, const FrameReads& reads) {
  FrameOutput out = run_bev(f, run_image(f, reads), history, reads);
  if (!reads.taps) note_timing(1, out.image_seconds + out.bev_seconds);
  return out;
}

// A bev stage outside a frame: it reads the last frame's new BEV as the previous one and
// writes its own output buffer, so no stream changes.
void StageRunner::Impl::execute_outside_frame(const BevRecording& s) {
  // A stage whose first frame failed before it executed has no rig or previous BEV to read.
  if (!s.last_lists.query_index.defined() || (s.use_prev && !s.last_bev.defined())) return;
  // The last frame's rig and previous BEV; the new BEV into the stage's own output buffer.
  BevBindings bound;
  std::span<const StageBinding> bindings = bev_bindings(bound, s, s.out.bev_embed, s.last_lists, s.last_bev);
  backend.execute(s.stage, bindings.subspan(1));
}

std::string StageRunner::Impl::describe() const {
  std::string out;
  stages.for_each([&out](const RecordedStage& s) { out += s.describe(); });
  return out;
}

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
