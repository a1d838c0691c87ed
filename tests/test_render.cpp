// Detections output (detections JSON, nuScenes results) and pictures (box corners, projection,
// rendering), checked by hand-computed cases and against the real nuScenes demo keyframe.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "io/detections_json.h"
#include "io/image.h"
#include "model/config.h"
#include "render/render.h"

namespace bev {
namespace {

constexpr double kPi = std::numbers::pi;

Detection det(Box9 box, int label, float score = 0.5f) {
  Detection d;
  d.box = box;
  d.label = label;
  d.score = score;
  return d;
}

int label_of(const std::string& name) {
  const auto& names = nuscenes_class_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  ADD_FAILURE() << "no class " << name;
  return -1;
}

std::array<double, 16> rz_pose(double angle, double tx, double ty, double tz) {
  const double c = std::cos(angle), s = std::sin(angle);
  return {c, -s, 0, tx, s, c, 0, ty, 0, 0, 1, tz, 0, 0, 0, 1};
}

// ---------------------------------------------------------------------------------------------
// Box conventions

TEST(BoxConvention, HeadingAndCorners) {
  // yaw = -pi/2: heading 0, the length along +x, the front face at x = +l/2.
  const Box9 b = {0, 0, -1, 2, 4, 1.5f, static_cast<float>(-kPi / 2), 0, 0};
  EXPECT_NEAR(box_heading(b), 0, 1e-7);
  const auto c = box_corners(b);
  EXPECT_NEAR(c[0][0], 2, 1e-6);   // front-left
  EXPECT_NEAR(c[0][1], 1, 1e-6);
  EXPECT_NEAR(c[1][0], 2, 1e-6);   // front-right
  EXPECT_NEAR(c[1][1], -1, 1e-6);
  EXPECT_NEAR(c[2][0], -2, 1e-6);  // back-right
  EXPECT_NEAR(c[2][1], -1, 1e-6);
  EXPECT_NEAR(c[0][2], -1, 1e-6);  // bottom face at z_bottom
  EXPECT_NEAR(c[4][2], 0.5, 1e-6);
  EXPECT_NEAR(c[4][0], c[0][0], 1e-9);
  EXPECT_NEAR(box_gravity_center(b)[2], -0.25, 1e-7);

  // yaw = 0 (mmdet3d 0.17: "yaw 0 at the negative y axis"): the front at y = -l/2.
  const Box9 b0 = {0, 0, 0, 2, 4, 1, 0, 0, 0};
  EXPECT_NEAR(box_heading(b0), -kPi / 2, 1e-7);
  const auto c0 = box_corners(b0);
  EXPECT_NEAR(c0[0][1], -2, 1e-6);
  EXPECT_NEAR(c0[1][1], -2, 1e-6);
  EXPECT_NEAR(std::abs(c0[0][0] - c0[1][0]), 2, 1e-6);  // the front face is w wide
}

TEST(BoxConvention, FromMmdet3dInfo) {
  // mmdet3d >= 1.0 info files: [x, y, z_gravity, dx = l, dy = w, dz = h, yaw = heading].
  const Box9 b = box_from_mmdet3d_info({1, 2, 3, 4.5, 1.9, 1.6, 0.3}, 0.5, -0.25);
  EXPECT_FLOAT_EQ(b[2], 2.2f);  // bottom = 3 - 1.6 / 2
  EXPECT_FLOAT_EQ(b[3], 1.9f);  // w
  EXPECT_FLOAT_EQ(b[4], 4.5f);  // l
  EXPECT_FLOAT_EQ(b[5], 1.6f);  // h
  EXPECT_NEAR(box_heading(b), 0.3, 1e-6);
  EXPECT_FLOAT_EQ(b[7], 0.5f);
  EXPECT_FLOAT_EQ(b[8], -0.25f);
}

// A camera looking along LiDAR +y (as CAM_FRONT does): cam x = lidar x, cam y = -lidar z, cam z =
// lidar y; K with f = 1000 and the principal point at the centre of a 1600 x 900 image.
std::array<double, 16> front_camera() {
  const double k[3][3] = {{1000, 0, 800}, {0, 1000, 450}, {0, 0, 1}};
  const double t[4][4] = {{1, 0, 0, 0}, {0, 0, -1, 0}, {0, 1, 0, 0}, {0, 0, 0, 1}};
  std::array<double, 16> m{};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      double s = 0;
      for (int q = 0; q < 4; ++q) s += (i < 3 && q < 3 ? k[i][q] : (i == q ? 1.0 : 0.0)) * t[q][j];
      m[static_cast<size_t>(i * 4 + j)] = s;
    }
  }
  return m;
}

TEST(Projection, SyntheticCamera) {
  const auto cam = front_camera();
  const ProjectedBox p = project_box_corners({0, 20, -1, 2, 4, 2, 0, 0, 0}, cam, 1600, 900);
  EXPECT_TRUE(p.center_visible);
  EXPECT_NEAR(p.center_uv[0], 800, 1e-6);
  EXPECT_NEAR(p.center_uv[1], 450, 1e-6);
  EXPECT_NEAR(p.center_depth, 20, 1e-9);
  EXPECT_EQ(p.num_visible, 8);
  // The top face is above the centre (smaller v), the bottom below.
  EXPECT_LT(p.uv[4][1], 450);
  EXPECT_GT(p.uv[0][1], 450);

  const ProjectedBox behind = project_box_corners({0, -20, -1, 2, 4, 2, 0, 0, 0}, cam, 1600, 900);
  EXPECT_EQ(behind.num_visible, 0);
  EXPECT_FALSE(behind.center_visible);
  EXPECT_LT(behind.center_depth, 0);

  const ProjectedBox aside = project_box_corners({40, 5, -1, 2, 4, 2, 0, 0, 0}, cam, 1600, 900);
  EXPECT_GT(aside.center_depth, 0);
  EXPECT_FALSE(aside.center_visible);  // u = 800 + 1000 * 40 / 5 is far right
}

// ---------------------------------------------------------------------------------------------
// nuScenes results (spec §7)

FramePoses identity_poses() { return {identity_pose(), identity_pose()}; }

TEST(NuscResults, IdentityPosesYawZero) {
  const Detection d = det({1, 2, -1, 2, 4, 1.5f, 0, 3, 0}, label_of("car"), 0.75f);
  const auto b = to_nusc_box(d, "car", identity_poses());
  ASSERT_TRUE(b);
  EXPECT_NEAR(b->translation[0], 1, 1e-9);
  EXPECT_NEAR(b->translation[1], 2, 1e-9);
  EXPECT_NEAR(b->translation[2], -0.25, 1e-9);  // gravity centre
  EXPECT_EQ(b->size, (std::array<double, 3>{2, 4, 1.5}));
  // yaw_nus = -0 - pi/2: q = (cos(-pi/4), 0, 0, sin(-pi/4)).
  EXPECT_NEAR(b->rotation[0], std::sqrt(0.5), 1e-9);
  EXPECT_NEAR(b->rotation[1], 0, 1e-12);
  EXPECT_NEAR(b->rotation[2], 0, 1e-12);
  EXPECT_NEAR(b->rotation[3], -std::sqrt(0.5), 1e-9);
  EXPECT_NEAR(b->velocity[0], 3, 1e-9);
  EXPECT_NEAR(b->velocity[1], 0, 1e-9);
  EXPECT_EQ(b->detection_name, "car");
  EXPECT_DOUBLE_EQ(b->detection_score, 0.75);
  EXPECT_EQ(b->attribute_name, "vehicle.moving");
}

TEST(NuscResults, EgoYawNinetyDegrees) {
  const FramePoses poses{rz_pose(kPi / 2, 100, 200, 10), identity_pose()};
  const Detection d = det({1, 2, -1, 2, 4, 1.5f, 0, 3, 0}, label_of("car"));
  const auto b = to_nusc_box(d, "car", poses);
  ASSERT_TRUE(b);
  EXPECT_NEAR(b->translation[0], 98, 1e-9);
  EXPECT_NEAR(b->translation[1], 201, 1e-9);
  EXPECT_NEAR(b->translation[2], 9.75, 1e-9);
  // Rz(90) ⊗ Rz(-90) = identity.
  EXPECT_NEAR(b->rotation[0], 1, 1e-9);
  EXPECT_NEAR(std::abs(b->rotation[3]), 0, 1e-9);
  EXPECT_NEAR(b->velocity[0], 0, 1e-9);
  EXPECT_NEAR(b->velocity[1], 3, 1e-9);
}

TEST(NuscResults, ClassRangeInEgoFrame) {
  // A nuScenes-like lidar2ego: yaw -90 degrees, 0.94 m forward, 1.84 m up.
  const FramePoses poses{identity_pose(), rz_pose(-kPi / 2, 0.94, 0, 1.84)};
  // 49.5 m ahead of the lidar is 50.44 m from the ego origin: dropped (lidar radius < 50).
  EXPECT_FALSE(to_nusc_box(det({0, 49.5f, -1.8f, 2, 4, 1.5f, 0, 0, 0}, 0), "car", poses));
  const auto kept = to_nusc_box(det({0, 48.9f, -1.8f, 2, 4, 1.5f, 0, 0, 0}, 0), "car", poses);
  ASSERT_TRUE(kept);
  EXPECT_NEAR(kept->translation[0], 48.9 + 0.94, 1e-5);  // lidar +y is ego +x
  EXPECT_FALSE(to_nusc_box(det({0, 39.5f, -1.8f, 0.6f, 0.7f, 1.7f, 0, 0, 0}, 8), "pedestrian", poses));
  EXPECT_TRUE(to_nusc_box(det({0, 38.5f, -1.8f, 0.6f, 0.7f, 1.7f, 0, 0, 0}, 8), "pedestrian", poses));
  EXPECT_FALSE(to_nusc_box(det({0, 29.5f, -1.8f, 0.4f, 0.4f, 0.8f, 0, 0, 0}, 9), "traffic_cone", poses));
  EXPECT_TRUE(to_nusc_box(det({0, 28.5f, -1.8f, 0.4f, 0.4f, 0.8f, 0, 0, 0}, 9), "traffic_cone", poses));
  EXPECT_THROW(to_nusc_box(det({0, 0, 0, 1, 1, 1, 0, 0, 0}, 0), "unicorn", poses), Error);
}

TEST(NuscResults, AttributesBySpeed) {
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"car", {"vehicle.parked", "vehicle.moving"}},
      {"truck", {"vehicle.parked", "vehicle.moving"}},
      {"trailer", {"vehicle.parked", "vehicle.moving"}},
      {"construction_vehicle", {"vehicle.parked", "vehicle.moving"}},
      {"bus", {"vehicle.stopped", "vehicle.moving"}},
      {"pedestrian", {"pedestrian.standing", "pedestrian.moving"}},
      {"bicycle", {"cycle.without_rider", "cycle.with_rider"}},
      {"motorcycle", {"cycle.without_rider", "cycle.with_rider"}},
      {"barrier", {"", ""}},
      {"traffic_cone", {"", ""}}};
  for (const auto& [name, attrs] : expected) {
    EXPECT_EQ(nusc_attribute(name, 0.1), attrs.first) << name;
    EXPECT_EQ(nusc_attribute(name, 0.2), attrs.first) << name;  // strictly > 0.2 is moving
    EXPECT_EQ(nusc_attribute(name, 1.0), attrs.second) << name;
  }
  // Through the conversion: the global speed decides.
  const auto slow = to_nusc_box(det({0, 10, -1.8f, 0.6f, 0.7f, 1.7f, 0, 0.1f, 0.1f}, 8), "pedestrian", identity_poses());
  const auto fast = to_nusc_box(det({0, 10, -1.8f, 0.6f, 0.7f, 1.7f, 0, 0.3f, 0.1f}, 8), "pedestrian", identity_poses());
  EXPECT_EQ(slow->attribute_name, "pedestrian.standing");
  EXPECT_EQ(fast->attribute_name, "pedestrian.moving");
}

TEST(NuscResults, AccumulatesSamples) {
  const auto& names = nuscenes_class_names();
  std::vector<Detection> many;
  for (int i = 0; i < 600; ++i) {
    many.push_back(det({0, static_cast<float>(i % 40), -1, 2, 4, 1.5f, 0, 0, 0}, 0, static_cast<float>(i) / 600.0f));
  }
  NuscResults r;
  r.add_sample("token_a", many, names, identity_poses());
  r.add_sample("token_b", {det({5, 5, -1, 0.6f, 0.7f, 1.7f, 0, 0, 0}, label_of("pedestrian"))}, names, identity_poses());
  EXPECT_THROW(r.add_sample("token_b", {}, names, identity_poses()), Error);
  EXPECT_EQ(r.num_samples(), 2u);
  const auto& a = r.sample("token_a");
  ASSERT_EQ(a.size(), NuscResults::kMaxBoxesPerSample);
  EXPECT_NEAR(a.front().detection_score, 599.0 / 600.0, 1e-6);
  EXPECT_NEAR(a.back().detection_score, 100.0 / 600.0, 1e-6);
  EXPECT_THROW(r.sample("token_c"), Error);

  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["meta"]["use_camera"], true);
  EXPECT_EQ(j["meta"]["use_lidar"], false);
  ASSERT_EQ(j["results"].size(), 2u);
  const auto& box = j["results"]["token_b"][0];
  for (const char* key : {"translation", "size", "rotation", "velocity", "detection_name", "detection_score",
                          "attribute_name"}) {
    EXPECT_TRUE(box.contains(key)) << key;
  }
  EXPECT_EQ(box["detection_name"], "pedestrian");
  EXPECT_EQ(box["rotation"].size(), 4u);
  EXPECT_EQ(box["velocity"].size(), 2u);
}

// ---------------------------------------------------------------------------------------------
// Detections JSON

TEST(DetectionsJson, FieldsAndWorldFrame) {
  const auto& names = nuscenes_class_names();
  const std::vector<Detection> dets = {det({1, 2, -1, 2, 4, 1.5f, static_cast<float>(-kPi / 2), 3, 0}, 0, 0.3f)};
  DetectionsMeta meta;
  meta.stream = "cam-rig-1";
  meta.timestamp = 12.5;
  meta.frame_index = 7;
  meta.model = "tiny";
  meta.untrained = true;

  const nlohmann::json lidar_only = detections_to_json(dets, names, std::nullopt, meta);
  EXPECT_EQ(lidar_only["untrained"], true);
  EXPECT_TRUE(lidar_only.contains("warning"));
  EXPECT_EQ(lidar_only["stream"], "cam-rig-1");
  EXPECT_EQ(lidar_only["frame_index"], 7);
  EXPECT_EQ(lidar_only["num_detections"], 1);
  const auto& b = lidar_only["detections"][0];
  EXPECT_EQ(b["class"], "car");
  EXPECT_EQ(b["label"], 0);
  EXPECT_NEAR(b["center"][2].get<double>(), -0.25, 1e-9);
  EXPECT_NEAR(b["heading"].get<double>(), 0, 1e-7);
  EXPECT_EQ(b["size"], (std::vector<double>{2, 4, 1.5}));
  EXPECT_FALSE(b.contains("world"));
  // The float score is written as its shortest decimal.
  EXPECT_NE(lidar_only.dump().find("\"score\":0.3,"), std::string::npos) << lidar_only.dump();

  const FramePoses poses{rz_pose(kPi / 2, 100, 200, 10), identity_pose()};
  const nlohmann::json world = detections_to_json(dets, names, poses, meta);
  const auto& w = world["detections"][0]["world"];
  EXPECT_NEAR(w["center"][0].get<double>(), 98, 1e-9);
  EXPECT_NEAR(w["center"][1].get<double>(), 201, 1e-9);
  EXPECT_NEAR(w["heading"].get<double>(), kPi / 2, 1e-7);
  EXPECT_NEAR(w["velocity"][0].get<double>(), 0, 1e-9);
  EXPECT_NEAR(w["velocity"][1].get<double>(), 3, 1e-9);
  EXPECT_NEAR(w["rotation"][0].get<double>(), std::sqrt(0.5), 1e-7);
  EXPECT_NEAR(w["rotation"][3].get<double>(), std::sqrt(0.5), 1e-7);
  EXPECT_TRUE(world.contains("poses"));

  EXPECT_THROW(detections_to_json({det({0, 0, 0, 1, 1, 1, 0, 0, 0}, 10)}, names, std::nullopt, meta), Error);
}

// ---------------------------------------------------------------------------------------------
// The nuScenes demo keyframe: real calibration and ground truth.

const std::string kDemoDir = std::string(BEV_SHARED_DIR) + "/data/nuscenes-demo";
// nuScenes slot order, as the model consumes the cameras.
const std::vector<std::string> kSlots = {"CAM_FRONT",     "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                         "CAM_BACK",      "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};

struct Demo {
  nlohmann::json info;  // data_list[0]
  std::map<std::string, std::array<double, 16>> lidar2img;
  std::vector<Detection> gt;       // BEVFormer labels; the instances of the 10 classes, in order
  std::vector<int> gt_v1_label;    // mmdetection3d's label of each instance
  std::vector<int> num_lidar_pts;
};

std::array<double, 16> mat4(const nlohmann::json& m) {
  std::array<double, 16> r{};
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) r[i * 4 + j] = m.at(i).at(j).get<double>();
  }
  return r;
}

// info.json was written by Python's json, which writes NaN (the velocity of boxes without one);
// JSON has no NaN: read those tokens (outside strings) as null.
std::string nan_to_null(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
      out += c;
    } else if (text.compare(i, 3, "NaN") == 0) {
      out += "null";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

double number_or_zero(const nlohmann::json& v) { return v.is_number() ? v.get<double>() : 0.0; }

const Demo& demo() {
  static const Demo d = [] {
    Demo out;
    std::ifstream f(kDemoDir + "/info.json");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const nlohmann::json all = nlohmann::json::parse(nan_to_null(text));
    out.info = all.at("data_list").at(0);
    // lidar2img = [K 0; 0 1] @ lidar2cam.
    for (const std::string& cam : kSlots) {
      const auto& im = out.info.at("images").at(cam);
      const auto l2c = mat4(im.at("lidar2cam"));
      std::array<double, 16> kpad{};
      for (size_t i = 0; i < 4; ++i) kpad[i * 4 + i] = 1;
      for (size_t i = 0; i < 3; ++i) {
        for (size_t j = 0; j < 3; ++j) kpad[i * 4 + j] = im.at("cam2img").at(i).at(j).get<double>();
      }
      std::array<double, 16> m{};
      for (size_t i = 0; i < 4; ++i) {
        for (size_t j = 0; j < 4; ++j) {
          for (size_t k = 0; k < 4; ++k) m[i * 4 + j] += kpad[i * 4 + k] * l2c[k * 4 + j];
        }
      }
      out.lidar2img[cam] = m;
    }
    // Labels by name: mmdetection3d's order differs from BEVFormer's.
    std::map<int, std::string> v1_names;
    for (const auto& [name, idx] : all.at("metainfo").at("categories").items()) v1_names[idx.get<int>()] = name;
    for (const auto& inst : out.info.at("instances")) {
      const auto bb = inst.at("bbox_3d").get<std::vector<double>>();
      const auto& v = inst.at("velocity");
      Detection g;
      g.box = box_from_mmdet3d_info({bb[0], bb[1], bb[2], bb[3], bb[4], bb[5], bb[6]}, number_or_zero(v.at(0)),
                                  number_or_zero(v.at(1)));
      const int v1 = inst.at("bbox_label_3d").get<int>();
      if (v1 < 0) continue;  // an object outside the 10 detection classes
      g.label = label_of(v1_names.at(v1));
      g.score = 1;
      out.gt.push_back(g);
      out.gt_v1_label.push_back(v1);
      out.num_lidar_pts.push_back(inst.at("num_lidar_pts").get<int>());
    }
    return out;
  }();
  return d;
}

TEST(DemoProjection, EveryBoxWithPointsIsSeenByACamera) {
  const Demo& d = demo();
  ASSERT_EQ(d.info.at("instances").size(), 69u);
  ASSERT_EQ(d.gt.size(), 68u);  // one object (label -1) is outside the 10 classes
  int checked = 0;
  for (size_t i = 0; i < d.gt.size(); ++i) {
    if (d.num_lidar_pts[i] <= 0) continue;
    ++checked;
    int seen_by = 0;
    for (const auto& [cam, m] : d.lidar2img) {
      const ProjectedBox p = project_box_corners(d.gt[i].box, m, 1600, 900);
      seen_by += p.center_visible && p.center_depth > 0 ? 1 : 0;
    }
    EXPECT_GE(seen_by, 1) << "instance " << i;
  }
  EXPECT_GT(checked, 20);
}

// The 180-degree question (which end is the front): every box that moves faster than 1 m/s moves
// along its heading.
TEST(DemoProjection, MovingBoxesMoveForward) {
  int moving = 0;
  for (const Detection& g : demo().gt) {
    const double speed = std::hypot(g.box[7], g.box[8]);
    if (speed < 1.0) continue;
    ++moving;
    const double h = box_heading(g.box);
    EXPECT_GT((std::cos(h) * g.box[7] + std::sin(h) * g.box[8]) / speed, 0.9);
  }
  EXPECT_GE(moving, 5);
}

// cam_instances hold, per camera, the projected gravity centre (center_2d), its depth and the 2D
// box of the projected corners (bbox) that mmdetection3d computed from nuScenes' own boxes. They
// carry no instance index: match by label and size, then compare. The centre checks lidar2img and
// that info.json's z is the gravity centre (as z_bottom it is off by 10-30 px); the 2D box checks
// the yaw and the w/l order (a 90-degree error gives 10-45 px). The 2D boxes are a few pixels
// off even so, mostly in v: nuScenes' boxes are upright in the global frame and carry pitch and
// roll in the tilted LiDAR frame (about 1.2 degrees here), which yaw-only boxes drop; a
// tolerance of 5 px or 6 % of the box's size covers that (the worst, a 10 m truck 15 m away, is
// 25 px off on a 470 px box).
TEST(DemoProjection, MatchesCamInstances) {
  const Demo& d = demo();
  int matched = 0, bbox_checked = 0;
  for (const std::string& cam : kSlots) {
    const auto& m = d.lidar2img.at(cam);
    for (const auto& ci : d.info.at("cam_instances").at(cam)) {
      const int v1 = ci.at("bbox_label_3d").get<int>();
      if (v1 < 0) {
        ++matched;  // outside the 10 classes: not in d.gt
        continue;
      }
      const auto cb = ci.at("bbox_3d").get<std::vector<double>>();  // camera box: l, h, w at 3..5
      const auto c2 = ci.at("center_2d").get<std::vector<double>>();
      const double depth = ci.at("depth").get<double>();
      double best = 1e9;
      size_t best_i = 0;
      for (size_t i = 0; i < d.gt.size(); ++i) {
        const Box9& b = d.gt[i].box;
        if (d.gt_v1_label[i] != v1 || std::abs(b[4] - cb[3]) > 1e-4 || std::abs(b[5] - cb[4]) > 1e-4 ||
            std::abs(b[3] - cb[5]) > 1e-4) {
          continue;
        }
        const ProjectedBox p = project_box_corners(b, m, 1600, 900);
        if (p.center_depth <= 0) continue;
        const double e = std::hypot(p.center_uv[0] - c2[0], p.center_uv[1] - c2[1]);
        if (e < best) {
          best = e;
          best_i = i;
        }
      }
      ASSERT_LT(best, 0.5) << cam << ": no ground-truth box projects onto center_2d " << c2[0] << ", " << c2[1];
      ++matched;
      const ProjectedBox p = project_box_corners(d.gt[best_i].box, m, 1600, 900);
      EXPECT_NEAR(p.center_depth, depth, 0.02) << cam;
      if (p.num_visible == 8) {  // the whole box inside the image: bbox is the corners' bounds
        double u0 = 1e9, v0 = 1e9, u1 = -1e9, v1b = -1e9;
        for (const auto& uv : p.uv) {
          u0 = std::min(u0, uv[0]);
          u1 = std::max(u1, uv[0]);
          v0 = std::min(v0, uv[1]);
          v1b = std::max(v1b, uv[1]);
        }
        const auto bb = ci.at("bbox").get<std::vector<double>>();
        const double tol = std::max(5.0, 0.06 * std::max(bb[2] - bb[0], bb[3] - bb[1]));
        EXPECT_NEAR(u0, bb[0], tol) << cam << " instance " << best_i;
        EXPECT_NEAR(v0, bb[1], tol) << cam << " instance " << best_i;
        EXPECT_NEAR(u1, bb[2], tol) << cam << " instance " << best_i;
        EXPECT_NEAR(v1b, bb[3], tol) << cam << " instance " << best_i;
        ++bbox_checked;
      }
    }
  }
  EXPECT_EQ(matched, 84);  // 47 + 18 + 2 + 10 + 2 + 5
  EXPECT_GT(bbox_checked, 20);
}

RenderInput demo_render_input() {
  const Demo& d = demo();
  RenderInput in;
  for (const std::string& cam : kSlots) {
    const auto& im = d.info.at("images").at(cam);
    in.cameras.push_back({cam, read_image(kDemoDir + "/" + im.at("img_path").get<std::string>()), d.lidar2img.at(cam)});
  }
  in.class_names = nuscenes_class_names();
  in.stream = "nuscenes-demo";
  in.timestamp = d.info.at("timestamp").get<double>();
  in.model = "ground truth";
  return in;
}

TEST(DemoRender, GroundTruthPicture) {
  RenderInput in = demo_render_input();
  ASSERT_EQ(in.cameras[0].image.size(0), 900);
  ASSERT_EQ(in.cameras[0].image.size(1), 1600);
  in.ground_truth = demo().gt;

  const RenderSize size = render_size(in);
  EXPECT_EQ(size.width, 3 * 640 + 2 * 360);  // mosaic of 640 x 360 tiles + a square BEV panel
  EXPECT_GT(size.height, 2 * 360);

  const std::string path = ::testing::TempDir() + "bev_test_render_gt.png";
  render_frame_to_file(in, path);
  ASSERT_TRUE(std::filesystem::exists(path));
  const Tensor png = read_image(path);
  EXPECT_EQ(png.size(0), size.height);
  EXPECT_EQ(png.size(1), size.width);
  std::filesystem::remove(path);

  // For looking at: the ground truth dashed, and the same boxes drawn as detections (class
  // colours, front faces crossed) into the build folder.
  render_frame_to_file(in, std::string(BEV_BINARY_DIR) + "/demo_gt.png");
  RenderInput as_dets = in;
  as_dets.ground_truth.clear();
  as_dets.detections = demo().gt;
  render_frame_to_file(as_dets, std::string(BEV_BINARY_DIR) + "/demo_gt_as_detections.png");
}

TEST(Render, UntrainedDrawsTopNAndRejectsBadImages) {
  RenderInput in;
  in.class_names = nuscenes_class_names();
  in.untrained = true;
  in.untrained_top_n = 2;
  for (int i = 0; i < 5; ++i) in.detections.push_back(det({0, 5.0f * i, -1, 2, 4, 1.5f, 0, 0, 0}, 0, 0.01f * i));
  const Tensor img = render_frame(in);  // no cameras: the BEV panel alone
  EXPECT_EQ(img.size(1), 720);
  EXPECT_EQ(img.dtype(), DType::kU8);
  const std::vector<uint8_t> png = encode_image(img, ".png");
  EXPECT_GT(png.size(), 100u);

  in.cameras.push_back({"CAM_FRONT", Tensor::zeros({10, 10}, DType::kU8), front_camera()});
  EXPECT_THROW(render_frame(in), Error);
  EXPECT_THROW(decode_image(std::vector<uint8_t>{1, 2, 3}, "bytes"), Error);
}

// --render's extension picks the encoding (PNG, or JPEG for .jpg/.jpeg in any case); anything
// else is refused by name before any work; the title says whether the history was used.
TEST(Render, PictureFormatFollowsTheExtensionAndTitleSaysHistory) {
  EXPECT_EQ(picture_format("a/b.png"), ".png");
  EXPECT_EQ(picture_format("a/b.JPEG"), ".jpg");
  EXPECT_EQ(picture_format("b.Jpg"), ".jpg");
  for (const char* bad : {"b.bmp", "b", "dir.png/b", "b.png.gif"}) {
    try {
      picture_format(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << bad;
      EXPECT_NE(std::string(e.what()).find(".jpg"), std::string::npos) << e.what();
    }
  }
  RenderInput in;
  in.class_names = nuscenes_class_names();
  in.detections.push_back(det({0, 10, -1, 2, 4, 1.5f, 0, 0, 0}, 0, 0.9f));
  const std::string jpg = std::string(BEV_BINARY_DIR) + "/render_format.jpg";
  render_frame_to_file(in, jpg);
  std::ifstream f(jpg, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 3u);
  EXPECT_EQ(bytes[0], 0xFF);  // JPEG's SOI marker, not PNG's signature
  EXPECT_EQ(bytes[1], 0xD8);
  EXPECT_EQ(decode_image(bytes, jpg).size(1), render_frame(in).size(1));
  // The title band (the top 40 rows) changes with what is known of the history, nothing else.
  auto title = [&](std::optional<bool> used) {
    RenderInput x = in;
    x.used_history = used;
    const Tensor img = render_frame(x);
    const auto* p = static_cast<const uint8_t*>(img.raw_data());
    return std::vector<uint8_t>(p, p + 40 * img.size(1) * 3);
  };
  EXPECT_NE(title(true), title(false));
  EXPECT_NE(title(true), title(std::nullopt));
  EXPECT_EQ(title(true), title(true));
}

}  // namespace
}  // namespace bev
