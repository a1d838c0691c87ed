#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include <unistd.h>

#include "bevformer/error.h"
#include "bevformer/profile.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/frame_json.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "profile/graph_report.h"
#include "profile/profiler.h"
#include "profile/report.h"
#include "runtime/engine.h"

namespace bev {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void create_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create the output directory: " + ec.message()).where(dir);
}

double gb(size_t bytes) { return static_cast<double>(bytes) * 1e-9; }

// The host memory guard: a run that would take the machine down stops with an error instead.
void guard_rss(size_t limit, size_t more, const std::string& when) {
  const size_t rss = resident_bytes();
  if (limit == 0 || rss + more <= limit) return;
  char buf[256];
  std::snprintf(buf, sizeof buf, "the resident set is %.2f GB (+%.2f GB to build) %s, over --max-rss-gb %.2f", gb(rss),
                gb(more), when.c_str(), gb(limit));
  throw Error(ErrorKind::kUnsupported, buf)
      .where("profile")
      .hint("a smaller config, or a larger --max-rss-gb where the machine has the memory");
}

size_t default_rss_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) / 4 * 3 : 0;
}

// The warm-up's frames: the given frame JSON every time (a parked vehicle: no ego motion, the
// history in use from the second frame), or frame k of the synthetic drive.
class WarmupFrames {
 public:
  WarmupFrames(const ModelConfig& cfg, const ProfileOptions& o) : cfg_(cfg), seed_(o.seed) {
    if (o.input.empty()) return;
    const std::filesystem::path path(o.input);
    const Frame spec = read_frame_json(o.input);
    given_ = prepare_frame(spec, cfg, path.has_parent_path() ? path.parent_path().string() : ".").input;
  }
  FrameInput operator()(int k) const { return given_ ? *given_ : synthetic_frame(cfg_, seed_, k); }

 private:
  const ModelConfig& cfg_;
  uint64_t seed_;
  std::optional<FrameInput> given_;
};

void write_graph_reports(const std::string& dir, StageRunner& model, Precision precision, size_t rss_limit,
                         ProfileReport& report) {
  const std::pair<const char*, const RecordedStage*> variants[] = {{"image", model.image_stage()},
                                                                   {"bev", model.bev_stage(/*with_history=*/true)}};
  for (const auto& [variant, stage] : variants) {
    if (stage == nullptr) throw Error(ErrorKind::kInternal, std::string("the ") + variant + " stage is not recorded");
    guard_rss(rss_limit, graph_report_estimated_bytes(*stage), std::string("before the ") + variant + " graph report");
    const std::filesystem::path out = std::filesystem::path(dir) / variant;
    create_directory(out.string());
    const nlohmann::json graph = graph_report_json(*stage, variant, precision);
    write_text_file(out / "graph.json", graph.dump(1) + "\n");
    write_text_file(out / "index.html", graph_report_html(graph));
    report.files.push_back((out / "graph.json").string());
    report.files.push_back((out / "index.html").string());
    guard_rss(rss_limit, 0, std::string("after the ") + variant + " graph report");
  }
}

nlohmann::json run_json(const ProfileOptions& o, const ProfileReport& r, const BackendInfo& info) {
  nlohmann::json stages = nlohmann::json::array();
  for (const ProfilePlanMemory& p : r.memory.plans) {
    stages.push_back({{"name", p.name},
                      {"ops", p.ops},
                      {"buffers", p.buffers},
                      {"arena_bytes", p.arena_bytes},
                      {"no_reuse_bytes", p.no_reuse_bytes},
                      {"description", p.description}});
  }
  return {{"config", r.config},
          {"weights", r.weights},
          {"device",
           {{"backend", info.backend},
            {"device", info.device},
            {"isa", info.isa},
            {"threads", info.threads},
            {"precision", info.precision},
            {"summary", r.device}}},
          {"knobs",
           {{"backend", o.backend},
            {"threads", o.threads},
            {"precision", o.precision},
            {"seed", o.seed},
            {"frames", o.frames},
            {"rounds", o.rounds},
            {"eager", o.eager},
            {"max_rss_bytes", r.max_rss_bytes}}},
          {"load_seconds", r.load_seconds},
          {"input", r.input},
          {"detections", r.detections},
          {"forward_ms", r.forward_ms},
          {"host_waits_per_frame", r.host_waits_per_frame},
          {"frame_ms", r.frame_ms},
          {"signposts", r.signposts},
          {"stages", std::move(stages)},
          {"memory", {{"rss_bytes", r.memory.rss_bytes}, {"peak_rss_bytes", r.memory.peak_rss_bytes}}},
          {"files", r.files}};
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
  parse_precision(o.precision, "profile options");  // a mistyped precision fails before a folder is made
  if (!o.out_dir.empty()) create_directory(o.out_dir);
  if (!o.graph_report.empty()) create_directory(o.graph_report);

  ProfileReport report;
  report.max_rss_bytes = o.max_rss_gb > 0 ? static_cast<size_t>(o.max_rss_gb * 1e9) : default_rss_limit();
  report.input = o.input.empty() ? "synthetic" : o.input;
  const ModelConfig cfg = load_config(o.config);
  // The input is read and checked against the config before the model loads: a wrong frame fails
  // in a second.
  const WarmupFrames warmup(cfg, o);
  report.config = cfg.name;
  report.precision = o.precision;
  report.weights = o.weights.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.weights;
  // The checkpoint lives only while a model is built from it (as in Model::load), so that the
  // memory report is a serving process's.
  auto checkpoint = [&]() {
    if (!o.weights.empty()) log_info("profile: loading ", o.weights);
    return o.weights.empty() ? random_checkpoint(cfg, o.seed) : load_checkpoint(o.weights);
  };

  EngineOptions engine_options = bev::engine_options(o, "profile options");
  engine_options.profiling = true;
  require_backend(engine_options.backend, engine_options.backend_options);
  std::unique_ptr<Engine> engine;
  {
    const auto t_load = std::chrono::steady_clock::now();
    const Checkpoint ck = checkpoint();
    for (const auto& [name, t] : ck.tensors()) report.memory.weight_bytes += t.nbytes();
    engine = Engine::create(cfg, ck, engine_options);
    report.load_seconds = ms_since(t_load) * 1e-3;
  }
  guard_rss(report.max_rss_bytes, 0, "after loading the model");
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
    const FrameInput frame = warmup(k);
    const auto t0 = std::chrono::steady_clock::now();
    const FrameOutput out = model.forward(frame);
    report.forward_ms = ms_since(t0);
    report.host_waits_per_frame = out.host_waits;
    report.detections = out.detections.size();
    log_info("profile: warm-up frame ", k + 1, " of ", o.frames, ": ", report.forward_ms, " ms",
             out.used_history ? " (history in use)" : "");
    if (k > 0 && !out.used_history) {
      throw Error(ErrorKind::kInternal, "warm-up frame " + std::to_string(k) + " did not use the history");
    }
  }
  guard_rss(report.max_rss_bytes, 0, "after the warm-up");

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
  // Round k's window is trace{k} > image{k}, bev{k} (no number in round 1: report.h).
  auto profiled = [&](size_t k) {
    auto signpost = [&](const char* base, bool end) {
      profiler.signpost(round_signpost(base, k) + (end ? "_end" : ""));
    };
    backend.attach(&profiler);
    signpost("trace", false);
    signpost("image", false);
    const bool image = model.replay_image_stage();
    signpost("image", true);
    signpost("bev", false);
    const bool bev = model.replay_bev_stage(/*with_history=*/true);
    signpost("bev", true);
    signpost("trace", true);
    backend.attach(nullptr);
    if (!image || !bev) throw Error(ErrorKind::kInternal, "the image or the bev stage with history is not recorded");
  };
  for (int k = 0; k < o.rounds; ++k) {
    if (k % 2 == 0) {
      unprofiled();
      profiled(static_cast<size_t>(k));
    } else {
      profiled(static_cast<size_t>(k));
      unprofiled();
    }
    log_info("profile: round ", k + 1, " of ", o.rounds);
  }

  for (const StageRunner::StageInfo& p : model.stage_info()) {
    report.memory.plans.push_back({p.name, p.ops, p.buffers, p.arena_bytes, p.no_reuse_bytes, p.description});
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
    // frame with history whose every op runs as it is built, with its stage on it. Each module
    // stage it enters is a signpost (ProfilingBackend::enter_stage), inside eager_image and
    // eager_bev.
    StageRunner eager(engine->model(), backend, /*replay=*/false);
    eager.forward(warmup(0));
    const FrameInput frame = warmup(1);
    backend.attach(&profiler);
    profiler.signpost("eager");
    profiler.signpost("eager_image");
    StagedFrame staged = eager.run_image(frame);
    profiler.signpost("eager_image_end");
    profiler.signpost("eager_bev");
    eager.run_bev(frame, std::move(staged));
    profiler.signpost("eager_bev_end");
    profiler.signpost("eager_end");
    backend.attach(nullptr);
    log_info("profile: eager frame done");
  }
  for (const Signpost& s : profiler.signposts()) report.signposts.push_back(s.name);

  report.labels_from_eager = carry_labels_from_eager(profiler, &report.labels_note);
  summarize_rounds(profiler, report);
  summarize_eager(profiler, report);

  summarize_overhead(report);

  if (!o.out_dir.empty()) write_profile_files(o.out_dir, profiler, report, o.top_ops);
  // Weights that are not int8 are held in the float arithmetic (bf16 for int8 on AMX).
  if (!o.graph_report.empty()) {
    write_graph_reports(o.graph_report, model, backend.float_precision(), report.max_rss_bytes, report);
  }
  if (!o.json_path.empty()) {
    report.files.push_back(o.json_path);
    write_text_file(o.json_path, run_json(o, report, info).dump(1) + "\n");
  }
  return report;
}

std::string profile_summary_json(const ProfileReport& report) { return summary_json(report).dump(); }

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
