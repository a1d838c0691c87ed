// Service::run_on_stream: a job on a stream's worker FIFO, waited for within --timeout — what the
// Open Inference Protocol's frames (oip_service.cpp) and the drain's history exports (fleet.cpp)
// run through, beside the /v1 frames of service.cpp (kept apart so each evolves on its own).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>

#include "server/api_error.h"
#include "server/service.h"

namespace bev::server {
namespace {

// What a request's handler thread and the worker running its job share.
struct Done {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

}  // namespace

void Service::run_on_stream(const std::string& stream, std::function<void()> job, bool* never_ran) {
  if (never_ran) *never_ran = false;
  auto done = std::make_shared<Done>();
  auto task = std::make_shared<Scheduler::Task>([done, job = std::move(job)]() mutable {
    job();
    job = nullptr;  // what it holds goes before the answer
    std::lock_guard lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  if (!scheduler_.submit(stream, task)) {
    if (never_ran) *never_ran = true;
    if (shutting_down_) throw ApiError(503, "shutting_down", "the server is shutting down and takes no new frames");
    throw ApiError(429, "queue_full",
                   "all " + std::to_string(options_.queue_capacity) + " queue slots are taken; retry after the Retry-After seconds", 1);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(options_.request_timeout_seconds));
  std::unique_lock lock(done->mu);
  if (done->cv.wait_until(lock, deadline, [&] { return done->done; })) return;
  lock.unlock();
  ++timeouts_;
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", options_.request_timeout_seconds);
  if (task->cancel()) {
    if (never_ran) *never_ran = true;
    throw ApiError(504, "timeout", std::string("the frame waited ") + limit +
                                       " s for a worker and was dropped; the stream's history is unchanged");
  }
  throw ApiError(504, "timeout", std::string("the frame did not finish within ") + limit +
                                     " s; it still completes and updates the stream's history");
}

}  // namespace bev::server
