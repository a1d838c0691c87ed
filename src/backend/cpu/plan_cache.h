// Plans kept per shape for the life of the process, made on first use: the attention ops' (one
// per sample shape; each plan serializes its own runs with its own mutex).
#pragma once

#include <map>
#include <memory>
#include <mutex>

namespace bev::cpu {

template <class Key, class Plan>
class PlanCache {
 public:
  // The plan for `key`, made by make() (returning std::unique_ptr<Plan>) the first time. Its
  // address holds as long as the process.
  template <class Make>
  Plan& get(const Key& key, Make&& make) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = plans_[key];
    if (!slot) slot = make();
    return *slot;
  }

 private:
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace bev::cpu
