#include "runtime/rig_cache.h"

#include <algorithm>

#include "bevformer/error.h"

namespace bev {

int64_t sca_capacity_for(int64_t bev_cells, int64_t longest) {
  const int64_t step = (bev_cells + 7) / 8;
  return std::min(bev_cells, (longest + step - 1) / step * step);
}

std::shared_ptr<const Rig> RigCache::rig(const FrameInput& f) {
  const auto [h, w] = model_.network_image_size(f.img);
  const int pad_h = static_cast<int>(h), pad_w = static_cast<int>(w);
  // The frame's rig moved to the front, if cached (under mu_).
  const auto cached = [&]() -> std::shared_ptr<const Rig> {
    const auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
      const RigGeometry& g = e.rig->geometry;
      return g.lidar2img == f.lidar2img && g.pad_w == pad_w && g.pad_h == pad_h;
    });
    if (it == entries_.end()) return nullptr;
    std::rotate(entries_.begin(), it, it + 1);
    return entries_.front().rig;
  };
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (auto r = cached()) return r;
  }
  // Computed outside the lock (milliseconds; another thread may run its own frame meanwhile). Two
  // threads that bring the same new rig at once each compute it; the first one in is kept.
  auto computed = std::make_shared<Rig>();
  computed->geometry = model_.rig_geometry(f);
  const std::lock_guard<std::mutex> lock(mu_);
  if (auto r = cached()) return r;
  computed->id = ++computed_;
  if (entries_.size() == kMaxRigs) entries_.pop_back();
  entries_.insert(entries_.begin(), Entry{std::move(computed), {}, {}});
  // The rig that just left the uploaded few lets its backend memory go.
  if (entries_.size() > kMaxUploadedRigs) {
    Entry& out = entries_[kMaxUploadedRigs];
    out.inv_count = Tensor();
    out.padded.clear();
  }
  return entries_.front().rig;
}

RigLists RigCache::upload(const Rig& rig, int64_t capacity, const Tensor& inv_count) const {
  const ScaQueryLists& q = rig.geometry.queries;
  if (capacity < q.max_len) {
    throw Error(ErrorKind::kInternal, "SCA lists of " + std::to_string(q.max_len) + " slots padded to a capacity of " +
                                          std::to_string(capacity));
  }
  const int64_t cams = q.query_index.size(0) / q.max_len, anchors = q.reference.size(2);
  const int64_t ref_floats = anchors * 2;
  Tensor qi = Tensor::empty({cams * capacity}, DType::kI64);
  Tensor ref = Tensor::zeros({cams * capacity, 1, anchors, 2}, DType::kF32);
  for (int64_t n = 0; n < cams; ++n) {
    int64_t* dst = qi.data<int64_t>() + n * capacity;
    const int64_t* src = q.query_index.data<int64_t>() + n * q.max_len;
    for (int64_t k = 0; k < capacity; ++k) dst[k] = k < q.max_len ? src[k] : -1;
    std::copy_n(q.reference.data<float>() + n * q.max_len * ref_floats, q.max_len * ref_floats,
                ref.data<float>() + n * capacity * ref_floats);
  }
  return {capacity, backend_.upload(qi), backend_.upload(ref),
          inv_count.defined() ? inv_count : backend_.upload(q.inv_count)};
}

RigLists RigCache::lists(const Rig& rig, int64_t capacity) {
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = std::find_if(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(
                                                                         std::min(entries_.size(), kMaxUploadedRigs)),
                               [&](const Entry& e) { return e.rig.get() == &rig; });
  // A rig that has left the uploaded few since its frame began (other streams' rigs came in
  // meanwhile): its lists for this frame alone.
  if (it == entries_.begin() + static_cast<std::ptrdiff_t>(std::min(entries_.size(), kMaxUploadedRigs))) {
    return upload(rig, capacity, Tensor());
  }
  Entry& e = *it;
  for (const RigLists& p : e.padded) {
    if (p.capacity == capacity) return p;
  }
  RigLists made = upload(rig, capacity, e.inv_count);
  e.inv_count = made.inv_count;
  if (e.padded.size() == kMaxCapacities) e.padded.erase(e.padded.begin());
  e.padded.push_back(made);
  return made;
}

size_t RigCache::computed() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return computed_;
}

}  // namespace bev
