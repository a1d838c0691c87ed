// Golden sets: the reader (io/golden_set.h), the tensor and detection comparisons, the report,
// and the end-to-end run of shared/golden/micro through the model (bevformer/golden.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/golden.h"
#include "io/checkpoint.h"
#include "io/golden_set.h"
#include "io/safetensors.h"
#include "model/bevformer.h"
#include "io_test_util.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

using testing::TempDir;

const std::vector<std::string> kSetFiles = {
    "config.json",        "checkpoint.pth",     "weights.safetensors", "golden.json",
    "frame0.safetensors", "frame0_meta.json",   "frame1.safetensors",  "frame1_meta.json",
    "frame2.safetensors", "frame2_meta.json"};

// Copies the micro set's files except `leave_out` into `dir`.
void copy_set(const TempDir& dir, const std::vector<std::string>& leave_out = {}) {
  for (const auto& f : kSetFiles) {
    if (std::find(leave_out.begin(), leave_out.end(), f) != leave_out.end()) continue;
    fs::copy_file(kMicro + "/" + f, dir.file(f));
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Runs `f`, expecting a bev::Error of `kind` whose message contains `fragment`.
void expect_error(const std::function<void()>& f, ErrorKind kind, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << error_kind_name(kind) << " mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

TEST(GoldenSetReader, FindsTheMicroSet) {
  const GoldenSetFiles s = find_golden_set(kMicro);
  ASSERT_EQ(s.num_frames(), 3u);
  EXPECT_EQ(fs::path(s.config_path).filename(), "config.json");
  EXPECT_EQ(fs::path(s.checkpoint_path).filename(), "checkpoint.pth");
  EXPECT_EQ(fs::path(s.summary_path).filename(), "golden.json");
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(fs::path(s.frame_tensor_paths[k]).filename(), "frame" + std::to_string(k) + ".safetensors");
    EXPECT_EQ(fs::path(s.frame_meta_paths[k]).filename(), "frame" + std::to_string(k) + "_meta.json");
  }
}

TEST(GoldenSetReader, BuildsFrameInputFromTensorsAndMeta) {
  const GoldenSetFiles s = find_golden_set(kMicro);
  for (size_t k : {0u, 1u}) {
    const GoldenFrame f = load_golden_frame(s, k);
    const json meta = read_json(s.frame_meta_paths[k]);
    const GoldenFrame& in = f;
    ASSERT_TRUE(in.img.defined());
    EXPECT_EQ(in.img.dtype(), DType::kF32);
    EXPECT_EQ(in.img.shape(), (Shape{6, 3, 64, 128}));
    const Tensor& img = *f.tensors.find("img");
    EXPECT_EQ(in.img.raw_data(), img.raw_data());  // the set's tensor itself, no copy

    ASSERT_EQ(in.lidar2img.size(), 6u);
    for (size_t c = 0; c < 6; ++c) {
      for (size_t r = 0; r < 4; ++r) {
        for (size_t col = 0; col < 4; ++col) {
          EXPECT_EQ(in.lidar2img[c][r * 4 + col], meta["lidar2img"][c][r][col].get<double>());
        }
      }
    }
    // Raw can_bus, before the test-time delta (that is the model's job).
    for (size_t i = 0; i < 18; ++i) EXPECT_EQ(in.can_bus[i], meta["can_bus"][i].get<double>());
    EXPECT_NE(in.can_bus[17], 0.0);
    EXPECT_EQ(in.scene_token, "micro-scene-0001");
  }
  // frame 0: absolute position, not the delta the model consumed.
  const GoldenFrame f0 = load_golden_frame(s, 0);
  EXPECT_DOUBLE_EQ(f0.can_bus[0], 411.3);
  EXPECT_DOUBLE_EQ(f0.can_bus[1], 1180.89);
}

TEST(GoldenSetReader, ReadsGoldenDetectionsInRankOrder) {
  const GoldenSetFiles s = find_golden_set(kMicro);
  const GoldenFrame f = load_golden_frame(s, 2);
  ASSERT_TRUE(f.has_detections);
  ASSERT_EQ(f.detections.size(), 300u);
  const Tensor boxes = f.tensors.find("det.boxes_3d")->to(DType::kF32);
  const Tensor labels = *f.tensors.find("det.labels_3d");
  const Tensor query = *f.tensors.find("det.query_index");
  for (size_t i = 0; i < f.detections.size(); ++i) {
    const DetectionRecord& d = f.detections[i];
    if (i > 0) {
      EXPECT_LE(d.score, f.detections[i - 1].score);
    }
    for (size_t j = 0; j < 9; ++j) EXPECT_EQ(static_cast<float>(d.box[j]), boxes.data<float>()[i * 9 + j]);
    EXPECT_EQ(d.label, labels.data<int64_t>()[i]);
    EXPECT_EQ(d.query, query.data<int64_t>()[i]);
    EXPECT_GE(d.label, 0);
    EXPECT_LT(d.label, 10);
    EXPECT_EQ(d.query * 10 + d.label >= 0, true);
  }
  // Round trip through the dump layout: the same dtypes as the set.
  const auto t = detection_tensors(f.detections);
  ASSERT_EQ(t.size(), 4u);
  for (const auto& [name, tensor] : t) {
    const Tensor* g = f.tensors.find(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_EQ(tensor.dtype(), g->dtype()) << name;
    EXPECT_EQ(tensor.shape(), g->shape()) << name;
    EXPECT_EQ(compare_golden_tensor(name, tensor, *g, 0).status, GoldenTensorResult::Status::kOk) << name;
  }
}

TEST(GoldenSetReader, FallsBackToWeightsSafetensors) {
  TempDir d;
  copy_set(d, {"checkpoint.pth"});
  const GoldenSetFiles s = find_golden_set(d.str());
  EXPECT_EQ(fs::path(s.checkpoint_path).filename(), "weights.safetensors");
  EXPECT_EQ(s.num_frames(), 3u);
}

TEST(GoldenSetReader, FramesStopAtTheFirstMissingOne) {
  TempDir d;
  copy_set(d, {"frame1.safetensors", "frame1_meta.json", "golden.json"});
  const GoldenSetFiles s = find_golden_set(d.str());
  EXPECT_EQ(s.num_frames(), 1u);
  EXPECT_TRUE(s.summary_path.empty());
  expect_error([&] { load_golden_frame(s, 1); }, ErrorKind::kNotFound, "frame 1");
}

TEST(GoldenSetReader, MissingFilesAreNotFound) {
  expect_error([] { find_golden_set(kMicro + "/no-such-set"); }, ErrorKind::kNotFound, "no-such-set");
  {
    TempDir d;
    copy_set(d, {"config.json"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kNotFound, "config.json");
  }
  {
    TempDir d;
    copy_set(d, {"checkpoint.pth", "weights.safetensors"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kNotFound, "weights.safetensors");
  }
  {
    TempDir d;
    copy_set(d, {"frame0.safetensors", "frame0_meta.json", "frame1.safetensors", "frame1_meta.json",
                 "frame2.safetensors", "frame2_meta.json"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kNotFound, "frame0");
  }
  {
    TempDir d;
    copy_set(d, {"frame1_meta.json"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kNotFound, "frame1_meta.json");
  }
  {
    TempDir d;
    copy_set(d, {"frame2.safetensors"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kNotFound, "frame2.safetensors");
  }
  {
    // golden.json lists 3 frames; the directory has 2.
    TempDir d;
    copy_set(d, {"frame2.safetensors", "frame2_meta.json"});
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kInvalidInput, "golden.json lists 3 frames");
  }
}

TEST(GoldenSetReader, GarbledFilesAreInvalidInput) {
  {
    TempDir d;
    copy_set(d);
    write_text(d.file("golden.json"), "{\"set\": \"micro\", \"frames\": [");
    expect_error([&] { find_golden_set(d.str()); }, ErrorKind::kInvalidInput, "golden.json");
  }
  {
    TempDir d;
    copy_set(d);
    write_text(d.file("frame1_meta.json"), "{\"scene_token\": \"micro-scene-0001\", \"can_bus\": [1, 2,");
    const GoldenSetFiles s = find_golden_set(d.str());
    EXPECT_NO_THROW(load_golden_frame(s, 0));
    expect_error([&] { load_golden_frame(s, 1); }, ErrorKind::kInvalidInput, "frame1_meta.json");
  }
  // Meta keys of the wrong form.
  const json meta = read_json(kMicro + "/frame0_meta.json");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> edits = {
      {[](json& m) { m["lidar2img"].erase(m["lidar2img"].begin()); }, "lidar2img"},
      {[](json& m) { m["lidar2img"][3][2] = json::array({1, 2, 3}); }, "lidar2img"},
      {[](json& m) { m["lidar2img"][0][0][0] = "x"; }, "lidar2img"},
      {[](json& m) { m["can_bus"].erase(m["can_bus"].begin()); }, "can_bus"},
      {[](json& m) { m.erase("can_bus"); }, "can_bus"},
      {[](json& m) { m.erase("scene_token"); }, "scene_token"},
      {[](json& m) { m["scene_token"] = 7; }, "scene_token"},
      {[](json& m) { m["frame"] = 4; }, "frame"},
      {[](json& m) { m = json::array(); }, "JSON object"},
  };
  for (const auto& [edit, key] : edits) {
    TempDir d;
    copy_set(d);
    json m = meta;
    edit(m);
    write_text(d.file("frame0_meta.json"), m.dump());
    const GoldenSetFiles s = find_golden_set(d.str());
    expect_error([&] { load_golden_frame(s, 0); }, ErrorKind::kInvalidInput, key);
  }
}

TEST(GoldenSetReader, WrongTensorsAreInvalidInput) {
  const Checkpoint frame = load_checkpoint(kMicro + "/frame0.safetensors");
  auto rewrite = [&](const TempDir& d, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> t = frame.tensors();
    edit(t);
    write_safetensors(d.file("frame0.safetensors"), t);
  };
  auto named = [](std::vector<std::pair<std::string, Tensor>>& t, const std::string& name) -> Tensor& {
    for (auto& [n, x] : t) {
      if (n == name) return x;
    }
    throw std::runtime_error("no " + name);
  };
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { named(t, "img") = named(t, "img").reshape({6, 3, 64 * 128}); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "'img'");
  }
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { named(t, "img") = named(t, "img").slice(1, 0, 2).contiguous(); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "'img'");
  }
  {
    // 5 cameras in img, 6 matrices in the meta file.
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { named(t, "img") = named(t, "img").slice(0, 0, 5).contiguous(); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "lidar2img");
  }
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { std::erase_if(t, [](const auto& p) { return p.first == "img"; }); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "'img'");
  }
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { std::erase_if(t, [](const auto& p) { return p.first == "det.labels_3d"; }); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "det.");
  }
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { named(t, "det.scores_3d") = named(t, "det.scores_3d").slice(0, 0, 299).contiguous(); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "inconsistent");
  }
  {
    TempDir d;
    copy_set(d);
    rewrite(d, [&](auto& t) { named(t, "det.labels_3d") = named(t, "det.labels_3d").to(DType::kF32); });
    expect_error([&] { load_golden_frame(find_golden_set(d.str()), 0); }, ErrorKind::kInvalidInput, "det.labels_3d");
  }
  {
    // A truncated file: the safetensors reader's error (it names the file).
    TempDir d;
    copy_set(d);
    fs::resize_file(d.file("frame0.safetensors"), 1000);
    try {
      load_golden_frame(find_golden_set(d.str()), 0);
      ADD_FAILURE() << "a truncated frame file was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("frame0.safetensors"), std::string::npos) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor comparison

TEST(GoldenCompare, FloatTensorsWithinAndOverTolerance) {
  const std::vector<float> v = {1, -2, 3, -4, 5, 6};
  const Tensor want = Tensor::from_floats({2, 3}, v);
  std::vector<float> near = v, far = v;
  near[2] += 3e-4f;  // relative L2 = 3e-4 / sqrt(91) = 3.1e-5
  far[2] += 3e-3f;   // 3.1e-4
  const auto ok = compare_golden_tensor("neck.0", Tensor::from_floats({2, 3}, near), want, 1e-4);
  EXPECT_EQ(ok.status, GoldenTensorResult::Status::kOk);
  EXPECT_NEAR(ok.relative_l2, 3e-4 / std::sqrt(91.0), 1e-8);
  EXPECT_NEAR(ok.max_abs, 3e-4, 1e-7);
  EXPECT_FALSE(ok.exact);
  EXPECT_FALSE(ok.failed());
  const auto bad = compare_golden_tensor("neck.0", Tensor::from_floats({2, 3}, far), want, 1e-4);
  EXPECT_EQ(bad.status, GoldenTensorResult::Status::kOverTolerance);
  EXPECT_TRUE(bad.failed());
  EXPECT_EQ(compare_golden_tensor("neck.0", Tensor::from_floats({2, 3}, far), want, 1e-3).status,
            GoldenTensorResult::Status::kOk);
  std::vector<float> nan = v;
  nan[0] = std::nanf("");
  const auto n = compare_golden_tensor("neck.0", Tensor::from_floats({2, 3}, nan), want, 1e-4);
  EXPECT_EQ(n.status, GoldenTensorResult::Status::kOverTolerance);
  EXPECT_EQ(n.note, "non-finite values");
}

TEST(GoldenCompare, IntegerTensorsMustBeEqual) {
  Tensor want = Tensor::zeros({4, 2}, DType::kU8);
  for (int i = 0; i < 8; ++i) want.data<uint8_t>()[i] = static_cast<uint8_t>(i % 2);
  Tensor same = want.clone();
  const auto ok = compare_golden_tensor("dbg.bev_mask", same, want, 1e-4);
  EXPECT_TRUE(ok.exact);
  EXPECT_EQ(ok.status, GoldenTensorResult::Status::kOk);
  // A bool or f32 tap of the same values is still equal.
  EXPECT_EQ(compare_golden_tensor("dbg.bev_mask", want.to(DType::kF32), want, 0).status, GoldenTensorResult::Status::kOk);
  Tensor flipped = want.clone();
  flipped.data<uint8_t>()[5] ^= 1;  // one of 8: relative L2 0.5, but any difference fails
  const auto bad = compare_golden_tensor("dbg.bev_mask", flipped, want, 1.0);
  EXPECT_EQ(bad.status, GoldenTensorResult::Status::kOverTolerance);
  EXPECT_EQ(bad.max_abs, 1.0);

  Tensor counts = Tensor::zeros({6}, DType::kI64);
  for (int i = 0; i < 6; ++i) counts.data<int64_t>()[i] = 69 + i * 1000000007LL;
  Tensor counts2 = counts.clone();
  counts2.data<int64_t>()[3] += 1;
  EXPECT_EQ(compare_golden_tensor("dbg.bev_mask_count", counts2, counts, 1e-4).status,
            GoldenTensorResult::Status::kOverTolerance);
}

TEST(GoldenCompare, ShapeMismatchAndNotProduced) {
  const Tensor want = Tensor::from_floats({4, 1, 2}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
  const auto m = compare_golden_tensor("bev_embed", want.reshape({4, 2}), want, 1e-4);
  EXPECT_EQ(m.status, GoldenTensorResult::Status::kMismatch);
  EXPECT_TRUE(m.failed());
  EXPECT_EQ(m.tapped_shape, (Shape{4, 2}));
  EXPECT_NE(m.note.find("[4, 2]"), std::string::npos) << m.note;
  const auto np = compare_golden_tensor("bev_embed", Tensor(), want, 1e-4);
  EXPECT_EQ(np.status, GoldenTensorResult::Status::kNotProduced);
  EXPECT_FALSE(np.failed());
  EXPECT_EQ(np.shape, (Shape{4, 1, 2}));
  EXPECT_STREQ(golden_status_name(np.status), "not produced");
}

TEST(GoldenCompare, FrameAgainstItselfInPipelineOrder) {
  const GoldenFrame f = load_golden_frame(find_golden_set(kMicro), 0);
  std::vector<std::pair<std::string, Tensor>> taps;
  for (const auto& [name, t] : f.tensors.tensors()) {
    if (name != "dbg.bev_pos") taps.emplace_back(name, t.clone());
  }
  taps.emplace_back("dbg.not_in_the_set", Tensor::zeros({3}, DType::kF32));  // ignored
  const auto r = compare_golden_tensors(f.tensors, taps, 1e-4);
  size_t dets = 0;
  for (const auto& [name, t] : f.tensors.tensors()) dets += name.rfind("det.", 0) == 0 ? 1 : 0;
  ASSERT_EQ(r.size(), f.tensors.size() - dets);
  EXPECT_EQ(r.front().name, "img");
  EXPECT_EQ(r.back().name, "all_bbox_preds");
  for (size_t i = 1; i < r.size(); ++i) {
    EXPECT_LE(golden_pipeline_rank(r[i - 1].name), golden_pipeline_rank(r[i].name)) << r[i].name;
  }
  for (const auto& t : r) {
    EXPECT_EQ(t.name.rfind("det.", 0), std::string::npos);
    if (t.name == "dbg.bev_pos") {
      EXPECT_EQ(t.status, GoldenTensorResult::Status::kNotProduced);
    } else {
      EXPECT_EQ(t.status, GoldenTensorResult::Status::kOk) << t.name;
      EXPECT_EQ(t.relative_l2, 0.0) << t.name;
    }
    if (t.name == "dbg.can_bus") {
      EXPECT_EQ(t.dtype, "f64");
    }
    if (t.name == "dbg.bev_mask" || t.name == "dbg.spatial_shapes") {
      EXPECT_TRUE(t.exact) << t.name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Detection comparison

std::vector<DetectionRecord> golden_detections(size_t frame) {
  return load_golden_frame(find_golden_set(kMicro), frame).detections;
}

// Golden ranks whose score is clear of both neighbours by `gap`.
std::vector<size_t> clear_ranks(const std::vector<DetectionRecord>& g, double gap = 1e-4) {
  std::vector<size_t> out;
  for (size_t i = 0; i + 1 < g.size(); ++i) {
    if ((i == 0 || g[i - 1].score - g[i].score > gap) && g[i].score - g[i + 1].score > gap) out.push_back(i);
  }
  return out;
}

DetectionRecord det(int64_t query, int64_t label, double score) {
  DetectionRecord d;
  d.query = query;
  d.label = label;
  d.score = score;
  d.box = {1.0 * query, 2.0, -1.0, 1.8, 4.2, 1.5, 0.3, 0.1, -0.2};
  return d;
}

TEST(GoldenDetections, SelfComparisonPasses) {
  for (size_t k = 0; k < 3; ++k) {
    const auto g = golden_detections(k);
    const auto r = compare_detections(g, g);
    EXPECT_TRUE(r.ok) << k;
    EXPECT_EQ(r.golden, 300u);
    EXPECT_EQ(r.ours, 300u);
    EXPECT_EQ(r.compared + r.ambiguous, 300u);
    EXPECT_EQ(r.matched, r.compared);
    EXPECT_GT(r.compared, 250u);
    EXPECT_EQ(r.extra, 0u);
    EXPECT_EQ(r.max_box_diff, 0.0);
    EXPECT_EQ(r.max_yaw_diff, 0.0);
    EXPECT_EQ(r.max_score_diff, 0.0);
    EXPECT_TRUE(r.problems.empty());
  }
}

TEST(GoldenDetections, OrderDoesNotMatter) {
  auto g = golden_detections(0);
  auto ours = g;
  std::reverse(ours.begin(), ours.end());
  EXPECT_TRUE(compare_detections(ours, g).ok);
}

TEST(GoldenDetections, SwappedLabelsFail) {
  const auto g = golden_detections(0);
  const auto clear = clear_ranks(g);
  ASSERT_GE(clear.size(), 2u);
  size_t a = clear[0], b = 0;
  for (size_t i : clear) {
    if (g[i].label != g[a].label) {
      b = i;
      break;
    }
  }
  ASSERT_NE(b, 0u);
  auto ours = g;
  std::swap(ours[a].label, ours[b].label);
  const auto r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_LT(r.matched, r.compared);
  EXPECT_FALSE(r.problems.empty());
}

TEST(GoldenDetections, BoxMovedBy2mmFails) {
  const auto g = golden_detections(1);
  const size_t i = clear_ranks(g).at(3);
  for (size_t field : {0u, 1u, 2u, 3u, 4u, 5u, 7u, 8u}) {
    auto ours = g;
    ours[i].box[field] += 2e-3;
    const auto r = compare_detections(ours, g);
    EXPECT_FALSE(r.ok) << field;
    EXPECT_EQ(r.out_of_tolerance, 1u) << field;
    EXPECT_NEAR(r.max_box_diff, 2e-3, 1e-6) << field;
    EXPECT_EQ(r.matched, r.compared);
  }
  auto ours = g;
  ours[i].box[0] += 5e-4;  // within 1e-3 m
  const auto r = compare_detections(ours, g);
  EXPECT_TRUE(r.ok);
  EXPECT_NEAR(r.max_box_diff, 5e-4, 1e-9);
}

TEST(GoldenDetections, YawWrapsAndScoresAreBounded) {
  const auto g = golden_detections(0);
  const size_t i = clear_ranks(g).at(0);
  auto ours = g;
  ours[i].box[6] += 2 * std::numbers::pi + 5e-4;  // same angle, one turn on
  auto r = compare_detections(ours, g);
  EXPECT_TRUE(r.ok);
  EXPECT_NEAR(r.max_yaw_diff, 5e-4, 1e-9);
  ours = g;
  ours[i].box[6] -= 2e-3;
  r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_NEAR(r.max_yaw_diff, 2e-3, 1e-9);
  ours = g;
  ours[i].score += 5e-5;
  EXPECT_TRUE(compare_detections(ours, g).ok);
  ours[i].score += 1e-4;
  EXPECT_FALSE(compare_detections(ours, g).ok);
  ours = g;
  ours[i].box[4] = std::nan("");
  r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(std::isnan(r.max_box_diff));
}

// golden --tolerance T scales the detection bounds with it (bf16 runs pass at a looser T);
// the default tolerance keeps the default bounds.
TEST(GoldenDetections, BoundsScaleWithTheTensorTolerance) {
  const DetectionTolerance base, same = detection_tolerance(1e-4), loose = detection_tolerance(1e-2);
  EXPECT_EQ(same.box_m, base.box_m);
  EXPECT_EQ(same.yaw_rad, base.yaw_rad);
  EXPECT_EQ(same.score, base.score);
  EXPECT_EQ(same.score_tie, base.score_tie);
  EXPECT_DOUBLE_EQ(loose.box_m, base.box_m * 100);
  const auto g = golden_detections(1);
  const size_t i = clear_ranks(g).at(3);
  auto ours = g;
  ours[i].box[0] += 2e-2;  // 2 cm: over the default 1 mm, within 1e-2's 10 cm
  ours[i].score += 5e-4;
  EXPECT_FALSE(compare_detections(ours, g, same).ok);
  EXPECT_TRUE(compare_detections(ours, g, loose).ok);
}

TEST(GoldenDetections, NearTiesAtTheCutAreTolerated) {
  // The set's last detection and an unseen rank-5 one are 4e-6 apart: ours may keep either.
  const std::vector<DetectionRecord> g = {det(0, 1, 0.9), det(1, 2, 0.8), det(2, 3, 0.7), det(3, 4, 0.5)};
  auto ours = g;
  ours[3] = det(7, 0, 0.500004);
  auto r = compare_detections(ours, g);
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_EQ(r.compared, 3u);
  EXPECT_EQ(r.matched, 3u);
  EXPECT_EQ(r.ambiguous, 1u);
  EXPECT_EQ(r.extra, 0u);
  // Not a tie: a different detection at the cut fails, both as extra and as missing.
  ours[3] = det(7, 0, 0.52);
  r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.extra, 1u);
  EXPECT_EQ(r.matched, 3u);
  EXPECT_EQ(r.compared, 4u);
  // Losing a clear detection is a failure.
  ours = g;
  ours.erase(ours.begin() + 1);
  r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.matched, 3u);
  EXPECT_EQ(r.compared, 4u);
}

TEST(GoldenDetections, RankSwapsOfNearTiesAreTolerated) {
  const std::vector<DetectionRecord> g = {det(0, 1, 0.9), det(1, 2, 0.800003), det(2, 3, 0.8), det(3, 4, 0.5)};
  auto ours = g;
  std::swap(ours[1], ours[2]);
  std::swap(ours[1].score, ours[2].score);  // ranks and scores swapped within the tie
  auto r = compare_detections(ours, g);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.ambiguous, 2u);
  EXPECT_EQ(r.compared, 2u);
  EXPECT_LE(r.max_score_diff, 3.1e-6);
  // The real set has ties of a few 1e-6 too; they are not required but compared when present.
  const auto real = golden_detections(0);
  EXPECT_GT(compare_detections(real, real).ambiguous, 0u);
}

TEST(GoldenDetections, DuplicatesAndExtrasFail) {
  const std::vector<DetectionRecord> g = {det(0, 1, 0.9), det(1, 2, 0.8)};
  auto ours = g;
  ours.push_back(g[1]);
  EXPECT_FALSE(compare_detections(ours, g).ok);
  ours = g;
  ours.push_back(det(5, 5, 0.1));
  const auto r = compare_detections(ours, g);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.extra, 1u);
  EXPECT_TRUE(compare_detections({}, {}).ok);
  EXPECT_FALSE(compare_detections({}, g).ok);
}

// ---------------------------------------------------------------------------------------------
// Public API

TEST(GoldenApi, MissingDirectoryIsNotFound) {
  expect_error([] { run_golden(kMicro + "/no-such-set"); }, ErrorKind::kNotFound, "no-such-set");
  GoldenOptions o;
  o.tolerance = -1;
  expect_error([&] { run_golden(kMicro, o); }, ErrorKind::kInvalidInput, "tolerance");
}

TEST(GoldenApi, ReportTextHasATableAndAVerdict) {
  GoldenReport r;
  r.dir = "set";
  r.tolerance = 1e-4;
  r.frames_in_set = 1;
  GoldenFrameResult f;
  f.frame = 0;
  f.scene_token = "s";
  GoldenTensorResult a;
  a.name = "backbone.0";
  a.shape = {6, 16, 8, 16};
  a.relative_l2 = 3e-7;
  a.status = GoldenTensorResult::Status::kOk;
  GoldenTensorResult b = a;
  b.name = "bev_embed";
  b.relative_l2 = 2e-3;
  b.status = GoldenTensorResult::Status::kOverTolerance;
  GoldenTensorResult c = a;
  c.name = "dbg.bev_pos";
  c.status = GoldenTensorResult::Status::kNotProduced;
  f.tensors = {a, b, c};
  f.has_detections = true;
  f.detections.golden = f.detections.ours = 300;
  f.detections.compared = f.detections.matched = 298;
  f.detections.ambiguous = 2;
  f.ok = false;
  r.frames.push_back(f);
  r.ok = false;
  EXPECT_EQ(r.compared(), 2u);
  EXPECT_EQ(r.failures(), 1u);
  EXPECT_EQ(r.not_produced(), 1u);
  const std::string text = format_golden_report(r);
  EXPECT_NE(text.find("backbone.0"), std::string::npos) << text;
  EXPECT_NE(text.find("[6, 16, 8, 16]"), std::string::npos) << text;
  EXPECT_NE(text.find("3.00e-07"), std::string::npos) << text;
  EXPECT_NE(text.find("not produced"), std::string::npos) << text;
  EXPECT_NE(text.find("298/298 matched"), std::string::npos) << text;
  const std::string verdict = golden_verdict(r);
  EXPECT_EQ(verdict.rfind("FAIL", 0), 0u) << verdict;
  EXPECT_NE(verdict.find("frame 0 bev_embed"), std::string::npos) << verdict;
  EXPECT_NE(text.find(verdict), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// End to end: needs the complete model.

TEST(GoldenEndToEnd, MicroSetPassesEveryStage) {
  TempDir dump;
  GoldenOptions o;
  o.threads = 2;
  o.dump_dir = dump.file("out");
  const GoldenReport r = run_golden(kMicro, o);
  EXPECT_TRUE(r.ok) << format_golden_report(r);
  ASSERT_EQ(r.frames.size(), 3u);
  EXPECT_EQ(r.frames_in_set, 3u);
  for (const auto& f : r.frames) {
    EXPECT_TRUE(f.ok) << "frame " << f.frame;
    EXPECT_EQ(f.used_history, f.frame > 0) << "frame " << f.frame;
    for (const auto& t : f.tensors) {
      EXPECT_FALSE(t.failed()) << "frame " << f.frame << " " << t.name << ": rel L2 " << t.relative_l2 << " "
                               << t.note;
    }
    for (const char* must : {"backbone.0", "backbone.1", "backbone.2", "neck.0", "neck.1", "neck.2", "neck.3",
                             "bev_embed", "all_cls_scores", "all_bbox_preds"}) {
      const auto it = std::find_if(f.tensors.begin(), f.tensors.end(), [&](const auto& t) { return t.name == must; });
      ASSERT_NE(it, f.tensors.end()) << must;
      EXPECT_EQ(it->status, GoldenTensorResult::Status::kOk) << "frame " << f.frame << " " << must;
    }
    ASSERT_TRUE(f.has_detections);
    EXPECT_TRUE(f.detections.ok);
    EXPECT_EQ(f.detections.matched, f.detections.compared);
    EXPECT_EQ(f.detections.ours, 300u);

    // The dump: every compared tensor and the detections, in the set's dtypes and shapes.
    ASSERT_FALSE(f.dump_path.empty());
    const Checkpoint ours = load_checkpoint(f.dump_path);
    const Checkpoint golden = load_checkpoint(kMicro + "/frame" + std::to_string(f.frame) + ".safetensors");
    for (const char* name : {"det.boxes_3d", "det.scores_3d", "det.labels_3d", "det.query_index", "bev_embed"}) {
      const Tensor* a = ours.find(name);
      const Tensor* b = golden.find(name);
      ASSERT_NE(a, nullptr) << name;
      EXPECT_EQ(a->dtype(), b->dtype()) << name;
      EXPECT_EQ(a->shape(), b->shape()) << name;
    }
  }
  EXPECT_NE(golden_verdict(r).rfind("PASS", 0), std::string::npos);
}

}  // namespace
}  // namespace bev
