// StageRunnerHandle (bevformer/runner.h): the model's recorded stages replayed and described
// through its engine's StageRunner, and eager runs of each stage on a second, eager runner of the
// same model and backend (so that a profiler attached to the backend sees their ops too).
#include <chrono>
#include <mutex>
#include <optional>

#include "api/model_impl.h"
#include "bevformer/error.h"
#include "bevformer/runner.h"
#include "profile/profiler.h"
#include "runtime/engine.h"
#include "runtime/prepare.h"

namespace bev {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Set-up work runs unrecorded: the profiler, if one is attached, is detached for the scope.
class Unprofiled {
 public:
  explicit Unprofiled(ProfilingBackend* backend) : backend_(backend) {
    if (backend_) {
      saved_ = backend_->attached();
      backend_->attach(nullptr);
    }
  }
  ~Unprofiled() {
    if (backend_) backend_->attach(saved_);
  }
  Unprofiled(const Unprofiled&) = delete;
  Unprofiled& operator=(const Unprofiled&) = delete;

 private:
  ProfilingBackend* backend_;
  Profiler* saved_ = nullptr;
};

Error unknown_variant(const std::string& variant) {
  return Error(ErrorKind::kInvalidInput, "no stage variant '" + variant + "'")
      .where("runner")
      .expected("\"image\", \"bev\" (with history) or \"bev_first\" (a stream's first frame)");
}

}  // namespace

struct StageRunnerHandle::Impl {
  Engine& engine;
  mutable std::mutex mu;  // everything below
  std::optional<Frame> last;
  std::string base_dir;
  uint64_t generation = 0;  // of `last`; what the eager state below was made from

  // Eager runs: two lanes, so that image features held from run_eager("image") and the frame
  // that primes the history can both exist.
  std::unique_ptr<StageRunner> eager;
  std::optional<FrameInput> input;
  uint64_t input_generation = 0;
  StagedFrame held;  // image features of the last run_eager("image")
  uint64_t held_generation = 0;
  std::optional<StreamHistory> primed;  // the eager runner's history: the last frame run once
  uint64_t primed_generation = 0;

  explicit Impl(Engine& e) : engine(e) {}

  const FrameInput& eager_input() {
    if (!last) {
      throw Error(ErrorKind::kNotFound, "no frame has run on this model yet")
          .where("runner.run_eager")
          .expected("a frame first: eager runs take the last frame's inputs");
    }
    if (!input || input_generation != generation) {
      input = prepare_frame(*last, engine.config(), base_dir).input;
      input_generation = generation;
    }
    if (!eager) eager = std::make_unique<StageRunner>(engine.model(), engine.backend(), /*replay=*/false, /*pipelined=*/true);
    return *input;
  }

  void prime_history() {
    const FrameInput& f = eager_input();
    if (primed && primed_generation == generation) return;
    const Unprofiled quiet(engine.profiling());
    StreamHistory h;
    eager->forward(f, h);
    primed = std::move(h);
    primed_generation = generation;
  }
};

StageRunnerHandle::StageRunnerHandle(Model& model)
    : impl_(std::make_unique<Impl>(*ModelInternals::of(model).engine)) {}
StageRunnerHandle::~StageRunnerHandle() = default;

void StageRunnerHandle::set_last_frame(const Frame& frame, const std::string& base_dir) {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->last = frame;
  impl_->base_dir = base_dir;
  ++impl_->generation;
  impl_->input.reset();
  impl_->held = StagedFrame();
  impl_->primed.reset();
}

bool StageRunnerHandle::has_last_frame() const {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->last.has_value();
}

StageRun StageRunnerHandle::replay(const std::string& variant) {
  const bool image = variant == "image";
  if (!image && variant != "bev" && variant != "bev_first") throw unknown_variant(variant);
  StageRunner& runner = impl_->engine.runner();
  StageRun run;
  run.variant = variant;
  run.stage = image ? "image" : variant == "bev" ? "bev (with history)" : "bev (first frame)";
  const auto t0 = Clock::now();
  const bool ran = image ? runner.replay_image_stage() : runner.replay_bev_stage(variant == "bev");
  run.seconds = seconds_since(t0);
  if (!ran) {
    Error e(ErrorKind::kNotFound, "the stage '" + run.stage + "' is not recorded");
    e.where("runner.replay");
    if (!impl_->engine.options().replay) {
      e.hint("the model runs every frame eagerly (replay off): load it with replay on to record its stages");
    } else if (variant == "bev") {
      e.hint("a stream's second frame records it (the first frame has no history); replay \"bev_first\" meanwhile");
    } else {
      e.hint("run a frame first: each stage is recorded by the first frame that needs it");
    }
    throw e;
  }
  return run;
}

StageRun StageRunnerHandle::run_eager(const std::string& variant) {
  const bool image = variant == "image";
  if (!image && variant != "bev" && variant != "bev_first") throw unknown_variant(variant);
  Impl& s = *impl_;
  const std::lock_guard<std::mutex> lock(s.mu);
  const FrameInput& f = s.eager_input();
  StageRun run;
  run.variant = variant;
  run.stage = "eager";
  if (image) {
    s.held = StagedFrame();  // its lane back before taking one
    const auto t0 = Clock::now();
    s.held = s.eager->run_image(f);
    run.seconds = seconds_since(t0);
    s.held_generation = s.generation;
    return run;
  }
  const bool with_history = variant == "bev";
  if (with_history) s.prime_history();
  StagedFrame staged;
  if (!s.held.empty() && s.held_generation == s.generation) {
    staged = std::move(s.held);
  } else {
    s.held = StagedFrame();
    const Unprofiled quiet(s.engine.profiling());
    staged = s.eager->run_image(f);
  }
  // A copy: the eager bev stage reads the primed BEV and leaves it (its new BEV is a new tensor),
  // so every run starts from the same history.
  StreamHistory history = with_history ? *s.primed : StreamHistory{};
  const auto t0 = Clock::now();
  const FrameOutput out = s.eager->run_bev(f, std::move(staged), history);
  run.seconds = seconds_since(t0);
  if (out.used_history != with_history) {
    throw Error(ErrorKind::kInternal, std::string("the eager bev stage ran ") + (out.used_history ? "with" : "without") +
                                          " history, expected the other");
  }
  return run;
}

void StageRunnerHandle::prepare_eager() {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->prime_history();
}

std::string StageRunnerHandle::describe() const { return impl_->engine.runner().describe(); }

std::vector<RecordedStageInfo> StageRunnerHandle::stages() const {
  std::vector<RecordedStageInfo> out;
  for (const StageRunner::StageInfo& i : impl_->engine.runner().stage_info()) {
    out.push_back({i.name, i.ops, i.buffers, i.arena_bytes, i.no_reuse_bytes});
  }
  return out;
}

}  // namespace bev
