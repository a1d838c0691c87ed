// Taps: named copies of intermediate tensors, in the golden sets' names and layouts (DESIGN §5:
// every intermediate has a name). The model fills them only when asked (golden comparison,
// --dump, debugging); a null Taps* costs nothing.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace bev {

class Taps {
 public:
  Taps() = default;
  // by_reference: put() keeps the tensor itself, not a copy (a recording's taps, read again
  // after every replay of the plan that keeps those tensors alive).
  explicit Taps(bool by_reference) : by_reference_(by_reference) {}

  // Stores a contiguous copy of `t` (later ops or a replay may overwrite the original).
  void put(const std::string& name, const Tensor& t);
  const Tensor* find(const std::string& name) const;
  const std::vector<std::pair<std::string, Tensor>>& all() const { return tensors_; }
  void clear() { tensors_.clear(); }

 private:
  bool by_reference_ = false;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace bev
