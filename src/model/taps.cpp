#include "model/taps.h"

namespace bev {

void Taps::put(const std::string& name, const Tensor& t) {
  const Tensor v = by_reference_ ? t : t.clone();
  for (auto& [n, old] : tensors_) {
    if (n == name) {
      old = v;
      return;
    }
  }
  tensors_.emplace_back(name, v);
}

const Tensor* Taps::find(const std::string& name) const {
  for (const auto& [n, v] : tensors_) {
    if (n == name) return &v;
  }
  return nullptr;
}

}  // namespace bev
