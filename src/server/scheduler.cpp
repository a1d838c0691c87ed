#include "server/scheduler.h"

#include <algorithm>

namespace bev::server {

bool Scheduler::Task::cancel() {
  std::lock_guard lock(mu_);
  if (started_) return false;
  cancelled_ = true;
  return true;
}

Scheduler::Scheduler(size_t workers, size_t capacity) : Scheduler(workers, capacity, Batching{}) {}

Scheduler::Scheduler(size_t workers, size_t capacity, Batching batching)
    : capacity_(capacity), batching_(std::move(batching)) {
  for (size_t i = 0; i < std::max<size_t>(workers, 1); ++i) threads_.emplace_back([this] { work(); });
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::submit(const std::string& stream, std::shared_ptr<Task> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued_ >= capacity_) return false;
    task->submitted_ = std::chrono::steady_clock::now();
    StreamQueue& q = streams_[stream];
    q.tasks.push_back(std::move(task));
    ++queued_;
    if (!q.running && q.tasks.size() == 1) ready_.push_back(stream);
  }
  // A worker forming a batch waits on the same condition: wake it too.
  if (batching_.max_batch > 1) {
    cv_.notify_all();
  } else {
    cv_.notify_one();
  }
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

std::pair<std::string, std::shared_ptr<Scheduler::Task>> Scheduler::take_locked() {
  std::string stream = std::move(ready_.front());
  ready_.pop_front();
  StreamQueue& q = streams_[stream];
  std::shared_ptr<Task> task = std::move(q.tasks.front());
  q.tasks.pop_front();
  q.running = true;
  --queued_;
  ++running_;
  return {std::move(stream), std::move(task)};
}

void Scheduler::work() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !ready_.empty() || (stopping_ && queued_ == 0); });
    if (ready_.empty()) return;  // stopping, and nothing left to run
    std::vector<std::pair<std::string, std::shared_ptr<Task>>> taken;
    taken.push_back(take_locked());
    if (batching_.max_batch > 1) {
      // Others join until the batch is full or the first task has waited its delay (at once
      // when stopping: the queue only drains then).
      const auto deadline = taken.front().second->submitted_ +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(batching_.max_delay_seconds));
      while (taken.size() < batching_.max_batch) {
        if (!ready_.empty()) {
          taken.push_back(take_locked());
          continue;
        }
        if (stopping_ || std::chrono::steady_clock::now() >= deadline) break;
        cv_.wait_until(lock, deadline, [&] { return !ready_.empty() || stopping_; });
      }
    }
    lock.unlock();
    std::vector<std::shared_ptr<Task>> run;
    for (auto& [stream, task] : taken) {
      std::lock_guard task_lock(task->mu_);
      if (!task->cancelled_) {
        task->started_ = true;
        run.push_back(task);
      }
    }
    // The tasks report their own errors; they must not throw.
    if (run.size() == 1) {
      run.front()->run_();
    } else if (run.size() > 1) {
      ++batches_;
      batched_tasks_ += run.size();
      batching_.run_batch(run);
    }
    run.clear();
    lock.lock();
    for (auto& [stream, task] : taken) {
      task.reset();
      --running_;
      StreamQueue& after = streams_[stream];
      after.running = false;
      if (!after.tasks.empty()) {
        ready_.push_back(stream);
      } else {
        streams_.erase(stream);
      }
    }
    cv_.notify_all();  // a waiting worker may take these streams' next tasks, or stop
  }
}

}  // namespace bev::server
