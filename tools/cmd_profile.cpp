// bevformer profile [--config C] [--weights W] [--frames N] [--rounds R] [--eager] [--input FRAME]
// [--json FILE] [--graph-report DIR] [--max-rss-gb G] -o DIR: warm-up frames until the history
// is in use, then R timed replays of each recorded stage (and, with --eager, one eager frame with
// the stage signposts); writes DIR/trace.json (Chrome trace, opens in Perfetto), summary.json,
// summary.md and memory.json, optionally the run's metadata and a graph report per variant, and
// prints the headline.
#include <cstdio>
#include <memory>
#include <string>

#include "bevformer/profile.h"
#include "commands.h"

namespace bev::cli {

Runner add_profile(CLI::App& app) {
  auto o = std::make_shared<ProfileOptions>();
  CLI::App* sub = app.add_subcommand(
      "profile", "Profile a model's stages op by op: Chrome trace, JSON and Markdown summaries, memory report");
  sub->add_option("--config", o->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--weights", o->weights, "Checkpoint (default: seeded random weights of the config)");
  sub->add_option("--frames", o->frames, "Warm-up frames through forward() (>= 2: the history is then in use)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  sub->add_option("--rounds", o->rounds, "Timed replays of each stage")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_flag("--eager", o->eager, "Also profile one eager frame (with history), with the stage signposts");
  add_engine_options(sub, *o);
  sub->add_option("--seed", o->seed, "Seed of the random weights and the synthetic frames")->capture_default_str();
  sub->add_option("--top", o->top_ops, "Ops listed in summary.md")->capture_default_str()->check(CLI::Range(0, 100000));
  sub->add_option("-o,--output", o->out_dir, "Output directory (created)")->required();
  sub->add_option("--input", o->input,
                  "A frame JSON run as every warm-up frame (e.g. from convert-pandaset or convert-info); default: "
                  "synthetic frames");
  sub->add_option("--json", o->json_path,
                  "Write the run's metadata: device, knobs, load seconds, input, detections, signposts, each "
                  "recorded stage's description");
  sub->add_option("--graph-report", o->graph_report,
                  "Write DIR/image and DIR/bev: each recorded stage's op graph, arena buffers with offsets and "
                  "lives, weights (graph.json) and an HTML page with the arena's occupancy");
  sub->add_option("--max-rss-gb", o->max_rss_gb,
                  "Stop with an error before the resident set passes this many GB (0: 3/4 of this machine's memory)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  return [o]() {
    const ProfileReport r = run_profile(*o);
    std::fputs(format_profile_headline(r).c_str(), stdout);
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bev::cli
