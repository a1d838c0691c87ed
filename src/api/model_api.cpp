#include "bevformer/model.h"

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/byte_source.h"
#include "io/checkpoint.h"
#include "io/detections_json.h"
#include "io/frame_json.h"
#include "io/nuscenes_info.h"
#include "io/safetensors.h"
#include "model/bevformer.h"
#include "model/synthetic.h"
#include "render/render.h"
#include "api/model_impl.h"
#include "runtime/engine.h"
#include "runtime/stream_handoff.h"

namespace bev {

namespace {

Box to_box(const Detection& d, const std::vector<std::string>& names) {
  Box b;
  b.center = {d.box[0], d.box[1], d.box[2]};
  b.size = {d.box[3], d.box[4], d.box[5]};
  b.yaw = d.box[6];
  b.velocity = {d.box[7], d.box[8]};
  b.score = d.score;
  b.label = d.label;
  b.class_name = d.label >= 0 && static_cast<size_t>(d.label) < names.size() ? names[static_cast<size_t>(d.label)] : "";
  b.query = d.query;
  return b;
}

// The ground truth of the info entry stamped `timestamp` (within a millisecond) as detections in
// the model's label order (by class name; classes the model lacks are skipped). NaN velocities
// (infos without them) become 0.
std::vector<Detection> info_ground_truth_at(const std::string& info_path, double timestamp,
                                            const std::vector<std::string>& class_names) {
  const NuScenesInfo info = read_nuscenes_info(info_path);
  for (const InfoSample& sample : info.samples) {
    if (std::fabs(sample.timestamp - timestamp) > 1e-3) continue;
    std::vector<Detection> out;
    for (const GtBox& g : read_info_ground_truth(info_path, sample.index)) {
      int label = -1;
      for (size_t c = 0; c < class_names.size(); ++c) {
        if (class_names[c] == g.class_name) label = static_cast<int>(c);
      }
      if (label < 0) continue;
      Detection d;
      d.box = box_from_mmdet3d_info(g.box, std::isfinite(g.velocity[0]) ? g.velocity[0] : 0.0,
                                  std::isfinite(g.velocity[1]) ? g.velocity[1] : 0.0);
      d.label = label;
      d.score = 1.0f;
      out.push_back(d);
    }
    return out;
  }
  throw Error(ErrorKind::kNotFound, "no entry with timestamp " + std::to_string(timestamp))
      .where(info_path)
      .hint("--gt takes the info file the frames were converted from");
}

std::string safe_file_part(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() ? "stream" : out;
}

}  // namespace

std::string nuscenes_results_json(const std::vector<Detections>& frames) {
  // Each frame's array is JSON text already: the document is assembled, not parsed again.
  nlohmann::json meta = NuscResults().to_json()["meta"];
  std::string out = "{\"meta\": " + meta.dump() + ", \"results\": {";
  std::set<std::string> seen;
  for (const Detections& d : frames) {
    if (d.nuscenes_json.empty()) {
      throw Error(ErrorKind::kInvalidInput, "frame of stream '" + d.stream + "' at t=" + std::to_string(d.timestamp) +
                                                " has no sample token or no ego pose")
          .expected("\"token\" and \"T_world_from_ego\" in the frame (convert-info writes both)");
    }
    if (!seen.insert(d.sample_token).second) {
      throw Error(ErrorKind::kInvalidInput, "sample token '" + d.sample_token + "' appears twice");
    }
    out += (seen.size() > 1 ? ", " : "") + nlohmann::json(d.sample_token).dump() + ": " + d.nuscenes_json;
  }
  return out + "}}";
}

void require_backend(const std::string& backend) { require_backend(backend, BackendOptions{}); }

size_t write_random_weights(const std::string& config, uint64_t seed, const std::string& path) {
  const Checkpoint ck = random_checkpoint(load_config(config), seed);
  write_safetensors(path, ck.tensors(), {{"format", "pt"}, {"note", "bevformer.cpp seeded random weights, seed " + std::to_string(seed)}});
  return ck.size();
}

Model::Model() : impl_(std::make_unique<Impl>()) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& config, const std::string& weights, const Knobs& knobs) {
  std::unique_ptr<Model> m(new Model());
  Impl& s = *m->impl_;
  const ModelConfig cfg = load_config(config);
  const auto t0 = std::chrono::steady_clock::now();
  EngineOptions options = engine_options(knobs, "knobs");
  options.replay = knobs.replay;
  options.pipelined = knobs.pipeline;
  options.profiling = knobs.profiling;
  if (knobs.max_batch < 1) {
    throw Error(ErrorKind::kInvalidInput, "max_batch " + std::to_string(knobs.max_batch)).where("knobs").expected("at least 1");
  }
  options.streams = StreamLimits{knobs.max_streams, knobs.stream_ttl_seconds, knobs.max_gap_seconds};
  require_backend(options.backend, options.backend_options);
  Checkpoint ck;
  if (weights.empty()) {
    log_info("model: no weights given: seeded random weights (seed ", knobs.seed, "), UNTRAINED: detections are meaningless");
    ck = random_checkpoint(cfg, knobs.seed);
    s.untrained = true;
    s.weights_name = "random (seed " + std::to_string(knobs.seed) + ")";
  } else {
    log_info("model: loading ", weights);
    ck = load_checkpoint(weights);
    s.weights_name = weights;
  }
  s.engine = Engine::create(cfg, ck, options);
  s.max_batch = knobs.max_batch;
  for (const auto& [name, t] : ck.tensors()) s.weight_bytes += t.nbytes();
  // Fleet history handoff: an int8 model's numbers depend on its calibration too.
  const Calibration* calibration = s.engine->calibration();
  s.fingerprint = model_fingerprint(cfg, ck, knobs.backend,
                                    calibration ? knobs.precision + "\n" + calibration->dump() : knobs.precision);
  log_info("model: ", cfg.name, " ready in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
           " s on ", s.engine->backend_info().summary());
  return m;
}

Detections Model::detect_file(const std::string& frame_json_path, const DetectOptions& options) {
  // A regular file of bounded size only: a FIFO would block forever, /dev/zero read until memory
  // runs out, and a directory is the caller's mistake (exit 2), not an i/o failure.
  const std::string text = read_regular_file(frame_json_path, kMaxFrameFileBytes, "frame file");
  const std::filesystem::path dir = std::filesystem::path(frame_json_path).parent_path();
  return detect_text(text, dir.empty() ? "." : dir.string(), frame_json_path, options);
}

Detections Model::detect(const std::string& frame_json, const std::string& base_dir, const DetectOptions& options) {
  return detect_text(frame_json, base_dir, "frame", options);
}

Detections Model::detect(const std::string& frame_json, const AttachedImages& images, const DetectOptions& options) {
  return detect_text(frame_json, "", "frame", options, &images);
}

Detections Model::detect(const Frame& frame, const std::string& base_dir, const DetectOptions& options) {
  return detect_frame(frame, base_dir, "frame", options, 0);
}

namespace {

// Points the cameras' images at `images` by the names their "image" fields give (views: the
// caller's bytes outlive the call).
void attach_images(Frame& spec, const AttachedImages& images, const std::string& where) {
  std::set<std::string_view> used;
  for (size_t i = 0; i < spec.cameras.size(); ++i) {
    Camera& cam = spec.cameras[i];
    if (cam.image_path.empty()) continue;  // inline base64
    const auto it = images.find(cam.image_path);
    if (it == images.end()) {
      throw Error(ErrorKind::kInvalidInput, "names the image '" + cam.image_path + "' but no such image was attached")
          .where(where + ": cameras[" + std::to_string(i) + "].image")
          .expected("one of the attached images (names: the multipart part names)");
    }
    cam.image_bytes.owner = nullptr;
    cam.image_bytes.bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(it->second.data()), it->second.size());
    cam.image_path.clear();
    used.insert(it->first);
  }
  for (const auto& [name, bytes] : images) {
    if (!used.count(name)) {
      throw Error(ErrorKind::kInvalidInput, "the attached image '" + name + "' is named by no camera")
          .where(where)
          .expected("each attached image named by a camera's \"image\"");
    }
  }
}

}  // namespace

Detections Model::detect_text(const std::string& text, const std::string& base_dir, const std::string& where,
                              const DetectOptions& options, const AttachedImages* images) {
  const auto t0 = std::chrono::steady_clock::now();
  Frame spec = parse_frame_json(text, where);
  if (images) attach_images(spec, *images, where);
  return detect_frame(spec, base_dir, where, options,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

namespace {

// With no base directory nothing is read from disk: every camera must carry its bytes (or pixels).
void check_image_bytes(const Frame& spec, const std::string& base_dir, const std::string& where) {
  if (!base_dir.empty()) return;
  for (size_t i = 0; i < spec.cameras.size(); ++i) {
    if (spec.cameras[i].image_bytes.empty() && spec.cameras[i].pixels.empty()) {
      throw Error(ErrorKind::kInvalidInput, "names the image file '" + spec.cameras[i].image_path + "'")
          .where(where + ": cameras[" + std::to_string(i) + "].image")
          .expected("the image's bytes (no base directory was given, so no file is read)");
    }
  }
}

Error as_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    return error;
  } catch (const std::exception& other) {
    return Error(ErrorKind::kInternal, other.what());
  } catch (...) {
    return Error(ErrorKind::kInternal, "an unknown exception");
  }
}

}  // namespace

std::vector<FrameOutcome> Model::detect_batch(const std::vector<Frame>& frames, const std::string& base_dir,
                                              const DetectOptions& options, int max_batch) {
  if (!options.render_png.empty() || options.render_picture) {
    throw Error(ErrorKind::kInvalidInput, "a picture (render_png, render_picture) for a batch of frames")
        .where("detect_batch")
        .expected("Model::detect per frame to render its picture");
  }
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<FrameOutcome> out(frames.size());
  std::vector<const Frame*> run;
  std::vector<size_t> index;
  for (size_t i = 0; i < frames.size(); ++i) {
    try {
      check_image_bytes(frames[i], base_dir, "frame " + std::to_string(i));
      run.push_back(&frames[i]);
      index.push_back(i);
    } catch (const Error& e) {
      out[i].error = e;
    }
  }
  DetectRequest request;
  request.taps = !options.dump_dir.empty();
  std::vector<Engine::Outcome> ran = s.engine->detect_batch(run, base_dir, request, max_batch > 0 ? max_batch : s.max_batch);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t k = 0; k < ran.size(); ++k) {
    FrameOutcome& o = out[index[k]];
    o.batch_size = static_cast<int>(ran[k].batch_size);
    if (ran[k].error) {
      o.error = as_error(ran[k].error);
      continue;
    }
    try {
      o.detections = frame_detections(ran[k].result, options, 0, seconds);
    } catch (...) {
      o.error = as_error(std::current_exception());
    }
  }
  return out;
}

Detections Model::detect_frame(const Frame& spec, const std::string& base_dir, const std::string& where,
                               const DetectOptions& options, double parse_seconds) {
  Impl& s = *impl_;
  Engine& engine = *s.engine;
  const auto t0 = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                        std::chrono::duration<double>(parse_seconds));
  check_image_bytes(spec, base_dir, where);
  DetectRequest request;
  request.taps = !options.dump_dir.empty();
  request.keep_images = !options.render_png.empty() || options.render_picture;
  FrameResult r = engine.detect(spec, base_dir, request);
  return frame_detections(r, options, parse_seconds,
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

Detections Model::frame_detections(FrameResult& r, const DetectOptions& options, double parse_seconds,
                                   double started_seconds_ago) {
  Impl& s = *impl_;
  const ModelConfig& cfg = s.engine->config();
  const auto t_output = std::chrono::steady_clock::now();
  Detections d;
  d.stream = r.stream;
  d.timestamp = r.timestamp;
  d.scene = r.scene.empty() ? r.stream : r.scene;
  d.untrained = s.untrained;
  d.used_history = r.used_history;
  d.history_reset = r.history_reset;
  d.frame_index = r.frame_index;
  d.prepare_seconds = parse_seconds + r.prepare_seconds;
  d.geometry_seconds = r.geometry_seconds;
  d.image_seconds = r.image_seconds;
  d.bev_seconds = r.bev_seconds;
  for (const Detection& det : r.detections) d.boxes.push_back(to_box(det, cfg.class_names));

  // The document is built once, as an object, and written as text once.
  DetectionsMeta meta;
  meta.stream = r.stream;
  meta.timestamp = r.timestamp;
  meta.frame_index = r.frame_index;
  meta.model = cfg.name + ", weights " + s.weights_name;
  meta.untrained = s.untrained;
  meta.sample_token = r.token;
  nlohmann::json j = detections_to_json(r.detections, cfg.class_names, r.poses, meta);
  j["used_history"] = r.used_history;
  if (!r.history_reset.empty()) j["history_reset"] = r.history_reset;
  d.json = j.dump(1);
  if (r.token && r.poses) {
    NuscResults nusc;
    nusc.add_sample(*r.token, r.detections, cfg.class_names, *r.poses);
    d.sample_token = *r.token;
    d.nuscenes_json = nusc.sample_json(*r.token).dump();
  }
  d.output_seconds = r.decode_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_output).count();

  if (!options.dump_dir.empty()) {
    std::filesystem::create_directories(options.dump_dir);
    const std::string path =
        options.dump_dir + "/" + safe_file_part(r.stream) + "_" + std::to_string(r.frame_index) + ".safetensors";
    write_safetensors(path, r.taps.all());
    log_info("dump: ", r.taps.all().size(), " tensors to ", path);
  }
  if (!options.render_png.empty() || options.render_picture) {
    RenderInput ri;
    for (size_t i = 0; i < r.images.size(); ++i) ri.cameras.push_back({r.camera_names[i], r.images[i], r.lidar2img[i]});
    ri.detections = r.detections;
    ri.class_names = cfg.class_names;
    if (!options.ground_truth_info.empty()) {
      ri.ground_truth = info_ground_truth_at(options.ground_truth_info, r.timestamp, cfg.class_names);
    }
    ri.stream = r.stream;
    ri.timestamp = r.timestamp;
    ri.frame_index = r.frame_index;
    ri.used_history = r.used_history;
    ri.model = cfg.name;
    ri.untrained = s.untrained;
    if (!options.render_png.empty()) {
      render_frame_to_file(ri, options.render_png);
      log_info("render: ", options.render_png);
    }
    if (options.render_picture) {
      const Tensor picture = render_frame(ri);
      d.picture.height = static_cast<int>(picture.size(0));
      d.picture.width = static_cast<int>(picture.size(1));
      const auto* bytes = static_cast<const uint8_t*>(picture.raw_data());
      d.picture.bgr.assign(bytes, bytes + picture.nbytes());
    }
  }
  d.seconds = started_seconds_ago + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_output).count();
  return d;
}

std::vector<StreamStatus> Model::streams() const {
  std::vector<StreamStatus> out;
  for (const StreamInfo& i : impl_->engine->streams().list()) {
    out.push_back({i.id, i.frames, i.last_timestamp, i.idle_seconds, i.has_history, i.busy});
  }
  return out;
}

bool Model::drop_stream(const std::string& id) { return impl_->engine->streams().drop(id); }

StreamTotals Model::stream_totals() const {
  const StreamStats st = impl_->engine->streams().stats();
  return {st.active, st.created, st.evicted_lru, st.evicted_ttl, st.dropped, st.resets_gap, st.resets_backwards,
          st.resets_scene, impl_->engine->runner().nonfinite_frames()};
}

bool Model::untrained() const { return impl_->untrained; }

DeviceInfo Model::device_info() const {
  const BackendInfo b = impl_->engine->backend_info();
  return {b.backend, b.device, b.isa, b.threads, b.precision, b.float_precision};
}

std::string Model::describe() {
  Impl& s = *impl_;
  StageRunner& runner = s.engine->runner();
  std::string stages = runner.describe();
  if (stages.empty()) {
    for (int k = 0; k < 2; ++k) runner.forward(synthetic_frame(s.engine->config(), 1, k));
    runner.reset_history();
    stages = runner.describe();
  }
  char head[256];
  std::snprintf(head, sizeof head, "weights: %.1f MiB (%s)\n", static_cast<double>(s.weight_bytes) / (1 << 20),
                s.weights_name.c_str());
  return config_summary() + "\n" + "backend: " + s.engine->backend_info().summary() + " (" +
         s.engine->backend_info().precision + ")\n" + head + stages;
}

std::string Model::config_summary() const { return bev::config_summary(impl_->engine->config()); }

std::vector<std::string> Model::class_names() const { return impl_->engine->config().class_names; }

}  // namespace bev
