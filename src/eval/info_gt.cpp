#include "eval/info_gt.h"

#include <cmath>
#include <limits>

#include "bevformer/error.h"
#include "eval/detection_config.h"
#include "io/detections_json.h"

namespace bev::eval {

namespace {

using M4 = std::array<double, 16>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

[[noreturn]] void fail(const std::string& where, const std::string& path, const std::string& problem,
                       const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where(where + ": " + path).expected(expected);
}

const ojson& at(const ojson& j, const std::string& key, const std::string& where, const std::string& path) {
  if (!j.is_object() || !j.contains(key)) fail(where, path + "." + key, "is missing", "the mmdet3d info v1.1 layout");
  return j.at(key);
}

double number(const ojson& v, const std::string& where, const std::string& path) {
  if (!v.is_number()) fail(where, path, "is " + v.dump(), "a number");
  return v.get<double>();
}

M4 matrix(const ojson& v, const std::string& where, const std::string& path) {
  if (!v.is_array() || v.size() != 4) fail(where, path, "is not a 4x4 matrix", "4 rows of 4 numbers");
  M4 m{};
  for (size_t r = 0; r < 4; ++r) {
    if (!v[r].is_array() || v[r].size() != 4) fail(where, path, "is not a 4x4 matrix", "4 rows of 4 numbers");
    for (size_t c = 0; c < 4; ++c) m[r * 4 + c] = number(v[r][c], where, path);
  }
  return m;
}

M4 mul(const M4& a, const M4& b) {
  M4 r{};
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) {
      for (size_t k = 0; k < 4; ++k) r[i * 4 + j] += a[i * 4 + k] * b[k * 4 + j];
    }
  }
  return r;
}

std::array<double, 3> apply(const M4& m, double x, double y, double z, double w) {
  return {m[0] * x + m[1] * y + m[2] * z + m[3] * w, m[4] * x + m[5] * y + m[6] * z + m[7] * w,
          m[8] * x + m[9] * y + m[10] * z + m[11] * w};
}

M4 rotation_about_z(double yaw) {
  const double c = std::cos(yaw), s = std::sin(yaw);
  return {c, -s, 0, 0, s, c, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
}

}  // namespace

std::array<double, 4> quaternion_from_rotation(const M4& m) {
  const double r00 = m[0], r01 = m[1], r02 = m[2], r10 = m[4], r11 = m[5], r12 = m[6], r20 = m[8], r21 = m[9],
               r22 = m[10];
  std::array<double, 4> q{};
  // Shepperd: divide by the largest of the four candidates for accuracy.
  const double t0 = r00 + r11 + r22, t1 = r00 - r11 - r22, t2 = r11 - r00 - r22, t3 = r22 - r00 - r11;
  if (t0 >= t1 && t0 >= t2 && t0 >= t3) {
    const double s = 2 * std::sqrt(1 + t0);
    q = {s / 4, (r21 - r12) / s, (r02 - r20) / s, (r10 - r01) / s};
  } else if (t1 >= t2 && t1 >= t3) {
    const double s = 2 * std::sqrt(1 + t1);
    q = {(r21 - r12) / s, s / 4, (r01 + r10) / s, (r02 + r20) / s};
  } else if (t2 >= t3) {
    const double s = 2 * std::sqrt(1 + t2);
    q = {(r02 - r20) / s, (r01 + r10) / s, s / 4, (r12 + r21) / s};
  } else {
    const double s = 2 * std::sqrt(1 + t3);
    q = {(r10 - r01) / s, (r02 + r20) / s, (r12 + r21) / s, s / 4};
  }
  const double n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  const double sign = q[0] < 0 ? -1.0 : 1.0;
  for (double& c : q) c = sign * c / n;
  return q;
}

GroundTruth ground_truth_from_info(const std::string& info_path, InfoAttributes attributes) {
  const ojson root = parse_python_json(read_text_file(info_path), info_path);
  const std::string& w = info_path;
  const ojson& cats = at(at(root, "metainfo", w, ""), "categories", w, "metainfo");
  std::vector<std::string> label_names(cats.size());
  for (const auto& [name, index] : cats.items()) {
    if (!index.is_number_integer() || index.get<int64_t>() < 0 || index.get<size_t>() >= label_names.size()) {
      fail(w, "metainfo.categories." + name, "is " + index.dump(), "distinct indices 0..N-1");
    }
    label_names[index.get<size_t>()] = name;
  }
  GroundTruth gt;
  gt.source = info_path;
  gt.description = "from the mmdetection3d info file " + info_path +
                   " (approximate: no bike racks; attributes " +
                   (attributes == InfoAttributes::kUnknown ? "unknown" : "from mmdet3d's speed rule") + ")";
  const ojson& list = at(root, "data_list", w, "");
  for (size_t e = 0; e < list.size(); ++e) {
    const std::string path = "data_list[" + std::to_string(e) + "]";
    const ojson& entry = list[e];
    const ojson& token = at(entry, "token", w, path);
    if (!token.is_string()) fail(w, path + ".token", "is not a string", "the sample token");
    GtSample& s = gt.add_sample(token.get<std::string>());
    const M4 ego2global = matrix(at(entry, "ego2global", w, path), w, path + ".ego2global");
    const M4 lidar2ego = matrix(at(at(entry, "lidar_points", w, path), "lidar2ego", w, path + ".lidar_points"), w,
                                path + ".lidar_points.lidar2ego");
    const M4 world_from_lidar = mul(ego2global, lidar2ego);
    s.ego_translation = {ego2global[3], ego2global[7], ego2global[11]};
    s.ego_rotation = quaternion_from_rotation(ego2global);
    if (!entry.contains("instances")) continue;
    const ojson& instances = entry.at("instances");
    for (size_t i = 0; i < instances.size(); ++i) {
      const std::string ip = path + ".instances[" + std::to_string(i) + "]";
      const ojson& in = instances[i];
      const ojson& label = at(in, "bbox_label_3d", w, ip);
      if (!label.is_number_integer()) fail(w, ip + ".bbox_label_3d", "is " + label.dump(), "an integer");
      const int64_t l = label.get<int64_t>();
      if (l < 0) continue;  // not one of the detection classes
      if (static_cast<size_t>(l) >= label_names.size()) fail(w, ip + ".bbox_label_3d", "is out of range", "a category index");
      const std::optional<int> cls = detection_index(label_names[static_cast<size_t>(l)]);
      if (!cls) continue;
      const ojson& b = at(in, "bbox_3d", w, ip);
      if (!b.is_array() || b.size() != 7) fail(w, ip + ".bbox_3d", "is " + b.dump(), "[x, y, z, l, w, h, yaw]");
      std::array<double, 7> v{};
      for (size_t k = 0; k < 7; ++k) v[k] = number(b[k], w, ip + ".bbox_3d");
      EvalBox box;
      box.detection = *cls;
      box.translation = apply(world_from_lidar, v[0], v[1], v[2], 1);
      box.size = {v[4], v[3], v[5]};
      box.rotation = quaternion_from_rotation(mul(world_from_lidar, rotation_about_z(v[6])));
      double vx = kNaN, vy = kNaN;
      if (in.contains("velocity") && in.at("velocity").is_array() && in.at("velocity").size() >= 2) {
        const ojson& vel = in.at("velocity");
        if (!vel[0].is_null()) vx = number(vel[0], w, ip + ".velocity");
        if (!vel[1].is_null()) vy = number(vel[1], w, ip + ".velocity");
      }
      const auto vg = apply(world_from_lidar, vx, vy, 0, 0);
      box.velocity = {vg[0], vg[1]};
      int64_t pts = 0;
      for (const char* key : {"num_lidar_pts", "num_radar_pts"}) {
        if (in.contains(key)) pts += in.at(key).is_number_integer() ? in.at(key).get<int64_t>() : 0;
      }
      box.num_pts = pts;
      if (attributes == InfoAttributes::kFromSpeed) {
        const std::string a = nusc_attribute(label_names[static_cast<size_t>(l)], std::hypot(vg[0], vg[1]));
        box.attribute = *attribute_index(a);
      }
      box.sample = static_cast<uint32_t>(gt.samples.size() - 1);
      box.index = static_cast<uint32_t>(s.boxes.size());
      s.boxes.push_back(box);
    }
  }
  return gt;
}

}  // namespace bev::eval
