// A recorded stage: the OpNodes of one Ops recording, with every intermediate activation moved
// into one arena laid out by buffer lifetimes (two buffers share bytes only when their lives do
// not overlap). Replaying runs the same nodes on the same memory: no allocation, no primitive
// creation, no shape logic. Tensors outside the arena stay where they are: the weights, the
// stage's inputs (rewritten in place before each replay) and the tensors the caller keeps
// (stage outputs, or anything read after the stage).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/op.h"

namespace bev {

class Plan {
 public:
  Plan() = default;
  // `nodes` were recorded by an Ops in kRecord mode (already run once) or kPlan mode (not run:
  // their outputs are deferred, placed here or given their own memory, and the first replay
  // computes them); `keep` are tensors whose storage must not move (outputs read after replay).
  Plan(std::string name, std::vector<OpNode> nodes, const std::vector<Tensor>& keep);

  void replay(Backend& backend) const;

  // The tensor as the plan now holds it: views of moved buffers point into the arena.
  Tensor resolve(const Tensor& t) const;

  const std::string& name() const { return name_; }
  const std::vector<OpNode>& nodes() const { return nodes_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t no_reuse_bytes() const { return no_reuse_bytes_; }  // sum of the moved buffers' sizes
  size_t buffers() const { return placements_.size(); }
  // One line per node: stage, label, op, input/output shapes and where each output lives.
  std::string describe() const;

 private:
  struct Placement {
    size_t offset = 0;
    size_t bytes = 0;
    size_t first = 0, last = 0;  // node indices of the first write and the last use
  };

  std::string name_;
  std::vector<OpNode> nodes_;
  std::shared_ptr<Storage> arena_;
  size_t arena_bytes_ = 0, no_reuse_bytes_ = 0;
  std::unordered_map<const Storage*, Placement> placements_;      // keyed by the old storage
  std::unordered_map<const Storage*, std::shared_ptr<Storage>> moved_;  // old storage -> arena view
};

}  // namespace bev
