#include "bevformer/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "profile/profiler.h"
#include "runtime/engine.h"

namespace bev {
namespace {

// The q-quantile with linear interpolation between order statistics (numpy's default, as the
// PyTorch reference's timing script reports it, so the two are comparable).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Per-stage op time of the profiled frame, in the order the stages first ran.
std::vector<BenchStage> stages_of(const Profiler& p, const std::vector<SignpostRange>& image,
                                  const std::vector<SignpostRange>& bev) {
  std::vector<BenchStage> out;
  auto add = [&](const std::vector<SignpostRange>& ranges, const char* group) {
    for (const SignpostRange& r : ranges) {
      for (size_t i : p.ops_in(r)) {
        const OpRecord& op = p.ops()[i];
        const std::string& name = p.text(op.stage);
        auto it = std::find_if(out.begin(), out.end(), [&](const BenchStage& s) { return s.name == name; });
        if (it == out.end()) {
          out.push_back({name, group});
          it = out.end() - 1;
        }
        it->ms += static_cast<double>(op.duration_ns) * 1e-6;
        it->gflop += op.flops * 1e-9;
      }
    }
  };
  add(image, "image");
  add(bev, "bev");
  double total = 0;
  for (const BenchStage& s : out) total += s.ms;
  for (BenchStage& s : out) {
    s.percent = total > 0 ? 100 * s.ms / total : 0;
    s.gflops = s.ms > 0 ? s.gflop / (s.ms * 1e-3) : 0;
  }
  return out;
}

// The drive through the model's two stages on two threads: a producer makes frame k and runs
// its image stage while this thread runs the bev stage of frame k-1 (the model's two lanes
// bound how far ahead it gets). `finished(k, output, start)` sees the frames in order.
void run_pipelined(StageRunner& model, const ModelConfig& cfg, uint64_t seed, int total,
                   const std::function<void(int, const FrameOutput&, std::chrono::steady_clock::time_point)>& finished) {
  if (model.lanes() != 2 || total < 3) {
    throw Error(ErrorKind::kInternal, "bench: pipelining needs a two-lane runner and at least 3 frames");
  }
  // The first three frames in a fixed order, so that both lanes have recorded their plans before
  // anything is timed (which lane a frame takes later depends on timing): frames 0 and 1 are
  // staged together (lanes 0 and 1), then run; frame 2 is lane 0's first frame with history.
  {
    FrameInput f0 = synthetic_frame(cfg, seed, 0), f1 = synthetic_frame(cfg, seed, 1);
    StagedFrame s0 = model.run_image(f0);
    StagedFrame s1 = model.run_image(f1);
    const auto start0 = s0.started(), start1 = s1.started();
    finished(0, model.run_bev(f0, std::move(s0)), start0);
    finished(1, model.run_bev(f1, std::move(s1)), start1);
    const FrameInput f2 = synthetic_frame(cfg, seed, 2);
    StagedFrame s2 = model.run_image(f2);
    const auto start2 = s2.started();
    finished(2, model.run_bev(f2, std::move(s2)), start2);
  }
  constexpr int kFirst = 3;
  struct Staged {
    FrameInput frame;
    StagedFrame staged;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Staged> ready;
  bool stop = false, producer_done = false;
  std::exception_ptr producer_error;
  std::thread producer([&] {
    try {
      for (int k = kFirst; k < total; ++k) {
        {
          const std::lock_guard<std::mutex> lock(mu);
          if (stop) break;
        }
        FrameInput frame = synthetic_frame(cfg, seed, k);
        StagedFrame staged = model.run_image(frame);
        {
          const std::lock_guard<std::mutex> lock(mu);
          if (stop) break;  // the consumer failed: `staged` gives its lane back here
          ready.push_back({std::move(frame), std::move(staged)});
        }
        cv.notify_all();
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mu);
      producer_error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mu);
    producer_done = true;
    cv.notify_all();
  });
  // On any exit: stop the producer and give back the lanes of staged frames it waits for.
  struct Join {
    std::mutex& mu;
    std::deque<Staged>& ready;
    bool& stop;
    std::thread& producer;
    ~Join() {
      {
        const std::lock_guard<std::mutex> lock(mu);
        stop = true;
        ready.clear();
      }
      producer.join();
    }
  } join{mu, ready, stop, producer};

  for (int k = kFirst; k < total; ++k) {
    Staged s;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !ready.empty() || producer_done; });
      if (ready.empty()) {
        if (producer_error) std::rethrow_exception(producer_error);
        throw Error(ErrorKind::kInternal, "bench: the image stage thread stopped early");
      }
      s = std::move(ready.front());
      ready.pop_front();
    }
    const auto start = s.staged.started();
    const FrameOutput out = model.run_bev(s.frame, std::move(s.staged));
    finished(k, out, start);
  }
}

// Vehicle v of a synthetic fleet: its own images and pose (seed + v) and, past the first, its
// own rig (every camera's focal length 2% longer per vehicle, as after another calibration).
FrameInput vehicle_frame(const ModelConfig& cfg, uint64_t seed, int vehicle, int k) {
  FrameInput f = synthetic_frame(cfg, seed + static_cast<uint64_t>(vehicle), k);
  const double scale = 1.0 + 0.02 * vehicle;
  for (auto& m : f.lidar2img) {
    for (size_t c = 0; c < 8; ++c) m[c] *= scale;
  }
  return f;
}

// A fleet's drive: each step runs every vehicle's next frame, `batch` vehicles per batch.
// `finished(step, output, batch wall time, batch size)` sees every frame.
void run_fleet(StageRunner& model, const ModelConfig& cfg, uint64_t seed, int streams, int batch, int steps,
               std::vector<StreamHistory>& histories,
               const std::function<void(int, const FrameOutput&, double, int)>& finished) {
  for (int k = 0; k < steps; ++k) {
    for (int first = 0; first < streams; first += batch) {
      const int n = std::min(batch, streams - first);
      // Made outside the timing: a user's frames arrive prepared by then.
      std::vector<FrameInput> frames;
      for (int v = first; v < first + n; ++v) frames.push_back(vehicle_frame(cfg, seed, v, k));
      std::vector<BatchSample> samples;
      for (int i = 0; i < n; ++i) samples.push_back({&frames[static_cast<size_t>(i)], &histories[static_cast<size_t>(first + i)]});
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<SampleOutput> out = model.forward_batch(samples);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (const SampleOutput& s : out) {
        if (s.error) std::rethrow_exception(s.error);
        finished(k, s.output, ms, n);
      }
    }
  }
}

}  // namespace

BenchReport run_bench(const BenchOptions& o) {
  if (o.streams < 1 || o.batch < 1 || o.batch > o.streams) {
    throw Error(ErrorKind::kInvalidInput, "--streams " + std::to_string(o.streams) + " --batch " + std::to_string(o.batch))
        .expected("1 <= batch <= streams (a batch holds frames of distinct vehicles)");
  }
  if (o.streams > 1 && o.pipeline) {
    throw Error(ErrorKind::kInvalidInput, "--pipeline with --streams " + std::to_string(o.streams))
        .expected("one of them: pipelining is the single-stream drive's");
  }

  if (o.frames < 1) throw Error(ErrorKind::kInvalidInput, "--frames " + std::to_string(o.frames)).expected("at least 1");
  if (o.warmup < 2) {
    throw Error(ErrorKind::kInvalidInput, "--warmup " + std::to_string(o.warmup))
        .expected("at least 2 (the first frame records the plans, the second is the first with history)");
  }
  if (o.pipeline && o.warmup < 3) {
    throw Error(ErrorKind::kInvalidInput, "--warmup " + std::to_string(o.warmup) + " with --pipeline")
        .expected("at least 3 (the second lane records its plans on frames 1 and 2)");
  }
  parse_precision(o.precision, "bench options");  // before the config is read
  const ModelConfig cfg = load_config(o.config);
  EngineOptions engine_options = bev::engine_options(o, "bench options");
  engine_options.replay = !o.eager;
  engine_options.pipelined = o.pipeline;
  engine_options.profiling = true;  // detached while timing: one pointer test per op
  engine_options.adaptive_batching = false;  // bench measures the batch size it is asked for
  require_backend(engine_options.backend, engine_options.backend_options);

  BenchReport r;
  r.config = cfg.name;
  r.precision = o.precision;
  r.frames = o.frames;
  r.warmup = o.warmup;
  r.mode = std::string(o.eager ? "eager" : "replay") + (o.pipeline ? ", pipelined" : "");
  const bool fleet = o.streams > 1;
  r.streams = o.streams;
  r.batch = o.batch;
  if (fleet) r.frames = o.frames * o.streams;
  r.weights = o.weights.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.weights;

  std::unique_ptr<Engine> engine;
  {
    // The checkpoint lives only while the model is built from it, as in a serving process.
    // Progress from the start: loading and the first warm-up frame (which records the stages)
    // take seconds to minutes on their own, and a silent start looks hung.
    log_info("bench: ", o.weights.empty() ? "making seeded random weights of " + cfg.name : "loading " + o.weights,
             ", then ", o.warmup, " warm-up and ", o.frames, " timed frames");
    const auto t_load = std::chrono::steady_clock::now();
    const Checkpoint ck = o.weights.empty() ? random_checkpoint(cfg, o.seed) : load_checkpoint(o.weights);
    size_t bytes = 0;
    for (const auto& [name, t] : ck.tensors()) bytes += t.nbytes();
    r.weight_mb = static_cast<double>(bytes) / (1 << 20);
    engine = Engine::create(cfg, ck, engine_options);
    log_info("bench: model ready in ",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count(),
             " s; warm-up frame 1 of ", o.warmup, " records the stages");
  }
  StageRunner* model = &engine->runner();
  ProfilingBackend& backend = *engine->profiling();
  const BackendInfo info = engine->backend_info();
  r.threads = info.threads;
  r.backend = info.backend;
  r.cpu = info.device;
  r.isa = info.isa;
  r.device = info.summary();

  std::vector<double> geometry, image, bev, decode;
  const int total = o.warmup + o.frames;
  std::chrono::steady_clock::duration timed{};
  std::chrono::steady_clock::time_point first_timed_start, last_timed_end;
  // One finished frame: its wall time (pipelined: from its image stage's start to its bev
  // stage's end) and parts.
  const auto finished = [&](int k, const FrameOutput& out, std::chrono::steady_clock::time_point start) {
    const auto end = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(end - start).count();
    if (k > 0 && !out.used_history) {
      throw Error(ErrorKind::kInternal, "bench frame " + std::to_string(k) + " did not use the history");
    }
    if (k == 0) r.first_frame_ms = ms;
    if (k < o.warmup) {
      log_info("bench: warm-up frame ", k + 1, " of ", o.warmup, ": ", ms, " ms");
      return;
    }
    if (k == o.warmup) first_timed_start = start;
    last_timed_end = end;
    timed += end - start;
    r.frame_ms.push_back(ms);
    geometry.push_back(out.geometry_seconds * 1e3);
    image.push_back(out.image_seconds * 1e3);
    bev.push_back(out.bev_seconds * 1e3);
    decode.push_back(out.decode_seconds * 1e3);
    log_info("bench: frame ", k - o.warmup + 1, " of ", o.frames, ": ", ms, " ms");
  };
  // A fleet's frame: its latency is its batch's wall time, its parts its share of the batch's.
  double fleet_ms = 0;
  size_t fleet_frames = 0;
  const auto fleet_finished = [&](int k, const FrameOutput& out, double batch_ms, int n) {
    if (k > 0 && !out.used_history) {
      throw Error(ErrorKind::kInternal, "bench step " + std::to_string(k) + " did not use the history");
    }
    if (k == 0 && r.first_frame_ms == 0) r.first_frame_ms = batch_ms;
    if (++fleet_frames % static_cast<size_t>(o.streams) == 0) {
      log_info("bench: step ", k + 1, " of ", total, k < o.warmup ? " (warm-up)" : "", ": ", o.streams, " vehicles, last batch ",
               batch_ms, " ms");
    }
    if (k < o.warmup) return;
    r.frame_ms.push_back(batch_ms);
    fleet_ms += batch_ms / n;
    geometry.push_back(out.geometry_seconds * 1e3);
    image.push_back(out.image_seconds * 1e3 / n);
    bev.push_back(out.bev_seconds * 1e3 / n);
    decode.push_back(out.decode_seconds * 1e3);
  };
  std::vector<StreamHistory> histories(static_cast<size_t>(o.streams));
  if (o.pipeline) {
    run_pipelined(*model, cfg, o.seed, total, finished);
  } else if (fleet) {
    run_fleet(*model, cfg, o.seed, o.streams, o.batch, total, histories, fleet_finished);
  } else {
    for (int k = 0; k < total; ++k) {
      // The frame is made outside the timing: a user's frame arrives prepared by then.
      const FrameInput frame = synthetic_frame(cfg, o.seed, k);
      const auto t0 = std::chrono::steady_clock::now();
      finished(k, model->forward(frame), t0);
    }
  }
  r.median_ms = quantile(r.frame_ms, 0.5);
  r.p90_ms = quantile(r.frame_ms, 0.9);
  r.min_ms = *std::min_element(r.frame_ms.begin(), r.frame_ms.end());
  r.max_ms = *std::max_element(r.frame_ms.begin(), r.frame_ms.end());
  double sum = 0;
  for (double v : r.frame_ms) sum += v;
  r.mean_ms = sum / static_cast<double>(r.frame_ms.size());
  // Pipelined frames overlap: throughput is over the timed span, not the sum of latencies; a
  // batch's frames share its wall time.
  r.fps = fleet ? static_cast<double>(r.frames) / (fleet_ms * 1e-3)
                : static_cast<double>(o.frames) /
                      std::chrono::duration<double>(o.pipeline ? last_timed_end - first_timed_start : timed).count();
  r.geometry_ms = quantile(geometry, 0.5);
  r.image_ms = quantile(image, 0.5);
  r.bev_ms = quantile(bev, 0.5);
  r.decode_ms = quantile(decode, 0.5);
  r.peak_rss_mb = static_cast<double>(peak_resident_bytes()) / (1 << 20);
  if (fleet && o.batch > 1) {
    const std::string tag = "(batch " + std::to_string(o.batch) + ")";
    size_t bytes = 0;
    for (const StageRunner::StageInfo& st : model->stage_info()) {
      if (st.name.find(tag) != std::string::npos) bytes += st.arena_bytes;
    }
    r.slot_mb = static_cast<double>(bytes) / o.batch / (1 << 20);
  }

  if (o.stages) {
    // One more frame of the same drive with every op timed. Replayed: the two recorded stages on
    // that frame's inputs; eager: the whole forward, whose ops carry their stage names too.
    Profiler profiler;
    profiler.reserve(8192);
    const FrameInput frame = synthetic_frame(cfg, o.seed, total);
    if (fleet) {
      // One more batch of the fleet (its first `batch` vehicles), every op timed; per frame.
      std::vector<FrameInput> frames;
      std::vector<BatchSample> samples;
      for (int v = 0; v < o.batch; ++v) frames.push_back(vehicle_frame(cfg, o.seed, v, total));
      for (int v = 0; v < o.batch; ++v) samples.push_back({&frames[static_cast<size_t>(v)], &histories[static_cast<size_t>(v)]});
      backend.attach(&profiler);
      profiler.signpost("frame");
      const std::vector<SampleOutput> out = model->forward_batch(samples);
      profiler.signpost("frame_end");
      backend.attach(nullptr);
      for (const SampleOutput& x : out) {
        if (x.error) std::rethrow_exception(x.error);
      }
      r.stages = stages_of(profiler, profiler.ranges("frame"), {});
      for (BenchStage& st : r.stages) {
        st.group = st.name.rfind("img", 0) == 0 ? "image" : "bev";
        st.ms /= o.batch;
        st.gflop /= o.batch;
      }
    } else if (o.eager) {
      backend.attach(&profiler);
      profiler.signpost("frame");
      model->forward(frame);
      profiler.signpost("frame_end");
      backend.attach(nullptr);
      r.stages = stages_of(profiler, profiler.ranges("frame"), {});
      for (BenchStage& s : r.stages) s.group = s.name.rfind("img", 0) == 0 ? "image" : "bev";
    } else {
      model->forward(frame);  // puts the frame's inputs into the recorded stages
      backend.attach(&profiler);
      profiler.signpost("image");
      const bool image_ok = model->replay_image_stage();
      profiler.signpost("image_end");
      profiler.signpost("bev");
      const bool bev_ok = model->replay_bev_stage(/*with_history=*/true);
      profiler.signpost("bev_end");
      backend.attach(nullptr);
      if (!image_ok || !bev_ok) throw Error(ErrorKind::kInternal, "bench: the stages are not recorded");
      r.stages = stages_of(profiler, profiler.ranges("image"), profiler.ranges("bev"));
    }
    for (const BenchStage& s : r.stages) {
      r.stage_sum_ms += s.ms;
      r.gflop_per_frame += s.gflop;
    }
    r.achieved_gflops = r.gflop_per_frame / (r.median_ms * 1e-3);
    double backbone_gflop = 0;
    for (const BenchStage& s : r.stages) {
      if (s.name == "img.stem" || s.name.rfind("img.layer", 0) == 0) {
        r.backbone_ms += s.ms;
        backbone_gflop += s.gflop;
      }
    }
    r.backbone_gflops = r.backbone_ms > 0 ? backbone_gflop / (r.backbone_ms * 1e-3) : 0;
  }
  if (o.measure_peak) {
    log_info("bench: measuring this machine's ", o.precision, " matmul peak");
    r.peak_gflops = backend.measure_peak_gflops();
    if (r.gflop_per_frame > 0) {
      r.floor_ms = r.gflop_per_frame / r.peak_gflops * 1e3;
      r.percent_of_floor = 100 * r.floor_ms / r.median_ms;
    }
    for (BenchStage& s : r.stages) s.percent_of_peak = 100 * s.gflops / r.peak_gflops;
  }
  return r;
}

std::string bench_json(const BenchReport& r) {
  nlohmann::json stages = nlohmann::json::array();
  for (const BenchStage& s : r.stages) {
    stages.push_back({{"name", s.name},
                      {"group", s.group},
                      {"ms", s.ms},
                      {"percent", s.percent},
                      {"gflop", s.gflop},
                      {"gflops", s.gflops},
                      {"percent_of_peak", s.percent_of_peak}});
  }
  const nlohmann::json j = {{"config", r.config},
                            {"weights", r.weights},
                            {"precision", r.precision},
                            {"device", r.device},
                            {"backend", r.backend},
                            {"cpu", r.cpu},
                            {"isa", r.isa},
                            {"threads", r.threads},
                            {"mode", r.mode},
                            {"streams", r.streams},
                            {"batch", r.batch},
                            {"slot_mb", r.slot_mb},
                            {"frames", r.frames},
                            {"warmup", r.warmup},
                            {"first_frame_ms", r.first_frame_ms},
                            {"frame_ms", r.frame_ms},
                            {"median_ms", r.median_ms},
                            {"p90_ms", r.p90_ms},
                            {"mean_ms", r.mean_ms},
                            {"min_ms", r.min_ms},
                            {"max_ms", r.max_ms},
                            {"fps", r.fps},
                            {"parts_ms",
                             {{"geometry", r.geometry_ms}, {"image", r.image_ms}, {"bev", r.bev_ms}, {"decode", r.decode_ms}}},
                            {"stages", stages},
                            {"stage_sum_ms", r.stage_sum_ms},
                            {"gflop_per_frame", r.gflop_per_frame},
                            {"backbone_ms", r.backbone_ms},
                            {"backbone_gflops", r.backbone_gflops},
                            {"achieved_gflops", r.achieved_gflops},
                            {"peak_gflops", r.peak_gflops},
                            {"floor_ms", r.floor_ms},
                            {"percent_of_floor", r.percent_of_floor},
                            {"peak_rss_mb", r.peak_rss_mb},
                            {"weight_mb", r.weight_mb}};
  return j.dump(1) + "\n";
}

std::string format_bench(const BenchReport& r) {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "bench: %s, weights %s, %s, %s, %s\n", r.config.c_str(), r.weights.c_str(),
                r.precision.c_str(), r.mode.c_str(), r.device.c_str());
  out += buf;
  if (r.streams > 1) {
    std::snprintf(buf, sizeof buf, "fleet: %d vehicles, %d per batch (a frame's latency is its batch's wall time; parts and stages per frame)\n",
                  r.streams, r.batch);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "frame: median %.1f ms, p90 %.1f ms (min %.1f, max %.1f) over %d frames after %d warm-up; %.2f frames/s\n",
                r.median_ms, r.p90_ms, r.min_ms, r.max_ms, r.frames, r.warmup, r.fps);
  out += buf;
  std::snprintf(buf, sizeof buf, "parts (medians): geometry %.2f ms, image %.1f ms, bev %.1f ms, decode %.2f ms; first frame %.0f ms (records the plans)\n",
                r.geometry_ms, r.image_ms, r.bev_ms, r.decode_ms, r.first_frame_ms);
  out += buf;
  if (r.gflop_per_frame > 0) {
    std::snprintf(buf, sizeof buf, "%.1f GFLOP per frame, %.0f GFLOP/s achieved", r.gflop_per_frame, r.achieved_gflops);
    out += buf;
    if (r.peak_gflops > 0) {
      std::snprintf(buf, sizeof buf, "; measured peak %.0f GFLOP/s, floor %.0f ms = %.0f%% of the median frame",
                    r.peak_gflops, r.floor_ms, r.percent_of_floor);
      out += buf;
      // int8's peak is the u8 x s8 rate: the floor takes every op at it, also the f32 ones.
      if (r.precision == "int8") out += " (the int8 rate for every op: a lower bound)";
    }
    out += "\n";
    std::snprintf(buf, sizeof buf, "backbone (img.stem .. img.layer4): %.1f ms at %.0f GFLOP/s", r.backbone_ms,
                  r.backbone_gflops);
    out += buf;
    if (r.peak_gflops > 0) {
      std::snprintf(buf, sizeof buf, " = %.0f%% of peak", 100 * r.backbone_gflops / r.peak_gflops);
      out += buf;
    }
    out += "\n";
  }
  if (!r.stages.empty()) {
    out += "stages (profiled frame, op time):\n";
    for (const BenchStage& s : r.stages) {
      std::snprintf(buf, sizeof buf, "  %-16s %-5s %9.2f ms %5.1f%% %8.1f GFLOP/s", s.name.c_str(), s.group.c_str(), s.ms,
                    s.percent, s.gflops);
      out += buf;
      if (r.peak_gflops > 0) {
        std::snprintf(buf, sizeof buf, " %4.0f%% of peak", s.percent_of_peak);
        out += buf;
      }
      out += "\n";
    }
  }
  std::snprintf(buf, sizeof buf, "peak RSS %.0f MiB (weights %.0f MiB)", r.peak_rss_mb, r.weight_mb);
  out += buf;
  if (r.slot_mb > 0) {
    std::snprintf(buf, sizeof buf, "; batched stages' arenas %.0f MiB per batch slot", r.slot_mb);
    out += buf;
  }
  out += "\n";
  return out;
}

}  // namespace bev
