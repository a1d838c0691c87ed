#include "bevformer/calibrate.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/frame_json.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "runtime/calibrate.h"
#include "runtime/engine.h"

namespace bev {

CalibrateReport run_calibrate(const CalibrateOptions& o) {
  if (o.output.empty()) throw Error(ErrorKind::kInvalidInput, "no output file").expected("-o FILE");
  if (o.frames.empty() && o.synthetic < 1) {
    throw Error(ErrorKind::kInvalidInput, "--synthetic " + std::to_string(o.synthetic) + " and no frames")
        .expected("frame files, or at least 1 synthetic frame");
  }
  // The output's folder and every frame file before the slow part, so that a typo fails at once.
  {
    const std::string probe = o.output + ".tmp";
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    if (!f) throw Error(ErrorKind::kIo, std::string("cannot write the calibration file: ") + std::strerror(errno)).where(o.output);
    std::fclose(f);
    std::remove(probe.c_str());
  }
  std::vector<Frame> specs;
  for (const std::string& path : o.frames) specs.push_back(read_frame_json(path));
  const ModelConfig cfg = load_config(o.config);
  if (o.precision != "f32" || !o.calibration.empty()) {
    throw Error(ErrorKind::kInvalidInput, "calibration options with precision " + o.precision +
                                              (o.calibration.empty() ? "" : " and a calibration file"))
        .where("calibrate options")
        .expected("precision f32 and no calibration file: calibration measures the f32 model's ranges");
  }
  EngineOptions options = engine_options(o, "calibrate options");
  require_backend(options.backend, options.backend_options);

  CalibrateReport r;
  r.output = o.output;
  r.config = cfg.name;
  r.weights = o.weights.empty() ? "random (seed " + std::to_string(o.seed) + ")" : o.weights;
  const auto t0 = std::chrono::steady_clock::now();
  log_info("calibrate: ", o.weights.empty() ? "making seeded random weights of " + cfg.name : "loading " + o.weights);
  const Checkpoint ck = o.weights.empty() ? random_checkpoint(cfg, o.seed) : load_checkpoint(o.weights);
  if (o.frames.empty() && !o.weights.empty()) {
    log_warn("calibrate: the synthetic drive's images are noise, not camera images: ranges measured on them may not ",
             "fit real frames; pass the frames you will run (frame JSON files)");
  }
  const int64_t total = o.frames.empty() ? o.synthetic : static_cast<int64_t>(specs.size());
  const Calibration c = measure_calibration(cfg, ck, options, [&](Engine& e, int64_t k) {
    if (k >= total) return false;
    const auto tf = std::chrono::steady_clock::now();
    if (o.frames.empty()) {
      e.runner().forward(synthetic_frame(cfg, o.seed, static_cast<int>(k)));
    } else {
      const std::filesystem::path dir = std::filesystem::path(o.frames[static_cast<size_t>(k)]).parent_path();
      e.detect(specs[static_cast<size_t>(k)], dir.empty() ? "." : dir.string());
    }
    log_info("calibrate: frame ", k + 1, " of ", total, " in ",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - tf).count(), " s");
    return true;
  });
  c.save(o.output);
  r.model = c.model;
  r.frames = c.frames;
  r.convs = c.ranges.size();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string format_calibrate(const CalibrateReport& r) {
  return "calibration of " + r.config + " (" + r.weights + ", model " + r.model + ")\n" + std::to_string(r.convs) +
         " convs' input and output ranges over " + std::to_string(r.frames) + " frame(s) in " + std::to_string(r.seconds) +
         " s\nwritten to " + r.output + "\n";
}

}  // namespace bev
