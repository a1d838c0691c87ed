// Options several subcommands share.
#include <unistd.h>

#include <filesystem>

#include "bevformer/error.h"
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

void add_engine_options(CLI::App* sub, EngineKnobs& knobs, bool precision) {
  sub->add_option("--threads", knobs.threads, "CPU threads for the kernels (0: one per hardware thread)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  add_backend_option(sub, knobs.backend);
  sub->add_option("--device", knobs.device, "Which GPU, for a device backend")->capture_default_str()->check(CLI::Range(0, 1023));
  if (precision) add_precision_options(sub, knobs.precision, knobs.calibration);
}

void check_writable(const std::string& path, const char* option) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0) {
    throw Error(ErrorKind::kInvalidInput, "its folder " + dir.string() + " does not exist or is not writable")
        .where(std::string(option) + " " + path);
  }
  if (fs::exists(p, ec) && (!fs::is_regular_file(p, ec) || ::access(path.c_str(), W_OK) != 0)) {
    throw Error(ErrorKind::kInvalidInput, "exists and is not a writable file").where(std::string(option) + " " + path);
  }
}

}  // namespace bev::cli
