// bevformer detect FRAME... [--weights FILE] [--config C] [-o OUT.json] [--render OUT.png|.jpg]
// [--video OUT.mp4 [--video-fps F]] [--gt INFO.json] [--dump DIR] [--nusc results_nusc.json [--resume]] [--shard K/N]
// [--threads N] [--precision f32|bf16|int8 --calibration FILE] [--backend B] [--batch N] [--top N]: frames in, detections out.
//
// Dataset-scale runs: --nusc writes results_nusc.json one sample at a time (a crash keeps what was
// done), --resume skips the scenes already written, --shard K/N runs the K-th of N scene-whole
// parts (a scene's frames carry history, so they stay in order on one worker), and progress goes
// to stderr with the rate and an ETA.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "commands.h"
#include "eval/results_writer.h"
#include "eval/shard.h"
#include "io/byte_source.h"
#include "io/frame_json.h"
#include "core/log.h"
#include "render/render.h"
#include "render/video.h"

namespace bev::cli {
namespace {

struct DetectArgs {
  std::vector<std::string> frames;
  std::string weights;
  std::string config = "tiny";
  std::string output;
  std::string render;
  std::string video;
  double video_fps = 2;
  std::string gt;
  std::string dump;
  std::string nusc;
  bool resume = false;
  std::string shard;
  EngineKnobs knobs;
  int batch = 1;
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

// What the run plan needs of a frame file, read before the model loads: a missing or malformed
// file fails in a second, not after a minute of loading weights.
struct FramePeek {
  std::string path;
  std::string stream;
  std::string scene_key;  // the frame's "scene", else its stream: frames sharing history
  std::string token;      // "" when the frame has none
};

FramePeek peek_frame(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_regular_file(path, kMaxFrameFileBytes, "frame file"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("not JSON: ") + e.what()).where(path);
  }
  FramePeek p;
  p.path = path;
  if (!j.is_object() || !j.contains("stream") || !j["stream"].is_string()) {
    throw Error(ErrorKind::kInvalidInput, "no \"stream\"").where(path).expected("a frame JSON (docs/FORMATS.md)");
  }
  p.stream = j["stream"].get<std::string>();
  p.scene_key = j.contains("scene") && j["scene"].is_string() ? j["scene"].get<std::string>()
                                                              : "stream:" + j["stream"].get<std::string>();
  if (j.contains("token") && j["token"].is_string()) p.token = j["token"].get<std::string>();
  return p;
}

std::string duration_text(double s) {
  char buf[64];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  }
  return buf;
}

int run(const DetectArgs& a) {
  require_backend(a.knobs.backend);  // a wrong --backend fails before anything is read
  if (a.resume && a.nusc.empty()) {
    throw Error(ErrorKind::kInvalidInput, "--resume without --nusc").expected("--nusc FILE: the results to resume");
  }
  std::vector<FramePeek> frames;
  for (const std::string& f : a.frames) frames.push_back(peek_frame(f));
  check_writable(a.output, "-o");
  check_writable(a.nusc, "--nusc");
  if (!a.render.empty()) {
    picture_format(a.render);  // .png or .jpg/.jpeg, refused now rather than after the first frame
    check_writable(numbered(a.render, 0, a.frames.size()), "--render");
  }
  if (a.batch > 1 && (!a.render.empty() || !a.video.empty())) {
    throw Error(ErrorKind::kInvalidInput, std::string(a.render.empty() ? "--video" : "--render") + " with --batch " +
                                              std::to_string(a.batch))
        .expected("--batch 1 to render pictures (they are drawn one frame at a time)");
  }
  std::unique_ptr<VideoWriter> video;
  if (!a.video.empty()) {
    check_video_path(a.video);
    check_writable(a.video, "--video");
    video = std::make_unique<VideoWriter>(a.video, a.video_fps);
  }

  // The frames this worker runs: its shard's scenes, in input order.
  std::vector<size_t> todo(frames.size());
  for (size_t k = 0; k < todo.size(); ++k) todo[k] = k;
  if (!a.shard.empty()) {
    const eval::ShardSpec s = eval::parse_shard(a.shard);
    std::vector<std::string> scenes;
    for (const FramePeek& f : frames) scenes.push_back(f.scene_key);
    todo = eval::shard_by_scene(scenes, s.index, s.count);
    log_info("detect: shard ", a.shard, ": ", todo.size(), " of ", frames.size(), " frames");
  }
  std::unique_ptr<eval::ResultsWriter> results;
  if (!a.nusc.empty()) {
    // The meta block of the submission format, in the devkit's key order.
    const eval::ojson meta = eval::ojson::parse(nuscenes_results_json({}))["meta"];
    results = std::make_unique<eval::ResultsWriter>(a.nusc, meta, a.resume);
  }
  if (a.resume && results) {
    // A scene is skipped only when every one of its samples is written: a partly written scene
    // runs again from its first frame (its history), without writing its samples twice.
    std::map<std::string, bool> scene_done;
    for (size_t k : todo) {
      const bool written = !frames[k].token.empty() && results->has_sample(frames[k].token);
      auto [it, fresh] = scene_done.try_emplace(frames[k].scene_key, written);
      if (!fresh) it->second = it->second && written;
    }
    std::vector<size_t> left;
    for (size_t k : todo) {
      if (!scene_done[frames[k].scene_key]) left.push_back(k);
    }
    log_info("detect: --resume: ", results->samples().size(), " sample(s) already in ", a.nusc, "; ", left.size(), " of ",
             todo.size(), " frames left");
    todo = std::move(left);
  }

  Knobs knobs;
  static_cast<EngineKnobs&>(knobs) = a.knobs;
  log_info("detect: loading ", a.config,
           a.weights.empty() ? " with seeded random weights (no --weights): detections will be meaningless" : " with " + a.weights);
  const std::unique_ptr<Model> model = Model::load(a.config, a.weights, knobs);
  std::map<size_t, std::string> documents;  // each frame's detections JSON (by input order), as the engine built it
  const auto t0 = std::chrono::steady_clock::now();
  size_t written = 0, done = 0;
  // One finished frame: progress, the printout, its document and its nuScenes sample.
  auto finish = [&](size_t k, const Detections& d, const DetectOptions& opt) {
    ++done;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_frame = elapsed / static_cast<double>(done);
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.2f", per_frame);
    log_info("detect: frame ", done, "/", todo.size(), " ", frames[k].path, ": ", rate, " s/frame, ETA ",
             duration_text(per_frame * static_cast<double>(todo.size() - done)));
    std::printf("%s  stream %s  t=%.6f  %s  %zu boxes  %.2f s%s\n", frames[k].path.c_str(), d.stream.c_str(), d.timestamp,
                d.used_history ? "history" : "first frame", d.boxes.size(), d.seconds,
                d.untrained ? "  (UNTRAINED weights: boxes are meaningless)" : "");
    for (size_t b = 0; b < d.boxes.size() && static_cast<int>(b) < a.top; ++b) {
      const Box& x = d.boxes[b];
      std::printf("  %5.3f %-20s x %7.2f y %7.2f z %6.2f  w %5.2f l %5.2f h %5.2f  yaw %6.2f\n", x.score,
                  x.class_name.c_str(), x.center[0], x.center[1], x.center[2], x.size[0], x.size[1], x.size[2], x.yaw);
    }
    if (!opt.render_png.empty()) std::printf("  picture: %s\n", opt.render_png.c_str());
    if (video) video->write(d.picture.bgr.data(), d.picture.width, d.picture.height);
    if (!a.output.empty()) documents[k] = d.json;
    if (results) {
      if (d.nuscenes_json.empty()) {
        throw Error(ErrorKind::kInvalidInput, "the frame has no sample token or no ego pose")
            .where(frames[k].path)
            .expected("\"token\" and \"T_world_from_ego\" in the frame for --nusc (convert-info writes both)");
      }
      if (!results->has_sample(d.sample_token)) {
        results->add_sample_text(d.sample_token, d.nuscenes_json);
        ++written;
      }
    }
  };
  if (a.batch <= 1) {
    for (const size_t k : todo) {
      DetectOptions opt;
      if (!a.render.empty()) opt.render_png = numbered(a.render, k, a.frames.size());
      opt.render_picture = video != nullptr;
      opt.ground_truth_info = a.gt;
      opt.dump_dir = a.dump;
      finish(k, model->detect_file(frames[k].path, opt), opt);
    }
  } else {
    // Batches of the earliest frames of up to --batch distinct streams; each stream's frames in
    // order. Only one batch's frames are read (and their images decoded) at a time.
    std::vector<std::string> streams;
    for (const size_t k : todo) streams.push_back(frames[k].stream);
    DetectOptions opt;
    opt.dump_dir = a.dump;
    size_t batches = 0, batched_frames = 0;
    for (const std::vector<size_t>& round : batch_rounds(streams, a.batch)) {
      std::vector<Frame> batch;
      for (const size_t r : round) {
        const std::string& path = frames[todo[r]].path;
        Frame f = read_frame(path);
        // Image paths relative to each frame file's own folder.
        const std::filesystem::path dir = std::filesystem::path(path).parent_path();
        for (Camera& c : f.cameras) {
          if (!c.image_path.empty() && std::filesystem::path(c.image_path).is_relative()) {
            c.image_path = (dir.empty() ? std::filesystem::path(".") : dir) / c.image_path;
          }
        }
        batch.push_back(std::move(f));
      }
      const std::vector<FrameOutcome> out = model->detect_batch(batch, ".", opt, a.batch);
      ++batches;
      for (size_t j = 0; j < round.size(); ++j) {
        const size_t k = todo[round[j]];
        if (out[j].error) {
          Error e = *out[j].error;
          e.where(e.place().empty() ? frames[k].path : frames[k].path + ": " + e.place());
          throw e;
        }
        batched_frames += static_cast<size_t>(out[j].batch_size);
        finish(k, *out[j].detections, opt);
      }
    }
    if (batches > 0) {
      log_info("detect: ", done, " frames in ", batches, " batches (", static_cast<double>(batched_frames) / static_cast<double>(done),
               " frames per batch on average)");
    }
  }
  if (video) {
    video->finish();
    if (video->frames() == 0) {
      std::printf("video: none written (no frame ran in this run)\n");
    } else {
      std::printf("video: %s (%d frames at %g fps, %s)\n", a.video.c_str(), video->frames(), a.video_fps,
                  video->codec().c_str());
    }
  }
  if (results) {
    results->finish();
    std::printf("nuScenes results: %s (%zu sample(s), %zu written by this run)\n", a.nusc.c_str(),
                results->samples().size(), written);
  }
  if (!a.output.empty()) {
    std::ofstream out(a.output, std::ios::binary);
    if (!out) throw Error(ErrorKind::kIo, "cannot write").where(a.output);
    if (documents.size() == 1) {
      out << documents.begin()->second << "\n";
    } else {
      // In the order the frames were given (a batched run finishes them batch by batch).
      out << "{\"frames\": [\n";
      size_t n = 0;
      for (const auto& [k, doc] : documents) out << doc << (++n < documents.size() ? ",\n" : "\n");
      out << "]}\n";
    }
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
  sub->add_option("--render", a->render, "Write a picture: cameras with projected boxes and a BEV panel (.png, or .jpg/.jpeg for JPEG; _<k> per frame when several)");
  sub->add_option("--video", a->video,
                  "Write every frame's picture into one video: .mp4 or .mkv (H.264), .avi (Motion JPEG)");
  sub->add_option("--video-fps", a->video_fps, "Frames per second of --video")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1000.0));
  sub->add_option("--gt", a->gt, "mmdet3d info file: draw its ground-truth boxes of the same timestamp too");
  sub->add_option("--dump", a->dump, "Write every stage's tensors per frame as DIR/<stream>_<k>.safetensors, k the frame's index in its stream (golden-set names and layouts)");
  sub->add_option("--nusc", a->nusc, "Write nuScenes results_nusc.json, one sample at a time as frames finish (needs their token and ego pose)");
  sub->add_flag("--resume", a->resume, "With --nusc: keep the samples already in the file and skip the scenes they complete");
  sub->add_option("--shard", a->shard, "Run only the K-th of N parts (K/N, 1-based), split by scene so history stays on one worker");
  add_engine_options(sub, a->knobs);
  sub->add_option("--batch", a->batch,
                  "Run frames of up to N streams as one batch (each stream's frames in order; identical results)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--top", a->top, "Boxes printed per frame")->capture_default_str();
  return [a]() { return run(*a); };
}

}  // namespace bev::cli
