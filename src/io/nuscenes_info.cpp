#include "io/nuscenes_info.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "core/mat4.h"
#include "io/byte_source.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr double kSceneGapSeconds = 2.0;     // a longer gap between keyframes of one log starts a new scene
constexpr double kCamInstanceMatchM = 0.01;  // cam_instances centre vs the box centre through lidar2cam

[[noreturn]] void fail(const std::string& where, const std::string& path, const std::string& problem,
                       const std::string& expected = {}) {
  Error e(ErrorKind::kInvalidInput, problem);
  e.where(path.empty() ? where : where + ": " + path);
  if (!expected.empty()) e.expected(expected);
  throw e;
}

std::string kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    default: return "a value of an unexpected kind";
  }
}

// Reads values at "where: a.b[2].c" with errors naming that path.
struct Node {
  const json& v;
  std::string where;
  std::string path;

  Node at(const std::string& key) const {
    const std::string p = path.empty() ? key : path + "." + key;
    if (!v.is_object()) fail(where, path, "is " + kind_of(v), "an object");
    const auto it = v.find(key);
    if (it == v.end()) fail(where, p, "is missing");
    return {*it, where, p};
  }
  bool has(const std::string& key) const { return v.is_object() && v.contains(key); }
  Node at(size_t i) const { return {v[i], where, path + "[" + std::to_string(i) + "]"}; }
  const json& list() const {
    if (!v.is_array()) fail(where, path, "is " + kind_of(v), "a list");
    return v;
  }
  const json& object() const {
    if (!v.is_object()) fail(where, path, "is " + kind_of(v), "an object");
    return v;
  }
  double number() const {
    if (!v.is_number()) fail(where, path, "is " + kind_of(v), "a number");
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(where, path, "is not finite", "a finite number");
    return x;
  }
  int64_t integer() const {
    if (!v.is_number_integer()) fail(where, path, "is " + kind_of(v), "an integer");
    return v.get<int64_t>();
  }
  std::string text() const {
    if (!v.is_string()) fail(where, path, "is " + kind_of(v), "a string");
    return v.get<std::string>();
  }
  Mat4 mat4() const { return mat4_from_json(v, where, path); }
};

json load_json(const std::string& path) {
  const auto src = ByteSource::map_file(path);
  return parse_python_json(std::string_view(reinterpret_cast<const char*>(src->data()), src->size()), path);
}

std::vector<std::string> read_categories(const Node& root) {
  const Node cats = root.at("metainfo").at("categories");
  std::vector<std::string> names(cats.object().size());
  for (const auto& [name, index] : cats.v.items()) {
    const Node n{index, cats.where, cats.path + "." + name};
    const int64_t i = n.integer();
    if (i < 0 || i >= static_cast<int64_t>(names.size()) || !names[static_cast<size_t>(i)].empty()) {
      fail(n.where, n.path, "is " + std::to_string(i),
           "distinct indices 0.." + std::to_string(names.size() - 1) + " (one per class)");
    }
    names[static_cast<size_t>(i)] = name;
  }
  return names;
}

InfoSample read_sample(const Node& e, size_t index) {
  InfoSample s;
  s.index = index;
  if (e.has("token")) s.token = e.at("token").text();
  s.timestamp = e.at("timestamp").number();
  if (e.has("scene_token")) s.scene_token = e.at("scene_token").text();
  s.ego2global = e.at("ego2global").mat4();
  const Node lidar = e.at("lidar_points");
  s.lidar2ego = lidar.at("lidar2ego").mat4();
  if (lidar.has("lidar_path")) s.lidar_path = lidar.at("lidar_path").text();
  const Node images = e.at("images");
  for (const std::string& name : nuscenes_camera_names()) {
    const Node c = images.at(name);
    InfoCamera cam;
    cam.name = name;
    cam.img_path = c.at("img_path").text();
    if (cam.img_path.empty()) fail(c.where, c.path + ".img_path", "is empty", "the camera's image file");
    const Node k = c.at("cam2img");
    if (k.v.is_array() && k.v.size() == 4) {
      cam.cam2img = k.mat4();
    } else {
      cam.cam2img = mat4_from_intrinsics(mat3_from_json(k.v, k.where, k.path));
    }
    cam.cam2ego = c.at("cam2ego").mat4();
    cam.lidar2cam = c.at("lidar2cam").mat4();
    if (c.has("timestamp")) cam.timestamp = c.at("timestamp").number();
    s.cameras.push_back(std::move(cam));
  }
  return s;
}

// "n015-2018-07-24-11-22-45+0800" of ".../n015-2018-07-24-11-22-45+0800__CAM_FRONT__153240.jpg".
std::string nuscenes_log_name(const std::string& file) {
  const std::string base = fs::path(file).filename().string();
  const auto p = base.find("__");
  return p == std::string::npos || p == 0 ? std::string() : base.substr(0, p);
}

std::string resolve_image(const fs::path& images_dir, const InfoCamera& cam, const std::string& where) {
  // An info file names images under --images: an absolute path or one that climbs out with ".."
  // would have the frames read files the user never pointed at.
  const fs::path rel = fs::path(cam.img_path).lexically_normal();
  if (rel.is_absolute() || rel.empty() || *rel.begin() == "..") {
    throw Error(ErrorKind::kInvalidInput, "img_path '" + cam.img_path + "' leads outside the images folder")
        .where(where)
        .expected("a path inside --images " + images_dir.string() + " (a file name, or samples/CAM/file)");
  }
  const fs::path direct = images_dir / cam.img_path;
  const fs::path tree = images_dir / "samples" / cam.name / cam.img_path;
  std::error_code ec;
  if (fs::is_regular_file(direct, ec)) return direct.string();
  if (fs::is_regular_file(tree, ec)) return tree.string();
  throw Error(ErrorKind::kNotFound, "camera image not found: " + cam.img_path)
      .where(where)
      .expected(direct.string() + " or " + tree.string())
      .hint("--images DIR names the folder that holds the images (or the nuScenes root with samples/)");
}

std::string relative_to(const std::string& file, const fs::path& dir) {
  std::error_code ec;
  const fs::path abs_file = fs::weakly_canonical(fs::absolute(file), ec);
  const fs::path abs_dir = fs::weakly_canonical(fs::absolute(dir), ec);
  const fs::path rel = abs_file.lexically_relative(abs_dir);
  return rel.empty() ? abs_file.string() : rel.generic_string();
}

}  // namespace

json parse_python_json(std::string_view text, const std::string& where) {
  // Python's json.dump writes float('nan') as a bare NaN; outside strings it becomes null.
  std::string fixed;
  size_t copied = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == 'N' && text.compare(i, 3, "NaN") == 0) {
      fixed.append(text.substr(copied, i - copied)).append("null");
      copied = i + 3;
      i += 2;
    }
  }
  if (copied > 0) fixed.append(text.substr(copied));
  const std::string_view input = copied > 0 ? std::string_view(fixed) : text;
  try {
    return json::parse(input.begin(), input.end());
  } catch (const json::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    Error err(ErrorKind::kInvalidInput, "not valid JSON: " + msg);
    err.where(where);
    if (copied == 0) err.at_offset(e.byte == 0 ? 0 : e.byte - 1);  // offsets shift where NaN was replaced
    throw err;
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("not valid JSON: ") + e.what()).where(where);
  }
}

const std::vector<std::string>& nuscenes_camera_names() {
  static const std::vector<std::string> names = {"CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                                 "CAM_BACK",  "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};
  return names;
}

NuScenesInfo read_nuscenes_info(const std::string& path) {
  const json j = load_json(path);
  const Node root{j, path, ""};
  NuScenesInfo info;
  info.path = path;
  info.categories = read_categories(root);
  const Node list = root.at("data_list");
  for (size_t i = 0; i < list.list().size(); ++i) info.samples.push_back(read_sample(list.at(i), i));
  if (info.samples.empty()) fail(path, "data_list", "is empty", "at least one sample");
  return info;
}

std::vector<Frame> info_to_frames(const NuScenesInfo& info, const std::string& out_dir,
                                      const ConvertInfoOptions& options) {
  const fs::path info_dir = fs::path(info.path).parent_path();
  const fs::path images_dir = options.images_dir.empty() ? (info_dir.empty() ? fs::path(".") : info_dir)
                                                         : fs::path(options.images_dir);
  const std::string stream = options.stream.empty() ? fs::path(info.path).stem().string() : options.stream;
  if (stream.empty()) throw Error(ErrorKind::kInvalidInput, "the stream id is empty").expected("--stream ID");

  std::vector<const InfoSample*> order;
  for (const InfoSample& s : info.samples) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(),
                   [](const InfoSample* a, const InfoSample* b) { return a->timestamp < b->timestamp; });

  struct LogRun {
    double last = 0;
    int run = 0;
  };
  std::map<std::string, LogRun> logs;
  std::vector<Frame> frames;
  for (const InfoSample* s : order) {
    const std::string where = info.path + ": data_list[" + std::to_string(s->index) + "]";
    Frame f;
    f.stream = stream;
    f.timestamp = s->timestamp;
    if (options.scene) {
      f.scene = *options.scene;
    } else if (s->scene_token) {
      f.scene = *s->scene_token;
    } else {
      const std::string log = nuscenes_log_name(s->lidar_path.empty() ? s->cameras[0].img_path : s->lidar_path);
      if (!log.empty()) {
        auto [it, inserted] = logs.try_emplace(log, LogRun{s->timestamp, 0});
        if (!inserted && s->timestamp - it->second.last > kSceneGapSeconds) ++it->second.run;
        it->second.last = s->timestamp;
        f.scene = log + "/" + std::to_string(it->second.run);
      }
    }
    if (!s->token.empty()) f.token = s->token;
    f.T_world_from_ego = s->ego2global;
    f.T_ego_from_lidar = s->lidar2ego;
    for (const InfoCamera& c : s->cameras) {
      Camera cam;
      cam.name = c.name;
      cam.image_path = relative_to(resolve_image(images_dir, c, where + ".images." + c.name), out_dir);
      cam.lidar2img = mat4_mul(c.cam2img, c.lidar2cam);
      f.cameras.push_back(std::move(cam));
    }
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<std::string> convert_info(const std::string& info_path, const std::string& out_dir,
                                      const ConvertInfoOptions& options) {
  const NuScenesInfo info = read_nuscenes_info(info_path);
  const std::vector<Frame> frames = info_to_frames(info, out_dir, options);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) {
    throw Error(ErrorKind::kIo, "cannot create the output folder" + (ec ? ": " + ec.message() : std::string()))
        .where(out_dir);
  }
  const size_t digits = std::max<size_t>(4, std::to_string(frames.size() - 1).size());
  std::vector<std::string> paths;
  for (size_t k = 0; k < frames.size(); ++k) {
    std::string number = std::to_string(k);
    number.insert(0, digits - std::min(digits, number.size()), '0');
    const std::string name = "frame_" + number + ".json";
    const std::string path = (fs::path(out_dir) / name).string();
    const std::string text = frame_json_text(frames[k]);
    parse_frame_json(text, path);  // the reader's checks (rigid poses, finite numbers) before writing
    write_frame_json(path, frames[k]);
    paths.push_back(path);
  }
  return paths;
}

std::vector<GtBox> read_info_ground_truth(const std::string& info_path, size_t entry) {
  const json j = load_json(info_path);
  const Node root{j, info_path, ""};
  const std::vector<std::string> categories = read_categories(root);
  const Node list = root.at("data_list");
  if (entry >= list.list().size()) {
    throw Error(ErrorKind::kNotFound, "no entry " + std::to_string(entry) + " in data_list")
        .where(info_path)
        .expected("an index below " + std::to_string(list.v.size()));
  }
  const Node e = list.at(entry);
  std::vector<GtBox> boxes;
  std::vector<int64_t> labels;
  if (!e.has("instances")) return boxes;
  const Node instances = e.at("instances");
  for (size_t i = 0; i < instances.list().size(); ++i) {
    const Node in = instances.at(i);
    const Node label_node = in.at("bbox_label_3d");
    const int64_t label = label_node.integer();
    if (label == -1) continue;  // not one of the detection classes
    if (label < 0 || label >= static_cast<int64_t>(categories.size())) {
      fail(label_node.where, label_node.path, "is " + std::to_string(label),
           "-1 or a metainfo.categories index below " + std::to_string(categories.size()));
    }
    GtBox b;
    b.class_name = categories[static_cast<size_t>(label)];
    const Node box = in.at("bbox_3d");
    if (box.list().size() < 7) fail(box.where, box.path, "has " + std::to_string(box.v.size()) + " numbers", "7 (x, y, z, l, w, h, yaw)");
    for (size_t k = 0; k < 7; ++k) b.box[k] = box.at(k).number();
    b.velocity = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
    if (in.has("velocity")) {
      const Node v = in.at("velocity");
      if (v.list().size() < 2) fail(v.where, v.path, "has " + std::to_string(v.v.size()) + " numbers", "2 (vx, vy)");
      for (size_t k = 0; k < 2; ++k) {
        if (!v.v[k].is_null()) b.velocity[k] = v.at(k).number();
      }
    }
    if (in.has("num_lidar_pts")) b.num_lidar_pts = in.at("num_lidar_pts").integer();
    if (in.has("bbox_3d_isvalid")) {
      const Node valid = in.at("bbox_3d_isvalid");
      if (!valid.v.is_boolean()) fail(valid.where, valid.path, "is " + kind_of(valid.v), "a boolean");
      b.valid = valid.v.get<bool>();
    }
    boxes.push_back(std::move(b));
    labels.push_back(label);
  }
  if (!e.has("cam_instances")) return boxes;
  // Per camera, each cam_instance's bbox_3d[0:3] is the box's centre (x, y, z) in that camera's frame.
  const Node cams = e.at("cam_instances");
  const Node images = e.at("images");
  for (const std::string& name : nuscenes_camera_names()) {
    if (!cams.has(name)) continue;
    const Mat4 l2c = images.at(name).at("lidar2cam").mat4();
    const Node list_c = cams.at(name);
    for (size_t i = 0; i < list_c.list().size(); ++i) {
      const Node ci = list_c.at(i);
      const int64_t label = ci.at("bbox_label_3d").integer();
      const Node cb = ci.at("bbox_3d");
      if (cb.list().size() < 3) fail(cb.where, cb.path, "has " + std::to_string(cb.v.size()) + " numbers", "at least 3");
      const double cx = cb.at(0).number(), cy = cb.at(1).number(), cz = cb.at(2).number();
      size_t best = boxes.size();
      double best_d = kCamInstanceMatchM;
      for (size_t k = 0; k < boxes.size(); ++k) {
        if (labels[k] != label) continue;
        const auto& bx = boxes[k].box;
        const double p[3] = {l2c[0] * bx[0] + l2c[1] * bx[1] + l2c[2] * bx[2] + l2c[3],
                             l2c[4] * bx[0] + l2c[5] * bx[1] + l2c[6] * bx[2] + l2c[7],
                             l2c[8] * bx[0] + l2c[9] * bx[1] + l2c[10] * bx[2] + l2c[11]};
        const double d = std::hypot(p[0] - cx, p[1] - cy, p[2] - cz);
        if (d < best_d) {
          best_d = d;
          best = k;
        }
      }
      if (best < boxes.size() && (boxes[best].cameras.empty() || boxes[best].cameras.back() != name)) {
        boxes[best].cameras.push_back(name);
      }
    }
  }
  return boxes;
}

}  // namespace bev
