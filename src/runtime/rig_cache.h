// The rigs a runner has seen, for single frames and batches alike: each rig's geometry (host:
// lidar2img and the padded image size decide it, forward_test's point sampling and SCA query
// lists) and, for the single-frame bev stages that bind them, its SCA lists uploaded to the
// backend, padded to the capacities those stages asked for. The bev stages never depend on a
// rig (its lists are inputs), so a vehicle whose rig left the cache costs its geometry again
// (milliseconds), never a recording.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "model/bevformer.h"

namespace bev {

// A rig's geometry, as computed once (shared by the frames and batches that run on it).
struct Rig {
  size_t id = 0;  // 1 for the first rig the cache computed, 2 for the next new one...
  RigGeometry geometry;
};

// A rig's SCA lists in backend memory, padded to `capacity` slots per camera (the rest -1 and
// zeros: the padding gathers zeros and scatters nowhere).
struct RigLists {
  int64_t capacity = 0;
  Tensor query_index, reference, inv_count;
};

// The SCA slot capacity per camera that lists of at most `longest` slots are recorded with once
// one rig has outgrown a stage: `longest` rounded up to a multiple of ceil(HW / 8), at most HW
// (a camera sees at most every cell), so that rigs alike fit from then on.
int64_t sca_capacity_for(int64_t bev_cells, int64_t longest);

class RigCache {
 public:
  RigCache(const BevFormer& model, Backend& backend) : model_(model), backend_(backend) {}

  // The frame's rig, computed when it is new (the least recently used beyond kMaxRigs dropped).
  // Thread-safe.
  std::shared_ptr<const Rig> rig(const FrameInput& f);
  // `rig`'s lists at `capacity` (at least its longest list), uploaded once per rig and capacity
  // while the rig is among the kMaxUploadedRigs most recently used. Thread-safe.
  RigLists lists(const Rig& rig, int64_t capacity);
  // How many rigs needed their geometry computed.
  size_t computed() const;

  static constexpr size_t kMaxRigs = 64;          // geometries kept (host: ~MiB each for base)
  static constexpr size_t kMaxUploadedRigs = 16;  // of them, those whose uploaded lists stay
  static constexpr size_t kMaxCapacities = 4;     // per rig: a tapped stage, a second lane or the other
                                                  // history variant may hold another

 private:
  struct Entry {
    std::shared_ptr<const Rig> rig;
    Tensor inv_count;              // uploaded with the first list
    std::vector<RigLists> padded;  // oldest first
  };
  RigLists upload(const Rig& rig, int64_t capacity, const Tensor& inv_count) const;

  const BevFormer& model_;
  Backend& backend_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // most recently used first
  size_t computed_ = 0;
};

}  // namespace bev
