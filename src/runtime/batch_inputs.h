// A batch's per-sample inputs of the bev stage, on the host (StageRunner::forward_batch): each
// sample's forward_test step and rig, and what the batched bev stage reads of them.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "model/bevformer.h"
#include "runtime/rig_cache.h"

namespace bev {

// A sample of a batch after its host step (forward_test steps 1-3 on a copy of its state).
struct BatchRow {
  size_t index = 0;  // into the caller's samples
  TemporalState next_state;
  BevStepInputs step;
  std::shared_ptr<const Rig> rig;
  double geometry_seconds = 0;
};

// TSA's value rows index the sources [prev_bevs[0..B), the encoder's input query (B), the layer
// input (B+1)]: a sample with history reads its own previous BEV (rotated) and the queries, a
// first frame the layer input twice, as a single frame does alone. The SCA lists are each
// sample's own, padded to `capacity` slots per camera and offset to its rows.
struct BatchHostInputs {
  Tensor can_bus, tsa_reference, value_index, value0_index, query_index, reference, inv_count;
};
BatchHostInputs batch_host_inputs(const ModelConfig& cfg, const std::vector<BatchRow>& rows, int64_t capacity);

// How fast each batch size ran (replayed), per frame: what adaptive batching chooses by. The
// first run of a size (it records the stages) is not counted. Thread-safe.
class BatchTimings {
 public:
  void note(int64_t batch, double seconds);
  // The batch size to run n samples at: n until it has been measured, then the measured size of
  // at most n that took the least time per frame (3% in n's favour), so batching never costs a
  // machine throughput where a smaller batch (or none) is faster.
  int64_t chosen(int64_t n) const;
  void seed(int64_t batch, double seconds_per_frame);

 private:
  struct Timing {
    int runs = 0;
    double per_frame = 0;  // seconds, exponentially averaged
  };
  mutable std::mutex mu_;
  std::map<int64_t, Timing> timings_;
};

}  // namespace bev
