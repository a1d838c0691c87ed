#include "model/taps.h"

namespace bev {

void Taps::put(const std::string& name, const Tensor& t) {
  for (auto& [n, old] : tensors_) {
    if (n == name) {
      old = t;
      return;
    }
  }
  tensors_.emplace_back(name, t);
}

const Tensor* Taps::find(const std::string& name) const {
  for (const auto& [n, v] : tensors_) {
    if (n == name) return &v;
  }
  return nullptr;
}

}  // namespace bev
