// The public Model API end to end: frame JSON with PNG files and calibration in, detections out.
// The golden set's frames through this path give the set's detections, and bad frames get one
// clear error while the stream's history stays exactly as it was.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "io/golden_set.h"

namespace bev {
namespace {

using json = nlohmann::json;
const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Golden frame k as a frame JSON: the raw PNGs, K + extrinsics, the ego pose, the raw CAN fields.
json micro_frame(int k) {
  const json meta = read_json(kMicro + "/frame" + std::to_string(k) + "_meta.json");
  json f;
  f["stream"] = "micro";
  f["timestamp"] = meta["timestamp"];
  f["scene"] = meta["scene_token"];
  f["T_world_from_ego"] = meta["ego2global"];
  f["T_ego_from_lidar"] = meta["lidar2ego"];
  f["can_bus"] = meta["can_bus"];
  for (const json& c : meta["cameras"]) {
    f["cameras"].push_back({{"name", c["name"]},
                            {"image", meta["img_filenames"][c["index"].get<size_t>()]},
                            {"K", c["cam2img"]},
                            {"T_ego_from_cam", c["cam2ego"]}});
  }
  return f;
}

std::unique_ptr<Model> micro_model() {
  Knobs k;
  k.threads = 2;
  return Model::load(kMicro + "/config.json", kMicro + "/checkpoint.pth", k);
}

TEST(ModelApi, GoldenFramesThroughTheFramePathGiveTheSetsDetections) {
  const auto model = micro_model();
  EXPECT_FALSE(model->untrained());
  const GoldenSetFiles set = find_golden_set(kMicro);
  for (int k = 0; k < 3; ++k) {
    const Detections d = model->detect(micro_frame(k).dump(), kMicro);
    EXPECT_EQ(d.used_history, k > 0);
    std::vector<DetectionRecord> ours;
    for (const Box& b : d.boxes) {
      DetectionRecord r;
      r.box = {b.center[0], b.center[1], b.center[2], b.size[0], b.size[1], b.size[2], b.yaw, b.velocity[0], b.velocity[1]};
      r.score = b.score;
      r.label = b.label;
      r.query = b.query;
      ours.push_back(r);
    }
    const GoldenFrame golden = load_golden_frame(set, static_cast<size_t>(k));
    const GoldenDetectionResult r = compare_detections(ours, golden.detections);
    EXPECT_TRUE(r.ok) << "frame " << k << ": " << r.matched << " of " << r.compared << " matched";
    EXPECT_GT(r.matched, 250u);
    const json doc = json::parse(d.json);
    EXPECT_EQ(doc["untrained"], false);
    EXPECT_EQ(doc["detections"].size(), d.boxes.size());
    EXPECT_TRUE(doc["detections"][0].contains("world"));
  }
  const auto streams = model->streams();
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0].frames, 3u);
  EXPECT_TRUE(streams[0].has_history);
}

TEST(ModelApi, BadFramesFailClearlyAndLeaveTheStreamAsItWas) {
  const auto clean = micro_model();
  const auto tested = micro_model();
  for (int k = 0; k < 2; ++k) {
    clean->detect(micro_frame(k).dump(), kMicro);
    tested->detect(micro_frame(k).dump(), kMicro);
  }
  const json good = micro_frame(2);
  auto expect_invalid = [&](const json& f, const std::string& needle) {
    try {
      tested->detect(f.dump(), kMicro);
      ADD_FAILURE() << "accepted a frame with " << needle;
    } catch (const Error& e) {
      EXPECT_TRUE(e.kind() == ErrorKind::kInvalidInput || e.kind() == ErrorKind::kNotFound) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  json f = good;
  f["cameras"].erase(3);
  expect_invalid(f, "camera");
  f = good;
  f["cameras"][1]["K"] = json::array({json::array({1, 0}), json::array({0, 1})});
  expect_invalid(f, "cameras[1].K");
  f = good;
  f["T_world_from_ego"][0][3] = "nan";
  expect_invalid(f, "T_world_from_ego");
  f = good;
  f["T_world_from_ego"][0][0] = 2.0;  // a scaled, not rigid, rotation
  expect_invalid(f, "T_world_from_ego");
  f = good;
  f["cameras"][0]["image"] = "no-such-image.png";
  expect_invalid(f, "no-such-image.png");
  f = good;
  f["colour"] = "red";
  expect_invalid(f, "colour");
  // A truncated PNG.
  {
    std::ifstream in(kMicro + "/" + good["cameras"][0]["image"].get<std::string>(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string cut = testing::TempDir() + "/truncated.png";
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    f = good;
    f["cameras"][0]["image"] = cut;
    expect_invalid(f, "truncated.png");
  }
  // The next good frame gives exactly what the clean stream gives.
  const Detections a = clean->detect(good.dump(), kMicro);
  const Detections b = tested->detect(good.dump(), kMicro);
  EXPECT_TRUE(b.used_history);
  ASSERT_EQ(a.boxes.size(), b.boxes.size());
  for (size_t i = 0; i < a.boxes.size(); ++i) {
    EXPECT_EQ(a.boxes[i].center, b.boxes[i].center);
    EXPECT_EQ(a.boxes[i].score, b.boxes[i].score);
  }
  EXPECT_EQ(tested->streams()[0].frames, 3u);
}

TEST(ModelApi, UntrainedModelSaysSoEverywhere) {
  Knobs k;
  k.threads = 2;
  const auto model = Model::load(kMicro + "/config.json", "", k);
  EXPECT_TRUE(model->untrained());
  const Detections d = model->detect(micro_frame(0).dump(), kMicro);
  EXPECT_TRUE(d.untrained);
  const json doc = json::parse(d.json);
  EXPECT_EQ(doc["untrained"], true);
  EXPECT_NE(doc["warning"].get<std::string>().find("meaningless"), std::string::npos);
}

}  // namespace
}  // namespace bev
