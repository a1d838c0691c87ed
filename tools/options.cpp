// Options several subcommands share.
#include "bevformer/model.h"
#include "commands.h"

namespace bev::cli {

CLI::Option* add_backend_option(CLI::App* sub, std::string& backend) {
  std::string names;
  for (const std::string& n : available_backends()) names += (names.empty() ? "" : " | ") + n;
  // No membership check here: a backend this binary lacks (cuda without BEV_CUDA) gets the
  // registry's error, which says what is missing and how to build it (exit 2).
  return sub->add_option("--backend", backend, "Where the model runs: " + names + " (foreign: the CPU kernels on memory guarded from the host, a test backend)")
      ->capture_default_str();
}

CLI::Option* add_precision_options(CLI::App* sub, std::string& precision, std::string& calibration) {
  sub->add_option("--calibration", calibration,
                  "int8: the calibration file `bevformer calibrate` made for these weights");
  return sub->add_option("--precision", precision,
                         "f32 | bf16 (convolutions and matmuls) | int8 (the backbone's convs; needs --calibration)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
}

}  // namespace bev::cli
