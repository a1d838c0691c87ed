// One bound on the request bytes the server holds at once (--max-inflight-mb): bodies being read,
// frames being parsed, waiting and running (their compressed images and the pixels they decode
// to). A request that would take the total past the bound is refused (503 `busy`, Retry-After)
// instead of letting concurrent uploads add up to whatever the machine has.
#pragma once

#include <atomic>
#include <cstddef>

namespace bev::server {

class MemoryBudget {
 public:
  explicit MemoryBudget(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }
  size_t in_use() const { return in_use_.load(); }

 private:
  friend class MemoryLease;
  bool take(size_t n);
  void give_back(size_t n) { in_use_.fetch_sub(n); }

  const size_t capacity_;
  std::atomic<size_t> in_use_{0};
};

// Bytes held from a budget until the lease is resized or destroyed. Move-only; an empty lease
// (no budget) holds nothing and every resize succeeds, for callers that bound nothing (tests).
class MemoryLease {
 public:
  MemoryLease() = default;
  explicit MemoryLease(MemoryBudget* budget) : budget_(budget) {}
  MemoryLease(MemoryLease&& o) noexcept : budget_(o.budget_), held_(o.held_) { o.held_ = 0; }
  MemoryLease& operator=(MemoryLease&& o) noexcept;
  MemoryLease(const MemoryLease&) = delete;
  MemoryLease& operator=(const MemoryLease&) = delete;
  ~MemoryLease() { resize(0); }

  // Holds exactly `bytes` from now on; false (and nothing changes) when growing would pass the
  // budget's capacity.
  bool resize(size_t bytes);
  size_t held() const { return held_; }

 private:
  MemoryBudget* budget_ = nullptr;
  size_t held_ = 0;
};

}  // namespace bev::server
