// The runner's image lanes: which are held by a frame between its two stages. A lane's image
// stage (or, eager, nothing) belongs to the frame holding it, so a frame's image outputs stay
// intact until its bev stage has read them. A plain runner has one lane, a pipelined one two.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <vector>

namespace bev {

class LanePool {
 public:
  explicit LanePool(int lanes) : busy_(static_cast<size_t>(lanes), false) {}
  int size() const { return static_cast<int>(busy_.size()); }

  // A free lane, waiting for one.
  int acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    size_t k = 0;
    cv_.wait(lock, [&] {
      for (k = 0; k < busy_.size(); ++k) {
        if (!busy_[k]) return true;
      }
      return false;
    });
    busy_[k] = true;
    return static_cast<int>(k);
  }
  void release(int lane) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      busy_[static_cast<size_t>(lane)] = false;
    }
    cv_.notify_all();
  }

  // Every lane, taken in order (so two callers cannot each hold half), released on destruction.
  class All {
   public:
    explicit All(LanePool& p) : pool_(p) {
      std::unique_lock<std::mutex> lock(p.mu_);
      for (size_t k = 0; k < p.busy_.size(); ++k) {
        p.cv_.wait(lock, [&] { return !p.busy_[k]; });
        p.busy_[k] = true;
      }
    }
    ~All() {
      for (int k = 0; k < pool_.size(); ++k) pool_.release(k);
    }
    All(const All&) = delete;
    All& operator=(const All&) = delete;

   private:
    LanePool& pool_;
  };

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
};

}  // namespace bev
