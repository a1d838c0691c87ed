#include "bevformer/golden.h"

#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/golden_set.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/taps.h"
#include "runtime/calibrate.h"
#include "runtime/engine.h"

namespace bev {
namespace {

// The model's input for a golden frame: img (the set's NCHW as the engine's NHWC), lidar2img,
// can_bus (raw), scene_token.
FrameInput frame_input(const GoldenFrame& frame) {
  FrameInput in;
  in.img = frame.img.permute({0, 2, 3, 1}).contiguous();
  in.lidar2img = frame.lidar2img;
  in.can_bus = frame.can_bus;
  in.scene_token = frame.scene_token;
  return in;
}

std::vector<DetectionRecord> records_of(const std::vector<Detection>& dets) {
  std::vector<DetectionRecord> out(dets.size());
  for (size_t i = 0; i < dets.size(); ++i) {
    for (size_t j = 0; j < 9; ++j) out[i].box[j] = dets[i].box[j];
    out[i].score = dets[i].score;
    out[i].label = dets[i].label;
    out[i].query = dets[i].query;
  }
  return out;
}

// The batch dimension the golden layouts keep at axis 1 ([HW, C] -> [HW, 1, C], [L, Q, K] ->
// [L, 1, Q, K]).
Tensor with_batch_axis(const Tensor& t) {
  Shape s = t.shape();
  s.insert(s.begin() + 1, 1);
  return t.contiguous().reshape(s);
}

// Every tap, then the stage outputs of FrameOutput under their golden names when the model did
// not tap them itself.
std::vector<std::pair<std::string, Tensor>> produced_tensors(const Taps& taps, const FrameOutput& out,
                                                             std::set<std::string>* from_output) {
  std::vector<std::pair<std::string, Tensor>> v = taps.all();
  const std::pair<const char*, const Tensor*> outputs[] = {
      {"bev_embed", &out.bev_embed}, {"all_cls_scores", &out.all_cls_scores}, {"all_bbox_preds", &out.all_bbox_preds}};
  for (const auto& [name, t] : outputs) {
    if (taps.find(name) || !t->defined() || t->dim() < 1) continue;
    v.emplace_back(name, with_batch_axis(*t));
    from_output->insert(name);
  }
  return v;
}

std::string format_e(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void appendf(std::string& out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  if (n > 0) {
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, fmt, again);
    out.resize(at + static_cast<size_t>(n));
  }
  va_end(again);
}

}  // namespace

const char* golden_status_name(GoldenTensorResult::Status s) {
  switch (s) {
    case GoldenTensorResult::Status::kOk: return "OK";
    case GoldenTensorResult::Status::kOverTolerance: return "FAIL";
    case GoldenTensorResult::Status::kMismatch: return "SHAPE";
    case GoldenTensorResult::Status::kNotProduced: return "not produced";
  }
  return "?";
}

size_t GoldenReport::compared() const {
  size_t n = 0;
  for (const auto& f : frames) {
    for (const auto& t : f.tensors) n += t.status != GoldenTensorResult::Status::kNotProduced ? 1 : 0;
  }
  return n;
}

size_t GoldenReport::failures() const {
  size_t n = 0;
  for (const auto& f : frames) {
    for (const auto& t : f.tensors) n += t.failed() ? 1 : 0;
    n += f.has_detections && !f.detections.ok ? 1 : 0;
  }
  return n;
}

size_t GoldenReport::not_produced() const {
  size_t n = 0;
  for (const auto& f : frames) {
    for (const auto& t : f.tensors) n += t.status == GoldenTensorResult::Status::kNotProduced ? 1 : 0;
  }
  return n;
}

GoldenReport run_golden(const std::string& dir, const GoldenOptions& options) {
  if (!(options.tolerance >= 0) || !std::isfinite(options.tolerance)) {
    throw Error(ErrorKind::kInvalidInput, "tolerance " + std::to_string(options.tolerance) + " is not usable")
        .expected("a finite number >= 0");
  }
  if (options.max_frames == 0) {
    throw Error(ErrorKind::kInvalidInput, "asked to run 0 frames").expected("at least 1 frame (or all)");
  }
  const GoldenSetFiles set = find_golden_set(dir);
  GoldenReport report;
  report.dir = dir;
  report.config_path = set.config_path;
  report.checkpoint_path = set.checkpoint_path;
  report.tolerance = options.tolerance;
  report.frames_in_set = set.num_frames();
  const size_t frames = options.max_frames < 0
                            ? set.num_frames()
                            : std::min(set.num_frames(), static_cast<size_t>(options.max_frames));

  const ModelConfig cfg = load_config(set.config_path);
  log_info("golden: loading ", set.checkpoint_path);
  EngineOptions engine_options = bev::engine_options(options, "golden options");
  engine_options.replay = !options.eager;
  require_backend(engine_options.backend, engine_options.backend_options);
  report.precision = options.precision;
  std::unique_ptr<Engine> engine;
  {
    const Checkpoint checkpoint = load_checkpoint(set.checkpoint_path);
    if (engine_options.backend_options.precision == Precision::kInt8 && options.calibration.empty()) {
      log_info("golden: int8 without --calibration: calibrating on the set's ", frames, " frame(s) first");
      engine_options.calibration = "the golden set's own frames";
      engine_options.calibration_data = std::make_shared<const Calibration>(
          measure_calibration(cfg, checkpoint, engine_options, [&](Engine& e, int64_t k) {
            if (static_cast<size_t>(k) >= frames) return false;
            e.runner().forward(frame_input(load_golden_frame(set, static_cast<size_t>(k))));
            return true;
          }));
    }
    engine = Engine::create(cfg, checkpoint, engine_options);
  }
  report.backend = engine->backend_info().summary();
  if (!options.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.dump_dir, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot create the dump directory: " + ec.message()).where(options.dump_dir);
  }

  for (size_t k = 0; k < frames; ++k) {
    const GoldenFrame frame = load_golden_frame(set, k);
    if (static_cast<int64_t>(frame.lidar2img.size()) != cfg.transformer.num_cams) {
      throw Error(ErrorKind::kInvalidInput, "the frame has " + std::to_string(frame.lidar2img.size()) +
                                                " cameras, the config " + std::to_string(cfg.transformer.num_cams))
          .where(frame.tensors_path)
          .expected("transformer.num_cams cameras");
    }
    GoldenFrameResult fr;
    fr.frame = static_cast<int>(k);
    fr.scene_token = frame.scene_token;
    log_info("golden: frame ", k, " (", k + 1, " of ", frames, "), scene ", frame.scene_token);

    Taps taps;
    const auto t0 = std::chrono::steady_clock::now();
    const FrameOutput out = engine->runner().forward(frame_input(frame), {.taps = &taps});
    fr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fr.used_history = out.used_history;

    std::set<std::string> from_output;
    const std::vector<std::pair<std::string, Tensor>> produced = produced_tensors(taps, out, &from_output);
    fr.tensors = compare_golden_tensors(frame.tensors, produced, options.tolerance);
    for (auto& t : fr.tensors) {
      if (from_output.count(t.name)) t.note += t.note.empty() ? "from FrameOutput" : ", from FrameOutput";
    }
    const std::vector<DetectionRecord> ours = records_of(out.detections);
    fr.has_detections = frame.has_detections;
    if (frame.has_detections) {
      fr.detections = compare_detections(ours, frame.detections, detection_tolerance(options.tolerance));
    }

    fr.ok = fr.detections.ok;
    for (const auto& t : fr.tensors) fr.ok = fr.ok && !t.failed();
    report.ok = report.ok && fr.ok;

    if (!options.dump_dir.empty()) {
      std::vector<std::pair<std::string, Tensor>> dump;
      std::set<std::string> names;
      for (auto& [name, t] : produced) {
        if (names.insert(name).second) dump.emplace_back(name, t);
      }
      for (auto& [name, t] : detection_tensors(ours)) {
        if (names.insert(name).second) dump.emplace_back(name, t);
      }
      fr.dump_path = (std::filesystem::path(options.dump_dir) / ("frame" + std::to_string(k) + ".safetensors")).string();
      write_safetensors(fr.dump_path, dump,
                        {{"producer", "bevformer.cpp golden"}, {"set", dir}, {"frame", std::to_string(k)}});
    }
    log_info("golden: frame ", k, ": ", fr.ok ? "ok" : "FAIL", " (forward ", fr.seconds, " s)");
    report.frames.push_back(std::move(fr));
  }
  return report;
}

DetectionTolerance detection_tolerance(double tensor_tolerance) {
  const DetectionTolerance base;
  const double s = tensor_tolerance / GoldenOptions{}.tolerance;
  return {base.score_tie * s, base.box_m * s, base.yaw_rad * s, base.score * s};
}

std::string golden_verdict(const GoldenReport& r) {
  size_t det_frames = 0, det_compared = 0, det_matched = 0;
  for (const auto& f : r.frames) {
    if (!f.has_detections) continue;
    ++det_frames;
    det_compared += f.detections.compared;
    det_matched += f.detections.matched;
  }
  std::string out = r.ok ? "PASS" : "FAIL";
  appendf(out, ": %zu of %zu frame(s), %zu tensor(s) compared at relative L2 <= %.1e", r.frames.size(),
          r.frames_in_set, r.compared(), r.tolerance);
  if (!r.ok) {
    size_t bad_tensors = 0;
    std::string names;
    for (const auto& f : r.frames) {
      for (const auto& t : f.tensors) {
        if (!t.failed()) continue;
        if (++bad_tensors <= 6) names += (names.empty() ? "" : ", ") + ("frame " + std::to_string(f.frame) + " " + t.name);
      }
    }
    if (bad_tensors) {
      appendf(out, ", %zu over tolerance (%s%s)", bad_tensors, names.c_str(), bad_tensors > 6 ? ", ..." : "");
    }
  }
  if (det_frames) {
    appendf(out, "; detections %zu/%zu matched", det_matched, det_compared);
    for (const auto& f : r.frames) {
      if (f.has_detections && !f.detections.ok) appendf(out, ", frame %d FAIL", f.frame);
    }
  }
  if (const size_t np = r.not_produced()) appendf(out, "; %zu golden tensor(s) not produced", np);
  return out;
}

std::string format_golden_report(const GoldenReport& r) {
  std::string out;
  appendf(out, "golden set %s\n", r.dir.c_str());
  appendf(out, "  config      %s\n", r.config_path.c_str());
  appendf(out, "  checkpoint  %s\n", r.checkpoint_path.c_str());
  appendf(out, "  frames      %zu of %zu, tolerance relative L2 <= %.1e (integer tensors exact)\n", r.frames.size(),
          r.frames_in_set, r.tolerance);
  const DetectionTolerance dt = detection_tolerance(r.tolerance);
  appendf(out, "  detections  box <= %.1e m, yaw <= %.1e rad, score <= %.1e, near ties within %.1e (scaled with the tolerance)\n",
          dt.box_m, dt.yaw_rad, dt.score, dt.score_tie);
  appendf(out, "  backend     %s\n", r.backend.c_str());
  appendf(out, "  precision   %s%s\n", r.precision.c_str(),
          r.precision == "bf16" ? " (convolutions and matmuls in bf16; golden is float32)" : "");
  size_t name_w = 10, shape_w = 5;
  for (const auto& f : r.frames) {
    for (const auto& t : f.tensors) {
      name_w = std::max(name_w, t.name.size());
      shape_w = std::max(shape_w, shape_text(t.shape).size());
    }
  }
  const int nw = static_cast<int>(name_w), sw = static_cast<int>(shape_w);
  for (const auto& f : r.frames) {
    appendf(out, "\nframe %d  scene %s  history %s  forward %.3f s  %s\n", f.frame, f.scene_token.c_str(),
            f.used_history ? "yes" : "no", f.seconds, f.ok ? "OK" : "FAIL");
    appendf(out, "  %-*s  %-*s  %-9s  %-9s  %s\n", nw, "tensor", sw, "shape", "rel L2", "max abs", "status");
    for (const auto& t : f.tensors) {
      const bool measured = t.status == GoldenTensorResult::Status::kOk ||
                            t.status == GoldenTensorResult::Status::kOverTolerance;
      appendf(out, "  %-*s  %-*s  %-9s  %-9s  %s%s%s%s\n", nw, t.name.c_str(), sw, shape_text(t.shape).c_str(),
              measured ? format_e(t.relative_l2).c_str() : "-", measured ? format_e(t.max_abs).c_str() : "-",
              golden_status_name(t.status), t.note.empty() ? "" : " (", t.note.c_str(), t.note.empty() ? "" : ")");
    }
    if (f.has_detections) {
      const GoldenDetectionResult& d = f.detections;
      appendf(out,
              "  %-*s  %zu golden, %zu ours: %zu/%zu matched (%zu near-tied), max diff box %.2e m, yaw %.2e rad, "
              "score %.2e  %s\n",
              nw, "detections", d.golden, d.ours, d.matched, d.compared, d.ambiguous, d.max_box_diff, d.max_yaw_diff,
              d.max_score_diff, d.ok ? "OK" : "FAIL");
      for (const auto& p : d.problems) appendf(out, "  %-*s    %s\n", nw, "", p.c_str());
    }
    if (!f.dump_path.empty()) appendf(out, "  dumped to %s\n", f.dump_path.c_str());
  }
  out += "\n" + golden_verdict(r) + "\n";
  return out;
}

}  // namespace bev
