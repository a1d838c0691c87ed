// convert-pandaset on a small synthetic sequence in the devkit's layout whose projections are
// known: six cameras on a vehicle that drives and turns, each looking along a known direction
// from a known place. Through the written frames (K, T_ego_from_cam, T_ego_from_lidar, as
// prepare_frame turns them into lidar2img) a point 20 m along a camera's axis in the BEV frame
// lands on that camera's principal point, one 2 m to its right 2/20 of fx right of it, in the
// camera slot the model expects; the ego frame is x forward, z up, and the ego pose follows the
// vehicle. Also: images resized to the nuScenes presets' 1600x900 with K scaled, or referenced
// as they are, and the errors for a broken sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/convert.h"
#include "bevformer/error.h"
#include "io/frame_json.h"
#include "io/image.h"
#include "io_test_util.h"
#include "io/pandaset.h"
#include "runtime/prepare.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kPi = std::numbers::pi;

// Rotation about z by `a` (radians), counter-clockwise seen from above.
Mat4 rot_z(double a, double x = 0, double y = 0, double z = 0) {
  return {std::cos(a), -std::sin(a), 0, x, std::sin(a), std::cos(a), 0, y, 0, 0, 1, z, 0, 0, 0, 1};
}

json pose_json(const Mat4& m) {
  // Rotation to quaternion (w, x, y, z), Shepperd's method on the largest diagonal term.
  const double r00 = m[0], r11 = m[5], r22 = m[10], tr = r00 + r11 + r22;
  double w, x, y, z;
  if (tr > 0) {
    const double s = std::sqrt(tr + 1) * 2;
    w = s / 4, x = (m[9] - m[6]) / s, y = (m[2] - m[8]) / s, z = (m[4] - m[1]) / s;
  } else if (r00 > r11 && r00 > r22) {
    const double s = std::sqrt(1 + r00 - r11 - r22) * 2;
    w = (m[9] - m[6]) / s, x = s / 4, y = (m[1] + m[4]) / s, z = (m[2] + m[8]) / s;
  } else if (r11 > r22) {
    const double s = std::sqrt(1 + r11 - r00 - r22) * 2;
    w = (m[2] - m[8]) / s, x = (m[1] + m[4]) / s, y = s / 4, z = (m[6] + m[9]) / s;
  } else {
    const double s = std::sqrt(1 + r22 - r00 - r11) * 2;
    w = (m[4] - m[1]) / s, x = (m[2] + m[8]) / s, y = (m[6] + m[9]) / s, z = s / 4;
  }
  return {{"position", {{"x", m[3]}, {"y", m[7]}, {"z", m[11]}}}, {"heading", {{"w", w}, {"x", x}, {"y", y}, {"z", z}}}};
}

std::array<double, 3> apply(const Mat4& m, const std::array<double, 3>& p) {
  std::array<double, 3> out{};
  for (int r = 0; r < 3; ++r) out[r] = m[r * 4] * p[0] + m[r * 4 + 1] * p[1] + m[r * 4 + 2] * p[2] + m[r * 4 + 3];
  return out;
}

// The six cameras in the lidar (BEV) frame: x right, y forward, z up. Camera i looks along the
// horizontal direction at `kYaw[i]` degrees counter-clockwise from forward, from kPlace[i].
constexpr double kYaw[6] = {0, -55, 55, 180, 90, -90};  // front, front_right, front_left, back, left, right
constexpr std::array<double, 3> kPlace[6] = {{0.0, 1.2, -0.3}, {0.6, 1.0, -0.3}, {-0.6, 1.0, -0.3},
                                             {0.0, -1.5, -0.2}, {-0.8, 0.0, -0.25}, {0.8, 0.0, -0.25}};
struct Intrinsics {
  double fx, fy, cx, cy;
};
constexpr Intrinsics kK[6] = {{1970, 1968, 970.5, 540.2}, {930, 931, 962.0, 536.0}, {935, 932, 958.0, 541.0},
                              {1000, 1001, 961.0, 538.0}, {932, 930, 963.5, 539.5}, {931, 933, 957.5, 537.5}};

std::array<double, 3> direction(int i) {
  const double a = kYaw[i] * kPi / 180;
  return {-std::sin(a), std::cos(a), 0};  // yaw 0 is +y (forward); +90 is -x (left)
}

// lidar_from_cam: camera z along the direction, y down, x = y cross z (right).
Mat4 lidar_from_cam(int i) {
  const auto d = direction(i);
  const std::array<double, 3> y = {0, 0, -1}, x = {y[1] * d[2] - y[2] * d[1], y[2] * d[0] - y[0] * d[2], y[0] * d[1] - y[1] * d[0]};
  const auto& t = kPlace[i];
  return {x[0], y[0], d[0], t[0], x[1], y[1], d[1], t[1], x[2], y[2], d[2], t[2], 0, 0, 0, 1};
}

// The vehicle's lidar pose in the world at frame k: it drives and turns left.
Mat4 world_from_lidar(int k) { return rot_z(0.4 + 0.05 * k, 120.0 + 3.0 * k, -40.0 + 1.5 * k, 1.85); }

// Writes the sequence: `frames` lidar frames, 1920x1080 JPEGs (a different grey per camera).
void write_sequence(const fs::path& seq, int frames) {
  json lidar_poses = json::array(), times = json::array();
  for (int k = 0; k < frames; ++k) {
    lidar_poses.push_back(pose_json(world_from_lidar(k)));
    times.push_back(1557540000.25 + 0.1 * k);
  }
  fs::create_directories(seq / "lidar");
  std::ofstream(seq / "lidar" / "poses.json") << lidar_poses.dump();
  std::ofstream(seq / "lidar" / "timestamps.json") << times.dump();
  for (int i = 0; i < 6; ++i) {
    const fs::path dir = seq / "camera" / kPandasetCameras[i];
    fs::create_directories(dir);
    std::ofstream(dir / "intrinsics.json") << json{{"fx", kK[i].fx}, {"fy", kK[i].fy}, {"cx", kK[i].cx}, {"cy", kK[i].cy}}.dump();
    json poses = json::array(), cam_times = json::array();
    for (int k = 0; k < frames; ++k) {
      poses.push_back(pose_json(mat4_mul(world_from_lidar(k), lidar_from_cam(i))));
      cam_times.push_back(1557540000.25 + 0.1 * k + 0.004 * i);
      Tensor img = Tensor::empty({1080, 1920, 3}, DType::kU8);
      auto* px = static_cast<uint8_t*>(img.raw_data());
      for (int64_t p = 0; p < img.numel(); ++p) px[p] = static_cast<uint8_t>(40 + 30 * i + (p % 7));
      const std::vector<uint8_t> jpg = encode_image(img, ".jpg");
      char name[16];
      std::snprintf(name, sizeof name, "%02d.jpg", k);
      std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(jpg.data()),
                                                        static_cast<std::streamsize>(jpg.size()));
    }
    std::ofstream(dir / "poses.json") << poses.dump();
    std::ofstream(dir / "timestamps.json") << cam_times.dump();
  }
}

std::array<double, 2> project(const Mat4& lidar2img, const std::array<double, 3>& p) {
  const std::array<double, 3> q = apply(lidar2img, p);
  return {q[0] / q[2], q[1] / q[2]};
}

class Pandaset : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    write_sequence(fs::path(tmp_->str()) / "017", 2);
  }
  static void TearDownTestSuite() { delete tmp_; }
  static fs::path seq() { return fs::path(tmp_->str()) / "017"; }
  static testing::TempDir* tmp_;
};
testing::TempDir* Pandaset::tmp_ = nullptr;

// Every camera's axis point lands on its principal point, a point to its right fx * 2/20 to the
// right, and each camera sits in the slot of its direction; at 1600x900 (x 5/6) and natively.
TEST_F(Pandaset, ProjectionsThroughTheFramesAreKnown) {
  for (const double scale : {5.0 / 6.0, 1.0}) {
    SCOPED_TRACE(scale);
    const fs::path out = fs::path(tmp_->str()) / (scale == 1.0 ? "native" : "resized");
    ConvertPandasetRequest r{seq().string(), out.string(), "", scale == 1.0 ? 0 : 1600, scale == 1.0 ? 0 : 900};
    const std::vector<std::string> paths = convert_pandaset(r);
    ASSERT_EQ(paths.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      const Frame f = read_frame_json(paths[k]);
      EXPECT_EQ(f.stream, "017");
      EXPECT_EQ(f.scene, "017");
      EXPECT_EQ(f.token, "017/0" + std::to_string(k));
      EXPECT_DOUBLE_EQ(f.timestamp, 1557540000.25 + 0.1 * k);
      ASSERT_EQ(f.cameras.size(), 6u);
      // Ego: x forward (the lidar's +y), z up, rigid with the BEV frame; the pose follows the vehicle.
      const Mat4 world_from_ego = *f.T_world_from_ego;
      const Mat4 lidar = mat4_mul(world_from_ego, *f.T_ego_from_lidar);
      for (int e = 0; e < 16; ++e) EXPECT_NEAR(lidar[e], world_from_lidar(k)[e], 1e-9) << e;
      const auto forward = apply(world_from_ego, {1, 0, 0}), origin = apply(world_from_ego, {0, 0, 0});
      const auto lidar_forward = apply(world_from_lidar(k), {0, 1, 0});
      for (int c = 0; c < 3; ++c) EXPECT_NEAR(forward[c] - origin[c], lidar_forward[c] - apply(world_from_lidar(k), {0, 0, 0})[c], 1e-9);
      EXPECT_NEAR(apply(world_from_ego, {0, 0, 1})[2] - origin[2], 1.0, 1e-12);

      for (int i = 0; i < 6; ++i) {
        SCOPED_TRACE(kPandasetSlotNames[i]);
        const Camera& cam = f.cameras[static_cast<size_t>(i)];
        EXPECT_EQ(cam.name, kPandasetSlotNames[i]);
        const Mat4 l2i = camera_lidar2img(cam, *f.T_ego_from_lidar);
        const auto d = direction(i);
        const auto& t = kPlace[i];
        const std::array<double, 3> ahead = {t[0] + 20 * d[0], t[1] + 20 * d[1], t[2] + 20 * d[2]};
        const auto uv = project(l2i, ahead);
        EXPECT_NEAR(uv[0], kK[i].cx * scale, 1e-6);
        EXPECT_NEAR(uv[1], kK[i].cy * scale, 1e-6);
        const auto right = apply(lidar_from_cam(i), {2, 0, 20});  // 2 m right of the axis, 20 m out
        const auto uv_right = project(l2i, right);
        EXPECT_NEAR(uv_right[0], (kK[i].cx + kK[i].fx * 0.1) * scale, 1e-6);
        EXPECT_NEAR(uv_right[1], kK[i].cy * scale, 1e-6);
        // The image is there, at the size the frame promises.
        const Tensor img = read_image((out / cam.image_path).string());
        EXPECT_EQ(img.size(1), scale == 1.0 ? 1920 : 1600);
        EXPECT_EQ(img.size(0), scale == 1.0 ? 1080 : 900);
      }
    }
  }
}

TEST_F(Pandaset, BrokenSequencesNameTheFile) {
  const fs::path bad = fs::path(tmp_->str()) / "bad";
  fs::remove_all(bad);
  fs::copy(seq(), bad, fs::copy_options::recursive);
  const fs::path out = fs::path(tmp_->str()) / "bad_out";
  // One camera pose short of the lidar frames.
  const fs::path poses = bad / "camera" / "left_camera" / "poses.json";
  json p = json::parse(std::ifstream(poses));
  p.erase(p.size() - 1);
  std::ofstream(poses) << p.dump();
  try {
    convert_pandaset({bad.string(), out.string(), "", 0, 0});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("left_camera"), std::string::npos) << e.what();
  }
  // An output folder that cannot be made: an I/O error naming it, not a crash.
  const fs::path file = fs::path(tmp_->str()) / "a_file";
  std::ofstream(file) << "x";
  try {
    convert_pandaset({seq().string(), (file / "out").string(), "", 0, 0});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("a_file"), std::string::npos) << e.what();
  }
  fs::remove_all(bad / "lidar");
  EXPECT_THROW(convert_pandaset({bad.string(), out.string(), "", 0, 0}), Error);
  EXPECT_THROW(convert_pandaset({(bad / "none").string(), out.string(), "", 0, 0}), Error);
}

// A frame detect would refuse (a timestamp of 1e300 in the second) is refused by the converter
// before anything is written (until 2026-12-07 it wrote such frames), and so is a missing image
// of the last frame (it left the earlier frames and images behind).
TEST_F(Pandaset, AFrameDetectWouldRefuseWritesNothing) {
  for (const std::string broken : {"timestamp", "image"}) {
    const fs::path bad = fs::path(tmp_->str()) / ("bad_" + broken);
    fs::remove_all(bad);
    fs::copy(seq(), bad, fs::copy_options::recursive);
    if (broken == "timestamp") {
      std::ofstream(bad / "lidar" / "timestamps.json") << "[1557540000.25, 1e300]";
    } else {
      fs::remove(bad / "camera" / "back_camera" / "01.jpg");
    }
    const fs::path out = fs::path(tmp_->str()) / ("bad_out_" + broken);
    fs::remove_all(out);
    try {
      convert_pandaset({bad.string(), out.string(), "", 800, 450});
      FAIL() << broken << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(broken == "timestamp" ? "1e+300" : "01.jpg"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(out)) << broken << ": " << out << " was written";
  }
}

// The devkit files' readers (what fuzz_pandaset drives): each broken entry named.
TEST(PandasetFiles, BadEntriesAreInvalidInput) {
  auto fails = [](auto parse, const std::string& text, const std::string& says) {
    try {
      parse(text, "f.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << text;
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const auto poses = [](const std::string& t, const std::string& w) { return parse_pandaset_poses(t, w); };
  const auto times = [](const std::string& t, const std::string& w) { return parse_pandaset_timestamps(t, w); };
  const auto intrinsics = [](const std::string& t, const std::string& w) { return parse_pandaset_intrinsics(t, w); };
  const std::string pos = R"("position": {"x": 1, "y": 2, "z": 3})";
  fails(poses, "[{" + pos + R"(, "heading": {"w": 2, "x": 0, "y": 0, "z": 0}}])", "unit quaternion");
  fails(poses, "[{" + pos + R"(, "heading": {"w": 1, "x": 0, "y": 0}}])", "\"z\"");
  fails(poses, R"([{"position": {"x": 1, "y": 2, "z": 3}}])", "heading");
  fails(poses, "{", "not JSON");
  fails(times, "[1.5, \"2\"]", "[1]");
  fails(intrinsics, R"({"fx": -5, "fy": 5, "cx": 1, "cy": 1})", "fx");
  fails(intrinsics, R"({"fx": 5, "fy": 5, "cx": 1})", "\"cy\"");
  // A good pose: the quaternion of a quarter turn about z, and its position.
  const std::vector<Mat4> p = parse_pandaset_poses(
      "[{" + pos + R"(, "heading": {"w": 0.7071067811865476, "x": 0, "y": 0, "z": 0.7071067811865476}}])", "f.json");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NEAR(p[0][0], 0, 1e-12);
  EXPECT_NEAR(p[0][1], -1, 1e-12);
  EXPECT_NEAR(p[0][4], 1, 1e-12);
  EXPECT_EQ(p[0][3], 1);
  EXPECT_EQ(p[0][7], 2);
  EXPECT_EQ(p[0][11], 3);
}

}  // namespace
}  // namespace bev
