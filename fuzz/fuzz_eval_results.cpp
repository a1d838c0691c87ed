// libFuzzer target: the evaluation's readers of user files — results_nusc.json (read from parser
// events into boxes, with the devkit's checks) and nuseval-gt-1 — and, when both halves of an
// input parse, the evaluation itself. A results file that reads must come back equal from the
// text merge-results writes.
#include <cstdint>
#include <string>
#include <string_view>

#include "bevformer/error.h"
#include "eval/metrics.h"
#include "eval/results_merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // "results JSON \x1e GT JSON": either half alone is fuzzed too.
  const size_t split = text.find('\x1e');
  bev::eval::Results results;
  bool have_results = false;
  try {
    results = bev::eval::parse_results(text.substr(0, split), "fuzz results", 500);
    have_results = true;
    const bev::eval::Results again = bev::eval::parse_results(bev::eval::results_text(results), "rewritten", 500);
    if (again.samples.size() != results.samples.size() || again.num_boxes() != results.num_boxes()) __builtin_trap();
  } catch (const bev::Error&) {
  }
  if (split == std::string_view::npos) return 0;
  try {
    const bev::eval::GroundTruth gt = bev::eval::ground_truth_from_json(
        bev::eval::parse_python_json(text.substr(split + 1), "fuzz gt"), "fuzz gt");
    if (have_results) (void)bev::eval::evaluate(gt, results, bev::eval::detection_cvpr_2019());
  } catch (const bev::Error&) {
  }
  return 0;
}
