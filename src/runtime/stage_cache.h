// The recorded stages of a runner (DESIGN §1: each stage recorded once per shape into a
// RecordedStage and replayed after), for single frames and batches, made by one pair of
// recorders: `record_image` over any number of frames' cameras, `record_bev` over any number of
// samples. What varies is only the key:
//   - single frames: per image lane one image stage (its input shape and tap setting), and bev
//     stages per lane, history variant, tap setting and SCA capacity, whose previous BEV, new
//     BEV and SCA lists are bound per execution (the stream's buffers, the rig's lists);
//   - batches: per batch size one image stage over B frames' cameras and one bev stage over B
//     samples, whose SCA lists and TSA value indices are written per batch and whose previous
//     BEVs are bound, so that one recording serves any mix of rigs and first frames.
// The cache itself takes no lock: the runner's stage locks guard it (docs in stage_runner.cpp).
// A recording it replaces or drops is waited for first (the backend may still hold an issued
// execution of it: backend.h's contract).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/recorded_stage.h"
#include "model/bevformer.h"
#include "model/taps.h"
#include "runtime/rig_cache.h"
#include "runtime/staging.h"

namespace bev {

struct ImageRecording {
  Shape shape;  // the input: [B*N, H, W, 3], u8 pixels or the f32 network input
  DType dtype = DType::kF32;
  bool tapped = false;
  uint64_t generation = 0;  // which recording: bev stages read the outputs of one
  Tensor img;               // the input, written every frame
  StagingBuffers staging;   // ...through these
  ImageOutputs out;         // kept out of the arena
  Taps taps;
  RecordedStage stage;
};

struct BevRecording {
  int64_t batch = 1;
  bool use_prev = false;  // single frames: the history variant (batches mix both)
  bool tapped = false;
  int lane = 0;                   // single frames: whose image outputs it reads...
  uint64_t image_generation = 0;  // ...as that lane's stage was recorded then
  int64_t capacity = 0;           // SCA slots per camera and sample: rigs whose longest list fits replay it
  // Single frames: can_bus, tsa_reference and rotation_index written per frame; prev_bev and the
  // SCA lists bound to the stream's buffer and the rig's lists. Batches: everything written per
  // batch but the previous BEVs, bound to each sample's stream.
  EncoderInputs in;
  StagingBuffers staging;  // what the per-frame inputs are written through
  BevOutputs out;  // single frames: out.bev_embed bound to the frame's new history buffer
  Taps taps;
  RecordedStage stage;
  // Single frames: what the last execution bound (what replays outside a frame read again).
  Tensor last_bev;
  RigLists last_lists;
};

struct BatchRecording {
  int64_t batch = 0;
  Shape img_shape;       // [B*N, H, W, 3]
  DType img_dtype = DType::kF32;
  int64_t capacity = 0;  // SCA slots per camera
  std::unique_ptr<ImageRecording> image;
  std::unique_ptr<BevRecording> bev;
};

// The bindings of a single frame's bev execution: its new BEV, its rig's lists and (with
// history) the previous BEV. On the caller's stack: a frame's execution allocates nothing.
using BevBindings = std::array<StageBinding, 5>;
std::span<const StageBinding> bev_bindings(BevBindings& b, const BevRecording& s, const Tensor& new_bev,
                                          const RigLists& lists, const Tensor& prev_bev);

class StageCache {
 public:
  StageCache(const BevFormer& model, Backend& backend, int lanes);

  // ---- single frames ----
  // Lane `lane`'s image stage for inputs of `img_shape` and `img_dtype`: the recorded one, or recorded now
  // (stale bev stages of the lane dropped when the bev stage next asks).
  // (`waits`, here and below: incremented for each time the host waited for the backend.)
  ImageRecording& image(int lane, const Shape& img_shape, DType img_dtype, bool tapped, int& waits);
  const ImageRecording* image_of_lane(int lane) const { return images_[static_cast<size_t>(lane)].get(); }
  // The bev stage for a frame of `lane` and variant whose rig's longest SCA list is `longest`
  // (pillar anchors `anchors`): the recorded one, or recorded now. The first recording holds
  // exactly the first rig's lists (one vehicle, or a fleet of one calibration, pays no
  // padding); a rig with a longer list re-records it at sca_capacity_for's rule (a larger
  // capacity replaces a smaller one).
  BevRecording& bev(int lane, bool use_prev, bool tapped, int64_t longest, int64_t anchors, int& waits);
  const std::vector<std::unique_ptr<BevRecording>>& bev_stages() const { return bevs_; }
  uint64_t bev_recordings() const { return bev_recordings_; }

  // ---- batches ----
  // The stages of `batch` samples of images `img_shape` and `img_dtype` (all cameras) with room for lists of
  // `longest` slots: the recorded ones (moved to the front), or recorded now; the last
  // kMaxBatchSizes sizes stay (their arenas grow with the batch: tiny's image stage alone is
  // ~280 MiB per sample).
  BatchRecording& batch(int64_t batch, const Shape& img_shape, DType img_dtype, int64_t longest, int64_t anchors,
                        int& waits);
  const BatchRecording* batch_of(int64_t batch) const;
  const std::vector<std::unique_ptr<BatchRecording>>& batches() const { return batches_; }
  static constexpr size_t kMaxBatchSizes = 3;

  // Every recorded stage: the lanes' image stages, the single bev stages, then each batch size's
  // image and bev stage.
  void for_each(const std::function<void(const RecordedStage&)>& f) const;

 private:
  std::unique_ptr<ImageRecording> record_image(const Shape& img_shape, DType img_dtype, bool tapped, std::string name);
  std::unique_ptr<BevRecording> record_bev(const ImageOutputs& image, int64_t batch, bool use_prev, bool tapped,
                                           int64_t capacity, int64_t anchors, std::string name);

  void wait(int& waits) {
    backend_.synchronize();
    ++waits;
  }

  const BevFormer& model_;
  const ModelConfig& cfg_;
  Backend& backend_;
  // One image stage per lane (a frame in flight between its stages). Lane k's stage belongs to
  // the frame holding lane k: its image stage records or executes it, then its bev stage reads
  // the outputs; no other frame touches it meanwhile.
  std::vector<std::unique_ptr<ImageRecording>> images_;
  uint64_t image_recordings_ = 0;
  std::vector<std::unique_ptr<BevRecording>> bevs_;  // most recently recorded last
  uint64_t bev_recordings_ = 0;
  std::vector<std::unique_ptr<BatchRecording>> batches_;  // most recently used first
};

}  // namespace bev
