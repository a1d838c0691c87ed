#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bev {

ThreadPool::ThreadPool(int threads, Threads kind) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_ = threads;
#ifdef _OPENMP
  openmp_ = kind == Threads::kOpenMP;
#else
  (void)kind;  // built without OpenMP: threads of its own
#endif
  if (openmp_) return;
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks(int participant) {
  while (true) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) return;
      c = next_chunk_++;
    }
    const int64_t b = c * chunk_;
    const int64_t e = std::min(n_, b + chunk_);
    try {
      (*fn_)(b, e, participant);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      next_chunk_ = num_chunks_;  // stop handing out work
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks(index + 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_workers_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  parallel_for_indexed(n, grain, [fn](int64_t b, int64_t e, int) { fn(b, e); });
}

void ThreadPool::parallel_for_indexed(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t, int)> fn) {
  if (n <= 0) return;
  // One job at a time: a second caller waits its turn instead of overwriting the job (and
  // participant 0's scratch) of the first.
  const std::lock_guard<std::mutex> caller(caller_mu_);
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  if (size_ == 1 || chunks == 1) {
    fn(0, n, 0);
    return;
  }
  if (openmp_) {
    run_openmp(n, (n + chunks - 1) / chunks, fn);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + chunks - 1) / chunks;
    num_chunks_ = (n + chunk_ - 1) / chunk_;
    next_chunk_ = 0;
    error_ = nullptr;
    pending_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  run_chunks(0);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_workers_ == 0; });
    fn_ = nullptr;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

// Chunks handed out by an atomic counter to the team's threads; the participant is the OpenMP
// thread number (a team may be smaller than asked, never larger). Nothing is allocated once the
// calling thread's team exists (libgomp keeps it between regions).
void ThreadPool::run_openmp(int64_t n, int64_t chunk, const FunctionRef<void(int64_t, int64_t, int)>& fn) {
#ifdef _OPENMP
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
#pragma omp parallel num_threads(size_)
  {
    const int participant = omp_get_thread_num();
    for (int64_t c; !failed.load(std::memory_order_relaxed) && (c = next.fetch_add(1)) < num_chunks;) {
      try {
        fn(c * chunk, std::min(n, c * chunk + chunk), participant);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  }
  if (error) std::rethrow_exception(error);
#else
  (void)n;
  (void)chunk;
  (void)fn;
#endif
}

}  // namespace bev
