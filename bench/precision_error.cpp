// precision_error: how far bf16 and int8 frames are from f32 frames on a full-size drive (issue 26).
//
//   precision_error [--config tiny] [--weights W] [--frames 4] [--calibration FILE | --calibrate-frames N]
//                   [--top 100]
//
// One model per precision (f32, bf16, and int8 when a calibration is given or measured here on
// N frames of another drive than the one compared) runs the same
// synthetic drive with history; per stage (the golden sets' tap names) the relative L2 and max
// abs error against f32's tap of the same frame, as the median and worst over frames; and the
// share of f32's top `top` detections (by (query, label)) that each precision's top `top` keeps,
// with the largest centre shift among the kept ones. Seeded random weights rank their boxes by
// near-equal scores, so the kept share is a pessimistic measure of a trained model's.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/conv2d_int8.h"
#include "backend/cpu/onednn.h"
#include "bevformer/error.h"
#include "core/compare.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "runtime/calibrate.h"
#include "runtime/engine.h"

namespace {

using namespace bev;

struct Run {
  std::string precision;
  std::unique_ptr<Engine> engine;
  std::map<std::string, std::vector<TensorDiff>> stages;  // per frame
  std::vector<double> kept, shift;                         // per frame
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bf16 and int8 frames against f32 frames, stage by stage, on a full-size synthetic drive"};
  std::string config = "tiny", weights, calibration;
  int frames = 4, top = 100, threads = 0, calibrate_frames = 0;
  uint64_t seed = 2026;
  app.add_option("--config", config, "tiny | small | base | config JSON")->capture_default_str();
  app.add_option("--weights", weights, "Checkpoint (default: seeded random weights)");
  app.add_option("--calibration", calibration, "int8's calibration file");
  app.add_option("--calibrate-frames", calibrate_frames,
                 "Without --calibration: calibrate int8 here on this many frames of another drive (seed + 1)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--frames", frames, "Frames of the synthetic drive")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--top", top, "Top detections compared")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads, "CPU threads (0: all)")->capture_default_str();
  app.add_option("--seed", seed, "Seed of the weights and the drive")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const ModelConfig cfg = load_config(config);
    const Checkpoint ck = weights.empty() ? random_checkpoint(cfg, seed) : load_checkpoint(weights);
    const bool int8 = !calibration.empty() || calibrate_frames > 0;
    if (int8 && !cpu::has_int8_dot()) {
      std::printf("int8 skipped: this CPU has no exact int8 dot product (oneDNN ISA %s)\n", cpu::isa_name().c_str());
      calibration.clear();
      calibrate_frames = 0;
    }
    std::shared_ptr<const Calibration> measured;
    if (calibration.empty() && calibrate_frames > 0) {
      EngineOptions o;
      o.backend_options.threads = threads;
      measured = std::make_shared<const Calibration>(measure_calibration(cfg, ck, o, [&](Engine& e, int64_t k) {
        if (k >= calibrate_frames) return false;
        e.runner().forward(synthetic_frame(cfg, seed + 1, static_cast<int>(k)));
        return true;
      }));
    }
    std::vector<Run> runs;
    for (const char* p : {"f32", "bf16", "int8"}) {
      if (std::string(p) == "int8" && calibration.empty() && !measured) continue;
      EngineOptions o;
      o.backend_options = {threads, parse_precision(p, "precision_error"), 0};
      if (std::string(p) == "int8") {
        o.calibration = calibration.empty() ? "measured here" : calibration;
        o.calibration_data = measured;
      }
      runs.push_back({p, Engine::create(cfg, ck, o), {}, {}, {}});
    }
    for (int k = 0; k < frames; ++k) {
      const FrameInput frame = synthetic_frame(cfg, seed, k);
      Taps want;
      const FrameOutput ref = runs[0].engine->runner().forward(frame, {.taps = &want});
      std::map<std::pair<int64_t, int>, const Detection*> ref_top;
      for (size_t i = 0; i < ref.detections.size() && static_cast<int>(i) < top; ++i) {
        ref_top[{ref.detections[i].query, ref.detections[i].label}] = &ref.detections[i];
      }
      for (size_t r = 1; r < runs.size(); ++r) {
        Taps got;
        const FrameOutput out = runs[r].engine->runner().forward(frame, {.taps = &got});
        for (const auto& [name, t] : want.all()) {
          const Tensor* g = got.find(name);
          if (g == nullptr || !dtype_is_float(t.dtype()) || g->shape() != t.shape()) continue;
          runs[r].stages[name].push_back(compare(*g, t));
        }
        int kept = 0;
        double shift = 0;
        for (size_t i = 0; i < out.detections.size() && static_cast<int>(i) < top; ++i) {
          const Detection& d = out.detections[i];
          const auto it = ref_top.find({d.query, d.label});
          if (it == ref_top.end()) continue;
          ++kept;
          shift = std::max<double>(shift, std::hypot(d.box[0] - it->second->box[0], d.box[1] - it->second->box[1]));
        }
        runs[r].kept.push_back(ref_top.empty() ? 1.0 : static_cast<double>(kept) / static_cast<double>(ref_top.size()));
        runs[r].shift.push_back(shift);
      }
      std::fprintf(stderr, "frame %d of %d done\n", k + 1, frames);
    }
    std::printf("%s (%s), %d frame(s) of the synthetic drive, against f32\n", cfg.name.c_str(),
                weights.empty() ? ("random weights, seed " + std::to_string(seed)).c_str() : weights.c_str(), frames);
    for (size_t r = 1; r < runs.size(); ++r) {
      std::printf("\n%s: stage, relative L2 median / worst, max abs worst\n", runs[r].precision.c_str());
      for (const auto& [name, diffs] : runs[r].stages) {
        std::vector<double> rel;
        double worst_rel = 0, worst_abs = 0;
        for (const TensorDiff& d : diffs) {
          rel.push_back(d.relative_l2);
          worst_rel = std::max(worst_rel, d.relative_l2);
          worst_abs = std::max(worst_abs, d.max_abs);
        }
        std::printf("  %-24s %9.2e / %9.2e   %9.2e\n", name.c_str(), median(rel), worst_rel, worst_abs);
      }
      std::printf("  top %d detections of f32 kept: median %.1f%%, worst %.1f%%; centre shift of kept, worst %.3g m\n",
                  top, 100 * median(runs[r].kept), 100 * *std::min_element(runs[r].kept.begin(), runs[r].kept.end()),
                  *std::max_element(runs[r].shift.begin(), runs[r].shift.end()));
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "precision_error: %s\n", e.what());
    return e.kind() == ErrorKind::kInvalidInput || e.kind() == ErrorKind::kNotFound ? 2 : 3;
  }
}
