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

}  // namespace bev::cli
