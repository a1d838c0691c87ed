// A BEVFormer loaded on a backend together with its StageRunner: what the model tests drive.
// forward() and run_bev() read the new BEV and the heads' outputs back to the host
// (FrameReads::bev_embed and heads), because the tests compare them; the engine itself reads
// them only when asked.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "backend/backend.h"
#include "backend/ops.h"
#include "model/bevformer.h"
#include "runtime/stage_runner.h"

namespace bev::testing {

inline BevFormer load_model(const ModelConfig& cfg, const Checkpoint& ck, Backend& backend) {
  Ops ops(backend);
  return BevFormer(cfg, ck, ops);
}

class LoadedModel {
 public:
  LoadedModel(const ModelConfig& cfg, const Checkpoint& ck, Backend& backend, bool replay = true,
              bool pipelined = false)
      : model_(load_model(cfg, ck, backend)), runner_(model_, backend, replay, pipelined) {}

  FrameOutput forward(const FrameInput& f, Taps* taps = nullptr) { return runner_.forward(f, {taps, true, true}); }
  FrameOutput forward(const FrameInput& f, StreamHistory& history) { return runner_.forward(f, history, {nullptr, true, true}); }
  StagedFrame run_image(const FrameInput& f) { return runner_.run_image(f); }
  FrameOutput run_bev(const FrameInput& f, StagedFrame staged) { return runner_.run_bev(f, std::move(staged), {nullptr, true, true}); }
  FrameOutput run_bev(const FrameInput& f, StagedFrame staged, StreamHistory& history) {
    return runner_.run_bev(f, std::move(staged), history, {nullptr, true, true});
  }
  void reset_history() { runner_.reset_history(); }
  int lanes() const { return runner_.lanes(); }
  std::string describe() const { return runner_.describe(); }
  std::vector<StageRunner::StageInfo> stage_info() const { return runner_.stage_info(); }
  size_t rigs_seen() const { return runner_.rigs_seen(); }
  StageRunner& runner() { return runner_; }
  const BevFormer& model() const { return model_; }

 private:
  BevFormer model_;
  StageRunner runner_;
};

// Same dtype, shape and bytes (host tensors, both read: two tensors a frame did not read back
// are not evidence of anything).
inline bool identical(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

// Two runs of a frame gave the same bits: history use, the new BEV (when read), the heads' outputs
// and every detection.
inline void expect_same_output(const FrameOutput& a, const FrameOutput& b, const std::string& what) {
  EXPECT_EQ(a.used_history, b.used_history) << what;
  EXPECT_EQ(a.bev_embed.defined(), b.bev_embed.defined()) << what;
  if (a.bev_embed.defined()) {
    EXPECT_TRUE(identical(a.bev_embed, b.bev_embed)) << what;
  }
  EXPECT_TRUE(identical(a.all_cls_scores, b.all_cls_scores)) << what;
  EXPECT_TRUE(identical(a.all_bbox_preds, b.all_bbox_preds)) << what;
  ASSERT_EQ(a.detections.size(), b.detections.size()) << what;
  for (size_t i = 0; i < a.detections.size(); ++i) {
    // Field by field: Detection has 4 padding bytes before `query`, which memcmp would compare
    // (they differed under clang's ASan build while every field was equal).
    const Detection &x = a.detections[i], &y = b.detections[i];
    EXPECT_TRUE(std::memcmp(x.box.data(), y.box.data(), sizeof x.box) == 0 &&
                std::memcmp(&x.score, &y.score, sizeof x.score) == 0 && x.label == y.label && x.query == y.query)
        << what << ", box " << i;
  }
}

}  // namespace bev::testing
