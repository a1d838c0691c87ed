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
  // Stores a contiguous copy of `t` (later ops or a replay may overwrite the original).
  void put(const std::string& name, const Tensor& t);
  const Tensor* find(const std::string& name) const;
  const std::vector<std::pair<std::string, Tensor>>& all() const { return tensors_; }
  void clear() { tensors_.clear(); }

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace bev
