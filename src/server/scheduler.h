// Runs frames on a fixed set of workers: one FIFO per stream (a stream's frames run one at a
// time, in arrival order), streams taken round-robin so a busy stream cannot starve the others,
// and one bound on all waiting frames (submit refuses past it: the caller answers 429).
//
// Each of the model's two stages runs one frame at a time inside the engine (a lock per stage), so
// workers overlap the parts around them (image decode, box output) and, with --pipeline, one
// frame's image stage with another's bev stage; several workers keep the model busy while another
// frame is being prepared.
//
// Batching (max_batch > 1, Triton's dynamic batching with the "oldest" policy): a worker that
// takes a task also takes the next waiting tasks of other streams, oldest stream turn first, up to
// max_batch, waiting for more at most until the first task has waited max_delay since it was
// submitted; two or more go to run_batch together (one per stream, so each stream stays in order).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bev::server {

class Scheduler {
 public:
  // A unit of work; cancel() before it starts and it is skipped (its request timed out).
  class Task {
   public:
    explicit Task(std::function<void()> run, std::shared_ptr<void> payload = nullptr)
        : run_(std::move(run)), payload_(std::move(payload)) {}
    // True when the task had not started (it never will); false when it runs or ran.
    bool cancel();
    // What run_batch needs of the task (the submitter's; the scheduler never looks inside).
    const std::shared_ptr<void>& payload() const { return payload_; }

   private:
    friend class Scheduler;
    std::function<void()> run_;
    std::shared_ptr<void> payload_;
    std::mutex mu_;
    bool started_ = false, cancelled_ = false;
    std::chrono::steady_clock::time_point submitted_;
  };

  struct Batching {
    size_t max_batch = 1;          // tasks of distinct streams run together; 1: one at a time
    double max_delay_seconds = 0;  // how long a task may wait for others to join its batch
    // Runs two or more started tasks together; it reports their results and must not throw.
    std::function<void(const std::vector<std::shared_ptr<Task>>&)> run_batch;
  };

  Scheduler(size_t workers, size_t capacity);  // one task at a time
  Scheduler(size_t workers, size_t capacity, Batching batching);
  ~Scheduler();  // stop()

  // Queues a task behind the stream's earlier ones; false when `capacity` tasks already wait or
  // the scheduler is stopping.
  bool submit(const std::string& stream, std::shared_ptr<Task> task);

  // Runs every queued task, then joins the workers. Later submits are refused.
  void stop();

  size_t queued() const;   // waiting, not running
  size_t running() const;
  size_t workers() const { return threads_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t batches() const { return batches_; }          // run_batch calls so far
  uint64_t batched_tasks() const { return batched_tasks_; }  // tasks they ran

 private:
  struct StreamQueue {
    std::deque<std::shared_ptr<Task>> tasks;
    bool running = false;
  };
  void work();

  // Takes the next ready stream's first task (under mu_), marking the stream running.
  std::pair<std::string, std::shared_ptr<Task>> take_locked();

  const size_t capacity_;
  const Batching batching_;
  std::atomic<uint64_t> batches_{0}, batched_tasks_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, StreamQueue> streams_;
  std::deque<std::string> ready_;  // streams with waiting tasks and none running, in turn order
  size_t queued_ = 0, running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace bev::server
