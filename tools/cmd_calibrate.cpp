// bevformer calibrate [FRAME.json...] [--config C] [--weights W] [--synthetic N] -o FILE:
// measures the input range of every conv over a drive of frames (f32, with
// history), for `--precision int8 --calibration FILE`.
#include <cstdio>
#include <memory>
#include <string>

#include "bevformer/calibrate.h"
#include "commands.h"

namespace bev::cli {

Runner add_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* sub = app.add_subcommand(
      "calibrate", "Measure the activation ranges int8 precision needs (--precision int8 --calibration FILE)");
  sub->add_option("--config", o->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--weights", o->weights, "Checkpoint (default: seeded random weights of the config)");
  sub->add_option("frames", o->frames,
                  "Frame JSON files to calibrate on, in drive order (the frames you will run; none: the synthetic drive)");
  sub->add_option("--synthetic", o->synthetic, "Frames of the synthetic drive, when no frame files are given")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  sub->add_option("--seed", o->seed, "Seed of the random weights and the synthetic drive")->capture_default_str();
  add_engine_options(sub, *o, /*precision=*/false);  // calibration measures in f32
  sub->add_option("-o,--output", o->output, "The calibration file to write")->required();
  return [o]() {
    check_writable(o->output, "-o");  // before the drive runs
    const CalibrateReport r = run_calibrate(*o);
    std::fputs(format_calibrate(r).c_str(), stdout);
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bev::cli
