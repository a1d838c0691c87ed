#include "server/scheduler.h"

#include <algorithm>

namespace bev::server {

bool Scheduler::Task::cancel() {
  std::lock_guard lock(mu_);
  if (started_) return false;
  cancelled_ = true;
  return true;
}

Scheduler::Scheduler(size_t workers, size_t capacity) : capacity_(capacity) {
  for (size_t i = 0; i < std::max<size_t>(workers, 1); ++i) threads_.emplace_back([this] { work(); });
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::submit(const std::string& stream, std::shared_ptr<Task> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued_ >= capacity_) return false;
    StreamQueue& q = streams_[stream];
    q.tasks.push_back(std::move(task));
    ++queued_;
    if (!q.running && q.tasks.size() == 1) ready_.push_back(stream);
  }
  cv_.notify_one();
  return true;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

size_t Scheduler::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

size_t Scheduler::running() const {
  std::lock_guard lock(mu_);
  return running_;
}

void Scheduler::work() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !ready_.empty() || (stopping_ && queued_ == 0); });
    if (ready_.empty()) return;  // stopping, and nothing left to run
    const std::string stream = std::move(ready_.front());
    ready_.pop_front();
    StreamQueue& q = streams_[stream];
    std::shared_ptr<Task> task = std::move(q.tasks.front());
    q.tasks.pop_front();
    q.running = true;
    --queued_;
    ++running_;
    lock.unlock();
    bool run = false;
    {
      std::lock_guard task_lock(task->mu_);
      if (!task->cancelled_) run = task->started_ = true;
    }
    if (run) task->run_();  // the task reports its own errors; it must not throw
    task.reset();
    lock.lock();
    --running_;
    StreamQueue& after = streams_[stream];
    after.running = false;
    if (!after.tasks.empty()) {
      ready_.push_back(stream);
    } else {
      streams_.erase(stream);
    }
    cv_.notify_all();  // a waiting worker may take this stream's next task, or stop
  }
}

}  // namespace bev::server
