// ProfileSession (bevformer/runner.h): a Profiler attached to a model's ProfilingBackend around
// whatever the caller runs, read back as op records, and summarized and written exactly as
// `bevformer profile` does (src/api/profile_api.cpp), from the caller's own signposts.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "api/model_impl.h"
#include "bevformer/error.h"
#include "bevformer/runner.h"
#include "profile/profiler.h"
#include "profile/report.h"
#include "runtime/engine.h"

namespace bev {

struct ProfileSession::Impl {
  ModelInternals::Impl& model;
  Engine& engine;
  ProfilingBackend& backend;
  Profiler profiler;

  Impl(ModelInternals::Impl& m, ProfilingBackend& b) : model(m), engine(*m.engine), backend(b) { profiler.reserve(4096); }
  bool attached() const { return backend.attached() == &profiler; }
};

namespace {

ProfilingBackend& profiling_backend_of(ModelInternals::Impl& m) {
  ProfilingBackend* b = m.engine->profiling();
  if (!b) {
    throw Error(ErrorKind::kUnsupported, "the model was loaded without profiling")
        .where("profiler")
        .hint("load it with Knobs::profiling = true (Python: BEVFormer.from_pretrained(..., profiling=True)); "
              "detached it costs one pointer test per op");
  }
  return *b;
}

}  // namespace

ProfileSession::ProfileSession(Model& model) {
  ModelInternals::Impl& m = ModelInternals::of(model);
  impl_ = std::make_unique<Impl>(m, profiling_backend_of(m));
}

ProfileSession::~ProfileSession() { stop(); }

void ProfileSession::start() {
  if (impl_->attached()) return;
  if (impl_->backend.attached() != nullptr) {
    throw Error(ErrorKind::kInvalidInput, "another profiler is recording this model")
        .where("profiler.start")
        .expected("one profiler at a time per model: stop the other first");
  }
  impl_->backend.attach(&impl_->profiler);
}

void ProfileSession::stop() {
  if (impl_->attached()) impl_->backend.attach(nullptr);
}

bool ProfileSession::running() const { return impl_->attached(); }

void ProfileSession::signpost(const std::string& name) {
  if (name.empty() || name == "_end") {
    throw Error(ErrorKind::kInvalidInput, "an empty signpost name").where("profiler.signpost").expected("\"x\" or \"x_end\"");
  }
  impl_->profiler.signpost(name);
}

size_t ProfileSession::op_count() const { return impl_->profiler.ops().size(); }

std::vector<ProfiledOp> ProfileSession::ops() const {
  const Profiler& p = impl_->profiler;
  std::vector<ProfiledOp> out;
  out.reserve(p.ops().size());
  for (size_t i = 0; i < p.ops().size(); ++i) {
    const OpRecord& r = p.ops()[i];
    ProfiledOp op;
    op.index = i;
    op.name = op_name(r.kind);
    op.stage = p.text(r.stage);
    op.label = p.text(r.label);
    op.inputs = tensors_text(p.inputs(r));
    op.outputs = tensors_text(p.outputs(r));
    op.start_ms = static_cast<double>(r.start_ns) * 1e-6;
    op.ms = static_cast<double>(r.duration_ns) * 1e-6;
    op.gflop = r.flops * 1e-9;
    op.gbyte = r.bytes * 1e-9;
    out.push_back(std::move(op));
  }
  return out;
}

std::vector<ProfiledSignpost> ProfileSession::signposts() const {
  std::vector<ProfiledSignpost> out;
  for (const Signpost& s : impl_->profiler.signposts()) out.push_back({s.name, static_cast<double>(s.t_ns) * 1e-6});
  return out;
}

ProfileReport ProfileSession::report(const SessionReportOptions& options) {
  Impl& s = *impl_;
  Profiler& p = s.profiler;
  const size_t rounds = std::min(p.ranges("image").size(), p.ranges("bev").size());
  if (rounds == 0) {
    throw Error(ErrorKind::kInvalidInput, "the recording has no round")
        .where("profiler.report")
        .expected("at least one closed \"image\"..\"image_end\" and \"bev\"..\"bev_end\" signpost range around the "
                  "stages (model.runner.replay(\"image\") between the first two, and so on)");
  }
  ProfileReport r;
  const BackendInfo info = s.engine.backend_info();
  r.config = s.engine.config().name;
  r.weights = s.model.weights_name;
  r.precision = info.precision;
  r.device = info.summary();
  r.backend = info.backend;
  r.cpu = info.device;
  r.isa = info.isa;
  r.threads = info.threads;
  r.forward_ms = options.forward_ms;

  StageRunner& runner = s.engine.runner();
  r.memory.weight_bytes = s.model.weight_bytes;
  for (const StageRunner::StageInfo& i : runner.stage_info()) {
    r.memory.plans.push_back({i.name, i.ops, i.buffers, i.arena_bytes, i.no_reuse_bytes, i.description});
    r.memory.arena_bytes += i.arena_bytes;
  }
  r.memory.rss_bytes = resident_bytes();
  r.memory.peak_rss_bytes = peak_resident_bytes();

  {
    // Measurements run detached, so that they never land in the recording.
    Profiler* was = s.backend.attached();
    s.backend.attach(nullptr);
    struct Reattach {
      ProfilingBackend& b;
      Profiler* p;
      ~Reattach() { b.attach(p); }
    } reattach{s.backend, was};
    if (options.measure_unprofiled) {
      // The rounds' bev stage: the one with history once a stream's second frame recorded it.
      bool with_history = false;
      for (const ProfilePlanMemory& plan : r.memory.plans) {
        with_history = with_history || plan.name.rfind("bev (with history", 0) == 0;
      }
      for (size_t k = 0; k < rounds; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        runner.replay_image_stage();
        runner.replay_bev_stage(with_history);
        r.overhead.unprofiled_round_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    if (options.measure_peaks) {
      r.peak_gflops = s.backend.measure_peak_gflops();
      r.peak_gbps = measure_copy_bandwidth_gbps(r.threads);
    }
  }

  r.labels_from_eager = carry_labels_from_eager(p, &r.labels_note);
  try {
    summarize_rounds(p, r);
  } catch (const Error& e) {
    // The rounds are the caller's signposts here, not the profile command's: a mismatch is theirs.
    throw Error(ErrorKind::kInvalidInput, e.problem())
        .where("profiler.report")
        .expected("every image..image_end range around the same stage, and every bev..bev_end range too");
  }
  summarize_eager(p, r);

  summarize_overhead(r);
  return r;
}

std::vector<std::string> ProfileSession::write(const std::string& dir_name, ProfileReport& r, int top_ops) const {
  const std::filesystem::path dir(dir_name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create the output directory: " + ec.message()).where(dir_name);
  r.files.clear();
  write_profile_files(dir, impl_->profiler, r, top_ops);
  return r.files;
}

}  // namespace bev
