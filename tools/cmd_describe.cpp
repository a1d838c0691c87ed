// bevformer describe [--config C] [--weights W] [--summary]: the recorded stages of a model: per
// stage its ops with shapes and arena offsets, the arena size against no reuse, weight bytes.
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "bevformer/model.h"
#include "commands.h"

namespace bev::cli {
namespace {

struct DescribeArgs {
  std::string config = "tiny";
  std::string weights;
  EngineKnobs knobs;
  bool summary = false;
};

}  // namespace

Runner add_describe(CLI::App& app) {
  auto a = std::make_shared<DescribeArgs>();
  CLI::App* sub = app.add_subcommand(
      "describe", "Show the recorded stages: ops, shapes, arena buffers and size, weight bytes (records on synthetic frames)");
  sub->add_option("--config", a->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--weights", a->weights, "Checkpoint (default: seeded random weights of the config)");
  add_engine_options(sub, a->knobs);
  sub->add_flag("--summary", a->summary, "Only the per-stage totals, not every op");
  return [a]() {
    Knobs k;
    static_cast<EngineKnobs&>(k) = a->knobs;
    const std::unique_ptr<Model> model = Model::load(a->config, a->weights, k);
    const std::string text = model->describe();
    if (!a->summary) {
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line[0] != ' ') std::printf("%s\n", line.c_str());
    }
    return 0;
  };
}

}  // namespace bev::cli
