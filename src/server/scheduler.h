// Runs frames on a fixed set of workers: one FIFO per stream (a stream's frames run one at a
// time, in arrival order), streams taken round-robin so a busy stream cannot starve the others,
// and one bound on all waiting frames (submit refuses past it: the caller answers 429).
//
// Each of the model's two stages runs one frame at a time inside the engine (a lock per stage), so
// workers overlap the parts around them (image decode, box output) and, with --pipeline, one
// frame's image stage with another's bev stage; several workers keep the model busy while another
// frame is being prepared.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace bev::server {

class Scheduler {
 public:
  // A unit of work; cancel() before it starts and it is skipped (its request timed out).
  class Task {
   public:
    explicit Task(std::function<void()> run) : run_(std::move(run)) {}
    // True when the task had not started (it never will); false when it runs or ran.
    bool cancel();

   private:
    friend class Scheduler;
    std::function<void()> run_;
    std::mutex mu_;
    bool started_ = false, cancelled_ = false;
  };

  Scheduler(size_t workers, size_t capacity);
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

 private:
  struct StreamQueue {
    std::deque<std::shared_ptr<Task>> tasks;
    bool running = false;
  };
  void work();

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, StreamQueue> streams_;
  std::deque<std::string> ready_;  // streams with waiting tasks and none running, in turn order
  size_t queued_ = 0, running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace bev::server
