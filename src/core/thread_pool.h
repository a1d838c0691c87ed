// A fixed pool of worker threads, one per engine (sized by Knobs), no hidden global threads.
// parallel_for splits [0, n) into contiguous chunks; the calling thread works too, so a pool of
// size 1 runs everything inline. Exceptions thrown by a chunk are rethrown in the caller.
//
// Threads::kOpenMP runs the chunks on the calling thread's OpenMP team instead of threads of its
// own: the CPU backend's kernels then share one set of threads with oneDNN, whose OpenMP workers
// spin for a while after each primitive. With a separate pool those spinning workers took the
// cores our workers needed (measured on 2 cores: the stem's max pool 12.9 ms after a oneDNN conv
// against 6.2 ms alone).
// Handing out work allocates nothing (the chunk function is taken by reference, FunctionRef), so
// kernels of a replayed plan can use the pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace bev {

class ThreadPool {
 public:
  enum class Threads { kOwn, kOpenMP };
  explicit ThreadPool(int threads, Threads kind = Threads::kOwn);  // threads <= 0: one per hardware thread
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // fn(begin, end) over chunks of at least `grain` items; blocks until all chunks are done.
  // Concurrent callers take turns (one job at a time). Not reentrant: a chunk must not call
  // parallel_for on the same pool.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);
  // The same, with the participant that runs the chunk: 0 for the calling thread, 1..size()-1
  // for the workers. No two chunks run at once with the same participant, so it can index
  // per-thread scratch that the caller sized once (size() slots) instead of allocating per chunk.
  void parallel_for_indexed(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t, int)> fn);

 private:
  void worker_loop(int index);
  void run_chunks(int participant);
  void run_openmp(int64_t n, int64_t chunk, const FunctionRef<void(int64_t, int64_t, int)>& fn);

  int size_ = 1;
  bool openmp_ = false;
  std::vector<std::thread> workers_;
  std::mutex caller_mu_;  // held by the one caller whose job the pool runs
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  // Current job.
  const FunctionRef<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int pending_workers_ = 0;
  std::exception_ptr error_;
};

}  // namespace bev
