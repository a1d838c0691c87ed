// The public Model API end to end: frame JSON with PNG files and calibration in, detections out.
// The golden set's frames through this path give the set's detections, and bad frames get one
// clear error while the stream's history stays exactly as it was.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "io/golden_set.h"
#include "micro_frames.h"

namespace bev {
namespace {

using json = nlohmann::json;
using testing::kMicroDir;
using testing::micro_frame_json;

std::unique_ptr<Model> micro_model() {
  Knobs k;
  k.threads = 2;
  return Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k);
}

TEST(ModelApi, GoldenFramesThroughTheFramePathGiveTheSetsDetections) {
  const auto model = micro_model();
  EXPECT_FALSE(model->untrained());
  const GoldenSetFiles set = find_golden_set(kMicroDir);
  for (int k = 0; k < 3; ++k) {
    const Detections d = model->detect(micro_frame_json(k).dump(), kMicroDir);
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

// Each frame knows its index in its stream (it was 0 for every frame: the index was looked up in
// a listing that skips the stream being run), titles and JSON carry it, and --dump writes one
// file per frame named <stream>_<k>.safetensors instead of overwriting one. A scene change is
// reported as a history reset and counted.
TEST(ModelApi, FramesCarryTheirIndexAndDumpOneFileEach) {
  const auto model = micro_model();
  const std::filesystem::path dir = std::filesystem::path(BEV_BINARY_DIR) / "tests" / "model_api_dump";
  std::filesystem::remove_all(dir);
  DetectOptions opt;
  opt.dump_dir = dir.string();
  for (int k = 0; k < 3; ++k) {
    const Detections d = model->detect(micro_frame_json(k).dump(), kMicroDir, opt);
    EXPECT_EQ(d.frame_index, k);
    EXPECT_EQ(json::parse(d.json)["frame_index"], k);
    EXPECT_TRUE(std::filesystem::exists(dir / ("micro_" + std::to_string(k) + ".safetensors"))) << k;
  }
  json next = micro_frame_json(0);
  next["timestamp"] = micro_frame_json(2)["timestamp"].get<double>() + 0.5;
  next["scene"] = "another scene";
  const Detections d = model->detect(next.dump(), kMicroDir);
  EXPECT_EQ(d.frame_index, 3);
  EXPECT_FALSE(d.used_history);
  EXPECT_NE(d.history_reset.find("scene changed"), std::string::npos) << d.history_reset;
  EXPECT_EQ(json::parse(d.json)["history_reset"], d.history_reset);
  EXPECT_EQ(model->stream_totals().resets_scene, 1u);
  EXPECT_EQ(model->device_info().backend, "cpu");
  EXPECT_EQ(model->device_info().threads, 2);
}

// The weights file can change under a running model (a redeploy copies over it, a disk fills):
// the model owns every byte it uses once loaded, so a truncated or overwritten file changes
// nothing (it was a SIGBUS on the next frame while the file stayed memory-mapped for life).
TEST(ModelApi, WeightsFileChangingUnderTheModelChangesNothing) {
  for (const std::string name : {"checkpoint.pth", "weights.safetensors"}) {
    SCOPED_TRACE(name);
    const std::filesystem::path copy = std::filesystem::path(::testing::TempDir()) / ("changing_" + name);
    std::filesystem::copy_file(kMicroDir + "/" + name, copy, std::filesystem::copy_options::overwrite_existing);
    Knobs k;
    k.threads = 2;
    const auto model = Model::load(kMicroDir + "/config.json", copy.string(), k);
    const auto reference = micro_model();
    model->detect(micro_frame_json(0).dump(), kMicroDir);
    reference->detect(micro_frame_json(0).dump(), kMicroDir);
    std::filesystem::resize_file(copy, 4096);  // truncate -s 4096
    const Detections a = model->detect(micro_frame_json(1).dump(), kMicroDir);
    std::ofstream(copy, std::ios::binary | std::ios::trunc) << std::string(1 << 16, 'x');  // cp over it
    const Detections b = model->detect(micro_frame_json(2).dump(), kMicroDir);
    const Detections ra = reference->detect(micro_frame_json(1).dump(), kMicroDir);
    const Detections rb = reference->detect(micro_frame_json(2).dump(), kMicroDir);
    ASSERT_EQ(a.boxes.size(), ra.boxes.size());
    ASSERT_EQ(b.boxes.size(), rb.boxes.size());
    for (size_t i = 0; i < a.boxes.size(); ++i) EXPECT_EQ(a.boxes[i].score, ra.boxes[i].score) << i;
    for (size_t i = 0; i < b.boxes.size(); ++i) EXPECT_EQ(b.boxes[i].center, rb.boxes[i].center) << i;
  }
}

// Numbers at float32's limits are never answered as success: values that do not fit float32 are
// refused naming the field; a frame whose stage overflows fails naming the stage, is counted, and
// leaves the stream's history as it was (the probe: can_bus[13:16] = 1e308 answered 200
// with every score null; a pose jump to 1e39 turned the next normal frame all-NaN).
TEST(ModelApi, NonFiniteNumbersFailTheFrameAndKeepTheHistory) {
  const auto model = micro_model();
  const auto reference = micro_model();
  model->detect(micro_frame_json(0).dump(), kMicroDir);
  reference->detect(micro_frame_json(0).dump(), kMicroDir);
  const auto expect_refused = [&](const json& f, const std::string& needle) {
    try {
      model->detect(f.dump(), kMicroDir);
      ADD_FAILURE() << "answered a frame with " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  json f = micro_frame_json(1);
  f["can_bus"][13] = 1e308;
  expect_refused(f, "can_bus[13]");
  f = micro_frame_json(1);
  f["T_world_from_ego"][0][3] = 1e39;
  expect_refused(f, "can_bus[0]");
  // Within float32, but the CAN-bus MLP overflows: the bev stage's numbers blow up.
  f = micro_frame_json(1);
  f["can_bus"][13] = 3e38;
  expect_refused(f, "bev stage produced");
  EXPECT_EQ(model->stream_totals().frames_nonfinite, 1u);
  // The history is the one frame 0 left: frames 1 and 2 give the reference's boxes.
  for (int k = 1; k < 3; ++k) {
    const Detections a = model->detect(micro_frame_json(k).dump(), kMicroDir);
    const Detections b = reference->detect(micro_frame_json(k).dump(), kMicroDir);
    EXPECT_TRUE(a.used_history);
    ASSERT_EQ(a.boxes.size(), b.boxes.size());
    for (size_t i = 0; i < a.boxes.size(); ++i) {
      EXPECT_EQ(a.boxes[i].score, b.boxes[i].score) << "frame " << k << " box " << i;
      EXPECT_EQ(a.boxes[i].center, b.boxes[i].center) << "frame " << k << " box " << i;
    }
  }
}

// Frames of several vehicles in one call: each stream's frames in order, batched with the other
// streams', every frame answered exactly as Model::detect answers it one at a time; a bad frame
// fails alone and its stream goes on from the history it had.
TEST(ModelApi, DetectBatchAnswersEachFrameAsDetectDoes) {
  const auto batched = micro_model();
  const auto single = micro_model();
  std::vector<Frame> frames;
  for (int k = 0; k < 3; ++k) {
    for (const char* stream : {"a", "b", "c"}) {
      json f = micro_frame_json(k);
      f["stream"] = stream;
      if (std::string(stream) == "b") f["T_world_from_ego"][0][3] = f["T_world_from_ego"][0][3].get<double>() + 2.5;
      if (std::string(stream) == "c" && k == 1) f["can_bus"][13] = 3e38;  // overflows in the bev stage
      frames.push_back(parse_frame(f.dump()));
    }
  }
  const std::vector<FrameOutcome> out = batched->detect_batch(frames, kMicroDir, {}, 3);
  ASSERT_EQ(out.size(), frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const std::string what = "frame " + std::to_string(i) + " (" + frames[i].stream + ")";
    if (i == 5) {  // stream c's second frame
      ASSERT_TRUE(out[i].error.has_value()) << what;
      EXPECT_NE(std::string(out[i].error->what()).find("bev stage produced"), std::string::npos) << out[i].error->what();
      EXPECT_THROW(single->detect(frames[i], kMicroDir), Error);
      continue;
    }
    ASSERT_TRUE(out[i].detections.has_value()) << what << ": " << (out[i].error ? out[i].error->what() : "");
    EXPECT_EQ(out[i].batch_size, 3) << what;
    const Detections want = single->detect(frames[i], kMicroDir);
    const Detections& got = *out[i].detections;
    EXPECT_EQ(got.json, want.json) << what;
    EXPECT_EQ(got.used_history, want.used_history) << what;
    EXPECT_EQ(got.frame_index, want.frame_index) << what;
  }
  EXPECT_EQ(batched->stream_totals().frames_nonfinite, 1u);
  // A picture per frame is Model::detect's; a batch refuses it before running anything.
  DetectOptions picture;
  picture.render_png = "x.png";
  EXPECT_THROW(batched->detect_batch(frames, kMicroDir, picture), Error);
}

TEST(ModelApi, BadFramesFailClearlyAndLeaveTheStreamAsItWas) {
  const auto clean = micro_model();
  const auto tested = micro_model();
  for (int k = 0; k < 2; ++k) {
    clean->detect(micro_frame_json(k).dump(), kMicroDir);
    tested->detect(micro_frame_json(k).dump(), kMicroDir);
  }
  const json good = micro_frame_json(2);
  auto expect_invalid = [&](const json& f, const std::string& needle) {
    try {
      tested->detect(f.dump(), kMicroDir);
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
    std::ifstream in(kMicroDir + "/" + good["cameras"][0]["image"].get<std::string>(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string cut = ::testing::TempDir() + "/truncated.png";
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    f = good;
    f["cameras"][0]["image"] = cut;
    expect_invalid(f, "truncated.png");
  }
  // The next good frame gives exactly what the clean stream gives.
  const Detections a = clean->detect(good.dump(), kMicroDir);
  const Detections b = tested->detect(good.dump(), kMicroDir);
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
  const auto model = Model::load(kMicroDir + "/config.json", "", k);
  EXPECT_TRUE(model->untrained());
  const Detections d = model->detect(micro_frame_json(0).dump(), kMicroDir);
  EXPECT_TRUE(d.untrained);
  const json doc = json::parse(d.json);
  EXPECT_EQ(doc["untrained"], true);
  EXPECT_NE(doc["warning"].get<std::string>().find("meaningless"), std::string::npos);
}

}  // namespace
}  // namespace bev
