// bevformer bench [--config C] [--precision P] [--frames N] [--warmup W] [--eager] [--pipeline]
// [--streams S --batch N] [--json]: a
// full-size model on a synthetic six-camera drive, as a user's stream runs it: median and p90
// frame latency, throughput, the parts of a frame, a per-stage breakdown from the profiler, the
// FLOP floor at this machine's measured peak, and the peak resident set.
#include <cstdio>
#include <memory>
#include <string>

#include "bevformer/bench.h"
#include "commands.h"
#include "core/log.h"

namespace bev::cli {

Runner add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto json = std::make_shared<bool>(false);
  auto no_stages = std::make_shared<bool>(false);
  auto no_peak = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "bench", "Time full-size frames on a synthetic drive: median/p90 latency, fps, stages, FLOP floor, peak RSS");
  sub->add_option("--config", o->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--weights", o->weights, "Checkpoint (default: seeded random weights of the config)");
  add_engine_options(sub, *o);
  sub->add_option("--frames", o->frames, "Timed frames")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--warmup", o->warmup, "Untimed frames first (>= 2: plans recorded, history in use)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  sub->add_option("--seed", o->seed, "Seed of the random weights and the synthetic frames")->capture_default_str();
  sub->add_flag("--eager", o->eager, "Run every frame eagerly instead of replaying the recorded stages");
  sub->add_flag("--pipeline", o->pipeline,
                "Run frame k+1's image stage on a second thread while frame k's bev stage runs (throughput)");
  sub->add_option("--streams", o->streams, "Synthetic vehicles driving at once (own rig, pose and images each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--batch", o->batch, "Vehicles' frames per batch (at most --streams)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_flag("--no-stages", *no_stages, "Skip the profiled frame (no per-stage breakdown, no FLOP count)");
  sub->add_flag("--no-peak", *no_peak, "Skip measuring the machine's matmul peak (no floor)");
  sub->add_flag("--json", *json, "Print one JSON object on stdout (progress stays on stderr)");
  return [o, json, no_stages, no_peak]() {
    o->stages = !*no_stages;
    o->measure_peak = !*no_peak;
    const BenchReport r = run_bench(*o);
    std::fputs((*json ? bench_json(r) : format_bench(r)).c_str(), stdout);
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bev::cli
