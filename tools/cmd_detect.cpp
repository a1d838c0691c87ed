// bevformer detect FRAME... [--weights FILE] [--config C] [-o OUT.json] [--render OUT.png]
// [--gt INFO.json] [--dump DIR] [--nusc results_nusc.json] [--threads N] [--precision f32|bf16]:
// frames in, detections out.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "commands.h"
#include "core/log.h"

namespace bev::cli {
namespace {

struct DetectArgs {
  std::vector<std::string> frames;
  std::string weights;
  std::string config = "tiny";
  std::string output;
  std::string render;
  std::string gt;
  std::string dump;
  std::string nusc;
  int threads = 0;
  std::string precision = "f32";
  int top = 5;
};

// out.png -> out_<k>.png when several frames are rendered.
std::string numbered(const std::string& path, size_t k, size_t n) {
  if (n == 1) return path;
  const size_t dot = path.rfind('.');
  const std::string stem = dot == std::string::npos ? path : path.substr(0, dot);
  const std::string ext = dot == std::string::npos ? ".png" : path.substr(dot);
  return stem + "_" + std::to_string(k) + ext;
}

int run(const DetectArgs& a) {
  Knobs knobs;
  knobs.threads = a.threads;
  knobs.precision = a.precision;
  log_info("detect: loading ", a.config,
           a.weights.empty() ? " with seeded random weights (no --weights): detections will be meaningless" : " with " + a.weights);
  const std::unique_ptr<Model> model = Model::load(a.config, a.weights, knobs);
  nlohmann::json all = nlohmann::json::array();
  std::vector<Detections> done;
  for (size_t k = 0; k < a.frames.size(); ++k) {
    DetectOptions opt;
    if (!a.render.empty()) opt.render_png = numbered(a.render, k, a.frames.size());
    opt.ground_truth_info = a.gt;
    opt.dump_dir = a.dump;
    log_info("detect: frame ", k + 1, "/", a.frames.size(), " ", a.frames[k]);
    const Detections d = model->detect_file(a.frames[k], opt);
    std::printf("%s  stream %s  t=%.6f  %s  %zu boxes  %.2f s%s\n", a.frames[k].c_str(), d.stream.c_str(), d.timestamp,
                d.used_history ? "history" : "first frame", d.boxes.size(), d.seconds,
                d.untrained ? "  (UNTRAINED weights: boxes are meaningless)" : "");
    for (size_t i = 0; i < d.boxes.size() && static_cast<int>(i) < a.top; ++i) {
      const Box& b = d.boxes[i];
      std::printf("  %5.3f %-20s x %7.2f y %7.2f z %6.2f  w %5.2f l %5.2f h %5.2f  yaw %6.2f\n", b.score,
                  b.class_name.c_str(), b.center[0], b.center[1], b.center[2], b.size[0], b.size[1], b.size[2], b.yaw);
    }
    if (!opt.render_png.empty()) std::printf("  picture: %s\n", opt.render_png.c_str());
    all.push_back(nlohmann::json::parse(d.json));
    if (!a.nusc.empty()) done.push_back(d);
  }
  if (!a.nusc.empty()) {
    std::ofstream out(a.nusc, std::ios::binary);
    if (!(out << nuscenes_results_json(done) << "\n")) throw Error(ErrorKind::kIo, "cannot write").where(a.nusc);
    std::printf("nuScenes results: %s (%zu sample(s))\n", a.nusc.c_str(), done.size());
  }
  if (!a.output.empty()) {
    std::ofstream out(a.output, std::ios::binary);
    if (!out) throw Error(ErrorKind::kIo, "cannot write").where(a.output);
    out << (a.frames.size() == 1 ? all[0] : nlohmann::json{{"frames", all}}).dump(1) << "\n";
    if (!out) throw Error(ErrorKind::kIo, "write failed").where(a.output);
    std::printf("detections: %s\n", a.output.c_str());
  }
  return 0;
}

}  // namespace

Runner add_detect(CLI::App& app) {
  auto a = std::make_shared<DetectArgs>();
  CLI::App* sub = app.add_subcommand("detect", "Detect 3D boxes in frames (frame JSON files, run in order as streams)");
  sub->add_option("frames", a->frames, "Frame JSON files (docs/FORMATS.md), run in the order given")->required();
  sub->add_option("--weights", a->weights, "Checkpoint (.pth or .safetensors); without it a seeded untrained model runs");
  sub->add_option("--config", a->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("-o,--output", a->output, "Write the detections JSON here (one frame: the document; several: {\"frames\": [...]})");
  sub->add_option("--render", a->render, "Write a picture: cameras with projected boxes and a BEV panel (PNG; _<k> per frame when several)");
  sub->add_option("--gt", a->gt, "mmdet3d info file: draw its ground-truth boxes of the same timestamp too");
  sub->add_option("--dump", a->dump, "Write every stage's tensors per frame as safetensors (golden-set names and layouts)");
  sub->add_option("--nusc", a->nusc, "Write nuScenes results_nusc.json for the frames (needs their token and ego pose)");
  sub->add_option("--threads", a->threads, "CPU threads (0: one per hardware thread)")->capture_default_str()->check(CLI::Range(0, 1024));
  sub->add_option("--precision", a->precision, "f32 | bf16")->capture_default_str()->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--top", a->top, "Boxes printed per frame")->capture_default_str();
  return [a]() { return run(*a); };
}

}  // namespace bev::cli
