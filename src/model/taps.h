// Taps: named intermediate tensors, in the golden sets' names and layouts (DESIGN §5: every
// intermediate has a name). The model fills them only when asked (golden comparison, --dump,
// debugging); a null Taps* costs nothing.
//
// A stage puts the tensors themselves (backend memory, or host tensors for the host-side
// geometry), not copies: the runtime reads them back to the host once the stage has run
// (StageRunner), when every tapped value is final.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace bev {

class Taps {
 public:
  // Keeps `t` under `name` (replacing an earlier tensor of that name).
  void put(const std::string& name, const Tensor& t);
  const Tensor* find(const std::string& name) const;
  const std::vector<std::pair<std::string, Tensor>>& all() const { return tensors_; }
  void clear() { tensors_.clear(); }

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace bev
