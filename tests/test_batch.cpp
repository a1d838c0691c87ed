// Batches of vehicles (StageRunner::forward_batch): every sample of a batch equals its stream
// run alone through forward(), on the golden set's frames mixed with other streams — vehicles
// on other rigs, on their first frame beside frames with history, across a scene change inside
// a batch — replayed and eager; a sample that fails fails alone; the plans replay for any mix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bevformer/error.h"
#include "core/compare.h"
#include "engine_test_util.h"
#include "io/checkpoint.h"
#include "io/golden_set.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using testing::identical;
using testing::LoadedModel;

const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

FrameInput golden_input(const GoldenSetFiles& set, size_t k) {
  const GoldenFrame g = load_golden_frame(set, k);
  FrameInput f;
  f.img = g.img.permute({0, 2, 3, 1}).contiguous();
  f.lidar2img = g.lidar2img;
  f.can_bus = g.can_bus;
  f.scene_token = g.scene_token;
  return f;
}

// Another vehicle's rig: every camera's focal lengths scaled (another calibration), so its
// bev_mask and SCA query lists differ.
FrameInput on_other_rig(FrameInput f, double scale) {
  for (auto& m : f.lidar2img) {
    for (int c = 0; c < 8; ++c) m[static_cast<size_t>(c)] *= scale;
  }
  return f;
}

// Another vehicle's pose: the CAN bus moved and turned, so the temporal step (shift, rotation,
// CAN-bus delta) differs from the golden drive's.
FrameInput moved(FrameInput f, double dx, double dyaw_deg) {
  f.can_bus[0] += dx;
  f.can_bus[1] -= 0.5 * dx;
  f.can_bus[16] += dyaw_deg * M_PI / 180.0;
  f.can_bus[17] += dyaw_deg;
  return f;
}

double rel_l2(const Tensor& got, const Tensor& want) { return compare(got, want).relative_l2; }

struct Comparison {
  int samples = 0, identical_samples = 0;
  double worst = 0;
};

// One sample against the same frame of its stream run alone: within 1e-6 relative L2 per
// output, the same detections (query and label; boxes and scores within the same bound).
void expect_equal(const FrameOutput& got, const FrameOutput& want, const std::string& what, Comparison& c) {
  EXPECT_EQ(got.used_history, want.used_history) << what;
  const double e = std::max({rel_l2(got.bev_embed, want.bev_embed), rel_l2(got.all_cls_scores, want.all_cls_scores),
                             rel_l2(got.all_bbox_preds, want.all_bbox_preds)});
  EXPECT_LE(e, 1e-6) << what;
  c.worst = std::max(c.worst, e);
  ++c.samples;
  if (identical(got.bev_embed, want.bev_embed) && identical(got.all_cls_scores, want.all_cls_scores) &&
      identical(got.all_bbox_preds, want.all_bbox_preds)) {
    ++c.identical_samples;
  }
  ASSERT_EQ(got.detections.size(), want.detections.size()) << what;
  std::map<std::pair<int64_t, int>, Detection> by_key;
  for (const Detection& d : want.detections) by_key[{d.query, d.label}] = d;
  for (const Detection& d : got.detections) {
    const auto it = by_key.find({d.query, d.label});
    ASSERT_NE(it, by_key.end()) << what << ": query " << d.query << " label " << d.label << " not detected alone";
    EXPECT_NEAR(d.score, it->second.score, 1e-6) << what;
    for (size_t i = 0; i < d.box.size(); ++i) EXPECT_NEAR(d.box[i], it->second.box[i], 1e-4) << what << ", box " << i;
  }
}

// A drive: one stream's frames, each either a frame or a gap (the stream sits a round out).
struct Drive {
  std::string name;
  std::vector<std::optional<FrameInput>> rounds;
};

// Runs the drives round by round as batches on `batched` and each drive alone on `alone`, and
// compares every sample.
void run_and_compare(LoadedModel& batched, LoadedModel& alone, const std::vector<Drive>& drives,
                     const std::string& what, Comparison& c) {
  std::vector<StreamHistory> batch_histories(drives.size()), alone_histories(drives.size());
  size_t rounds = 0;
  for (const Drive& d : drives) rounds = std::max(rounds, d.rounds.size());
  for (size_t r = 0; r < rounds; ++r) {
    std::vector<BatchSample> samples;
    std::vector<size_t> which;
    for (size_t i = 0; i < drives.size(); ++i) {
      if (r < drives[i].rounds.size() && drives[i].rounds[r]) {
        samples.push_back({&*drives[i].rounds[r], &batch_histories[i]});
        which.push_back(i);
      }
    }
    const std::vector<SampleOutput> got = batched.runner().forward_batch(samples, {nullptr, true, true});
    ASSERT_EQ(got.size(), samples.size());
    for (size_t s = 0; s < samples.size(); ++s) {
      const std::string where = what + ", round " + std::to_string(r) + ", " + drives[which[s]].name;
      ASSERT_FALSE(got[s].error) << where;
      EXPECT_EQ(got[s].batch_size, static_cast<int64_t>(samples.size())) << where;
      const FrameOutput want = alone.forward(*samples[s].frame, alone_histories[which[s]]);
      expect_equal(got[s].output, want, where, c);
    }
  }
}

class BatchGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_ = new GoldenSetFiles(find_golden_set(kMicro));
    cfg_ = new ModelConfig(load_config(set_->config_path));
    ck_ = new Checkpoint(load_checkpoint(set_->checkpoint_path));
    for (size_t k = 0; k < set_->num_frames(); ++k) frames_.push_back(golden_input(*set_, k));
  }
  static void TearDownTestSuite() {
    delete set_;
    delete cfg_;
    delete ck_;
    frames_.clear();
  }

  // The golden drive beside three other vehicles: one on another rig and pose that joins a
  // round later (its first frame beside frames with history), one whose scene changes inside a
  // batch (history dropped there), one on a third rig that sits a round out.
  static std::vector<Drive> drives() {
    const std::vector<FrameInput>& g = frames_;
    std::vector<Drive> d(4);
    d[0] = {"golden", {g[0], g[1], g[2]}};
    d[1] = {"other rig", {std::nullopt, on_other_rig(moved(g[0], 3, 4), 1.05), on_other_rig(moved(g[1], 3, 4), 1.05),
                          on_other_rig(moved(g[2], 3, 4), 1.05)}};
    FrameInput new_scene = moved(g[2], -2, -3);
    new_scene.scene_token = "another scene";
    d[2] = {"scene change", {moved(g[0], -2, -3), moved(g[1], -2, -3), new_scene}};
    d[3] = {"third rig", {on_other_rig(g[0], 0.95), std::nullopt, on_other_rig(g[1], 0.95)}};
    return d;
  }

  static GoldenSetFiles* set_;
  static ModelConfig* cfg_;
  static Checkpoint* ck_;
  static std::vector<FrameInput> frames_;
};
GoldenSetFiles* BatchGolden::set_ = nullptr;
ModelConfig* BatchGolden::cfg_ = nullptr;
Checkpoint* BatchGolden::ck_ = nullptr;
std::vector<FrameInput> BatchGolden::frames_;

TEST_F(BatchGolden, EverySampleEqualsItsStreamAloneReplayedAndEager) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  for (const bool replay : {true, false}) {
    LoadedModel batched(*cfg_, *ck_, *backend, replay), alone(*cfg_, *ck_, *backend, replay);
    Comparison c;
    run_and_compare(batched, alone, drives(), replay ? "replay" : "eager", c);
    EXPECT_EQ(c.samples, 11);
    // Every sample bit-identical, on every CPU: every kernel computes each row, query and MSDA
    // batch entry on its own, with a reduction order that does not depend on how many rows there
    // are (oneDNN's brgemm on AVX-512, cpu::RowGemm below it: oneDNN's gemm:jit is not;
    // docs/PERF.md). A car's boxes must not depend on which cars shared its batch.
    EXPECT_EQ(c.identical_samples, c.samples);
    std::printf("[ batch    ] f32 %s: %d samples, %d bit-identical, worst relative L2 %.3g\n",
                replay ? "replay" : "eager", c.samples, c.identical_samples, c.worst);
  }
}

// bf16 batches equal bf16 alone (the same kernels on the same rows).
TEST_F(BatchGolden, Bf16SamplesEqualTheirStreamAlone) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  auto backend = make_cpu_backend(2, Precision::kBF16);
  LoadedModel batched(*cfg_, *ck_, *backend), alone(*cfg_, *ck_, *backend);
  Comparison c;
  run_and_compare(batched, alone, drives(), "bf16 replay", c);
  EXPECT_EQ(c.samples, 11);
  EXPECT_EQ(c.identical_samples, c.samples);
  std::printf("[ batch    ] bf16 replay: %d samples, %d bit-identical, worst relative L2 %.3g\n", c.samples,
              c.identical_samples, c.worst);
}

// One recording per batch size serves every mix of rigs and history; the SCA lists' capacity
// follows the stated rule, and a rig with longer lists re-records at a larger capacity without
// changing any sample's result.
TEST_F(BatchGolden, PlansReplayForAnyMixAndGrowTheirCapacityWhenARigNeedsIt) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  LoadedModel batched(*cfg_, *ck_, *backend), alone(*cfg_, *ck_, *backend);
  const int64_t hw = int64_t{cfg_->head.bev_h} * cfg_->head.bev_w, step = (hw + 7) / 8;
  auto capacity = [&](const FrameInput& f) {
    return std::min(hw, (batched.model().rig_geometry(f).queries.max_len + step - 1) / step * step);
  };
  // Longer focal lengths: each camera sees fewer cells, so the first batch records a small capacity.
  auto narrow = [&](size_t k) { return on_other_rig(frames_[k], 2.0); };
  auto narrower = [&](size_t k) { return moved(on_other_rig(frames_[k], 1.5), 2, 3); };
  const int64_t small = std::max(capacity(narrow(0)), capacity(narrower(0)));
  ASSERT_GT(capacity(frames_[0]), small) << "the golden rig must need a larger capacity for this test to mean anything";
  std::vector<Drive> d(3);
  d[0] = {"narrow", {narrow(0), narrow(1), narrow(2)}};
  d[1] = {"narrower", {narrower(0), std::nullopt, narrower(1)}};
  d[2] = {"golden", {std::nullopt, frames_[0], frames_[1]}};
  std::vector<StreamHistory> hb(3), ha(3);
  Comparison c;
  for (size_t r = 0; r < 3; ++r) {
    std::vector<BatchSample> samples;
    std::vector<size_t> which;
    for (size_t i = 0; i < 3; ++i) {
      if (d[i].rounds[r]) {
        samples.push_back({&*d[i].rounds[r], &hb[i]});
        which.push_back(i);
      }
    }
    const std::vector<SampleOutput> got = batched.runner().forward_batch(samples, {nullptr, true, true});
    // Round 0 records batch 2 at the narrow rigs' capacity; round 1 needs the golden rig's and
    // re-records batch 2; round 2 is batch 3.
    const int64_t b = static_cast<int64_t>(samples.size());
    EXPECT_EQ(batched.runner().batch_capacity(b), r == 0 ? small : capacity(frames_[0])) << "round " << r;
    for (size_t s = 0; s < samples.size(); ++s) {
      ASSERT_FALSE(got[s].error) << "round " << r;
      expect_equal(got[s].output, alone.forward(*samples[s].frame, ha[which[s]]),
                   "round " + std::to_string(r) + ", " + d[which[s]].name, c);
    }
  }
  // Batch 2's first recording was replaced by the larger one: one image and one bev stage each
  // for batch 2 and batch 3.
  size_t two = 0, three = 0;
  for (const auto& s : batched.stage_info()) {
    two += s.name.find("(batch 2)") != std::string::npos;
    three += s.name.find("(batch 3)") != std::string::npos;
  }
  EXPECT_EQ(two, 2u);
  EXPECT_EQ(three, 2u);
  EXPECT_EQ(c.samples, 7);
}

// A sample that fails (a frame the model refuses, a stage that overflows) fails alone: the
// batch's other samples are answered exactly as alone, the failed stream keeps its history.
TEST_F(BatchGolden, ASampleThatFailsFailsAlone) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  for (const bool replay : {true, false}) {
    LoadedModel batched(*cfg_, *ck_, *backend, replay), alone(*cfg_, *ck_, *backend, replay);
    std::vector<StreamHistory> hb(3), ha(3);
    // Round 0: three good first frames.
    std::vector<FrameInput> r0 = {frames_[0], on_other_rig(frames_[0], 1.05), moved(frames_[0], 1, 2)};
    std::vector<BatchSample> s0;
    for (size_t i = 0; i < 3; ++i) s0.push_back({&r0[i], &hb[i]});
    for (const SampleOutput& o : batched.runner().forward_batch(s0, {nullptr, true, true})) ASSERT_FALSE(o.error);
    for (size_t i = 0; i < 3; ++i) alone.forward(r0[i], ha[i]);
    const Tensor kept_bev = backend->read(hb[1].prev_bev);
    // Round 1: sample 1's CAN bus is at float32's limit (its queries overflow in the bev stage); sample 2 has one camera too few.
    std::vector<FrameInput> r1 = {frames_[1], on_other_rig(frames_[1], 1.05), moved(frames_[1], 1, 2)};
    for (const size_t i : {7, 8, 9, 10}) r1[1].can_bus[i] = 3e38;
    r1[2].lidar2img.pop_back();
    r1[2].img = r1[2].img.slice(0, 0, r1[2].img.size(0) - 1).contiguous();
    std::vector<BatchSample> s1;
    for (size_t i = 0; i < 3; ++i) s1.push_back({&r1[i], &hb[i]});
    const std::vector<SampleOutput> got = batched.runner().forward_batch(s1, {nullptr, true, true});
    ASSERT_FALSE(got[0].error);
    Comparison c;
    expect_equal(got[0].output, alone.forward(r1[0], ha[0]), replay ? "replay" : "eager", c);
    ASSERT_TRUE(got[1].error);
    ASSERT_TRUE(got[2].error);
    try {
      std::rethrow_exception(got[1].error);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
    }
    try {
      std::rethrow_exception(got[2].error);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    }
    // The failed streams' histories are as before: their next good frame equals the stream alone.
    EXPECT_TRUE(identical(backend->read(hb[1].prev_bev), kept_bev));
    std::vector<FrameInput> r2 = {on_other_rig(frames_[1], 1.05), moved(frames_[1], 1, 2)};
    const std::vector<BatchSample> s2 = {{&r2[0], &hb[1]}, {&r2[1], &hb[2]}};
    const std::vector<SampleOutput> again = batched.runner().forward_batch(s2, {nullptr, true, true});
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_FALSE(again[i].error);
      expect_equal(again[i].output, alone.forward(r2[i], ha[i + 1]), "after the failure", c);
    }
    EXPECT_EQ(batched.runner().nonfinite_frames(), 1u);
  }
}

// Adaptive batching runs the batch size measured fastest per frame (never one that costs
// throughput against a smaller one), measuring each size first; the answers do not change.
TEST_F(BatchGolden, AdaptiveBatchingRunsTheFastestMeasuredSize) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  LoadedModel batched(*cfg_, *ck_, *backend), alone(*cfg_, *ck_, *backend);
  StageRunner& runner = batched.runner();
  EXPECT_EQ(runner.chosen_batch(4), 4);  // off: as given
  runner.set_adaptive_batching(true);
  EXPECT_EQ(runner.chosen_batch(4), 4);  // nothing measured: run it and see
  runner.seed_batch_timing(1, 1.0);
  runner.seed_batch_timing(2, 0.9);
  runner.seed_batch_timing(4, 1.2);  // batching four costs throughput here
  EXPECT_EQ(runner.chosen_batch(4), 2);
  EXPECT_EQ(runner.chosen_batch(2), 2);
  EXPECT_EQ(runner.chosen_batch(3), 3);  // not measured yet
  runner.seed_batch_timing(3, 0.5);
  EXPECT_EQ(runner.chosen_batch(4), 3);
  runner.seed_batch_timing(3, 2.0);
  // Four vehicles as two batches of two; every sample as alone.
  std::vector<FrameInput> in = {frames_[0], on_other_rig(frames_[0], 1.05), moved(frames_[0], 1, 2),
                                moved(on_other_rig(frames_[0], 0.95), -1, 3)};
  std::vector<StreamHistory> hb(4), ha(4);
  std::vector<BatchSample> s;
  for (size_t i = 0; i < 4; ++i) s.push_back({&in[i], &hb[i]});
  const std::vector<SampleOutput> got = runner.forward_batch(s, {nullptr, true, true});
  Comparison c;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_FALSE(got[i].error);
    EXPECT_EQ(got[i].batch_size, 2);
    expect_equal(got[i].output, alone.forward(in[i], ha[i]), "sample " + std::to_string(i), c);
  }
}

TEST_F(BatchGolden, FramesOfOneStreamOrTapsAreRefused) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  LoadedModel model(*cfg_, *ck_, *backend);
  StreamHistory h, other;
  const std::vector<BatchSample> twice = {{&frames_[0], &h}, {&frames_[1], &h}};
  EXPECT_THROW(model.runner().forward_batch(twice), Error);
  Taps taps;
  const std::vector<BatchSample> two = {{&frames_[0], &h}, {&frames_[0], &other}};
  EXPECT_THROW(model.runner().forward_batch(two, {&taps, false}), Error);
  EXPECT_FALSE(h.state.has_prev_bev);
}

// Images of different sizes cannot share an image stage: they run as separate batches (one
// alone through forward()), each as its stream alone.
TEST_F(BatchGolden, ImagesOfDifferentSizesRunApart) {
  auto backend = make_cpu_backend(2, Precision::kF32);
  LoadedModel batched(*cfg_, *ck_, *backend), alone(*cfg_, *ck_, *backend);
  const FrameInput& f = frames_[0];
  FrameInput wider = f;
  Tensor b = Tensor::zeros({f.img.size(0), f.img.size(1), f.img.size(2) + 32, f.img.size(3)}, DType::kF32);
  for (int64_t row = 0; row < f.img.size(0) * f.img.size(1); ++row) {
    std::copy_n(f.img.data<float>() + row * f.img.size(2) * 3, f.img.size(2) * 3, b.data<float>() + row * b.size(2) * 3);
  }
  wider.img = b;
  std::vector<StreamHistory> hb(3), ha(3);
  const std::vector<FrameInput> in = {f, wider, moved(f, 2, 1)};
  std::vector<BatchSample> s;
  for (size_t i = 0; i < 3; ++i) s.push_back({&in[i], &hb[i]});
  const std::vector<SampleOutput> got = batched.runner().forward_batch(s, {nullptr, true, true});
  Comparison c;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_FALSE(got[i].error);
    EXPECT_EQ(got[i].batch_size, i == 1 ? 1 : 2);
    expect_equal(got[i].output, alone.forward(in[i], ha[i]), "sample " + std::to_string(i), c);
  }
}

}  // namespace
}  // namespace bev
