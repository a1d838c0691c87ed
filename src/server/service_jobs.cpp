// Service::run_on_stream and run_frame_on_stream: a job or a frame on a stream's worker FIFO,
// waited for within --timeout — what the Open Inference Protocol's frames (oip_service.cpp; they
// batch with other streams' frames like /v1's) and the drain's history exports (fleet.cpp) run
// through, beside the /v1 frames of service.cpp (kept apart so each evolves on its own).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>

#include "bevformer/model.h"
#include "server/api_error.h"
#include "server/service.h"

namespace bev::server {

// What a request's handler thread and the worker running its job share.
struct Service::Done {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

// A frame that tells its waiter when it has its answer however it ran: alone (run_alone) or in a
// batch (run_batch calls its done or failed).
struct Service::SignallingFrame final : BatchFrame {
  std::shared_ptr<BatchFrame> inner;
  std::shared_ptr<Service::Done> signal;
  const Frame& frame() const override { return inner->frame(); }
  bool before() override {
    if (inner->before()) return true;
    finish();
    return false;
  }
  void done(Detections d) override {
    if (!inner) return;  // answered already
    inner->done(std::move(d));
    finish();
  }
  void failed(ApiError e) override {
    if (!inner) return;
    inner->failed(std::move(e));
    finish();
  }
  void finish() {
    inner.reset();  // what it holds goes before the answer
    std::lock_guard lock(signal->mu);
    signal->done = true;
    signal->cv.notify_all();
  }
};

void Service::run_on_stream(const std::string& stream, std::function<void()> job, bool* never_ran) {
  auto done = std::make_shared<Done>();
  auto task = std::make_shared<Scheduler::Task>([done, job = std::move(job)]() mutable {
    job();
    job = nullptr;  // what it holds goes before the answer
    std::lock_guard lock(done->mu);
    done->done = true;
    done->cv.notify_all();
  });
  submit_and_wait(stream, task, *done, never_ran);
}

void Service::run_frame_on_stream(const std::string& stream, std::shared_ptr<BatchFrame> frame, bool* never_ran) {
  auto done = std::make_shared<Done>();
  auto signalling = std::make_shared<SignallingFrame>();
  signalling->inner = std::move(frame);
  signalling->signal = done;
  std::shared_ptr<BatchFrame> payload = signalling;  // run_batch reads the payload as a BatchFrame
  auto task = std::make_shared<Scheduler::Task>([this, signalling]() { run_alone(*signalling); }, payload);
  submit_and_wait(stream, task, *done, never_ran);
}

void Service::submit_and_wait(const std::string& stream, const std::shared_ptr<Scheduler::Task>& task, Done& done,
                              bool* never_ran) {
  if (never_ran) *never_ran = false;
  if (!scheduler_.submit(stream, task)) {
    if (never_ran) *never_ran = true;
    if (shutting_down_) throw ApiError(503, "shutting_down", "the server is shutting down and takes no new frames");
    throw ApiError(429, "queue_full",
                   "all " + std::to_string(options_.queue_capacity) + " queue slots are taken; retry after the Retry-After seconds", 1);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(options_.request_timeout_seconds));
  std::unique_lock lock(done.mu);
  if (done.cv.wait_until(lock, deadline, [&] { return done.done; })) return;
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
