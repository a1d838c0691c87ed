// A recorded stage: the OpNodes of one Ops recording (kPlan mode), with every intermediate
// activation moved into one arena of backend memory laid out by buffer lifetimes (two buffers
// share bytes only when their lives do not overlap). Backend::execute runs it: the same nodes on
// the same memory every time, no allocation, no primitive creation, no shape logic (a CUDA
// backend may capture it as one graph). Tensors outside the arena stay where they are: the
// weights, the stage's inputs (rewritten through Backend::write before each execution) and the
// tensors the caller keeps (stage outputs, or anything read after the stage).
//
// Bindable tensors are inputs or kept outputs that an execution may point at other memory of
// the same backend (StageBinding): a stream's previous BEV is read, and its new BEV written, in
// the stream's own buffer instead of being copied into and out of the stage every frame.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/op.h"

namespace bev {

class Backend;
struct StageBinding;

class RecordedStage {
 public:
  RecordedStage() = default;
  // `nodes` were recorded by an Ops in kPlan mode (not run: their outputs are deferred, placed
  // here in the arena or, when kept, in memory of their own, all from `backend`); `keep` are
  // tensors whose storage must not move (outputs read after an execution); `bindable` are kept
  // tensors or inputs an execution may bind elsewhere.
  RecordedStage(std::string name, std::vector<OpNode> nodes, const std::vector<Tensor>& keep, Backend& backend,
                const std::vector<Tensor>& bindable = {});

  // The tensor as the stage now holds it: views of moved buffers point into the arena.
  Tensor resolve(const Tensor& t) const;
  bool is_bindable(const Tensor& t) const;
  // Whether a node reads (takes as an input) / writes (produces as an output) `t`'s storage.
  bool reads(const Tensor& t) const;
  bool writes(const Tensor& t) const;
  // Throws Error(kInternal) unless `b` binds one of this stage's bindable tensors to a
  // contiguous tensor of the same shape, dtype and device (Backend::execute's precondition).
  void check_binding(const StageBinding& b) const;
  // Unique per recording (a moved stage keeps it): what a backend keys its captures by.
  uint64_t id() const { return id_; }
  // Whether every node that reads `input` runs before the first node that writes `output`: then
  // both may be bound to the same memory (the history buffer read as the previous BEV and written
  // as the new one).
  bool reads_before_writes(const Tensor& input, const Tensor& output) const;

  const std::string& name() const { return name_; }
  const std::vector<OpNode>& nodes() const { return nodes_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t no_reuse_bytes() const { return no_reuse_bytes_; }  // sum of the moved buffers' sizes
  size_t buffers() const { return placements_.size(); }
  // One line per node: stage, label, op, input/output shapes and where each output lives.
  std::string describe() const;

  // One buffer of the arena, as the profiler's graph report draws it: where it lies, how large
  // it is (aligned), and its life in node indices (first write, last read or write).
  struct ArenaBuffer {
    size_t offset = 0, bytes = 0;
    size_t first = 0, last = 0;
    const Storage* storage = nullptr;  // what the nodes' tensors in this buffer point at
  };
  // Every arena buffer, by first write (then offset).
  std::vector<ArenaBuffer> arena_buffers() const;

 private:
  struct Placement {
    size_t offset = 0;
    size_t bytes = 0;
    size_t first = 0, last = 0;  // node indices of the first write and the last use
  };

  std::string name_;
  uint64_t id_ = 0;
  std::vector<OpNode> nodes_;
  std::shared_ptr<Storage> arena_;
  size_t arena_bytes_ = 0, no_reuse_bytes_ = 0;
  std::unordered_map<const Storage*, Placement> placements_;      // keyed by the old storage
  std::unordered_map<const Storage*, std::shared_ptr<Storage>> moved_;  // old storage -> arena view
  std::vector<const Storage*> bindable_;
};

}  // namespace bev
