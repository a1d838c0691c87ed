#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "bevformer/error.h"
#include "bevformer/profile.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "profile/profiler.h"
#include "profile/report.h"
#include "runtime/engine.h"

namespace bev {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw Error(ErrorKind::kIo, "cannot write the file").where(path.string());
}

}  // namespace

ProfileReport run_profile(const ProfileOptions& o) {
  if (o.frames < 2) {
    throw Error(ErrorKind::kInvalidInput, "--frames " + std::to_string(o.frames))
        .expected("at least 2 warm-up frames (the second is the first to use the history)");
  }
  if (o.rounds < 1) {
    throw Error(ErrorKind::kInvalidInput, "--rounds " + std::to_string(o.rounds)).expected("at least 1");
  }
  const Precision precision = parse_precision(o.precision, "profile options");
  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot create the output directory: " + ec.message()).where(o.out_dir);
  }

  ProfileReport report;
  const ModelConfig cfg = load_config(o.config);
  report.config = cfg.name;
  report.precision = o.precision;
  report.weights = o.weights.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.weights;
  // The checkpoint lives only while a model is built from it (as in Model::load), so that the
  // memory report is a serving process's.
  auto checkpoint = [&]() {
    if (!o.weights.empty()) log_info("profile: loading ", o.weights);
    return o.weights.empty() ? random_checkpoint(cfg, o.seed) : load_checkpoint(o.weights);
  };

  EngineOptions engine_options;
  engine_options.backend = o.backend;
  engine_options.backend_options = {o.threads, precision, 0};
  engine_options.profiling = true;
  require_backend(engine_options.backend, engine_options.backend_options);
  std::unique_ptr<Engine> engine;
  {
    const Checkpoint ck = checkpoint();
    for (const auto& [name, t] : ck.tensors()) report.memory.weight_bytes += t.nbytes();
    engine = Engine::create(cfg, ck, engine_options);
  }
  StageRunner& model = engine->runner();
  ProfilingBackend& backend = *engine->profiling();
  const BackendInfo info = engine->backend_info();
  report.threads = info.threads;
  report.backend = info.backend;
  report.cpu = info.device;
  report.isa = info.isa;
  report.device = info.summary();

  // Warm-up: the first frame records the image plan and the first-frame bev plan, the second the
  // bev plan with history; later ones replay both. All on the same synthetic drive.
  for (int k = 0; k < o.frames; ++k) {
    const FrameInput frame = synthetic_frame(cfg, o.seed, k);
    const auto t0 = std::chrono::steady_clock::now();
    const FrameOutput out = model.forward(frame);
    report.forward_ms = ms_since(t0);
    log_info("profile: warm-up frame ", k + 1, " of ", o.frames, ": ", report.forward_ms, " ms",
             out.used_history ? " (history in use)" : "");
    if (k > 0 && !out.used_history) {
      throw Error(ErrorKind::kInternal, "warm-up frame " + std::to_string(k) + " did not use the history");
    }
  }

  // The rounds: each replays both stages once unprofiled (wall clock only) and once profiled,
  // between signposts; which comes first alternates, so that neither gains from the order.
  Profiler profiler;
  profiler.reserve(4096);
  auto unprofiled = [&]() {
    const auto t0 = std::chrono::steady_clock::now();
    model.replay_image_stage();
    model.replay_bev_stage(/*with_history=*/true);
    report.overhead.unprofiled_round_ms.push_back(ms_since(t0));
  };
  auto profiled = [&]() {
    backend.attach(&profiler);
    profiler.signpost("image");
    const bool image = model.replay_image_stage();
    profiler.signpost("image_end");
    profiler.signpost("bev");
    const bool bev = model.replay_bev_stage(/*with_history=*/true);
    profiler.signpost("bev_end");
    backend.attach(nullptr);
    if (!image || !bev) throw Error(ErrorKind::kInternal, "the image or the bev stage with history is not recorded");
  };
  profiler.signpost("trace");
  for (int k = 0; k < o.rounds; ++k) {
    if (k % 2 == 0) {
      unprofiled();
      profiled();
    } else {
      profiled();
      unprofiled();
    }
    log_info("profile: round ", k + 1, " of ", o.rounds);
  }

  for (const StageRunner::StageInfo& p : model.stage_info()) {
    report.memory.plans.push_back({p.name, p.ops, p.buffers, p.arena_bytes, p.no_reuse_bytes});
    report.memory.arena_bytes += p.arena_bytes;
  }
  report.memory.rss_bytes = resident_bytes();
  report.memory.peak_rss_bytes = peak_resident_bytes();

  // The peaks, after the memory report: the bandwidth test's buffers would raise the peak RSS.
  log_info("profile: measuring this machine's peaks");
  report.peak_gflops = backend.measure_peak_gflops();
  report.peak_gbps = measure_copy_bandwidth_gbps(report.threads);

  if (o.eager) {
    // A second runner, eager, of the same model on the same backend: one warm-up frame, then a
    // frame with history whose every op runs as it is built, with its stage on it.
    StageRunner eager(engine->model(), backend, /*replay=*/false);
    eager.forward(synthetic_frame(cfg, o.seed, 0));
    const FrameInput frame = synthetic_frame(cfg, o.seed, 1);
    backend.attach(&profiler);
    profiler.signpost("eager");
    eager.forward(frame);
    profiler.signpost("eager_end");
    backend.attach(nullptr);
    log_info("profile: eager frame done");
  }
  profiler.signpost("trace_end");

  report.labels_from_eager = carry_labels_from_eager(profiler, &report.labels_note);
  summarize_rounds(profiler, report);
  summarize_eager(profiler, report);

  ProfileOverhead& cost = report.overhead;
  cost.unprofiled_frame_ms = median(cost.unprofiled_round_ms);
  cost.profiled_frame_ms = median(report.round_frame_ms);
  cost.on_percent = 100 * (cost.profiled_frame_ms - cost.unprofiled_frame_ms) / cost.unprofiled_frame_ms;
  const double ops = static_cast<double>(report.ops_per_frame);
  cost.off_ns_per_op = detached_overhead_ns_per_op();
  cost.off_percent = 100 * cost.off_ns_per_op * 1e-6 * ops / cost.unprofiled_frame_ms;
  cost.recording_ns_per_op = attached_cost_ns_per_op();
  cost.recording_percent = 100 * cost.recording_ns_per_op * 1e-6 * ops / cost.unprofiled_frame_ms;

  if (!o.out_dir.empty()) {
    const std::filesystem::path dir(o.out_dir);
    const nlohmann::json meta = {{"config", report.config},       {"weights", report.weights},
                                 {"precision", report.precision}, {"device", report.device},
                                 {"backend", report.backend},     {"cpu", report.cpu},
                                 {"isa", report.isa},
                                 {"rounds", report.rounds},       {"peak_gflops", report.peak_gflops},
                                 {"peak_gbps", report.peak_gbps}};
    // The list of files is complete before summary.json is written, so it can name itself.
    for (const char* f : {"trace.json", "summary.json", "summary.md", "memory.json"}) {
      report.files.push_back((dir / f).string());
    }
    write_file(dir / "trace.json", chrome_trace_json(profiler, meta));
    write_file(dir / "summary.json", summary_json(report).dump(1) + "\n");
    write_file(dir / "summary.md", summary_markdown(report, o.top_ops));
    write_file(dir / "memory.json", memory_json(report.memory).dump(1) + "\n");
  }
  return report;
}

std::string format_profile_headline(const ProfileReport& r) {
  char buf[512];
  std::string out;
  std::snprintf(buf, sizeof buf, "profile: %s, weights %s, %s, %s\n", r.config.c_str(), r.weights.c_str(),
                r.precision.c_str(), r.device.c_str());
  out += buf;
  std::snprintf(buf, sizeof buf,
                "frame %.2f ms (image %.2f, bev %.2f; mean of %d replayed rounds); stages sum to %.2f ms (%.1f%%)\n",
                r.frame_ms, r.image_ms, r.bev_ms, r.rounds, r.stage_sum_ms,
                r.frame_ms > 0 ? 100 * r.stage_sum_ms / r.frame_ms : 0.0);
  out += buf;
  const double gflops = r.stage_sum_ms > 0 ? r.gflop_per_frame / (r.stage_sum_ms * 1e-3) : 0;
  std::snprintf(buf, sizeof buf, "%.2f GFLOP per frame at %.1f GFLOP/s = %.0f%% of the measured %.0f GFLOP/s\n",
                r.gflop_per_frame, gflops, r.peak_gflops > 0 ? 100 * gflops / r.peak_gflops : 0.0, r.peak_gflops);
  out += buf;
  std::vector<const ProfileStage*> top;
  for (const ProfileStage& s : r.stages) top.push_back(&s);
  std::stable_sort(top.begin(), top.end(), [](const ProfileStage* a, const ProfileStage* b) { return a->ms > b->ms; });
  out += "heaviest stages:";
  for (size_t i = 0; i < top.size() && i < 5; ++i) {
    std::snprintf(buf, sizeof buf, "%s %s %.1f%%", i ? "," : "", top[i]->name.c_str(), top[i]->percent_of_frame);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "\nprofiler cost: off %.5f%% of the frame; on: recording %.4f%%, measured %+.2f%% (rounds' noise "
                "included)\n",
                r.overhead.off_percent, r.overhead.recording_percent, r.overhead.on_percent);
  out += buf;
  for (const std::string& f : r.files) out += "wrote " + f + "\n";
  return out;
}

}  // namespace bev
