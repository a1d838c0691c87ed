// BEVFormer's forward beyond the golden set: the engine must stay general (other grids, styles,
// level and layer counts, camera counts), keep history exactly as forward_test does, and refuse
// bad frames and misfit checkpoints with one clear error without corrupting its state.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "bevformer/error.h"
#include "core/compare.h"
#include "model/bevformer.h"
#include "model/param_spec.h"
#include "model/synthetic.h"
#include "engine_test_util.h"
#include "error_test_util.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using testing::LoadedModel;

ModelConfig micro() { return load_config(std::string(BEV_SHARED_DIR) + "/golden/micro/config.json"); }

bool all_finite(const Tensor& t) {
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (!std::isfinite(c.data<float>()[i])) return false;
  }
  return true;
}

bool identical(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void expect_sane(const ModelConfig& cfg, const FrameOutput& out) {
  const int64_t hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w, q = cfg.head.num_query;
  EXPECT_EQ(out.bev_embed.shape(), (Shape{hw, cfg.transformer.embed_dims}));
  EXPECT_EQ(out.all_cls_scores.shape(), (Shape{cfg.transformer.decoder_layers, q, cfg.head.num_classes}));
  EXPECT_EQ(out.all_bbox_preds.shape(), (Shape{cfg.transformer.decoder_layers, q, cfg.head.code_size}));
  EXPECT_TRUE(all_finite(out.bev_embed));
  EXPECT_TRUE(all_finite(out.all_cls_scores));
  EXPECT_TRUE(all_finite(out.all_bbox_preds));
  EXPECT_EQ(static_cast<int64_t>(out.detections.size()),
            std::min<int64_t>(cfg.head.max_num, q * cfg.head.num_classes));
  for (size_t i = 1; i < out.detections.size(); ++i) {
    EXPECT_GE(out.detections[i - 1].score, out.detections[i].score);
  }
}

// Runs two frames of a synthetic drive; the second uses the history.
void run_two_frames(const ModelConfig& cfg) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 3);
  LoadedModel model(cfg, ck, *backend);
  const FrameOutput a = model.forward(synthetic_frame(cfg, 3, 0));
  EXPECT_FALSE(a.used_history);
  expect_sane(cfg, a);
  const FrameOutput b = model.forward(synthetic_frame(cfg, 3, 1));
  EXPECT_TRUE(b.used_history);
  expect_sane(cfg, b);
}

TEST(BevFormerGeneral, MicroAsPublished) { run_two_frames(micro()); }

TEST(BevFormerGeneral, RectangularBevGrid) {
  ModelConfig cfg = micro();
  cfg.head.bev_h = 14;
  cfg.head.bev_w = 23;
  cfg.head.pos_row_num_embed = 14;
  cfg.head.pos_col_num_embed = 23;
  run_two_frames(cfg);
}

TEST(BevFormerGeneral, PytorchStyleSingleLevelNoDcnLikeTiny) {
  ModelConfig cfg = micro();
  cfg.backbone.style = ResNetStyle::kPytorch;
  cfg.backbone.dcn = false;
  cfg.backbone.stage_with_dcn = {false, false, false, false};
  cfg.backbone.out_indices = {3};
  cfg.neck.in_channels = {64};
  cfg.neck.num_outs = 1;
  cfg.transformer.sca.num_levels = 1;
  run_two_frames(cfg);
}

TEST(BevFormerGeneral, TwoExtraLevelsWithReluBetween) {
  ModelConfig cfg = micro();
  cfg.backbone.out_indices = {2, 3};
  cfg.neck.in_channels = {32, 64};
  cfg.neck.num_outs = 4;  // two extra stride-2 convs, ReLU before the second
  cfg.transformer.sca.num_levels = 4;
  run_two_frames(cfg);
}

TEST(BevFormerGeneral, MoreLayersFewerCamerasNoBoxRefine) {
  ModelConfig cfg = micro();
  cfg.transformer.encoder_layers = 3;
  cfg.transformer.decoder_layers = 3;
  cfg.transformer.num_cams = 5;
  cfg.head.with_box_refine = false;
  run_two_frames(cfg);
}

TEST(BevFormerGeneral, ShiftAliasSwitchChangesOnlyFramesWithHistory) {
  ModelConfig clone_cfg = micro();
  ModelConfig alias_cfg = micro();
  alias_cfg.transformer.shift_ref_2d_alias = true;
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(clone_cfg, 5);
  LoadedModel a(clone_cfg, ck, *backend), b(alias_cfg, ck, *backend);
  EXPECT_TRUE(identical(a.forward(synthetic_frame(clone_cfg, 5, 0)).bev_embed,
                        b.forward(synthetic_frame(alias_cfg, 5, 0)).bev_embed));
  EXPECT_FALSE(identical(a.forward(synthetic_frame(clone_cfg, 5, 1)).bev_embed,
                         b.forward(synthetic_frame(alias_cfg, 5, 1)).bev_embed));
}

TEST(BevFormerHistory, SceneChangeAndResetDropHistory) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 7);
  LoadedModel model(cfg, ck, *backend);
  const FrameInput f0 = synthetic_frame(cfg, 7, 0);
  const FrameOutput first = model.forward(f0);
  EXPECT_TRUE(model.forward(synthetic_frame(cfg, 7, 1)).used_history);
  // The same frame in a new scene runs as a first frame: bit-identical to a fresh model.
  FrameInput other = f0;
  other.scene_token = "another scene";
  const FrameOutput fresh = model.forward(other);
  EXPECT_FALSE(fresh.used_history);
  EXPECT_TRUE(identical(fresh.bev_embed, first.bev_embed));
  EXPECT_TRUE(model.forward(synthetic_frame(cfg, 7, 2)).used_history == false);  // scene changed back
  model.reset_history();
  const FrameOutput again = model.forward(f0);
  EXPECT_FALSE(again.used_history);
  EXPECT_TRUE(identical(again.bev_embed, first.bev_embed));
}

TEST(BevFormerHistory, VideoTestModeOffNeverUsesHistory) {
  ModelConfig cfg = micro();
  cfg.video_test_mode = false;
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 9);
  LoadedModel model(cfg, ck, *backend);
  model.forward(synthetic_frame(cfg, 9, 0));
  EXPECT_FALSE(model.forward(synthetic_frame(cfg, 9, 1)).used_history);
}

TEST(BevFormerInput, BadFramesFailClearlyAndLeaveHistoryIntact) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 11);
  LoadedModel model(cfg, ck, *backend);
  LoadedModel reference(cfg, ck, *backend);
  model.forward(synthetic_frame(cfg, 11, 0));
  reference.forward(synthetic_frame(cfg, 11, 0));

  auto expect_invalid = [&](FrameInput f, const std::string& needle) {
    try {
      model.forward(f);
      ADD_FAILURE() << "accepted a frame with " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const FrameInput good = synthetic_frame(cfg, 11, 1);
  FrameInput f = good;
  f.img = good.img.slice(0, 0, 5).contiguous();
  expect_invalid(f, "camera image");
  f = good;
  f.lidar2img.pop_back();
  expect_invalid(f, "lidar2img");
  f = good;
  f.lidar2img[2][5] = std::nan("");
  expect_invalid(f, "non-finite");
  f = good;
  f.can_bus[0] = INFINITY;
  expect_invalid(f, "can_bus");
  f = good;
  f.img = Tensor();
  expect_invalid(f, "img");
  // None of that touched the history: the next good frame equals the reference's.
  EXPECT_TRUE(identical(model.forward(good).bev_embed, reference.forward(good).bev_embed));
}

// Weights at float32's limits make a stage's numbers blow up: the frame fails naming the stage,
// replayed and eager, and is counted; nothing is answered.
TEST(BevFormerInput, AStageThatOverflowsFailsNamingIt) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint good = random_checkpoint(cfg, 15);
  Checkpoint bad;
  for (const auto& [name, t] : good.tensors()) {
    Tensor c = t.clone();
    if (name == "img_backbone.conv1.weight") c.data<float>()[7] = std::numeric_limits<float>::infinity();
    bad.add(name, c);
  }
  for (const bool replay : {true, false}) {
    LoadedModel model(cfg, bad, *backend, replay);
    test::expect_invalid_input([&] { model.forward(synthetic_frame(cfg, 15, 0)); }, "image stage produced");
    EXPECT_EQ(model.runner().nonfinite_frames(), 1u);
  }
}

TEST(BevFormerInput, MisfitCheckpointListsEveryProblem) {
  const ModelConfig cfg = micro();
  ModelConfig other = cfg;
  other.transformer.encoder_layers = 3;
  const Checkpoint ck = random_checkpoint(other, 1);
  auto backend = make_cpu_backend(1, Precision::kF32);
  try {
    LoadedModel model(cfg, ck, *backend);
    FAIL() << "accepted a checkpoint with an extra encoder layer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("encoder.layers.2"), std::string::npos) << e.what();
  }
}


}  // namespace
}  // namespace bev

namespace bev {
namespace {

using testing::LoadedModel;

// Recorded plans replay bit-identically to eager execution: first frames, frames with history,
// a scene change (back to the first-frame plan), with and without taps.
TEST(BevFormerPlans, ReplayIsBitIdenticalToEager) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 13);
  LoadedModel eager(cfg, ck, *backend, /*replay=*/false), planned(cfg, ck, *backend, /*replay=*/true);
  for (int k = 0; k < 5; ++k) {
    FrameInput f = synthetic_frame(cfg, 13, k);
    if (k >= 3) f.scene_token = "next scene";
    Taps te, tp;
    const bool tapped = k == 2;
    const FrameOutput a = eager.forward(f, tapped ? &te : nullptr);
    const FrameOutput b = planned.forward(f, tapped ? &tp : nullptr);
    EXPECT_EQ(a.used_history, b.used_history);
    EXPECT_TRUE(identical(a.bev_embed, b.bev_embed)) << "frame " << k;
    EXPECT_TRUE(identical(a.all_cls_scores, b.all_cls_scores)) << "frame " << k;
    EXPECT_TRUE(identical(a.all_bbox_preds, b.all_bbox_preds)) << "frame " << k;
    ASSERT_EQ(a.detections.size(), b.detections.size());
    for (size_t i = 0; i < a.detections.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a.detections[i].box, &b.detections[i].box, sizeof(a.detections[i].box)), 0);
    }
    ASSERT_EQ(te.all().size(), tp.all().size());
    for (const auto& [name, t] : te.all()) {
      const Tensor* u = tp.find(name);
      ASSERT_NE(u, nullptr) << name;
      EXPECT_TRUE(identical(t, *u)) << name << " frame " << k;
    }
  }
  const std::string d = planned.describe();
  EXPECT_NE(d.find("image:"), std::string::npos);
  EXPECT_NE(d.find("bev (with history)"), std::string::npos);
  EXPECT_NE(d.find("@arena+"), std::string::npos);
}

// bf16 precision keeps the backbone's activations bf16 between convolutions: replay still equals
// eager bit for bit, and the result stays near f32's (a dropped rounding or a misread bf16
// buffer would not).
TEST(BevFormerPlans, Bf16ReplayIsBitIdenticalToEagerAndNearF32) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  const ModelConfig cfg = micro();
  auto bf16 = make_cpu_backend(2, Precision::kBF16);
  auto f32 = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 17);
  LoadedModel eager(cfg, ck, *bf16, /*replay=*/false), planned(cfg, ck, *bf16, /*replay=*/true);
  LoadedModel exact(cfg, ck, *f32, /*replay=*/true);
  for (int k = 0; k < 3; ++k) {
    const FrameInput f = synthetic_frame(cfg, 17, k);
    const FrameOutput a = eager.forward(f), b = planned.forward(f), c = exact.forward(f);
    EXPECT_TRUE(identical(a.bev_embed, b.bev_embed)) << "frame " << k;
    EXPECT_TRUE(identical(a.all_cls_scores, b.all_cls_scores)) << "frame " << k;
    const TensorDiff d = compare(b.bev_embed, c.bev_embed);
    EXPECT_GT(d.relative_l2, 0.0) << "bf16 equal to f32: no bf16 at all?";
    EXPECT_LT(d.relative_l2, 3e-2) << "frame " << k;
  }
  EXPECT_NE(planned.describe().find("bf16["), std::string::npos) << "no bf16 activation in the recorded image stage";
}

// Another vehicle's rig: the synthetic rig with its focal lengths 3% longer (as after a
// different calibration), so its SCA query lists differ.
FrameInput on_other_rig(FrameInput f, double scale) {
  for (auto& m : f.lidar2img) {
    for (int c = 0; c < 4; ++c) {
      m[static_cast<size_t>(c)] *= scale;
      m[static_cast<size_t>(4 + c)] *= scale;
    }
  }
  return f;
}

// Two vehicles with different rigs take turns on one model: each rig's geometry is computed
// once, the bev stages are the rig's by binding its SCA lists (one stage per history variant,
// whatever the rigs), and every output equals that vehicle's eager run alone.
TEST(BevFormerPlans, RigCacheServesVehiclesWithDifferentRigs) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 21);
  LoadedModel planned(cfg, ck, *backend, /*replay=*/true);
  LoadedModel eager_a(cfg, ck, *backend, /*replay=*/false), eager_b(cfg, ck, *backend, /*replay=*/false);
  StreamHistory ha, hb;
  for (int k = 0; k < 4; ++k) {
    const FrameInput fa = synthetic_frame(cfg, 21, k);
    const FrameInput fb = on_other_rig(synthetic_frame(cfg, 22, k), 1.03);
    const FrameOutput pa = planned.forward(fa, ha), pb = planned.forward(fb, hb);
    const FrameOutput ea = eager_a.forward(fa), eb = eager_b.forward(fb);
    EXPECT_EQ(pa.used_history, k > 0);
    EXPECT_TRUE(identical(pa.bev_embed, ea.bev_embed)) << "vehicle a, frame " << k;
    EXPECT_TRUE(identical(pa.all_cls_scores, ea.all_cls_scores)) << "vehicle a, frame " << k;
    EXPECT_TRUE(identical(pb.bev_embed, eb.bev_embed)) << "vehicle b, frame " << k;
    EXPECT_TRUE(identical(pb.all_bbox_preds, eb.all_bbox_preds)) << "vehicle b, frame " << k;
    EXPECT_FALSE(identical(pa.bev_embed, pb.bev_embed));
  }
  EXPECT_EQ(planned.rigs_seen(), 2u);
  EXPECT_EQ(planned.stage_info().size(), 3u);  // image, bev (first frame), bev (with history)
  EXPECT_EQ(planned.describe().find(", rig "), std::string::npos);
}

// Eight vehicles on eight rigs, more than a per-rig recording could keep: after one round (which
// may grow the stages' list capacity once), a second round replays the same stages, and every
// vehicle's frames equal its eager run alone. Before, each rig had its own bev stages and only
// four rigs kept theirs: every frame of the second round recorded a bev stage again.
TEST(BevFormerPlans, EightRigsReplayWithoutRecordingAgain) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 23);
  LoadedModel planned(cfg, ck, *backend, /*replay=*/true);
  constexpr int kVehicles = 8;
  std::vector<StreamHistory> history(kVehicles);
  std::vector<std::unique_ptr<LoadedModel>> alone;
  for (int v = 0; v < kVehicles; ++v) alone.push_back(std::make_unique<LoadedModel>(cfg, ck, *backend, /*replay=*/false));
  auto frame = [&](int v, int k) { return on_other_rig(synthetic_frame(cfg, 40 + static_cast<uint64_t>(v), k), 0.9 + 0.04 * v); };
  uint64_t after_first_round = 0;
  for (int k = 0; k < 3; ++k) {
    for (int v = 0; v < kVehicles; ++v) {
      const FrameInput f = frame(v, k);
      const FrameOutput p = planned.forward(f, history[static_cast<size_t>(v)]);
      const FrameOutput e = alone[static_cast<size_t>(v)]->forward(f);
      EXPECT_TRUE(identical(p.bev_embed, e.bev_embed)) << "vehicle " << v << ", frame " << k;
      EXPECT_TRUE(identical(p.all_bbox_preds, e.all_bbox_preds)) << "vehicle " << v << ", frame " << k;
    }
    if (k == 1) after_first_round = planned.runner().bev_recordings();
  }
  EXPECT_GE(after_first_round, 2u);  // the first-frame and with-history stages
  EXPECT_EQ(planned.runner().bev_recordings(), after_first_round) << "a bev stage was recorded again";
  EXPECT_EQ(planned.rigs_seen(), static_cast<size_t>(kVehicles));  // each rig's geometry computed once
  EXPECT_EQ(planned.stage_info().size(), 3u);
}


// The same frame with its padded image `extra` pixels wider (zeros on the right, as the test
// pipeline pads): another input shape for the image stage, the same rig. img is NHWC.
FrameInput padded_wider(FrameInput f, int64_t extra) {
  const Tensor& a = f.img;
  Tensor b = Tensor::zeros({a.size(0), a.size(1), a.size(2) + extra, a.size(3)}, DType::kF32);
  const int64_t row_a = a.size(2) * a.size(3), row_b = b.size(2) * b.size(3);
  for (int64_t row = 0; row < a.size(0) * a.size(1); ++row) {
    std::memcpy(b.data<float>() + row * row_b, a.data<float>() + row * row_a, static_cast<size_t>(row_a) * sizeof(float));
  }
  f.img = b;
  return f;
}

// One stream through a pipelined model: a second thread stages frame k+1 (run_image) while this
// thread runs frame k's bev stage; the lanes bound how far ahead it gets.
std::vector<FrameOutput> run_pipelined(LoadedModel& model, const std::vector<FrameInput>& frames) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StagedFrame> ready;
  std::thread producer([&] {
    for (const FrameInput& f : frames) {
      StagedFrame s = model.run_image(f);
      const std::lock_guard<std::mutex> lock(mu);
      ready.push_back(std::move(s));
      cv.notify_all();
    }
  });
  std::vector<FrameOutput> out;
  for (const FrameInput& f : frames) {
    StagedFrame s;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !ready.empty(); });
      s = std::move(ready.front());
      ready.pop_front();
    }
    out.push_back(model.run_bev(f, std::move(s)));
  }
  producer.join();
  return out;
}

void expect_identical(const FrameOutput& a, const FrameOutput& b, const std::string& what) {
  EXPECT_EQ(a.used_history, b.used_history) << what;
  EXPECT_TRUE(identical(a.bev_embed, b.bev_embed)) << what;
  EXPECT_TRUE(identical(a.all_cls_scores, b.all_cls_scores)) << what;
  EXPECT_TRUE(identical(a.all_bbox_preds, b.all_bbox_preds)) << what;
  ASSERT_EQ(a.detections.size(), b.detections.size()) << what;
  for (size_t i = 0; i < a.detections.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.detections[i].box, &b.detections[i].box, sizeof(a.detections[i].box)), 0) << what;
  }
}

// Pipelining gives the bits of forward() one frame at a time, replayed and eager, in f32 and
// bf16: over a rig change and an image size change, which re-records one lane's image plan (the
// bev plans that read its old outputs must be dropped, not replayed on those stale outputs).
TEST(BevFormerPipeline, StagedAheadIsBitIdenticalToOneFrameAtATime) {
  const ModelConfig cfg = micro();
  const Checkpoint ck = random_checkpoint(cfg, 41);
  std::vector<FrameInput> frames;
  for (int k = 0; k < 9; ++k) {
    FrameInput f = synthetic_frame(cfg, 41, k);
    if (k == 3 || k == 4) f = on_other_rig(std::move(f), 1.04);
    if (k == 5 || k == 6) f = padded_wider(std::move(f), 32);
    frames.push_back(std::move(f));
  }
  for (const Precision precision : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    auto backend = make_cpu_backend(2, precision);
    for (const bool replay : {true, false}) {
      LoadedModel plain(cfg, ck, *backend, replay), piped(cfg, ck, *backend, replay, /*pipelined=*/true);
      EXPECT_EQ(plain.lanes(), 1);
      EXPECT_EQ(piped.lanes(), 2);
      const std::vector<FrameOutput> got = run_pipelined(piped, frames);
      for (size_t k = 0; k < frames.size(); ++k) {
        const FrameOutput want = plain.forward(frames[k]);
        EXPECT_EQ(want.used_history, k > 0);
        expect_identical(want, got[k],
                         std::string(precision == Precision::kF32 ? "f32" : "bf16") + (replay ? " replay" : " eager") +
                             ", frame " + std::to_string(k));
      }
      if (replay) {
        EXPECT_NE(piped.describe().find("image (lane 2)"), std::string::npos);
      }
    }
  }
}

// A lane whose image plan is re-recorded (a new image size, which is also a new rig) drops the
// bev plans that read its old outputs on every rig, not only the current one: they would keep
// the old outputs alive (base: about 1.1 GB each). The frames are staged two at a time, which
// pins them to lanes 1 and 2.
TEST(BevFormerPipeline, ReRecordedLanesDropTheirOldBevPlansOnEveryRig) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 53);
  LoadedModel piped(cfg, ck, *backend, /*replay=*/true, /*pipelined=*/true), plain(cfg, ck, *backend);
  int k = 0;
  const auto two_at_once = [&](bool wide) {
    FrameInput a = synthetic_frame(cfg, 53, k), b = synthetic_frame(cfg, 53, k + 1);
    if (wide) {
      a = padded_wider(std::move(a), 32);
      b = padded_wider(std::move(b), 32);
    }
    StagedFrame sa = piped.run_image(a), sb = piped.run_image(b);
    expect_identical(plain.forward(a), piped.run_bev(a, std::move(sa)), "frame " + std::to_string(k));
    expect_identical(plain.forward(b), piped.run_bev(b, std::move(sb)), "frame " + std::to_string(k + 1));
    k += 2;
  };
  two_at_once(false);
  EXPECT_EQ(piped.stage_info().size(), 4u);  // two image plans, a bev plan per lane
  two_at_once(true);                        // both lanes re-record, on a new rig
  EXPECT_EQ(piped.stage_info().size(), 4u) << piped.describe();
  two_at_once(false);                       // and back
  EXPECT_EQ(piped.stage_info().size(), 4u) << piped.describe();
  EXPECT_EQ(piped.rigs_seen(), 2u);
}

// Several streams call forward() at once on a pipelined model (a server's workers): each stream
// equals that stream run alone on a plain model.
TEST(BevFormerPipeline, ConcurrentStreamsOnAPipelinedModelEqualEachAlone) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 43);
  LoadedModel piped(cfg, ck, *backend, /*replay=*/true, /*pipelined=*/true);
  constexpr int kStreams = 3, kFrames = 4;
  std::vector<std::vector<FrameOutput>> got(kStreams);
  std::vector<std::thread> workers;
  for (int s = 0; s < kStreams; ++s) {
    workers.emplace_back([&, s] {
      StreamHistory history;
      for (int k = 0; k < kFrames; ++k) {
        got[static_cast<size_t>(s)].push_back(piped.forward(synthetic_frame(cfg, 50 + static_cast<uint64_t>(s), k), history));
      }
    });
  }
  for (auto& w : workers) w.join();
  for (int s = 0; s < kStreams; ++s) {
    LoadedModel alone(cfg, ck, *backend);
    for (int k = 0; k < kFrames; ++k) {
      expect_identical(alone.forward(synthetic_frame(cfg, 50 + static_cast<uint64_t>(s), k)),
                       got[static_cast<size_t>(s)][static_cast<size_t>(k)],
                       "stream " + std::to_string(s) + ", frame " + std::to_string(k));
    }
  }
}

// A staged frame that never reaches run_bev gives its lane back; run_bev refuses a staged frame
// of another model, an empty one, or a different frame, and the model carries on unchanged.
TEST(BevFormerPipeline, MisusedStagedFramesFailClearlyAndFreeTheirLane) {
  const ModelConfig cfg = micro();
  auto backend = make_cpu_backend(2, Precision::kF32);
  const Checkpoint ck = random_checkpoint(cfg, 47);
  LoadedModel model(cfg, ck, *backend), other(cfg, ck, *backend), reference(cfg, ck, *backend);
  const FrameInput f0 = synthetic_frame(cfg, 47, 0), f1 = synthetic_frame(cfg, 47, 1);
  { StagedFrame dropped = model.run_image(f0); }  // one lane: a leak would hang the next call
  test::expect_invalid_input([&] { model.run_bev(f0, other.run_image(f0)); }, "another runner");
  test::expect_invalid_input([&] { model.run_bev(f0, StagedFrame{}); }, "empty staged frame");
  test::expect_invalid_input([&] { model.run_bev(f0, model.run_image(padded_wider(f0, 32))); }, "differs from the one staged");
  FrameInput nan_pose = f0;
  nan_pose.can_bus[3] = std::nan("");
  test::expect_invalid_input([&] { model.run_image(nan_pose); }, "can_bus");
  const FrameOutput a = model.forward(f0), b = model.forward(f1);
  expect_identical(reference.forward(f0), a, "frame 0 after the errors");
  expect_identical(reference.forward(f1), b, "frame 1 after the errors");
}

}  // namespace
}  // namespace bev
