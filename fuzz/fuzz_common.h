// Shared by the fuzz targets: read every byte of every loaded tensor, so a view that points
// outside its storage is caught by ASan instead of passing unnoticed.
#pragma once

#include <cstdint>

#include "io/checkpoint.h"

namespace bev::fuzz {

inline uint64_t touch_all(const Checkpoint& ck) {
  uint64_t acc = 0;
  for (const auto& [name, t] : ck.tensors()) {
    const Tensor c = t.contiguous();
    const auto* p = static_cast<const uint8_t*>(c.raw_data());
    for (size_t i = 0; i < c.nbytes(); ++i) acc += p[i];
    acc += name.size();
  }
  return acc;
}

}  // namespace bev::fuzz
