// bevformer eval: nuScenes detection metrics (the devkit's detection_cvpr_2019) of results_nusc.json
// files against ground truth from nuseval-gt-1, the nuScenes database or an info file; and
// bevformer merge-results: the results files of a sharded run as one (docs/EVAL.md).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "commands.h"
#include "core/log.h"
#include "eval/info_gt.h"
#include "eval/metrics.h"
#include "eval/nuscenes_db.h"
#include "eval/plots.h"
#include "eval/results_merge.h"

namespace bev::cli {
namespace {

// Where the ground truth comes from: exactly one of --gt, --dataroot/--version[/--split], --gt-info.
struct GtArgs {
  std::string gt;
  std::string dataroot;
  std::string version;
  std::string split;
  std::string info;
  std::string info_attributes = "none";

  void add_to(CLI::App* sub) {
    sub->add_option("--gt", gt, "Ground truth in format nuseval-gt-1 (docs/EVAL.md)");
    sub->add_option("--dataroot", dataroot, "nuScenes root: the folder holding VERSION/ with the v1.0 JSON tables");
    sub->add_option("--version", version, "nuScenes version folder: v1.0-trainval, v1.0-mini, v1.0-test");
    sub->add_option("--split", split,
                    "Split of the database: val, mini_val, train, test, ... or a split of VERSION/splits.json "
                    "(default: val for trainval, mini_val for mini, test for test)");
    sub->add_option("--gt-info", info,
                    "Approximate ground truth from an mmdetection3d info file (JSON): no bike racks, no attributes");
    sub->add_option("--info-attributes", info_attributes,
                    "With --gt-info: none (attributes unknown) or speed (mmdet3d's speed rule)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "speed"}));
  }

  bool given() const { return !gt.empty() || !dataroot.empty() || !version.empty() || !info.empty(); }

  eval::GroundTruth load() const {
    const int sources = (!gt.empty()) + (!dataroot.empty() || !version.empty()) + (!info.empty());
    if (sources != 1) {
      throw Error(ErrorKind::kInvalidInput, sources == 0 ? "no ground truth given" : "more than one ground truth given")
          .expected("exactly one of --gt GT.json, --dataroot DIR --version V [--split S], --gt-info INFO.json");
    }
    if (!gt.empty()) return eval::read_ground_truth(gt);
    if (!info.empty()) {
      return eval::ground_truth_from_info(
          info, info_attributes == "speed" ? eval::InfoAttributes::kFromSpeed : eval::InfoAttributes::kUnknown);
    }
    if (dataroot.empty() || version.empty()) {
      throw Error(ErrorKind::kInvalidInput, "--dataroot and --version go together")
          .expected("--dataroot DIR --version v1.0-trainval|v1.0-mini|v1.0-test [--split S]");
    }
    return eval::load_nuscenes_gt({dataroot, version, split});
  }
};

struct EvalArgs {
  std::vector<std::string> results;
  GtArgs gt;
  std::string export_gt;
  bool json = false;
  std::string output;
  std::string details;
  std::string config;
  std::string plots;
};

struct MergeArgs {
  std::vector<std::string> inputs;
  std::string output;
  GtArgs gt;
};

int run_eval(const EvalArgs& a) {
  if (a.results.empty() && a.export_gt.empty()) {
    throw Error(ErrorKind::kInvalidInput, "nothing to do")
        .expected("--results FILE... to evaluate, and/or --export-gt FILE to write the ground truth");
  }
  check_writable(a.output, "-o");  // before the ground truth loads (minutes on trainval)
  check_writable(a.details, "--details");
  check_writable(a.export_gt, "--export-gt");
  const eval::DetectionConfig cfg = a.config.empty() ? eval::detection_cvpr_2019() : eval::read_detection_config(a.config);
  const eval::GroundTruth gt = a.gt.load();
  size_t num_boxes = 0;
  for (const eval::GtSample& s : gt.samples) num_boxes += s.boxes.size();
  log_info("ground truth: ", gt.samples.size(), " samples, ", num_boxes, " boxes (", gt.source, ")");
  if (!a.export_gt.empty()) {
    eval::write_ground_truth(a.export_gt, gt);
    log_info("wrote ", a.export_gt);
  }
  if (a.results.empty()) return 0;

  const eval::Results results = eval::read_results_files(a.results, cfg.max_boxes_per_sample);
  log_info("results: ", results.samples.size(), " samples, ", results.num_boxes(), " boxes (", results.source, ")");
  const eval::Evaluation e = eval::evaluate(gt, results, cfg);
  log_info("after filtering: ", e.gt_counts.after_bike_racks, " of ", e.gt_counts.total, " GT boxes, ",
           e.pred_counts.after_bike_racks, " of ", e.pred_counts.total, " predictions; ", e.metrics.eval_time, " s");
  const eval::ojson summary = eval::metrics_summary_json(e.metrics, results.meta);
  const std::string text = eval::dump_python(summary);
  if (!a.output.empty()) write_file_atomically(a.output, text + "\n");
  if (!a.details.empty()) write_file_atomically(a.details, eval::metrics_details_json(e).dump() + "\n");
  if (!a.plots.empty()) {
    const std::vector<std::string> files = eval::render_curves(e, a.plots);
    log_info("wrote ", files.size(), " plots to ", a.plots);
  }
  if (a.json) {
    std::printf("%s\n", text.c_str());
  } else {
    std::printf("%s", eval::text_summary(e.metrics).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval", "nuScenes detection metrics (mAP, TP errors, NDS) of results_nusc.json, as the official devkit computes them");
  sub->add_option("--results", a->results,
                  "results_nusc.json (several files, or the flag repeated: the shards of one run, merged; a sample in "
                  "two files is an error)")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  a->gt.add_to(sub);
  sub->add_option("--export-gt", a->export_gt, "Write the ground truth as nuseval-gt-1 (also without --results)");
  sub->add_flag("--json", a->json, "Print metrics_summary.json's object (NaN as null) instead of the text summary");
  sub->add_option("-o,--output", a->output, "Write metrics_summary.json (NaN as null)");
  sub->add_option("--details", a->details, "Write metrics_details.json (every curve, as the devkit writes it)");
  sub->add_option("--config", a->config, "Detection config JSON (default: the built-in detection_cvpr_2019)");
  sub->add_option("--plots", a->plots, "Write PR and TP-error curves as PNG into this folder");
  return [a]() { return run_eval(*a); };
}

Runner add_merge_results(CLI::App& app) {
  auto a = std::make_shared<MergeArgs>();
  CLI::App* sub = app.add_subcommand("merge-results",
                                     "Merge the results_nusc.json files of a sharded run into one (a sample in two "
                                     "files is an error; with a ground truth, so is a missing one)");
  sub->add_option("inputs", a->inputs, "results_nusc.json files, in order")->required();
  sub->add_option("-o,--output", a->output, "The merged results_nusc.json")->required();
  a->gt.add_to(sub);
  return [a]() {
    check_writable(a->output, "-o");
    const eval::Results merged = eval::read_results_files(a->inputs, eval::detection_cvpr_2019().max_boxes_per_sample);
    if (a->gt.given()) eval::check_same_samples(merged, a->gt.load());
    eval::write_results(a->output, merged);
    log_info("wrote ", a->output, ": ", merged.samples.size(), " samples, ", merged.num_boxes(), " boxes");
    return 0;
  };
}

}  // namespace bev::cli
