#include "bevformer/model.h"

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "backend/backend.h"
#include "bevformer/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/detections_json.h"
#include "io/frame_json.h"
#include "io/nuscenes_info.h"
#include "io/safetensors.h"
#include "model/bevformer.h"
#include "model/synthetic.h"
#include "render/render.h"
#include "runtime/prepare.h"
#include "runtime/streams.h"

namespace bev {

struct Model::Impl {
  ModelConfig cfg;
  bool untrained = false;
  std::string weights_name;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<BevFormer> model;
  std::unique_ptr<StreamRegistry> streams;
  std::unique_ptr<ThreadPool> prepare_pool;  // image decoding and preprocessing
  std::mutex prepare_pool_mu;                // the pool takes one caller at a time
  uint64_t weight_bytes = 0;                 // the checkpoint's tensors
};

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
  nlohmann::json doc = NuscResults().to_json();  // the meta block, and an empty results object
  for (const Detections& d : frames) {
    if (d.nuscenes_json.empty()) {
      throw Error(ErrorKind::kInvalidInput, "frame of stream '" + d.stream + "' at t=" + std::to_string(d.timestamp) +
                                                " has no sample token or no ego pose")
          .expected("\"token\" and \"T_world_from_ego\" in the frame (convert-info writes both)");
    }
    if (doc["results"].contains(d.sample_token)) {
      throw Error(ErrorKind::kInvalidInput, "sample token '" + d.sample_token + "' appears twice");
    }
    doc["results"][d.sample_token] = nlohmann::json::parse(d.nuscenes_json);
  }
  return doc.dump();
}

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
  s.cfg = load_config(config);
  const auto t0 = std::chrono::steady_clock::now();
  Checkpoint ck;
  if (weights.empty()) {
    log_info("model: no weights given: seeded random weights (seed ", knobs.seed, "), UNTRAINED: detections are meaningless");
    ck = random_checkpoint(s.cfg, knobs.seed);
    s.untrained = true;
    s.weights_name = "random (seed " + std::to_string(knobs.seed) + ")";
  } else {
    log_info("model: loading ", weights);
    ck = load_checkpoint(weights);
    s.weights_name = weights;
  }
  s.backend = make_cpu_backend(knobs.threads, parse_precision(knobs.precision, "knobs"));
  s.model = std::make_unique<BevFormer>(s.cfg, ck, *s.backend, knobs.replay, knobs.pipeline);
  for (const auto& [name, t] : ck.tensors()) s.weight_bytes += t.nbytes();
  s.streams = std::make_unique<StreamRegistry>(StreamLimits{knobs.max_streams, knobs.stream_ttl_seconds, knobs.max_gap_seconds});
  s.prepare_pool = std::make_unique<ThreadPool>(knobs.threads);
  log_info("model: ", s.cfg.name, " ready in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
  return m;
}

Detections Model::detect_file(const std::string& frame_json_path, const DetectOptions& options) {
  std::ifstream in(frame_json_path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kNotFound, "cannot open the frame file").where(frame_json_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::filesystem::path dir = std::filesystem::path(frame_json_path).parent_path();
  return detect_text(text, dir.empty() ? "." : dir.string(), frame_json_path, options);
}

Detections Model::detect(const std::string& frame_json, const std::string& base_dir, const DetectOptions& options) {
  return detect_text(frame_json, base_dir, "frame", options);
}

Detections Model::detect(const std::string& frame_json, const AttachedImages& images, const DetectOptions& options) {
  return detect_text(frame_json, "", "frame", options, &images);
}

namespace {

// Fills the cameras' images from `images` by the names their "image" fields give.
void attach_images(FrameSpec& spec, const AttachedImages& images, const std::string& where) {
  std::set<std::string_view> used;
  for (size_t i = 0; i < spec.cameras.size(); ++i) {
    CameraSpec& cam = spec.cameras[i];
    if (cam.image_path.empty()) continue;  // inline base64
    const auto it = images.find(cam.image_path);
    if (it == images.end()) {
      throw Error(ErrorKind::kInvalidInput, "names the image '" + cam.image_path + "' but no such image was attached")
          .where(where + ": cameras[" + std::to_string(i) + "].image")
          .expected("one of the attached images (names: the multipart part names)");
    }
    cam.image_bytes.assign(it->second.begin(), it->second.end());
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
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  FrameSpec spec = parse_frame_json(text, where);
  if (images) attach_images(spec, *images, where);
  PreparedFrame frame;
  {
    // ThreadPool::parallel_for is not for concurrent callers (frames of several streams at once
    // deadlock it): a frame that finds the pool taken decodes its images on its own thread, so
    // concurrent frames still overlap their preparation.
    std::unique_lock pool_lock(s.prepare_pool_mu, std::try_to_lock);
    frame = prepare_frame(spec, s.cfg, base_dir, pool_lock.owns_lock() ? s.prepare_pool.get() : nullptr);
  }
  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };

  Detections d;
  d.prepare_seconds = seconds_since(t0);
  d.stream = frame.stream;
  d.timestamp = frame.timestamp;
  d.scene = frame.input.scene_token;
  d.untrained = s.untrained;
  FrameOutput out;
  int64_t frame_index = 0;
  Taps taps;
  {
    StreamRegistry::Lease lease = s.streams->acquire(frame.stream);
    d.history_reset = lease.begin_frame(frame.timestamp);
    if (!d.history_reset.empty()) log_info("stream ", frame.stream, ": history dropped: ", d.history_reset);
    for (const StreamInfo& info : s.streams->list()) {
      if (info.id == frame.stream) frame_index = static_cast<int64_t>(info.frames);
    }
    out = s.model->forward(frame.input, lease.history(), options.dump_dir.empty() ? nullptr : &taps);
    lease.end_frame(frame.timestamp);
  }
  const auto t_output = std::chrono::steady_clock::now();
  d.geometry_seconds = out.geometry_seconds;
  d.image_seconds = out.image_seconds;
  d.bev_seconds = out.bev_seconds;
  d.used_history = out.used_history;
  for (const Detection& det : out.detections) d.boxes.push_back(to_box(det, s.cfg.class_names));

  std::optional<FramePoses> poses;
  if (frame.T_world_from_ego) poses = FramePoses{*frame.T_world_from_ego, frame.T_ego_from_lidar};
  DetectionsMeta meta;
  meta.stream = frame.stream;
  meta.timestamp = frame.timestamp;
  meta.frame_index = frame_index;
  meta.model = s.cfg.name + ", weights " + s.weights_name;
  meta.untrained = s.untrained;
  meta.sample_token = spec.token;
  nlohmann::json j = detections_to_json(out.detections, s.cfg.class_names, poses, meta);
  j["used_history"] = out.used_history;
  if (!d.history_reset.empty()) j["history_reset"] = d.history_reset;
  d.json = j.dump(1);
  if (spec.token && poses) {
    NuscResults nusc;
    nusc.add_sample(*spec.token, out.detections, s.cfg.class_names, *poses);
    d.sample_token = *spec.token;
    d.nuscenes_json = nusc.to_json()["results"][*spec.token].dump();
  }
  d.output_seconds = out.decode_seconds + seconds_since(t_output);

  if (!options.dump_dir.empty()) {
    std::filesystem::create_directories(options.dump_dir);
    const std::string path = options.dump_dir + "/" + safe_file_part(frame.stream) + "_" + std::to_string(frame_index) +
                             ".safetensors";
    write_safetensors(path, taps.all());
    log_info("dump: ", taps.all().size(), " tensors to ", path);
  }
  if (!options.render_png.empty()) {
    RenderInput r;
    for (size_t i = 0; i < frame.images.size(); ++i) {
      r.cameras.push_back({frame.camera_names[i], frame.images[i], frame.lidar2img_original[i]});
    }
    r.detections = out.detections;
    r.class_names = s.cfg.class_names;
    if (!options.ground_truth_info.empty()) {
      r.ground_truth = info_ground_truth_at(options.ground_truth_info, frame.timestamp, s.cfg.class_names);
    }
    r.stream = frame.stream;
    r.timestamp = frame.timestamp;
    r.frame_index = frame_index;
    r.model = s.cfg.name;
    r.untrained = s.untrained;
    render_frame_to_file(r, options.render_png);
    log_info("render: ", options.render_png);
  }
  d.seconds = seconds_since(t0);
  return d;
}

std::vector<StreamStatus> Model::streams() const {
  std::vector<StreamStatus> out;
  for (const StreamInfo& i : impl_->streams->list()) {
    out.push_back({i.id, i.frames, i.last_timestamp, i.idle_seconds, i.has_history, i.busy});
  }
  return out;
}

bool Model::drop_stream(const std::string& id) { return impl_->streams->drop(id); }

StreamTotals Model::stream_totals() const {
  const StreamStats st = impl_->streams->stats();
  return {st.active, st.created, st.evicted_lru, st.evicted_ttl, st.dropped, st.resets_gap, st.resets_backwards};
}

bool Model::untrained() const { return impl_->untrained; }

std::string Model::describe() {
  Impl& s = *impl_;
  std::string plans = s.model->describe();
  if (plans.empty()) {
    for (int k = 0; k < 2; ++k) s.model->forward(synthetic_frame(s.cfg, 1, k));
    s.model->reset_history();
    plans = s.model->describe();
  }
  char head[256];
  std::snprintf(head, sizeof head, "weights: %.1f MiB (%s)\n", static_cast<double>(s.weight_bytes) / (1 << 20),
                s.weights_name.c_str());
  return config_summary() + "\n" + head + plans;
}

std::string Model::config_summary() const { return bev::config_summary(impl_->cfg); }

std::vector<std::string> Model::class_names() const { return impl_->cfg.class_names; }

}  // namespace bev
