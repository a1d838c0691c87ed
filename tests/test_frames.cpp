// The frame path before the model: frame JSON (io/frame_json.h), image decoding (io/image.h),
// mmdetection3d info conversion and ground truth (io/nuscenes_info.h) and prepare_frame
// (runtime/prepare.h) — against the golden set's img / lidar2img / can_bus, the real nuScenes
// demo keyframe, and a catalogue of bad frames that must each give one clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "backend/registry.h"
#include "bevformer/error.h"
#include "core/mat4.h"
#include "io/checkpoint.h"
#include "io/frame_json.h"
#include "io/image.h"
#include "io/nuscenes_info.h"
#include "model/config.h"
#include "model/bevformer.h"
#include "model/geometry.h"
#include "runtime/prepare.h"
#include "io_test_util.h"
#include "micro_frames.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using testing::kMicroDir;
using testing::micro_frame_json;
using testing::TempDir;

const std::string kDemo = std::string(BEV_SHARED_DIR) + "/data/nuscenes-demo";

json read_json(const std::string& path) {
  const std::vector<uint8_t> b = read_file_bytes(path);
  return parse_python_json(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), path);
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Mat4 mat4_of(const json& j) { return mat4_from_json(j, "test", ""); }

double max_abs(const Mat4& a, const Mat4& b) {
  double m = 0;
  for (int i = 0; i < 16; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs(const Mat4& a) {
  double m = 0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

// Runs fn, which must throw Error of `kind` whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << parts.front() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// The image stage's first op (Ops::image_preprocess) on `backend`: a prepared frame's camera
// pixels as the network input, f32 [N, H_pad, W_pad, 3], read back to the host.
Tensor network_input(const PreparedFrame& p, const ModelConfig& cfg, const std::string& backend) {
  const std::unique_ptr<Backend> b = make_backend(backend, {.threads = 2});
  Ops ops(*b);
  const Tensor& px = p.input.img;
  return b->read(ops.image_preprocess(b->upload(px), image_preprocess_attrs(cfg.image, px.size(1), px.size(2)), "img"));
}

void expect_parse_error(const json& frame, const std::vector<std::string>& parts) {
  expect_error([&] { parse_frame_json(frame.dump(), "bad.json"); }, ErrorKind::kInvalidInput, parts);
}

// ------------------------------------------------------------------------------------------------
// Golden set: img, lidar2img and can_bus exactly as upstream built them (img: the set's PNGs as
// the frame path's pixels, through the image stage's preprocessing op on the CPU and on the
// asynchronous foreign backend).

TEST(FramesGolden, MicroFramesGiveTheSetsInputs) {
  const ModelConfig cfg = load_config(kMicroDir + "/config.json");
  TemporalState state;
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE("frame " + std::to_string(k));
    const json meta = read_json(kMicroDir + "/frame" + std::to_string(k) + "_meta.json");
    const Frame spec = parse_frame_json(micro_frame_json(k).dump(2), "micro.json");
    const PreparedFrame p = prepare_frame(spec, cfg, kMicroDir);
    const Checkpoint golden = load_checkpoint(kMicroDir + "/frame" + std::to_string(k) + ".safetensors");

    // img: every value equal (the set's NCHW against the engine's NHWC).
    const Tensor* nchw = golden.find("img");
    ASSERT_NE(nchw, nullptr);
    const Tensor nhwc = nchw->permute({0, 2, 3, 1}).contiguous();
    const Tensor* img = &nhwc;
    ASSERT_EQ(p.input.img.dtype(), DType::kU8);
    ASSERT_EQ(p.input.img.shape(), (Shape{6, 63, 112, 3}));  // the PNGs' pixels, preprocessed in the image stage
    for (const std::string backend : {"cpu", "foreign"}) {
      SCOPED_TRACE(backend);
      const Tensor net = network_input(p, cfg, backend);
      ASSERT_EQ(net.shape(), img->shape());
      const float* a = net.data<float>();
      const float* b = img->data<float>();
      double worst = 0;
      int64_t differ = 0;
      for (int64_t i = 0; i < img->numel(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
        differ += a[i] != b[i];
      }
      EXPECT_EQ(differ, 0) << "largest difference " << worst;
    }

    // lidar2img from K, T_ego_from_cam, T_ego_from_lidar: the set's to 1e-9 relative.
    ASSERT_EQ(p.input.lidar2img.size(), 6u);
    double rel = 0;
    for (size_t i = 0; i < 6; ++i) {
      const Mat4 want = mat4_of(meta["lidar2img"][i]);
      rel = std::max(rel, max_abs(p.input.lidar2img[i], want) / max_abs(want));
      EXPECT_EQ(p.lidar2img_original[i], p.input.lidar2img[i]);  // no resize in micro
    }
    EXPECT_LE(rel, 1e-9);
    RecordProperty("lidar2img_rel_frame" + std::to_string(k), json(rel).dump());

    // Absolute can_bus: the pose fields from T_world_from_ego, the rest from the frame's can_bus.
    const auto want_cb = meta["can_bus"].get<std::vector<double>>();
    double cb_worst = 0;
    for (int i = 0; i < 18; ++i) cb_worst = std::max(cb_worst, std::abs(p.input.can_bus[i] - want_cb[i]));
    RecordProperty("can_bus_max_abs_frame" + std::to_string(k), json(cb_worst).dump());
    for (int i = 0; i < 18; ++i) {
      if (i < 7 || i >= 16) {
        EXPECT_NEAR(p.input.can_bus[i], want_cb[i], 1e-9) << "can_bus[" << i << "]";
      } else {
        EXPECT_EQ(p.input.can_bus[i], want_cb[i]) << "can_bus[" << i << "]";
      }
    }
    EXPECT_EQ(p.input.scene_token, meta["scene_token"].get<std::string>());
    EXPECT_EQ(p.scene, meta["scene_token"].get<std::string>());
    EXPECT_EQ(p.stream, "micro");
    EXPECT_EQ(p.camera_names[2], "CAM_FRONT_LEFT");
    ASSERT_EQ(p.images.size(), 6u);
    EXPECT_EQ(p.images[0].shape(), (Shape{63, 112, 3}));

    // Through the model's delta: dbg.can_bus and dbg.shift.
    const TemporalStep step = temporal_step(state, p.input.scene_token, p.input.can_bus, cfg.video_test_mode);
    state.has_prev_bev = true;
    const Tensor* dbg_cb = golden.find("dbg.can_bus");
    const Tensor* dbg_shift = golden.find("dbg.shift");
    ASSERT_NE(dbg_cb, nullptr);
    ASSERT_NE(dbg_shift, nullptr);
    for (int i = 0; i < 18; ++i) EXPECT_NEAR(step.can_bus[i], dbg_cb->data<double>()[i], 1e-9) << "dbg.can_bus[" << i << "]";
    double dbg_worst = 0;
    for (int i = 0; i < 18; ++i) dbg_worst = std::max(dbg_worst, std::abs(step.can_bus[i] - dbg_cb->data<double>()[i]));
    RecordProperty("dbg_can_bus_max_abs_frame" + std::to_string(k), json(dbg_worst).dump());
    const std::array<float, 2> shift = bev_shift(step.can_bus, cfg);
    RecordProperty("shift_frame" + std::to_string(k), json({shift[0] - dbg_shift->data<float>()[0], shift[1] - dbg_shift->data<float>()[1]}).dump());
    EXPECT_NEAR(shift[0], dbg_shift->data<float>()[0], 1e-7);
    EXPECT_NEAR(shift[1], dbg_shift->data<float>()[1], 1e-7);
  }
}

TEST(FramesGolden, Lidar2imgGivenDirectlyAndInlineImagesGiveTheSameInput) {
  const ModelConfig cfg = load_config(kMicroDir + "/config.json");
  const json meta = read_json(kMicroDir + "/frame1_meta.json");
  const PreparedFrame ref = prepare_frame(parse_frame_json(micro_frame_json(1).dump()), cfg, kMicroDir);
  json f = micro_frame_json(1);
  for (size_t i = 0; i < 6; ++i) {
    json& c = f["cameras"][i];
    c.erase("K");
    c.erase("T_ego_from_cam");
    c["lidar2img"] = meta["lidar2img"][i];
    const std::vector<uint8_t> png = read_file_bytes(kMicroDir + "/" + c["image"].get<std::string>());
    c["image"] = {{"base64", base64_encode(png)}};
  }
  const Frame spec = parse_frame_json(f.dump());
  EXPECT_FALSE(spec.cameras[0].image_bytes.empty());
  const PreparedFrame p = prepare_frame(spec, cfg, "/nonexistent");  // base_dir unused for inline images
  ASSERT_EQ(p.input.img.shape(), ref.input.img.shape());
  EXPECT_EQ(0, std::memcmp(p.input.img.raw_data(), ref.input.img.raw_data(), p.input.img.nbytes()));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(p.input.lidar2img[i], mat4_of(meta["lidar2img"][i]));
  EXPECT_EQ(p.input.can_bus, ref.input.can_bus);
  // Cameras decoded in parallel give the same bytes.
  ThreadPool pool(3);
  const PreparedFrame q = prepare_frame(spec, cfg, "/nonexistent", &pool);
  EXPECT_EQ(0, std::memcmp(q.input.img.raw_data(), ref.input.img.raw_data(), q.input.img.nbytes()));
  EXPECT_EQ(q.lidar2img_original, p.lidar2img_original);
}

TEST(FramesGolden, PoseOnlyFrameHasZeroCanFields) {
  json f = micro_frame_json(0);
  f.erase("can_bus");
  f.erase("scene");
  const Frame spec = parse_frame_json(f.dump());
  const std::array<double, 18> cb = absolute_can_bus(spec);
  const json meta = read_json(kMicroDir + "/frame0_meta.json");
  for (int i = 0; i < 18; ++i) {
    if (i < 7 || i >= 16) {
      EXPECT_NEAR(cb[i], meta["can_bus"][i].get<double>(), 1e-9);
    } else {
      EXPECT_EQ(cb[i], 0.0);
    }
  }
  const PreparedFrame p = prepare_frame(spec, load_config(kMicroDir + "/config.json"), kMicroDir);
  EXPECT_EQ(p.scene, "");
  EXPECT_EQ(p.input.scene_token, "micro");  // the stream id stands in for a missing scene
}

TEST(FramesGolden, CanBusAloneIsUsedAsIs) {
  json f = micro_frame_json(2);
  f.erase("T_world_from_ego");
  const Frame spec = parse_frame_json(f.dump());
  const json meta = read_json(kMicroDir + "/frame2_meta.json");
  const std::array<double, 18> cb = absolute_can_bus(spec);
  const auto want = meta["can_bus"].get<std::vector<double>>();
  for (size_t i = 0; i < 18; ++i) EXPECT_EQ(cb[i], want[i]) << i;
}

TEST(FramesGolden, QuaternionAndPatchAngleOfKnownRotations) {
  // A yaw of -100 degrees about z: quaternion (cos(-50°), 0, 0, sin(-50°)), patch angle 260°.
  const double a = -100 * std::numbers::pi / 180;
  Mat4 t = mat4_identity();
  t[0] = std::cos(a);
  t[1] = -std::sin(a);
  t[4] = std::sin(a);
  t[5] = std::cos(a);
  t[3] = 1.5;
  t[7] = -2.5;
  const auto q = rotation_quaternion_wxyz(t);
  EXPECT_NEAR(q[0], std::cos(a / 2), 1e-15);
  EXPECT_NEAR(q[3], std::sin(a / 2), 1e-15);
  Frame spec;
  spec.T_world_from_ego = t;
  const auto cb = absolute_can_bus(spec);
  EXPECT_EQ(cb[0], 1.5);
  EXPECT_EQ(cb[1], -2.5);
  EXPECT_NEAR(cb[17], 260.0, 1e-12);
  EXPECT_NEAR(cb[16], 260.0 * std::numbers::pi / 180, 1e-12);
  // A 180-degree turn (trace -1) takes another branch; w >= 0 always.
  Mat4 r = mat4_identity();
  r[0] = -1;
  r[5] = -1;
  const auto q2 = rotation_quaternion_wxyz(r);
  EXPECT_NEAR(std::abs(q2[3]), 1.0, 1e-15);
  EXPECT_GE(q2[0], 0.0);
}

// ------------------------------------------------------------------------------------------------
// The nuScenes demo keyframe: convert-info -> frame JSON -> prepare_frame with the tiny preset.

TEST(FramesDemo, ConvertInfoThenPrepareTiny) {
  TempDir dir;
  const std::string out = dir.file("frames");
  const std::vector<std::string> paths = convert_info(kDemo + "/info.json", out, {});
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(fs::path(paths[0]).filename(), "frame_0000.json");
  const Frame spec = read_frame_json(paths[0]);
  const json info = read_json(kDemo + "/info.json");
  const json& e = info["data_list"][0];
  EXPECT_EQ(spec.stream, "info");
  EXPECT_EQ(spec.scene.value_or(""), "n015-2018-07-24-11-22-45+0800/0");
  EXPECT_EQ(spec.timestamp, e["timestamp"].get<double>());
  EXPECT_EQ(*spec.T_world_from_ego, mat4_of(e["ego2global"]));
  EXPECT_EQ(*spec.T_ego_from_lidar, mat4_of(e["lidar_points"]["lidar2ego"]));
  ASSERT_EQ(spec.cameras.size(), 6u);

  const ModelConfig cfg = config_preset("tiny");
  const PreparedFrame p = prepare_frame(spec, cfg, out);
  ASSERT_EQ(p.input.img.shape(), (Shape{6, 900, 1600, 3}));  // the pixels the image stage preprocesses
  const Tensor net = network_input(p, cfg, "cpu");
  ASSERT_EQ(net.shape(), (Shape{6, 480, 800, 3}));
  // The foreign backend's queue runs the same op to the same bits.
  const Tensor foreign = network_input(p, cfg, "foreign");
  EXPECT_EQ(0, std::memcmp(foreign.raw_data(), net.raw_data(), net.nbytes()));
  const float* img = net.data<float>();
  const auto& mean = cfg.image.mean;
  const auto& std_ = cfg.image.std;
  ASSERT_TRUE(cfg.image.to_rgb);
  double worst = 0;
  for (size_t i = 0; i < 6; ++i) {
    const std::string name = nuscenes_camera_names()[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(spec.cameras[i].name, name);
    const json& cam = e["images"][name];
    // The image path is relative to the frame file and decodes to the original 1600x900 pixels.
    EXPECT_EQ(fs::path(spec.cameras[i].image_path).filename(), cam["img_path"].get<std::string>());
    const Tensor bgr = read_image(kDemo + "/" + cam["img_path"].get<std::string>());
    ASSERT_EQ(bgr.shape(), (Shape{900, 1600, 3}));
    EXPECT_EQ(0, std::memcmp(bgr.data<uint8_t>(), p.images[i].data<uint8_t>(), bgr.nbytes()));

    // Pixels by hand: RGB, (v - mean) / std, then at s = 0.5 the 2x2 box average.
    const uint8_t* px = bgr.data<uint8_t>();
    for (const auto& [y, x] : std::vector<std::pair<int, int>>{{0, 0}, {100, 200}, {224, 399}, {449, 799}, {300, 123}}) {
      for (int c = 0; c < 3; ++c) {
        const int bgr_c = 2 - c;  // network channel c (RGB) reads BGR channel 2 - c
        double sum = 0;
        for (int dy = 0; dy < 2; ++dy) {
          for (int dx = 0; dx < 2; ++dx) {
            const double v = px[((2 * y + dy) * 1600 + (2 * x + dx)) * 3 + bgr_c];
            sum += (v - mean[c]) / std_[c];
          }
        }
        const double got = img[((i * 480 + y) * 800 + x) * 3 + c];
        worst = std::max(worst, std::abs(got - sum / 4));
        EXPECT_NEAR(got, sum / 4, 1e-5) << "pixel (" << y << ", " << x << ") channel " << c;
      }
    }
    // Padding rows 450..479 are exactly 0.
    for (int c = 0; c < 3; ++c) {
      for (int y = 450; y < 480; y += 7) {
        for (int x = 0; x < 800; x += 97) EXPECT_EQ(img[((i * 480 + y) * 800 + x) * 3 + c], 0.0f);
      }
    }

    // lidar2img = diag(.5, .5, 1, 1) @ [K 0; 0 1] @ lidar2cam, and the original without the scale.
    const Mat4 k4 = mat4_from_intrinsics(mat3_from_json(cam["cam2img"], "test", ""));
    const Mat4 original = mat4_mul(k4, mat4_of(cam["lidar2cam"]));
    Mat4 scaled = original;
    for (int col = 0; col < 4; ++col) {
      scaled[col] *= 0.5;
      scaled[4 + col] *= 0.5;
    }
    EXPECT_LE(max_abs(p.lidar2img_original[i], original), 1e-12 * max_abs(original));
    EXPECT_LE(max_abs(p.input.lidar2img[i], scaled), 1e-12 * max_abs(scaled));
  }
  RecordProperty("demo_pixel_max_abs", json(worst).dump());

  // can_bus from the pose: translation, a quaternion of the rotation, patch angle; zeros elsewhere.
  const Mat4 t = mat4_of(e["ego2global"]);
  EXPECT_EQ(p.input.can_bus[0], t[3]);
  EXPECT_EQ(p.input.can_bus[1], t[7]);
  EXPECT_EQ(p.input.can_bus[2], t[11]);
  const double w = p.input.can_bus[3], x = p.input.can_bus[4], y = p.input.can_bus[5], z = p.input.can_bus[6];
  EXPECT_NEAR(1 - 2 * (y * y + z * z), t[0], 1e-6);
  EXPECT_NEAR(2 * (x * y + w * z), t[4], 1e-6);
  EXPECT_NEAR(2 * (x * z - w * y), t[8], 1e-6);
  double deg = std::atan2(t[4], t[0]) * 180 / std::numbers::pi;
  if (deg < 0) deg += 360;
  EXPECT_NEAR(p.input.can_bus[17], deg, 1e-9);
  for (int i = 7; i < 16; ++i) EXPECT_EQ(p.input.can_bus[i], 0.0);
  EXPECT_EQ(p.input.scene_token, "n015-2018-07-24-11-22-45+0800/0");
}

TEST(FramesDemo, ConvertInfoOptionsAndErrors) {
  TempDir dir;
  ConvertInfoOptions o;
  o.stream = "car7";
  o.scene = "drive-1";
  const auto paths = convert_info(kDemo + "/info.json", dir.file("a/b"), o);
  const Frame spec = read_frame_json(paths.at(0));
  EXPECT_EQ(spec.stream, "car7");
  EXPECT_EQ(spec.scene.value_or(""), "drive-1");
  // Images that are not where the info says.
  o.images_dir = dir.str();
  expect_error([&] { convert_info(kDemo + "/info.json", dir.file("c"), o); }, ErrorKind::kNotFound,
               {"data_list[0].images.CAM_FRONT", "camera image not found", "samples/CAM_FRONT"});
  // A broken info file names the key.
  json info = read_json(kDemo + "/info.json");
  info["data_list"][0]["images"]["CAM_BACK"]["cam2img"][1] = {1.0, 2.0};
  std::ofstream(dir.file("bad_info.json")) << info.dump();
  expect_error([&] { read_nuscenes_info(dir.file("bad_info.json")); }, ErrorKind::kInvalidInput,
               {"bad_info.json: data_list[0].images.CAM_BACK.cam2img[1]", "has 2 numbers"});
  // An img_path out of --images (absolute, or climbing out with ..) is refused, even where the
  // file exists (until 2026-12-07 the frame pointed at it).
  for (const std::string escape : {"/etc/hostname", "../../../../../../etc/hostname", "x/../../y.jpg"}) {
    json out = read_json(kDemo + "/info.json");
    out["data_list"][0]["images"]["CAM_FRONT"]["img_path"] = escape;
    std::ofstream(dir.file("escape_info.json")) << out.dump();
    ConvertInfoOptions e;
    e.images_dir = kDemo;
    expect_error([&] { convert_info(dir.file("escape_info.json"), dir.file("d"), e); }, ErrorKind::kInvalidInput,
                 {"data_list[0].images.CAM_FRONT", "leads outside the images folder"});
  }
}

TEST(FramesDemo, GroundTruthOfTheDemoEntry) {
  const json info = read_json(kDemo + "/info.json");
  const json& e = info["data_list"][0];
  const std::vector<GtBox> boxes = read_info_ground_truth(kDemo + "/info.json", 0);
  size_t want = 0, cam_instances = 0;
  for (const json& in : e["instances"]) want += in["bbox_label_3d"].get<int>() != -1;
  for (const auto& [name, list] : e["cam_instances"].items()) {
    for (const json& ci : list) cam_instances += ci["bbox_label_3d"].get<int>() != -1;
  }
  ASSERT_EQ(boxes.size(), want);
  const json& first = e["instances"][0];
  for (size_t k = 0; k < 7; ++k) EXPECT_EQ(boxes[0].box[k], first["bbox_3d"][k].get<double>());
  EXPECT_EQ(boxes[0].class_name, "pedestrian");  // label 7 in mmdetection3d's order
  EXPECT_EQ(boxes[0].num_lidar_pts, first["num_lidar_pts"].get<int64_t>());
  EXPECT_EQ(boxes[0].cameras, std::vector<std::string>{"CAM_FRONT"});
  size_t seen = 0;
  for (const GtBox& b : boxes) seen += b.cameras.size();
  EXPECT_EQ(seen, cam_instances);  // every cam_instance found its box
  EXPECT_EQ(boxes[1].velocity[1], e["instances"][1]["velocity"][1].get<double>());
  expect_error([&] { read_info_ground_truth(kDemo + "/info.json", 1); }, ErrorKind::kNotFound, {"no entry 1"});
}

// ------------------------------------------------------------------------------------------------
// Bad frames: one clear error each, naming the field or camera.

TEST(FramesBad, ParseErrorsNameTheField) {
  const json good = micro_frame_json(0);
  ASSERT_NO_THROW(parse_frame_json(good.dump()));
  {
    json f = good;
    f["cameras"][2].erase("name");
    expect_parse_error(f, {"bad.json: cameras[2].name", "is missing"});
  }
  {
    json f = good;
    f["cameras"][4].erase("image");
    expect_parse_error(f, {"cameras[4].image", "is missing"});
  }
  {
    json f = good;
    f["cameras"][3].erase("T_ego_from_cam");
    expect_parse_error(f, {"cameras[3].T_ego_from_cam", "is missing (K is given)"});
  }
  {
    json f = good;
    f["cameras"][1]["K"][0].push_back(0.0);
    expect_parse_error(f, {"cameras[1].K[0]", "has 4 numbers", "3 per row (3x3)"});
  }
  {
    json f = good;
    f["T_world_from_ego"].erase(3);
    expect_parse_error(f, {"T_world_from_ego", "has 3 rows", "4x4"});
  }
  {
    json f = good;
    f["can_bus"].erase(17);
    expect_parse_error(f, {"can_bus", "a list of 17", "18 numbers"});
  }
  {
    json f = good;
    f["T_world_from_ego"][0][3] = std::numeric_limits<double>::quiet_NaN();
    expect_error([&] { frame_from_json(f, "bad.json"); }, ErrorKind::kInvalidInput,
                 {"T_world_from_ego[0][3]", "is not finite"});
    std::string text = good.dump();
    text.replace(text.find("411.3"), 5, "1e999");
    expect_error([&] { parse_frame_json(text, "bad.json"); }, ErrorKind::kInvalidInput, {"bad.json", "number overflow"});
  }
  {
    json f = good;
    for (int r = 0; r < 3; ++r) f["T_world_from_ego"][r][0] = f["T_world_from_ego"][r][0].get<double>() * 1.1;
    expect_parse_error(f, {"T_world_from_ego", "not a rigid transform", "|R^T R - I|"});
  }
  {
    json f = good;
    for (int r = 0; r < 3; ++r) f["cameras"][5]["T_ego_from_cam"][r][1] = -f["cameras"][5]["T_ego_from_cam"][r][1].get<double>();
    expect_parse_error(f, {"cameras[5].T_ego_from_cam", "reflection"});
  }
  {
    json f = good;
    f["T_ego_from_lidar"][3][2] = 0.5;
    expect_parse_error(f, {"T_ego_from_lidar", "bottom row"});
  }
  {
    json f = good;
    f["cameras"][2]["Kx"] = 1;
    expect_parse_error(f, {"cameras[2].Kx: unknown field", "one of: name, image, K, T_ego_from_cam, lidar2img"});
    json g = good;
    g["pose"] = 1;
    expect_parse_error(g, {"bad.json: pose: unknown field"});
    json h = good;
    h["cameras"][0]["image"] = {{"base64", "AAAA"}, {"mime", "image/png"}};
    expect_parse_error(h, {"cameras[0].image.mime: unknown field"});
  }
  {
    json f = good;
    f["cameras"][0]["image"] = {{"base64", "iVBORw0K%GgoAAAA"}};
    expect_parse_error(f, {"cameras[0].image.base64", "not valid base64", "'%'", "character 8"});
    f["cameras"][0]["image"] = {{"base64", "data:image/png;base64,iVBO"}};
    expect_parse_error(f, {"cameras[0].image.base64", "data: URI"});
    f["cameras"][0]["image"] = {{"base64", ""}};
    expect_parse_error(f, {"cameras[0].image.base64", "is empty"});
  }
  {
    json f = good;
    f["cameras"][3]["name"] = "CAM_FRONT";
    expect_parse_error(f, {"cameras[3].name", "also the name of cameras[0]"});
  }
  {
    json f = good;
    f["cameras"][1]["lidar2img"] = f["T_world_from_ego"];
    expect_parse_error(f, {"cameras[1]", "both lidar2img and K"});
  }
  {
    json f = good;
    f.erase("T_world_from_ego");
    f.erase("can_bus");
    expect_parse_error(f, {"T_world_from_ego", "is missing (and there is no can_bus)"});
  }
  {
    json f = good;
    f.erase("T_world_from_ego");
    f["can_bus"][3] = 0.0;
    expect_parse_error(f, {"can_bus[3:7]", "unit quaternion"});
  }
  {
    json f = good;
    f["cameras"][0]["K"][0][0] = -5.0;
    expect_parse_error(f, {"cameras[0].K", "focal lengths"});
  }
  {
    json f = good;
    f["stream"] = "";
    expect_parse_error(f, {"stream", "is empty"});
    f["stream"] = 5;
    expect_parse_error(f, {"stream", "a number (5)"});
  }
  // Duplicate keys and syntax errors in the text itself.
  std::string text = good.dump();
  text.insert(1, "\"stream\":\"x\",");
  expect_error([&] { parse_frame_json(text, "bad.json"); }, ErrorKind::kInvalidInput, {"bad.json: stream", "duplicate field"});
  std::string cam_dup = good.dump();
  const size_t at = cam_dup.find("\"name\":\"CAM_FRONT_LEFT\"");
  ASSERT_NE(at, std::string::npos);
  cam_dup.insert(at, "\"name\":\"X\",");
  expect_error([&] { parse_frame_json(cam_dup, "bad.json"); }, ErrorKind::kInvalidInput, {"cameras[2].name", "duplicate field"});
  expect_error([&] { parse_frame_json("{\"stream\": ", "bad.json"); }, ErrorKind::kInvalidInput, {"bad.json (byte", "not valid JSON"});
  expect_error([&] { parse_frame_json(std::string(100, '[') + std::string(100, ']'), "deep.json"); }, ErrorKind::kInvalidInput,
               {"deep.json", "nests deeper than 16"});
  expect_error([&] { parse_frame_json("[1, 2]", "bad.json"); }, ErrorKind::kInvalidInput, {"a JSON object"});
}

TEST(FramesBad, PrepareErrorsNameTheCamera) {
  const ModelConfig cfg = load_config(kMicroDir + "/config.json");
  const json good = micro_frame_json(0);
  TempDir dir;
  auto prepare = [&](const json& f, const std::string& base) { prepare_frame(parse_frame_json(f.dump()), cfg, base); };
  {
    json f = good;
    f["cameras"].erase(5);
    expect_error([&] { prepare(f, kMicroDir); }, ErrorKind::kInvalidInput, {"cameras", "the frame has 5 cameras", "6 (the model's camera slots"});
  }
  {
    json f = good;
    std::swap(f["cameras"][1], f["cameras"][2]);
    expect_error([&] { prepare(f, kMicroDir); }, ErrorKind::kInvalidInput, {"cameras[1] (CAM_FRONT_LEFT)", "out of slot order"});
  }
  {
    json f = good;
    f["cameras"][3]["image"] = "images/no_such_file.png";
    expect_error([&] { prepare(f, kMicroDir); }, ErrorKind::kNotFound, {"cameras[3] (CAM_BACK) image", "no_such_file.png"});
  }
  // Image files that are not images, empty, or cut short.
  const std::vector<uint8_t> jpeg = read_file_bytes(kDemo + "/n015-2018-07-24-11-22-45+0800__CAM_FRONT__1532402927612460.jpg");
  const std::vector<uint8_t> png = read_file_bytes(kMicroDir + "/images/frame0_cam4_CAM_BACK_LEFT.png");
  write_bytes(dir.file("text.png"), std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o'});
  write_bytes(dir.file("empty.jpg"), {});
  write_bytes(dir.file("cut.jpg"), std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  write_bytes(dir.file("cut.png"), std::vector<uint8_t>(png.begin(), png.begin() + png.size() - 20));
  write_bytes(dir.file("big.jpg"), jpeg);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"text.png", "not a JPEG or PNG image"},
      {"empty.jpg", "the image is empty"},
      {"cut.jpg", "JPEG image is truncated"},
      {"cut.png", "PNG image is truncated"},
      {"big.jpg", "the image is 1600x900 but the model's camera rig is 112x63"},
  };
  for (const auto& [file, message] : cases) {
    SCOPED_TRACE(file);
    json f = good;
    f["cameras"][4]["image"] = dir.file(file);  // an absolute path ignores base_dir
    expect_error([&] { prepare(f, kMicroDir); }, ErrorKind::kInvalidInput, {"cameras[4] (CAM_BACK_LEFT) image", file, message});
  }
  // The same bytes inline.
  json f = good;
  f["cameras"][0]["image"] = {{"base64", base64_encode(std::vector<uint8_t>(png.begin(), png.begin() + 100))}};
  expect_error([&] { prepare(f, kMicroDir); }, ErrorKind::kInvalidInput, {"cameras[0] (CAM_FRONT) image (base64)", "truncated"});
}

TEST(FramesImage, EveryTruncationOfAJpegIsRefused) {
  const std::vector<uint8_t> jpeg = read_file_bytes(kDemo + "/n015-2018-07-24-11-22-45+0800__CAM_BACK__1532402927637525.jpg");
  const ImageHeader h = inspect_image(jpeg, "full");
  EXPECT_EQ(h.format, ImageFormat::kJpeg);
  EXPECT_EQ(h.width, 1600);
  EXPECT_EQ(h.height, 900);
  for (size_t cut = 0; cut < jpeg.size(); cut += 997) {
    EXPECT_THROW(inspect_image(std::span<const uint8_t>(jpeg.data(), cut), "cut"), Error) << cut;
  }
  EXPECT_THROW(inspect_image(std::span<const uint8_t>(jpeg.data(), jpeg.size() - 1), "cut"), Error);
  // A PNG round trip through encode/decode keeps every pixel.
  const Tensor bgr = read_image(kMicroDir + "/images/frame2_cam5_CAM_BACK_RIGHT.png");
  const Tensor back = decode_image(encode_image(bgr, ".png"), "encoded");
  ASSERT_EQ(back.shape(), bgr.shape());
  EXPECT_EQ(0, std::memcmp(back.data<uint8_t>(), bgr.data<uint8_t>(), bgr.nbytes()));
}

// ------------------------------------------------------------------------------------------------
// Writing frames and base64.

TEST(FramesJson, TextRoundTripKeepsEveryValue) {
  Frame spec = parse_frame_json(micro_frame_json(2).dump());
  spec.cameras[1].image_path.clear();
  spec.cameras[1].image_bytes = ImageBytes::adopt({0, 1, 2, 250, 255});
  spec.cameras[2].K.reset();
  spec.cameras[2].T_ego_from_cam.reset();
  spec.cameras[2].lidar2img = Mat4{0.1, 1e-300, -3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0, 0, 1};
  spec.timestamp = 1533151603.547590123;
  const std::string text = frame_json_text(spec);
  EXPECT_EQ(parse_frame_json(text), spec);
  EXPECT_NE(text.find("\"T_world_from_ego\": [\n    ["), std::string::npos) << text.substr(0, 400);
  TempDir dir;
  write_frame_json(dir.file("f.json"), spec);
  EXPECT_EQ(read_frame_json(dir.file("f.json")), spec);
  expect_error([&] { read_frame_json(dir.file("missing.json")); }, ErrorKind::kNotFound, {"missing.json", "no such frame file"});
}

TEST(FramesJson, Base64FollowsRfc4648) {
  const std::vector<std::pair<std::string, std::string>> vectors = {
      {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    const std::vector<uint8_t> bytes(plain.begin(), plain.end());
    EXPECT_EQ(base64_encode(bytes), encoded);
    EXPECT_EQ(base64_decode(encoded, "t"), bytes);
  }
  EXPECT_EQ(base64_decode("Zm9v\r\nYmFy\n", "t"), (std::vector<uint8_t>{'f', 'o', 'o', 'b', 'a', 'r'}));
  for (const char* bad : {"Zg=", "Z===", "Zg==Zg==", "Zm9", "Zm9v!", "=Zm9"}) {
    EXPECT_THROW(base64_decode(bad, "t"), Error) << bad;
  }
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  EXPECT_EQ(base64_decode(base64_encode(all), "t"), all);
}

}  // namespace
}  // namespace bev
