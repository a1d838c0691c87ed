// A fixed pool of worker threads, one per engine (sized by Knobs), no hidden global threads.
// parallel_for splits [0, n) into contiguous chunks; the calling thread works too, so a pool of
// size 1 runs everything inline. Exceptions thrown by a chunk are rethrown in the caller.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bev {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 0: one per hardware thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(begin, end) over chunks of at least `grain` items; blocks until all chunks are done.
  // Not reentrant: a chunk must not call parallel_for on the same pool.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  void run_chunks(int participant);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  // Current job.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int pending_workers_ = 0;
  std::exception_ptr error_;
};

}  // namespace bev
