// A BEVFormer loaded on a backend together with its StageRunner: what the model tests drive.
// forward() and run_bev() read the new BEV back to the host (FrameReads::bev_embed), because the
// tests compare it; the engine itself reads it only when asked.
#pragma once

#include <memory>
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

  FrameOutput forward(const FrameInput& f, Taps* taps = nullptr) { return runner_.forward(f, {taps, true}); }
  FrameOutput forward(const FrameInput& f, StreamHistory& history) { return runner_.forward(f, history, {nullptr, true}); }
  StagedFrame run_image(const FrameInput& f) { return runner_.run_image(f); }
  FrameOutput run_bev(const FrameInput& f, StagedFrame staged) { return runner_.run_bev(f, std::move(staged), {nullptr, true}); }
  FrameOutput run_bev(const FrameInput& f, StagedFrame staged, StreamHistory& history) {
    return runner_.run_bev(f, std::move(staged), history, {nullptr, true});
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

}  // namespace bev::testing
