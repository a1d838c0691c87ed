#include "io/golden_set.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <unordered_map>

#include "bevformer/error.h"
#include "core/compare.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open the file").where(path);
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("not valid JSON: ") + e.what()).where(path).at_offset(e.byte);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("JSON cannot be read: ") + e.what()).where(path);
  }
}

Error bad_meta(const std::string& path, const std::string& key, const std::string& problem,
               const std::string& expected) {
  Error e(ErrorKind::kInvalidInput, problem);
  e.where(path + ": \"" + key + "\"").expected(expected);
  return e;
}

double json_number(const json& v, const std::string& path, const std::string& key) {
  if (!v.is_number()) throw bad_meta(path, key, "not a number: " + v.dump(), "a number");
  return v.get<double>();
}

const Tensor& need_tensor(const Checkpoint& ck, const std::string& name) {
  const Tensor* t = ck.find(name);
  if (!t) {
    throw Error(ErrorKind::kInvalidInput, "the frame has no tensor '" + name + "'").where(ck.path);
  }
  return *t;
}

void check_tensor(const Checkpoint& ck, const std::string& name, const Tensor& t, bool want_float, size_t dims) {
  const bool is_float = dtype_is_float(t.dtype());
  if (is_float != want_float || t.dim() != static_cast<int64_t>(dims)) {
    throw Error(ErrorKind::kInvalidInput, "tensor '" + name + "' is " + t.describe())
        .where(ck.path)
        .expected(std::string(want_float ? "a float" : "an integer") + " tensor of " + std::to_string(dims) +
                  " dimension(s)");
  }
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The pipeline order of the golden names; entries ending in '.' are prefixes (numbered tensors).
const std::vector<std::string>& pipeline_order() {
  static const std::vector<std::string> order = {
      "img",                  "backbone.",        "neck.",
      "dbg.spatial_shapes",   "dbg.level_start_index", "dbg.reference_points_cam",
      "dbg.bev_mask",         "dbg.bev_mask_count",    "dbg.can_bus",
      "dbg.shift",            "dbg.bev_pos",           "dbg.bev_query_in",
      "dbg.prev_bev_rotated", "dbg.enc_layer.",        "bev_embed",
      "dbg.init_reference",   "dbg.inter_states",      "dbg.inter_references",
      "all_cls_scores",       "all_bbox_preds",        "det.",
  };
  return order;
}

// The number after the last '.', for numbered tensors ("backbone.10" after "backbone.9").
int64_t numeric_suffix(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot + 1 >= name.size()) return -1;
  int64_t v = 0;
  for (size_t i = dot + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
    if (v > (int64_t{1} << 40)) return -1;
  }
  return v;
}

std::string key_text(const DetectionRecord& d) {
  return "(query " + std::to_string(d.query) + ", label " + std::to_string(d.label) + ")";
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// m = max(m, v), where a NaN wins and stays: a NaN difference must show and fail. True when m changed.
bool raise_max(double& m, double v) {
  if (std::isnan(m) || !(std::isnan(v) || v > m)) return false;
  m = v;
  return true;
}

constexpr size_t kMaxProblems = 8;

void add_problem(GoldenDetectionResult& r, size_t& count, std::string text) {
  ++count;
  if (r.problems.size() < kMaxProblems) r.problems.push_back(std::move(text));
}

}  // namespace

GoldenSetFiles find_golden_set(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::kNotFound, "golden set directory not found")
        .where(dir)
        .expected("a directory with config.json, checkpoint.pth (or weights.safetensors), frame<k>.safetensors "
                  "and frame<k>_meta.json");
  }
  GoldenSetFiles s;
  s.dir = dir;
  s.config_path = join(dir, "config.json");
  if (!is_file(s.config_path)) {
    throw Error(ErrorKind::kNotFound, "the golden set has no config.json").where(dir);
  }
  for (const char* name : {"checkpoint.pth", "weights.safetensors"}) {
    if (is_file(join(dir, name))) {
      s.checkpoint_path = join(dir, name);
      break;
    }
  }
  if (s.checkpoint_path.empty()) {
    throw Error(ErrorKind::kNotFound, "the golden set has no checkpoint").where(dir)
        .expected("checkpoint.pth or weights.safetensors");
  }
  for (size_t k = 0;; ++k) {
    const std::string stem = "frame" + std::to_string(k);
    const std::string tensors = join(dir, stem + ".safetensors"), meta = join(dir, stem + "_meta.json");
    const bool has_tensors = is_file(tensors), has_meta = is_file(meta);
    if (!has_tensors && !has_meta) break;
    if (!has_tensors) {
      throw Error(ErrorKind::kNotFound, "frame " + std::to_string(k) + " has a meta file but no tensors").where(tensors);
    }
    if (!has_meta) {
      throw Error(ErrorKind::kNotFound, "frame " + std::to_string(k) + " has tensors but no meta file").where(meta);
    }
    s.frame_tensor_paths.push_back(tensors);
    s.frame_meta_paths.push_back(meta);
  }
  if (s.frame_tensor_paths.empty()) {
    throw Error(ErrorKind::kNotFound, "the golden set has no frames").where(dir)
        .expected("frame0.safetensors and frame0_meta.json (then frame1, ...)");
  }
  const std::string summary = join(dir, "golden.json");
  if (is_file(summary)) {
    s.summary_path = summary;
    const json j = read_json_file(summary);
    if (!j.is_object()) throw Error(ErrorKind::kInvalidInput, "not a JSON object").where(summary);
    if (j.contains("frames")) {
      if (!j["frames"].is_array()) {
        throw Error(ErrorKind::kInvalidInput, "\"frames\" is not an array").where(summary);
      }
      if (j["frames"].size() != s.num_frames()) {
        throw Error(ErrorKind::kInvalidInput, "golden.json lists " + std::to_string(j["frames"].size()) +
                                                  " frames, the directory has " + std::to_string(s.num_frames()))
            .where(dir)
            .hint("a frame<k>.safetensors or frame<k>_meta.json is missing, or golden.json is from another set");
      }
    }
  }
  return s;
}

GoldenFrame load_golden_frame(const GoldenSetFiles& set, size_t k) {
  if (k >= set.num_frames()) {
    throw Error(ErrorKind::kNotFound, "frame " + std::to_string(k) + " is not in the set").where(set.dir);
  }
  GoldenFrame f;
  f.index = k;
  f.tensors_path = set.frame_tensor_paths[k];
  f.meta_path = set.frame_meta_paths[k];
  f.tensors = load_checkpoint(f.tensors_path);
  f.meta = read_json_file(f.meta_path);
  const std::string& mp = f.meta_path;
  if (!f.meta.is_object()) throw Error(ErrorKind::kInvalidInput, "not a JSON object").where(mp);

  // The image: f32 [N, 3, H, W].
  f.img = need_tensor(f.tensors, "img");
  check_tensor(f.tensors, "img", f.img, true, 4);
  if (f.img.dtype() != DType::kF32 || f.img.size(1) != 3 || f.img.size(0) < 1) {
    throw Error(ErrorKind::kInvalidInput, "tensor 'img' is " + f.img.describe())
        .where(f.tensors_path)
        .expected("f32[N, 3, H, W]");
  }
  const size_t cams = static_cast<size_t>(f.img.size(0));

  const json* frame_no = f.meta.contains("frame") ? &f.meta["frame"] : nullptr;
  if (frame_no && frame_no->is_number_integer() && frame_no->get<int64_t>() != static_cast<int64_t>(k)) {
    throw bad_meta(mp, "frame", "the meta file says frame " + f.meta["frame"].dump(), "frame " + std::to_string(k));
  }
  if (!f.meta.contains("scene_token") || !f.meta["scene_token"].is_string()) {
    throw bad_meta(mp, "scene_token", "missing or not a string", "the frame's scene token (a string)");
  }
  f.scene_token = f.meta["scene_token"].get<std::string>();

  if (!f.meta.contains("can_bus") || !f.meta["can_bus"].is_array() || f.meta["can_bus"].size() != 18) {
    throw bad_meta(mp, "can_bus", f.meta.contains("can_bus") ? "has the wrong form" : "missing",
                   "18 numbers (raw, before the test-time delta)");
  }
  for (size_t i = 0; i < 18; ++i) f.can_bus[i] = json_number(f.meta["can_bus"][i], mp, "can_bus");

  const std::string l2i_expected = std::to_string(cams) + " x 4 x 4 numbers (one row-major matrix per camera of 'img')";
  if (!f.meta.contains("lidar2img") || !f.meta["lidar2img"].is_array()) {
    throw bad_meta(mp, "lidar2img", "missing or not an array", l2i_expected);
  }
  const json& l2i = f.meta["lidar2img"];
  if (l2i.size() != cams) {
    throw bad_meta(mp, "lidar2img", "has " + std::to_string(l2i.size()) + " matrices, 'img' has " +
                                        std::to_string(cams) + " cameras", l2i_expected);
  }
  f.lidar2img.resize(cams);
  for (size_t c = 0; c < cams; ++c) {
    const json& m = l2i[c];
    for (size_t r = 0; r < 4; ++r) {
      if (!m.is_array() || m.size() != 4 || !m[r].is_array() || m[r].size() != 4) {
        throw bad_meta(mp, "lidar2img", "matrix " + std::to_string(c) + " is not 4 x 4", l2i_expected);
      }
      for (size_t col = 0; col < 4; ++col) f.lidar2img[c][r * 4 + col] = json_number(m[r][col], mp, "lidar2img");
    }
  }

  // The detections: all four det.* tensors or none.
  static const char* kDet[] = {"det.boxes_3d", "det.scores_3d", "det.labels_3d", "det.query_index"};
  size_t present = 0;
  for (const char* n : kDet) present += f.tensors.find(n) ? 1 : 0;
  if (present != 0 && present != 4) {
    throw Error(ErrorKind::kInvalidInput, "the frame has only some of the detection tensors")
        .where(f.tensors_path)
        .expected("all of det.boxes_3d, det.scores_3d, det.labels_3d, det.query_index, or none");
  }
  if (present == 4) {
    const Tensor& boxes = *f.tensors.find(kDet[0]);
    const Tensor& scores = *f.tensors.find(kDet[1]);
    const Tensor& labels = *f.tensors.find(kDet[2]);
    const Tensor& query = *f.tensors.find(kDet[3]);
    check_tensor(f.tensors, kDet[0], boxes, true, 2);
    check_tensor(f.tensors, kDet[1], scores, true, 1);
    check_tensor(f.tensors, kDet[2], labels, false, 1);
    check_tensor(f.tensors, kDet[3], query, false, 1);
    const int64_t n = boxes.size(0);
    if (boxes.size(1) != 9 || scores.size(0) != n || labels.size(0) != n || query.size(0) != n) {
      throw Error(ErrorKind::kInvalidInput, "detection tensors of inconsistent shapes: boxes " + boxes.describe() +
                                                ", scores " + scores.describe() + ", labels " + labels.describe() +
                                                ", query_index " + query.describe())
          .where(f.tensors_path)
          .expected("boxes [K, 9], scores [K], labels [K], query_index [K]");
    }
    const Tensor b = boxes.to(DType::kF64), s = scores.to(DType::kF64);
    const Tensor l = labels.to(DType::kI64), q = query.to(DType::kI64);
    f.has_detections = true;
    f.detections.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      DetectionRecord& d = f.detections[static_cast<size_t>(i)];
      for (int64_t j = 0; j < 9; ++j) d.box[static_cast<size_t>(j)] = b.data<double>()[i * 9 + j];
      d.score = s.data<double>()[i];
      d.label = l.data<int64_t>()[i];
      d.query = q.data<int64_t>()[i];
    }
  }
  return f;
}

bool golden_tensor_is_exact(DType dtype) { return !dtype_is_float(dtype); }

GoldenTensorResult compare_golden_tensor(const std::string& name, const Tensor& got, const Tensor& want,
                                         double tolerance) {
  GoldenTensorResult r;
  r.name = name;
  r.dtype = dtype_name(want.dtype());
  r.shape = want.shape();
  r.exact = golden_tensor_is_exact(want.dtype());
  if (!got.defined()) {
    r.status = GoldenTensorResult::Status::kNotProduced;
    return r;
  }
  r.tapped_shape = got.shape();
  if (got.shape() != want.shape()) {
    r.status = GoldenTensorResult::Status::kMismatch;
    r.note = "tapped " + got.describe() + ", golden " + want.describe();
    return r;
  }
  const TensorDiff d = compare(got, want);
  r.relative_l2 = d.relative_l2;
  r.max_abs = d.max_abs;
  // Written so that NaN fails.
  const bool ok = r.exact ? (d.max_abs == 0.0 && d.relative_l2 == 0.0) : (d.relative_l2 <= tolerance);
  r.status = ok ? GoldenTensorResult::Status::kOk : GoldenTensorResult::Status::kOverTolerance;
  if (std::isnan(d.relative_l2) || std::isnan(d.max_abs)) r.note = "non-finite values";
  else if (r.exact) r.note = "exact";
  return r;
}

int golden_pipeline_rank(const std::string& name) {
  const auto& order = pipeline_order();
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string& o = order[i];
    if (o.back() == '.' ? starts_with(name, o) : name == o) return static_cast<int>(i);
  }
  return static_cast<int>(order.size());
}

std::vector<GoldenTensorResult> compare_golden_tensors(const Checkpoint& golden,
                                                       const std::vector<std::pair<std::string, Tensor>>& taps,
                                                       double tolerance) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : taps) by_name.emplace(name, &t);  // the first of a repeated name
  std::vector<GoldenTensorResult> out;
  for (const auto& [name, want] : golden.tensors()) {
    if (starts_with(name, "det.")) continue;
    const auto it = by_name.find(name);
    out.push_back(compare_golden_tensor(name, it == by_name.end() ? Tensor() : *it->second, want, tolerance));
  }
  std::stable_sort(out.begin(), out.end(), [](const GoldenTensorResult& a, const GoldenTensorResult& b) {
    const int ra = golden_pipeline_rank(a.name), rb = golden_pipeline_rank(b.name);
    if (ra != rb) return ra < rb;
    return numeric_suffix(a.name) < numeric_suffix(b.name);
  });
  return out;
}

GoldenDetectionResult compare_detections(const std::vector<DetectionRecord>& ours,
                                         const std::vector<DetectionRecord>& golden,
                                         const DetectionTolerance& tol) {
  GoldenDetectionResult r;
  r.golden = golden.size();
  r.ours = ours.size();
  using Key = std::pair<int64_t, int64_t>;
  std::map<Key, size_t> our_index, golden_index;
  size_t failures = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (!our_index.emplace(Key{ours[i].query, ours[i].label}, i).second) {
      add_problem(r, failures, "ours has " + key_text(ours[i]) + " twice");
    }
  }
  for (size_t i = 0; i < golden.size(); ++i) golden_index.emplace(Key{golden[i].query, golden[i].label}, i);

  // Near ties in the golden ranking may swap; at the cut the unseen next rank is a neighbour too,
  // so one of ours that is not in the set is explained when it ties the set's lowest score.
  std::vector<bool> ambiguous(golden.size(), false);
  for (size_t i = 0; i < golden.size(); ++i) {
    const bool tie_before = i > 0 && std::fabs(golden[i].score - golden[i - 1].score) <= tol.score_tie;
    const bool tie_after = i + 1 < golden.size() && std::fabs(golden[i].score - golden[i + 1].score) <= tol.score_tie;
    ambiguous[i] = tie_before || tie_after;
  }
  for (const DetectionRecord& d : ours) {
    if (golden_index.count(Key{d.query, d.label})) continue;
    if (!golden.empty() && std::fabs(d.score - golden.back().score) <= tol.score_tie) {
      ambiguous.back() = true;  // swapped across the cut with the set's last one
      continue;
    }
    ++r.extra;
    add_problem(r, failures, "ours has " + key_text(d) + " (score " + num(d.score) + ") that the set does not");
  }

  static constexpr size_t kMetres[] = {0, 1, 2, 3, 4, 5, 7, 8};
  for (size_t i = 0; i < golden.size(); ++i) {
    const DetectionRecord& g = golden[i];
    if (ambiguous[i]) ++r.ambiguous;
    else ++r.compared;
    const auto it = our_index.find(Key{g.query, g.label});
    if (it == our_index.end()) {
      if (!ambiguous[i]) {
        add_problem(r, failures, "missing " + key_text(g) + " at golden rank " + std::to_string(i) + " (score " +
                                     num(g.score) + ")");
      }
      continue;
    }
    if (!ambiguous[i]) ++r.matched;
    const DetectionRecord& o = ours[it->second];
    double box = 0;
    size_t worst = 0;
    for (size_t j : kMetres) {
      const double e = std::fabs(o.box[j] - g.box[j]);
      if (raise_max(box, e)) worst = j;
    }
    const double yaw = std::fabs(std::remainder(o.box[6] - g.box[6], 2 * std::numbers::pi));
    const double score = std::fabs(o.score - g.score);
    raise_max(r.max_box_diff, box);
    raise_max(r.max_yaw_diff, yaw);
    raise_max(r.max_score_diff, score);
    if (!(box <= tol.box_m) || !(yaw <= tol.yaw_rad) || !(score <= tol.score)) {
      static const char* kField[] = {"x", "y", "z", "w", "l", "h", "yaw", "vx", "vy"};
      std::string what;
      if (!(box <= tol.box_m)) what += " box." + std::string(kField[worst]) + " off by " + num(box);
      if (!(yaw <= tol.yaw_rad)) what += " yaw off by " + num(yaw) + " rad";
      if (!(score <= tol.score)) what += " score off by " + num(score);
      ++r.out_of_tolerance;
      add_problem(r, failures, key_text(g) + " at golden rank " + std::to_string(i) + ":" + what);
    }
  }
  if (failures > r.problems.size()) {
    r.problems.push_back("... and " + std::to_string(failures - r.problems.size()) + " more");
  }
  r.ok = failures == 0;
  return r;
}

std::vector<std::pair<std::string, Tensor>> detection_tensors(const std::vector<DetectionRecord>& detections) {
  const auto n = static_cast<int64_t>(detections.size());
  Tensor boxes = Tensor::empty({n, 9}, DType::kF32);
  Tensor scores = Tensor::empty({n}, DType::kF32);
  Tensor labels = Tensor::empty({n}, DType::kI64);
  Tensor query = Tensor::empty({n}, DType::kI64);
  for (int64_t i = 0; i < n; ++i) {
    const DetectionRecord& d = detections[static_cast<size_t>(i)];
    for (int64_t j = 0; j < 9; ++j) boxes.data<float>()[i * 9 + j] = static_cast<float>(d.box[static_cast<size_t>(j)]);
    scores.data<float>()[i] = static_cast<float>(d.score);
    labels.data<int64_t>()[i] = d.label;
    query.data<int64_t>()[i] = d.query;
  }
  return {{"det.boxes_3d", boxes}, {"det.scores_3d", scores}, {"det.labels_3d", labels}, {"det.query_index", query}};
}

}  // namespace bev
