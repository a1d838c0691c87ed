// The runtime's contract with a backend that runs asynchronously (issue 46): the host waits for
// the backend once per frame, where the frame's results leave the engine (its boxes and both
// stages' non-finite counts together), and once per batch; only taps ask for more. Counted by
// a decorator that sees every wait the runner makes, replayed and eager, plain and pipelined.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/foreign/foreign_backend.h"
#include "backend/forwarding_backend.h"
#include "engine_test_util.h"
#include "micro_frames.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/synthetic.h"
#include "runtime/engine.h"

namespace bev {
namespace {

// Counts the host's waits for the backend's work (every read and read_all ends in synchronize),
// and the writes from host memory that is not staging memory where the backend wants staging.
class WaitCounter : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void synchronize() override {
    ++waits;
    inner_.synchronize();
  }
  void write(const Tensor& dst, const Tensor& host_src) override {
    if (wants_staging() && host_src.storage()->staging_owner() == nullptr) {
      ++unstaged_writes;
      unstaged += " " + host_src.describe();
    }
    inner_.write(dst, host_src);
  }
  int unstaged_writes = 0;
  std::string unstaged;  // what they wrote
  // Stages as the inner backend runs them (whole, on its queue), not node by node through here.
  void execute(const RecordedStage& stage, std::span<const StageBinding> bindings,
               std::vector<OpTime>* times) override {
    inner_.execute(stage, bindings, times);
  }
  int waits = 0;
};

ModelConfig micro() { return load_config(std::string(BEV_SHARED_DIR) + "/golden/micro/config.json"); }

// `inner`'s frames, replayed and eager, plain and pipelined. `foreign`: its memory is not the
// host's, so that taps there are reads of their own.
void expect_one_wait_per_frame(Backend& inner, bool foreign) {
  const ModelConfig cfg = micro();
  const Checkpoint ck = random_checkpoint(cfg, 46);
  for (const bool replay : {true, false}) {
    for (const bool pipelined : {false, true}) {
      const std::string what = std::string(inner.name()) + ", " + (replay ? "replayed" : "eager") +
                               (pipelined ? ", pipelined" : "");
      WaitCounter counter(inner);
      testing::LoadedModel model(cfg, ck, counter, replay, pipelined);
      StageRunner& runner = model.runner();
      for (int k = 0; k < 4; ++k) {
        const FrameInput f = synthetic_frame(cfg, 46, k);
        counter.waits = 0;
        counter.unstaged_writes = 0;
        counter.unstaged.clear();
        FrameOutput out;
        if (k % 2 == 0) {
          out = runner.forward(f);  // detections only: what the engine asks
        } else {
          // Everything a test compares (heads and the new BEV) leaves in the same wait.
          out = runner.run_bev(f, runner.run_image(f), {nullptr, true, true});
          EXPECT_TRUE(out.bev_embed.defined() && out.all_cls_scores.defined()) << what;
        }
        EXPECT_EQ(counter.waits, 1) << what << ", frame " << k;
        EXPECT_EQ(out.host_waits, 1) << what << ", frame " << k;
        // A replayed frame's inputs cross in staging memory (frames 0 and 1 record stages, whose
        // constants are uploaded once; eager frames upload everything).
        if (replay && k >= 2) {
          EXPECT_EQ(counter.unstaged_writes, 0) << what << ", frame " << k << ":" << counter.unstaged;
        }
        EXPECT_EQ(out.used_history, k > 0) << what;
        EXPECT_FALSE(out.detections.empty()) << what;
        if (k % 2 == 0) {
          EXPECT_FALSE(out.all_cls_scores.defined() || out.bev_embed.defined()) << what << ": read without being asked";
        }
      }
      // Taps read every golden tensor, each a wait of its own where backend memory is not the
      // host's: counted, not hidden.
      Taps taps;
      counter.waits = 0;
      const FrameOutput tapped = runner.forward(synthetic_frame(cfg, 46, 4), {&taps});
      EXPECT_FALSE(taps.all().empty()) << what;
      EXPECT_EQ(tapped.host_waits, counter.waits) << what;
      if (foreign) {
        EXPECT_GT(tapped.host_waits, 1) << what;
      }
    }
  }
}

TEST(FramePath, OneHostWaitPerFrame) {
  expect_one_wait_per_frame(*make_cpu_backend(2, Precision::kF32), false);
  expect_one_wait_per_frame(*make_foreign_backend(2, Precision::kF32), true);
}

TEST(FramePath, OneHostWaitPerBatch) {
  const ModelConfig cfg = micro();
  const Checkpoint ck = random_checkpoint(cfg, 47);
  auto cpu = make_cpu_backend(2, Precision::kF32);
  for (const bool replay : {true, false}) {
    WaitCounter counter(*cpu);
    testing::LoadedModel model(cfg, ck, counter, replay);
    std::vector<StreamHistory> histories(3);
    for (int k = 0; k < 3; ++k) {
      std::vector<FrameInput> frames;
      for (int s = 0; s < 3; ++s) frames.push_back(synthetic_frame(cfg, 47 + s, k));
      std::vector<BatchSample> samples;
      for (size_t s = 0; s < 3; ++s) samples.push_back({&frames[s], &histories[s]});
      counter.waits = 0;
      const std::vector<SampleOutput> got = model.runner().forward_batch(samples, {nullptr, k == 2, k == 2});
      EXPECT_EQ(counter.waits, 1) << (replay ? "replayed" : "eager") << ", batch " << k;
      for (const SampleOutput& o : got) {
        ASSERT_FALSE(o.error);
        EXPECT_EQ(o.batch_size, 3);
        EXPECT_EQ(o.output.host_waits, 1);
        EXPECT_EQ(o.output.bev_embed.defined(), k == 2);
        EXPECT_EQ(o.output.all_bbox_preds.defined(), k == 2);
      }
    }
  }
}

// A frame file's pixels are decoded straight into the staging memory of a backend that wants it
// (one copy less on the way to a device), and into ordinary memory for the CPU.
TEST(FramePath, FramePixelsAreDecodedIntoStagingMemory) {
  const ModelConfig cfg = micro();
  const Checkpoint ck = random_checkpoint(cfg, 49);
  const Frame spec = parse_frame(testing::micro_frame_json(0).dump());
  for (const std::string backend : {"foreign", "cpu"}) {
    EngineOptions o;
    o.backend = backend;
    o.backend_options.threads = 2;
    const std::unique_ptr<Engine> engine = Engine::create(cfg, ck, o);
    const PreparedFrame p = engine->prepare(spec, testing::kMicroDir);
    EXPECT_EQ(p.input.img.dtype(), DType::kU8);
    EXPECT_EQ(p.input.img.storage()->staging_owner(), backend == "foreign" ? &engine->backend() : nullptr) << backend;
  }
}

// A frame given up between its stages leaves its image stage issued on a late backend; the
// runner that goes then must let it run first (its stages go with it). Under ASan a missing wait
// is a use after free.
TEST(FramePath, ARunnerGoneWithWorkIssuedWaitsForIt) {
  const ModelConfig cfg = micro();
  const Checkpoint ck = random_checkpoint(cfg, 48);
  const auto foreign = make_foreign_backend(2, Precision::kF32, /*delay_us=*/20000);
  {
    testing::LoadedModel model(cfg, ck, *foreign);
    const FrameInput f = synthetic_frame(cfg, 48, 0);
    (void)model.runner().run_image(f);  // staged, then dropped: its lane is free, its work queued
  }
  foreign->synchronize();  // nothing failed on the queue
}

}  // namespace
}  // namespace bev
