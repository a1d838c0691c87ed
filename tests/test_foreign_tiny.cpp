// The foreign-memory backend at BEVFormer's real shapes: a tiny model at full size (six 480x800
// cameras, a 50x50 BEV) over a sequence, f32 and bf16, gives the CPU backend's bits, and the
// profiler's replays outside frames run on it. (Label slow: about a minute on two cores.)
#include <gtest/gtest.h>

#include "backend/registry.h"
#include "model/synthetic.h"
#include "engine_test_util.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using testing::expect_same_output;
using testing::LoadedModel;

TEST(ForeignBackend, FullSizeTinySequenceGivesTheCpuBits) {
  const ModelConfig cfg = config_preset("tiny");
  const Checkpoint ck = random_checkpoint(cfg, 71);
  for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    const auto cpu = make_backend("cpu", {0, p, 0});
    const auto foreign = make_backend("foreign", {0, p, 0});
    LoadedModel a(cfg, ck, *cpu), b(cfg, ck, *foreign);
    for (int k = 0; k < (p == Precision::kF32 ? 3 : 2); ++k) {
      const FrameInput f = synthetic_frame(cfg, 71, k);
      expect_same_output(a.forward(f), b.forward(f), std::string(precision_name(p)) + ", frame " + std::to_string(k));
    }
    EXPECT_TRUE(b.runner().replay_image_stage());
    EXPECT_TRUE(b.runner().replay_bev_stage(true));
  }
}

}  // namespace
}  // namespace bev
