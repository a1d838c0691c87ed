#include "io/detections_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>

#include "bevformer/error.h"
#include "core/mat4.h"

namespace bev {

namespace {

using Vec3 = std::array<double, 3>;
using Quat = std::array<double, 4>;  // w, x, y, z

constexpr double kPi = std::numbers::pi;

double wrap_angle(double a) {  // to (-pi, pi]
  a = std::remainder(a, 2 * kPi);
  return a <= -kPi ? a + 2 * kPi : a;
}

Vec3 rotate(const Mat4& m, const Vec3& v) {
  return {m[0] * v[0] + m[1] * v[1] + m[2] * v[2], m[4] * v[0] + m[5] * v[1] + m[6] * v[2],
          m[8] * v[0] + m[9] * v[1] + m[10] * v[2]};
}

Vec3 transform(const Mat4& m, const Vec3& p) {
  Vec3 r = rotate(m, p);
  return {r[0] + m[3], r[1] + m[7], r[2] + m[11]};
}

Quat normalized(Quat q) {
  const double n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  for (double& c : q) c /= n;
  return q;
}

// The unit quaternion of a 4x4's rotation block (Shepperd's method, then normalized: the poses
// of real rigs are float32 and not exactly orthonormal).
Quat quat_from_matrix(const Mat4& m) {
  const double r00 = m[0], r01 = m[1], r02 = m[2], r10 = m[4], r11 = m[5], r12 = m[6], r20 = m[8], r21 = m[9],
               r22 = m[10];
  const double tr = r00 + r11 + r22;
  Quat q;
  if (tr > 0) {
    const double s = std::sqrt(tr + 1.0) * 2;
    q = {0.25 * s, (r21 - r12) / s, (r02 - r20) / s, (r10 - r01) / s};
  } else if (r00 > r11 && r00 > r22) {
    const double s = std::sqrt(1.0 + r00 - r11 - r22) * 2;
    q = {(r21 - r12) / s, 0.25 * s, (r01 + r10) / s, (r02 + r20) / s};
  } else if (r11 > r22) {
    const double s = std::sqrt(1.0 + r11 - r00 - r22) * 2;
    q = {(r02 - r20) / s, (r01 + r10) / s, 0.25 * s, (r12 + r21) / s};
  } else {
    const double s = std::sqrt(1.0 + r22 - r00 - r11) * 2;
    q = {(r10 - r01) / s, (r02 + r20) / s, (r12 + r21) / s, 0.25 * s};
  }
  return normalized(q);
}

Quat quat_mul(const Quat& a, const Quat& b) {  // a ⊗ b (apply b, then a)
  return {a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3], a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
          a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1], a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0]};
}

Quat quat_about_z(double angle) { return {std::cos(angle / 2), 0, 0, std::sin(angle / 2)}; }

Quat canonical(Quat q) {  // q and -q are the same rotation; write the one with w >= 0
  q = normalized(q);
  if (q[0] < 0) {
    for (double& c : q) c = -c;
  }
  return q;
}

nlohmann::json mat_json(const Mat4& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) {
    rows.push_back({m[static_cast<size_t>(i * 4)], m[static_cast<size_t>(i * 4 + 1)], m[static_cast<size_t>(i * 4 + 2)],
                    m[static_cast<size_t>(i * 4 + 3)]});
  }
  return rows;
}

const std::string& class_name_of(const Detection& d, const std::vector<std::string>& class_names) {
  if (d.label < 0 || static_cast<size_t>(d.label) >= class_names.size()) {
    throw Error(ErrorKind::kInvalidInput, "detection label " + std::to_string(d.label) + " has no class name")
        .where("detections")
        .expected("a label in [0, " + std::to_string(class_names.size()) + ")");
  }
  return class_names[static_cast<size_t>(d.label)];
}

// A float of the model as the double nearest its shortest decimal form, so that the JSON says 0.3
// and not 0.30000001192092896 (the float itself round-trips from either).
double f(float v) {
  if (!std::isfinite(v)) return static_cast<double>(v);
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

}  // namespace

double box_heading(const Box9& box) { return wrap_angle(-static_cast<double>(box[6]) - kPi / 2); }

std::array<double, 3> box_gravity_center(const Box9& box) {
  return {f(box[0]), f(box[1]), f(box[2]) + 0.5 * f(box[5])};
}

Box9 box_from_mmdet3d_info(const std::array<double, 7>& b, double vx, double vy) {
  return {static_cast<float>(b[0]), static_cast<float>(b[1]), static_cast<float>(b[2] - 0.5 * b[5]), static_cast<float>(b[4]),
          static_cast<float>(b[3]), static_cast<float>(b[5]), static_cast<float>(wrap_angle(-b[6] - kPi / 2)),
          static_cast<float>(vx), static_cast<float>(vy)};
}

std::array<double, 16> identity_pose() { return mat4_identity(); }

nlohmann::json detections_to_json(const std::vector<Detection>& detections,
                                  const std::vector<std::string>& class_names,
                                  const std::optional<FramePoses>& poses, const DetectionsMeta& meta) {
  nlohmann::json out;
  out["format"] = "bevformer.cpp detections 1";
  out["stream"] = meta.stream;
  out["timestamp"] = meta.timestamp;
  out["frame_index"] = meta.frame_index;
  if (meta.sample_token) out["sample_token"] = *meta.sample_token;
  out["model"] = meta.model;
  out["untrained"] = meta.untrained;
  if (meta.untrained) {
    out["warning"] = "untrained weights (random initialisation): these boxes are meaningless";
  }
  if (meta.score_threshold) out["score_threshold"] = *meta.score_threshold;
  out["frame"] = "lidar";
  out["conventions"] = {
      {"lidar_frame", "the BEV frame: x right, y forward, z up (nuScenes LIDAR_TOP)"},
      {"center", "gravity centre [x, y, z] (the model's bottom z + h/2), metres"},
      {"size", "[w, l, h]: width, length (along the heading), height, metres"},
      {"yaw", "the model's yaw (mmdet3d 0.17 LiDAR boxes); heading = -yaw - pi/2"},
      {"heading", "direction of the box's front, radians counter-clockwise from +x, in (-pi, pi]"},
      {"velocity", "[vx, vy] m/s"},
      {"world", "the same box in T_world_from_ego @ T_ego_from_lidar; rotation is a quaternion [w, x, y, z]"}};
  if (poses) {
    out["poses"] = {{"T_world_from_ego", mat_json(poses->world_from_ego)},
                    {"T_ego_from_lidar", mat_json(poses->ego_from_lidar)}};
  }
  const Mat4 world_from_lidar = poses ? mat4_mul(poses->world_from_ego, poses->ego_from_lidar) : identity_pose();
  const Quat q_world_from_lidar =
      poses ? quat_mul(quat_from_matrix(poses->world_from_ego), quat_from_matrix(poses->ego_from_lidar)) : Quat{1, 0, 0, 0};

  nlohmann::json boxes = nlohmann::json::array();
  for (const Detection& d : detections) {
    const std::string& name = class_name_of(d, class_names);
    const Vec3 c = box_gravity_center(d.box);
    const double heading = box_heading(d.box);
    nlohmann::json b = {
        {"class", name},
        {"label", d.label},
        {"score", f(d.score)},
        {"query", d.query},
        {"center", {c[0], c[1], c[2]}},
        {"size", {f(d.box[3]), f(d.box[4]), f(d.box[5])}},
        {"yaw", f(d.box[6])},
        {"heading", heading},
        {"velocity", {f(d.box[7]), f(d.box[8])}},
    };
    if (poses) {
      const Vec3 cw = transform(world_from_lidar, c);
      const Vec3 fw = rotate(world_from_lidar, {std::cos(heading), std::sin(heading), 0});
      const Vec3 vw = rotate(world_from_lidar, {f(d.box[7]), f(d.box[8]), 0});
      const Quat q = canonical(quat_mul(q_world_from_lidar, quat_about_z(heading)));
      b["world"] = {{"center", {cw[0], cw[1], cw[2]}},
                    {"heading", std::atan2(fw[1], fw[0])},
                    {"rotation", {q[0], q[1], q[2], q[3]}},
                    {"velocity", {vw[0], vw[1]}}};
    }
    boxes.push_back(std::move(b));
  }
  out["num_detections"] = detections.size();
  out["detections"] = std::move(boxes);
  return out;
}

// ---------------------------------------------------------------------------------------------

std::optional<double> nusc_class_range(std::string_view n) {
  if (n == "car" || n == "truck" || n == "bus" || n == "trailer" || n == "construction_vehicle") return 50.0;
  if (n == "pedestrian" || n == "motorcycle" || n == "bicycle") return 40.0;
  if (n == "traffic_cone" || n == "barrier") return 30.0;
  return std::nullopt;
}

std::string nusc_attribute(std::string_view n, double speed) {
  const bool vehicle = n == "car" || n == "truck" || n == "trailer" || n == "construction_vehicle";
  const bool cycle = n == "bicycle" || n == "motorcycle";
  if (speed > 0.2) {
    if (vehicle || n == "bus") return "vehicle.moving";
    if (cycle) return "cycle.with_rider";
  } else {
    if (n == "pedestrian") return "pedestrian.standing";
    if (n == "bus") return "vehicle.stopped";
  }
  // NuScenesDataset.DefaultAttribute
  if (vehicle) return "vehicle.parked";
  if (n == "bus") return "vehicle.moving";
  if (n == "pedestrian") return "pedestrian.moving";
  if (cycle) return "cycle.without_rider";
  return "";
}

nlohmann::json to_json(const NuscBox& b) {
  return {{"translation", b.translation},         {"size", b.size},
          {"rotation", b.rotation},               {"velocity", b.velocity},
          {"detection_name", b.detection_name},   {"detection_score", b.detection_score},
          {"attribute_name", b.attribute_name}};
}

std::optional<NuscBox> to_nusc_box(const Detection& d, const std::string& class_name, const FramePoses& poses) {
  const std::optional<double> range = nusc_class_range(class_name);
  if (!range) {
    throw Error(ErrorKind::kInvalidInput, "class '" + class_name + "' is not a nuScenes detection class")
        .where("results_nusc.json")
        .expected("car, truck, construction_vehicle, bus, trailer, barrier, motorcycle, bicycle, pedestrian or "
                  "traffic_cone");
  }
  // output_to_nusc_box: gravity centre, size (w, l, h), yaw_nus = -yaw - pi/2, velocity (vx, vy, 0).
  Vec3 c = box_gravity_center(d.box);
  Quat q = quat_about_z(-f(d.box[6]) - kPi / 2);
  Vec3 v = {f(d.box[7]), f(d.box[8]), 0};
  // lidar -> ego, then the class range in the ego frame.
  const Mat4& l2e = poses.ego_from_lidar;
  c = transform(l2e, c);
  q = quat_mul(quat_from_matrix(l2e), q);
  v = rotate(l2e, v);
  if (std::hypot(c[0], c[1]) > *range) return std::nullopt;
  // ego -> global.
  const Mat4& e2g = poses.world_from_ego;
  c = transform(e2g, c);
  q = quat_mul(quat_from_matrix(e2g), q);
  v = rotate(e2g, v);

  NuscBox b;
  b.translation = c;
  b.size = {f(d.box[3]), f(d.box[4]), f(d.box[5])};
  b.rotation = canonical(q);
  b.velocity = {v[0], v[1]};
  b.detection_name = class_name;
  b.detection_score = f(d.score);
  b.attribute_name = nusc_attribute(class_name, std::hypot(v[0], v[1]));
  return b;
}

void NuscResults::add_sample(const std::string& sample_token, const std::vector<Detection>& detections,
                             const std::vector<std::string>& class_names, const FramePoses& poses) {
  if (results_.count(sample_token)) {
    throw Error(ErrorKind::kInvalidInput, "sample token '" + sample_token + "' was already added")
        .where("results_nusc.json")
        .hint("each nuScenes sample must appear once");
  }
  std::vector<NuscBox> boxes;
  boxes.reserve(detections.size());
  for (const Detection& d : detections) {
    if (auto b = to_nusc_box(d, class_name_of(d, class_names), poses)) boxes.push_back(std::move(*b));
  }
  std::stable_sort(boxes.begin(), boxes.end(),
                   [](const NuscBox& a, const NuscBox& b) { return a.detection_score > b.detection_score; });
  if (boxes.size() > kMaxBoxesPerSample) boxes.resize(kMaxBoxesPerSample);
  results_.emplace(sample_token, std::move(boxes));
}

nlohmann::json NuscResults::sample_json(const std::string& sample_token) const {
  nlohmann::json list = nlohmann::json::array();
  for (const NuscBox& b : sample(sample_token)) {
    // The devkit's DetectionBox.deserialize reads each box's own sample_token (KeyError without).
    nlohmann::json jb = bev::to_json(b);
    jb["sample_token"] = sample_token;
    list.push_back(std::move(jb));
  }
  return list;
}

const std::vector<NuscBox>& NuscResults::sample(const std::string& sample_token) const {
  const auto it = results_.find(sample_token);
  if (it == results_.end()) {
    throw Error(ErrorKind::kNotFound, "no sample '" + sample_token + "' in the results");
  }
  return it->second;
}

nlohmann::json NuscResults::to_json() const {
  nlohmann::json results = nlohmann::json::object();
  for (const auto& [token, boxes] : results_) results[token] = sample_json(token);
  return {{"meta",
           {{"use_camera", true}, {"use_lidar", false}, {"use_radar", false}, {"use_map", false},
            {"use_external", true}}},
          {"results", std::move(results)}};
}

}  // namespace bev
