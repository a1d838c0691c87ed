// The HTTP API without sockets: routes a request, parses and validates it, runs frames through
// the scheduler and the model, and maps every failure to a status with a JSON error body. The
// HTTP layer (http_server.h) only moves bytes; tests and the fuzz target call handle() directly.
//
//   POST   /v1/streams/{id}/frames   a frame (JSON with base64 images, or multipart) -> detections
//   GET    /v1/streams               the streams with history
//   DELETE /v1/streams/{id}          forget a stream's history (404 when unknown)
//   GET    /v1/model                 config, weights, backend, knobs, classes
//   GET    /healthz                  200 while serving, 503 once shutting down
//   GET    /metrics                  Prometheus text
//   /v2/...                          the Open Inference Protocol (oip_service.h)
//   POST /v1/handoff, GET /v1/handoff/owner   the fleet's history handoff (fleet.h)
// (HEAD wherever GET is.) A frame holds its bytes from the in-flight budget (memory()) from the
// moment its body is read until it is answered: refused 503 `busy` when they do not fit.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "bevformer/model.h"
#include "server/api_error.h"
#include "server/frame_request.h"
#include "server/http_types.h"
#include "server/memory_budget.h"
#include "server/fleet.h"
#include "server/metrics.h"
#include "server/oip_service.h"
#include "server/router.h"
#include "server/scheduler.h"
#include "server/sequences.h"
#include "server/stream_work.h"

namespace bev::server {

struct ServiceOptions {
  size_t workers = 2;                    // frames in flight at once (different streams)
  size_t queue_capacity = 32;            // frames waiting for a worker; past it: 429
  double request_timeout_seconds = 30;   // queue wait + run; past it: 504
  size_t max_body_bytes = 64u << 20;     // past it: 413
  size_t max_inflight_bytes = 1u << 30;  // request bytes held at once (memory_budget.h); past it: 503 busy
  // Dynamic batching: up to max_batch frames of distinct streams run as one batch
  // (Model::detect_batch), a frame waiting at most batch_delay_seconds for others to join.
  size_t max_batch = 1;
  double batch_delay_seconds = 0.005;
  RequestLimits limits;
  nlohmann::json model_info = nlohmann::json::object();  // config, weights, backend, knobs (shown by /v1/model)
  OipOptions oip;
  FleetOptions fleet;
};

class Service final : public StreamWork {
 public:
  Service(Model& model, ServiceOptions options);
  ~Service();  // finish()

  // Never throws; every failure is a 4xx/5xx response with {"error": {"kind", "message"}}.
  HttpResponse handle(HttpRequest request);

  // New frames get 503 from now on (health too); frames already accepted still run.
  void begin_shutdown();
  // Leaving a fleet: not ready any more (/v2/health/ready 400, so the balancer stops sending),
  // but frames are still served until their streams are handed over (Fleet::drain).
  void begin_drain();
  bool ready() const override { return !shutting_down_ && !draining_; }
  bool shutting_down() const override { return shutting_down_; }
  // Runs every accepted frame to its end and stops the workers.
  void finish();

  // An answer the HTTP layer gave without calling handle() (431, 413, 408, ...): counted the same.
  void count_refusal(const std::string& route, const HttpResponse& r);

  Metrics& metrics() override { return metrics_; }
  MemoryBudget& memory() { return memory_; }
  const ServiceOptions& options() const { return options_; }
  const RequestLimits& limits() const override { return options_.limits; }
  Model& model() { return model_; }
  Oip& oip() { return *oip_; }
  Fleet& fleet() { return *fleet_; }

  // before(), the model, then done() or failed(): one BatchFrame (stream_work.h) run by itself;
  // run_batch runs several the same way.
  void run_alone(BatchFrame& f);

  // StreamWork: the FIFOs the /v2 and handoff front ends run on.
  void run_on_stream(const std::string& stream, std::function<void()> job, bool* never_ran = nullptr) override;
  void run_frame_on_stream(const std::string& stream, std::shared_ptr<BatchFrame> frame,
                           bool* never_ran = nullptr) override;

 private:
  HttpResponse dispatch(const Route& route, HttpRequest& request);
  HttpResponse post_frame(const std::string& stream, HttpRequest& request);
  struct V1Frame;  // a /v1 frame in the queue (service.cpp)
  struct Done;             // a job's waiter and its worker (service_jobs.cpp)
  struct SignallingFrame;  // a frame that tells its waiter when it is answered (service_jobs.cpp)
  void submit_and_wait(const std::string& stream, const std::shared_ptr<Scheduler::Task>& task, Done& done, bool* never_ran);
  // The frames of a batch (each task's payload a BatchFrame), each answered as run_alone would.
  void run_batch(const std::vector<std::shared_ptr<Scheduler::Task>>& tasks);
  // 409 when a frame is not after its stream's last one (frames of one stream run one at a time,
  // so this cannot race with another frame of the same stream).
  std::optional<HttpResponse> out_of_order(const Frame& frame) const;
  void observe_parts(const Detections& d);
  HttpResponse get_streams() const;
  HttpResponse delete_stream(const std::string& stream);
  HttpResponse get_model() const;
  HttpResponse get_metrics();

  Model& model_;
  const ServiceOptions options_;
  Metrics metrics_;
  MemoryBudget memory_;
  Scheduler scheduler_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> timeouts_{0};
  std::unique_ptr<Oip> oip_;      // after the scheduler: its sweeper uses it
  std::unique_ptr<Fleet> fleet_;
};

}  // namespace bev::server
