// The API the Python package binds, from C++ (so that the sanitizer build, which has no Python
// package, runs it too): a camera's decoded pixels (bevformer/frame.h ImagePixels) detect what
// the file they came from detects, bit for bit; the runner handle replays, runs eagerly and
// describes the recorded stages without touching any stream; a profile session records the
// caller's signposted rounds and writes the profile files.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "bevformer/error.h"
#include "bevformer/frame.h"
#include "bevformer/model.h"
#include "bevformer/runner.h"
#include "io/image.h"
#include "micro_frames.h"

namespace bev {
namespace {

using testing::kMicroDir;
using testing::micro_frame_json;

std::unique_ptr<Model> micro_model(bool profiling = false) {
  Knobs k;
  k.threads = 1;
  k.profiling = profiling;
  return Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k);
}

Frame micro_frame(int k) { return parse_frame(micro_frame_json(k).dump(), "micro"); }

void expect_same(const Detections& a, const Detections& b) {
  ASSERT_EQ(a.boxes.size(), b.boxes.size());
  ASSERT_GT(a.boxes.size(), 0u);
  for (size_t i = 0; i < a.boxes.size(); ++i) {
    EXPECT_EQ(a.boxes[i].center, b.boxes[i].center) << i;
    EXPECT_EQ(a.boxes[i].size, b.boxes[i].size) << i;
    EXPECT_EQ(a.boxes[i].yaw, b.boxes[i].yaw) << i;
    EXPECT_EQ(a.boxes[i].velocity, b.boxes[i].velocity) << i;
    EXPECT_EQ(a.boxes[i].score, b.boxes[i].score) << i;
    EXPECT_EQ(a.boxes[i].label, b.boxes[i].label) << i;
  }
  EXPECT_EQ(a.used_history, b.used_history);
}

// The frame with every camera's image decoded into ImagePixels (as the Python binding passes
// numpy arrays), owned by the frame.
Frame with_pixels(Frame f) {
  for (Camera& c : f.cameras) {
    auto t = std::make_shared<Tensor>(read_image(kMicroDir + "/" + c.image_path));
    c.pixels.data = t->data<uint8_t>();
    c.pixels.height = t->size(0);
    c.pixels.width = t->size(1);
    c.pixels.owner = t;
    c.image_path.clear();
  }
  return f;
}

TEST(RunnerApi, DecodedPixelsDetectWhatTheirFilesDetect) {
  const auto by_path = micro_model();
  const auto by_pixels = micro_model();
  const auto by_json = micro_model();
  for (int k = 0; k < 3; ++k) {
    const Detections want = by_path->detect(micro_frame(k), kMicroDir);
    const Frame pixels = with_pixels(micro_frame(k));
    expect_same(by_pixels->detect(pixels, ""), want);
    // frame_json writes the pixels as a PNG of them; that detects the same again.
    expect_same(by_json->detect(frame_json(pixels), ""), want);
  }
}

TEST(RunnerApi, PixelsAreCheckedAsAFilesHeaderIs) {
  const auto model = micro_model();
  Frame f = with_pixels(micro_frame(0));
  f.cameras[3].pixels.height -= 1;  // the buffer is larger than that: only the size is wrong
  try {
    model->detect(f, "");
    FAIL() << "a short image was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("cameras[3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("112x62"), std::string::npos) << e.what();
  }
  Frame both = with_pixels(micro_frame(0));
  both.cameras[0].image_path = micro_frame(0).cameras[0].image_path;
  EXPECT_THROW(model->detect(both, kMicroDir), Error);
  EXPECT_TRUE(model->streams().empty());  // neither frame reached the stream
}

TEST(RunnerApi, ReplaysAndEagerRunsChangeNoStream) {
  const auto model = micro_model();
  const auto clean = micro_model();
  StageRunnerHandle runner(*model);
  try {
    runner.replay("image");
    FAIL() << "a replay before any frame";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  }
  EXPECT_THROW(runner.run_eager("image"), Error);
  EXPECT_THROW(runner.replay("decoder"), Error);
  for (int k = 0; k < 2; ++k) {
    const Frame f = micro_frame(k);
    expect_same(model->detect(f, kMicroDir), clean->detect(f, kMicroDir));
    runner.set_last_frame(f, kMicroDir);
  }
  for (const char* v : {"image", "bev", "bev_first"}) {
    const StageRun r = runner.replay(v);
    EXPECT_EQ(r.variant, v);
    EXPECT_GT(r.seconds, 0);
  }
  runner.run_eager("image");
  runner.run_eager("bev");
  runner.run_eager("bev_first");
  const std::vector<RecordedStageInfo> stages = runner.stages();
  ASSERT_GE(stages.size(), 3u);
  for (const RecordedStageInfo& s : stages) {
    EXPECT_GT(s.ops, 0u) << s.name;
    EXPECT_LE(s.arena_bytes, s.no_reuse_bytes) << s.name;
  }
  EXPECT_NE(runner.describe().find("bev (with history)"), std::string::npos);
  expect_same(model->detect(micro_frame(2), kMicroDir), clean->detect(micro_frame(2), kMicroDir));
}

TEST(RunnerApi, AProfileSessionRecordsTheCallersRoundsAndWritesTheFiles) {
  {
    const auto plain = micro_model();
    EXPECT_THROW(ProfileSession s(*plain), Error);
  }
  const auto model = micro_model(/*profiling=*/true);
  StageRunnerHandle runner(*model);
  for (int k = 0; k < 2; ++k) {
    const Frame f = micro_frame(k);
    model->detect(f, kMicroDir);
    runner.set_last_frame(f, kMicroDir);
  }
  runner.prepare_eager();
  ProfileSession session(*model);
  ProfileSession other(*model);
  session.start();
  EXPECT_THROW(other.start(), Error);
  for (int round = 0; round < 2; ++round) {
    for (const std::string v : {"image", "bev"}) {
      session.signpost(v);
      runner.replay(v);
      session.signpost(v + "_end");
    }
  }
  session.signpost("eager");
  runner.run_eager("image");
  runner.run_eager("bev");
  session.signpost("eager_end");
  session.stop();
  const size_t recorded = session.op_count();
  model->detect(micro_frame(2), kMicroDir);  // stopped: records nothing
  EXPECT_EQ(session.op_count(), recorded);

  const std::vector<ProfiledOp> ops = session.ops();
  ASSERT_EQ(ops.size(), recorded);
  EXPECT_EQ(ops[0].index, 0u);
  EXPECT_FALSE(ops[0].name.empty());
  EXPECT_EQ(ops[0].stage.rfind("img.", 0), 0u) << ops[0].stage;
  // The caller's ten signposts, in order; the eager run adds one per module stage it entered,
  // all inside its eager window.
  std::vector<std::string> caller;
  bool in_eager = false;
  size_t stage_marks = 0;
  for (const ProfiledSignpost& sp : session.signposts()) {
    if (sp.name == "eager") in_eager = true;
    if (sp.name == "eager_end") in_eager = false;
    const bool own = sp.name == "image" || sp.name == "image_end" || sp.name == "bev" || sp.name == "bev_end" ||
                     sp.name == "eager" || sp.name == "eager_end";
    if (own) {
      caller.push_back(sp.name);
    } else {
      EXPECT_TRUE(in_eager) << sp.name << " outside the eager window";
      ++stage_marks;
    }
  }
  EXPECT_EQ(caller, (std::vector<std::string>{"image", "image_end", "bev", "bev_end", "image", "image_end", "bev",
                                              "bev_end", "eager", "eager_end"}));
  EXPECT_GT(stage_marks, 10u);

  SessionReportOptions o;
  o.measure_peaks = false;
  ProfileReport r = session.report(o);
  EXPECT_EQ(r.rounds, 2);
  EXPECT_GT(r.ops_per_frame, 0u);
  EXPECT_LT(2 * r.ops_per_frame, recorded);  // the eager frame's ops come on top
  const std::string dir = std::string(BEV_BINARY_DIR) + "/tests/runner_api_profile";
  std::filesystem::remove_all(dir);
  const std::vector<std::string> files = session.write(dir, r);
  ASSERT_EQ(files.size(), 4u);
  for (const std::string& f : files) EXPECT_GT(std::filesystem::file_size(f), 0u) << f;
}

}  // namespace
}  // namespace bev
