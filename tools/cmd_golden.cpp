// bevformer golden DIR [--dump OUT] [--tolerance T] [--threads N] [--frames K] [--eager] [--precision P]: runs a golden set's
// frames in order through one model and compares every stage and the detections with the set.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bevformer/golden.h"
#include "commands.h"

namespace bev::cli {
namespace {

struct GoldenArgs {
  std::string dir;
  GoldenOptions options;
};

// CLI11's NonNegativeNumber prints the range up to DBL_MAX in full; these say what they want.
CLI::Validator at_least(double lowest, const std::string& what, const std::string& tag) {
  return CLI::Validator(
      [lowest, what](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lowest) {
          return "'" + text + "' is not " + what;
        }
        return {};
      },
      tag);
}

}  // namespace

Runner add_golden(CLI::App& app) {
  auto a = std::make_shared<GoldenArgs>();
  CLI::App* sub = app.add_subcommand(
      "golden", "Run a golden set's frames in order and compare every stage and the detections with it");
  sub->add_option("dir", a->dir, "Golden set directory (config.json, checkpoint.pth, frame<k>.safetensors, ...)")
      ->required();
  sub->add_option("--dump", a->options.dump_dir,
                  "Write every tapped tensor and the detections as OUT/frame<k>.safetensors (golden names)");
  sub->add_option("--tolerance", a->options.tolerance, "Largest relative L2 error a float tensor may have")
      ->capture_default_str()
      ->check(at_least(0, "a number >= 0", "NONNEGATIVE"));
  sub->add_flag("--eager", a->options.eager,
               "Run every frame eagerly (default: record each stage once, then replay the plan)");
  add_engine_options(sub, a->options);
  sub->get_option("--precision")
      ->description("f32 | bf16 | int8: shows its error per stage (int8 without --calibration calibrates on the set's own frames)");
  sub->add_option("--frames", a->options.max_frames, "Run only the first K frames (default: all)")
      ->check(at_least(1, "an integer >= 1", "POSITIVE"));
  return [a]() {
    const GoldenReport r = run_golden(a->dir, a->options);
    std::fputs(format_golden_report(r).c_str(), stdout);
    std::fflush(stdout);
    return r.ok ? 0 : 1;
  };
}

}  // namespace bev::cli
