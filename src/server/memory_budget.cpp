#include "server/memory_budget.h"

#include <utility>

namespace bev::server {

bool MemoryBudget::take(size_t n) {
  size_t used = in_use_.load();
  do {
    if (n > capacity_ || used > capacity_ - n) return false;
  } while (!in_use_.compare_exchange_weak(used, used + n));
  return true;
}

MemoryLease& MemoryLease::operator=(MemoryLease&& o) noexcept {
  if (this != &o) {
    resize(0);
    budget_ = o.budget_;
    held_ = std::exchange(o.held_, 0);
  }
  return *this;
}

bool MemoryLease::resize(size_t bytes) {
  if (!budget_) {
    held_ = bytes;
    return true;
  }
  if (bytes > held_) {
    if (!budget_->take(bytes - held_)) return false;
  } else {
    budget_->give_back(held_ - bytes);
  }
  held_ = bytes;
  return true;
}

}  // namespace bev::server
