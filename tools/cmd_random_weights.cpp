// bevformer random-weights --config C [--seed S] -o FILE.safetensors: a checkpoint of seeded
// random weights in the official layout of any config (every key and shape an official
// checkpoint of it has), for exercising a pipeline end to end or timing against another engine
// on identical weights. Nothing trained: detections from it are meaningless.
#include <cstdio>
#include <memory>
#include <string>

#include "bevformer/model.h"
#include "commands.h"

namespace bev::cli {
namespace {

struct RandomWeightsArgs {
  std::string config = "tiny";
  uint64_t seed = 2026;
  std::string output;
};

}  // namespace

Runner add_random_weights(CLI::App& app) {
  auto a = std::make_shared<RandomWeightsArgs>();
  CLI::App* sub = app.add_subcommand(
      "random-weights", "Write seeded random weights in the official checkpoint layout of a config (safetensors)");
  sub->add_option("--config", a->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed (the untrained model of detect uses 2026)")->capture_default_str();
  sub->add_option("-o,--output", a->output, "Output .safetensors file")->required();
  return [a]() {
    const size_t n = write_random_weights(a->config, a->seed, a->output);
    std::printf("%s: %zu tensors of seeded random weights (seed %llu, config %s)\n", a->output.c_str(), n,
                static_cast<unsigned long long>(a->seed), a->config.c_str());
    return 0;
  };
}

}  // namespace bev::cli
