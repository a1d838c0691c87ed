// The host buffers a recorded stage's per-frame inputs cross in (Backend::write_staged): one per
// input tensor written every frame — per byte offset, so the slices a batch writes sample by
// sample each have their own — made on first use and reused at every execution. Reuse is safe
// because the runner waits once per frame or batch: a buffer is not rewritten before the write
// that read it has run. Owned by the recording whose inputs they feed.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace bev {

class StagingBuffers {
 public:
  void write(Backend& backend, const Tensor& dst, const Tensor& host_src) {
    backend.write_staged(dst, host_src, buffer_for(dst));
  }

 private:
  Tensor& buffer_for(const Tensor& dst) {
    const std::pair<const Storage*, int64_t> key{dst.storage().get(), dst.offset()};
    for (auto& [k, t] : buffers_) {
      if (k == key) return t;
    }
    return buffers_.emplace_back(key, Tensor()).second;
  }
  std::vector<std::pair<std::pair<const Storage*, int64_t>, Tensor>> buffers_;
};

}  // namespace bev
