#include "server/service.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include "bevformer/error.h"
#include "server/api_error.h"
#include "server/oip.h"
#include "core/number_text.h"

namespace bev::server {
namespace {

using json = nlohmann::json;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

HttpResponse json_response(const json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
  return r;
}

// %.6f of any double, uncut (a fixed buffer would cut a large one mid-number).

HttpResponse busy(const std::string& message) {
  HttpResponse r = error_response(503, "busy", message + "; retry after the Retry-After seconds");
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string mib(size_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

// What a frame's handler thread and the worker running it share.
struct FrameJob {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  HttpResponse response;
};

}  // namespace

// A queued /v1 frame: the request, the memory it holds, and where its answer goes.
struct Service::V1Frame final : BatchFrame {
  Service* service = nullptr;
  std::shared_ptr<FrameRequest> request;
  std::shared_ptr<MemoryLease> held;
  std::shared_ptr<FrameJob> job;
  double queued_at = 0;

  const Frame& frame() const override { return request->frame; }
  bool before() override {
    service->metrics_.observe("queue", now_seconds() - queued_at);
    if (auto refused = service->out_of_order(request->frame)) {
      answer(std::move(*refused));
      return false;
    }
    return true;
  }
  void done(Detections d) override {
    service->observe_parts(d);
    HttpResponse r;
    r.body = d.json + "\n";
    answer(std::move(r));
  }
  void failed(ApiError e) override { answer(error_response(e)); }
  void answer(HttpResponse r) {
    // Freed before the answer goes out, so the budget is free again when the client sees it.
    request.reset();
    held.reset();
    std::lock_guard lock(job->mu);
    job->response = std::move(r);
    job->done = true;
    job->cv.notify_all();
  }
};

Service::Service(Model& model, ServiceOptions options)
    : model_(model),
      options_(std::move(options)),
      memory_(options_.max_inflight_bytes),
      scheduler_(options_.workers, options_.queue_capacity,
                 Scheduler::Batching{std::max<size_t>(options_.max_batch, 1), options_.batch_delay_seconds,
                                     [this](const std::vector<std::shared_ptr<Scheduler::Task>>& tasks) { run_batch(tasks); }}),
      oip_(std::make_unique<Oip>(model_, *this, options_.oip)),
      fleet_(std::make_unique<Fleet>(model_, *this, oip_->sequences(), options_.fleet)) {}

Service::~Service() { finish(); }

void Service::begin_shutdown() { shutting_down_ = true; }

void Service::begin_drain() { draining_ = true; }

void Service::finish() {
  shutting_down_ = true;
  scheduler_.stop();
}

HttpResponse Service::handle(HttpRequest request) {
  const double t0 = now_seconds();
  const Route route = route_request(request.method, request.path);
  HttpResponse r;
  try {
    if (route.refusal) {
      // /v2 refusals in the Open Inference Protocol's error shape (server/oip.h).
      r = route.name.rfind("v2", 0) == 0 ? oip_error_from_v1(*route.refusal) : *route.refusal;
    } else {
      r = dispatch(route, request);
    }
  } catch (const ApiError& e) {
    r = error_response(e);
  } catch (const Error& e) {
    r = error_response(api_error_from(e, ErrorStage::kRequest));
  } catch (const std::exception& e) {
    r = error_response(500, "internal", std::string("internal error: ") + e.what());
  }
  count_refusal(route.name, r);
  if (route.id == RouteId::kFrames || route.id == RouteId::kV2Infer) metrics_.observe("total", now_seconds() - t0);
  return r;
}

void Service::count_refusal(const std::string& route, const HttpResponse& r) {
  metrics_.count_request(route, r.status);
  if (r.status >= 400) {
    const std::string kind = error_kind_of(r);
    metrics_.count_error(kind.empty() ? "unknown" : kind);
  }
}

HttpResponse Service::dispatch(const Route& route, HttpRequest& request) {
  switch (route.id) {
    case RouteId::kHealthz:
      if (shutting_down_) return error_response(503, "shutting_down", "the server is shutting down");
      return json_response({{"status", "ok"}});
    case RouteId::kMetrics: return get_metrics();
    case RouteId::kModel: return get_model();
    case RouteId::kStreams: return get_streams();
    case RouteId::kStream: return delete_stream(route.stream);
    case RouteId::kFrames: return post_frame(route.stream, request);
    case RouteId::kV2Server:
    case RouteId::kV2Live:
    case RouteId::kV2Ready:
    case RouteId::kV2Model:
    case RouteId::kV2ModelReady:
    case RouteId::kV2Infer: return oip_->handle(route, request);
    case RouteId::kHandoff:
    case RouteId::kHandoffOwner: return fleet_->handle(route, request);
    case RouteId::kNone: break;
  }
  return error_response(404, "not_found", "no route (see docs/API.md)");
}

HttpResponse Service::post_frame(const std::string& stream, HttpRequest& request) {
  if (shutting_down_) return error_response(503, "shutting_down", "the server is shutting down and takes no new frames");
  if (oip_->sequences().moved(stream)) {
    HttpResponse r = error_response(503, "sequence_moved", "stream " + stream +
                                                              " was handed to the server that owns it now (this one is leaving the "
                                                              "fleet); retry: the balancer sends it there");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  }
  if (request.body.size() > options_.max_body_bytes) {
    return error_response(413, "body_too_large", "the body is " + std::to_string(request.body.size()) +
                                                     " bytes; this server takes at most " +
                                                     std::to_string(options_.max_body_bytes));
  }
  // While a body is parsed it is held with the JSON tree (its base64 strings) and the lexer's
  // buffer for the string being read, which grows by doubling: three times the body at most.
  MemoryLease& lease = request.lease;
  if (!lease.resize(3 * request.body.size())) {
    return busy("the server holds " + mib(memory_.in_use()) + " of requests (--max-inflight-mb " + mib(memory_.capacity()) + ")");
  }
  const double t0 = now_seconds();
  auto frame = std::make_shared<FrameRequest>(
      parse_frame_request(stream, request.content_type, std::move(request.body), options_.limits));
  // From here until it is answered the frame holds its bytes and the pixels its images decode to.
  if (!lease.resize(frame->held_bytes + frame->decoded_bytes)) {
    return busy("the frame's images decode to " + mib(frame->decoded_bytes) + " and the server holds " +
                mib(memory_.in_use()) + " of requests (--max-inflight-mb " + mib(memory_.capacity()) + ")");
  }
  auto held = std::make_shared<MemoryLease>(std::move(lease));
  const double queued_at = now_seconds();
  metrics_.observe("parse", queued_at - t0);

  auto job = std::make_shared<FrameJob>();
  auto pending = std::make_shared<V1Frame>();
  pending->service = this;
  pending->request = std::move(frame);
  pending->held = std::move(held);
  pending->job = job;
  pending->queued_at = queued_at;
  std::shared_ptr<BatchFrame> batchable = pending;
  auto task = std::make_shared<Scheduler::Task>([this, pending]() { run_alone(*pending); }, batchable);
  if (!scheduler_.submit(stream, task)) {
    if (shutting_down_) return error_response(503, "shutting_down", "the server is shutting down and takes no new frames");
    HttpResponse r = error_response(
        429, "queue_full",
        "all " + std::to_string(options_.queue_capacity) + " queue slots are taken; retry after the Retry-After seconds");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(options_.request_timeout_seconds));
  std::unique_lock lock(job->mu);
  if (job->cv.wait_until(lock, deadline, [&] { return job->done; })) return std::move(job->response);
  lock.unlock();
  ++timeouts_;
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", options_.request_timeout_seconds);
  if (task->cancel()) {
    return error_response(504, "timeout", std::string("the frame waited ") + limit +
                                              " s for a worker and was dropped; the stream's history is unchanged");
  }
  return error_response(504, "timeout", std::string("the frame did not finish within ") + limit +
                                            " s; it still completes and updates the stream's history");
}

void Service::run_alone(BatchFrame& f) {
  std::optional<Detections> d;
  std::optional<ApiError> error;
  try {
    if (!f.before()) return;
    // The parsed frame as it is: its images view the request's bytes (no base dir: no file is read).
    d = model_.detect(f.frame(), "");
  } catch (const Error& e) {
    error = api_error_from(e, ErrorStage::kModel);
  } catch (const std::exception& e) {
    error = ApiError(500, "internal", std::string("internal error: ") + e.what());
  }
  if (error) {
    f.failed(std::move(*error));
  } else {
    f.done(std::move(*d));
  }
}

std::optional<HttpResponse> Service::out_of_order(const Frame& frame) const {
  for (const StreamStatus& s : model_.streams()) {
    if (s.id == frame.stream && s.frames > 0 && !(frame.timestamp > s.last_timestamp)) {
      return error_response(409, "out_of_order",
                            "timestamp " + number_text(frame.timestamp) + " is not after the stream's last frame (" +
                                number_text(s.last_timestamp) + "); frames of a stream must be sent in time order. DELETE /v1/streams/" +
                                frame.stream + " to start it again");
    }
  }
  return std::nullopt;
}

void Service::observe_parts(const Detections& d) {
  metrics_.observe("prepare", d.prepare_seconds);
  metrics_.observe("geometry", d.geometry_seconds);
  metrics_.observe("image", d.image_seconds);
  metrics_.observe("bev", d.bev_seconds);
  metrics_.observe("output", d.output_seconds);
}

void Service::run_batch(const std::vector<std::shared_ptr<Scheduler::Task>>& tasks) {
  std::vector<BatchFrame*> members;
  std::vector<Frame> frames;  // copies share the requests' image bytes (views)
  members.reserve(tasks.size());  // so that the two stay in step: push_back cannot throw
  frames.reserve(tasks.size());
  for (const auto& t : tasks) {
    // Every payload is a BatchFrame (stored as one: the void pointer is the BatchFrame's).
    auto* f = static_cast<BatchFrame*>(t->payload().get());
    std::optional<ApiError> error;
    try {
      if (!f->before()) continue;
      frames.push_back(f->frame());
      members.push_back(f);
      continue;
    } catch (const Error& e) {
      error = api_error_from(e, ErrorStage::kModel);
    } catch (const std::exception& e) {
      error = ApiError(500, "internal", std::string("internal error: ") + e.what());
    }
    f->failed(std::move(*error));
  }
  if (members.empty()) return;
  std::vector<FrameOutcome> out;
  std::optional<ApiError> error;
  try {
    out = model_.detect_batch(frames, "", {}, static_cast<int>(frames.size()));
  } catch (const Error& e) {
    error = api_error_from(e, ErrorStage::kModel);
  } catch (const std::exception& e) {
    error = ApiError(500, "internal", std::string("internal error: ") + e.what());
  }
  // The copies hold the requests' bytes; each member's lease is released as it is answered.
  std::vector<Frame>().swap(frames);
  if (error) {
    for (BatchFrame* f : members) f->failed(*error);
    return;
  }
  for (size_t i = 0; i < members.size(); ++i) {
    if (out[i].error) {
      members[i]->failed(api_error_from(*out[i].error, ErrorStage::kModel));
    } else {
      members[i]->done(std::move(*out[i].detections));
    }
  }
}

HttpResponse Service::get_streams() const {
  json list = json::array();
  for (const StreamStatus& s : model_.streams()) {
    list.push_back({{"id", s.id},
                    {"frames", s.frames},
                    {"last_timestamp", s.last_timestamp},
                    {"idle_seconds", s.idle_seconds},
                    {"has_history", s.has_history},
                    {"busy", s.busy}});
  }
  return json_response({{"streams", list}});
}

HttpResponse Service::delete_stream(const std::string& stream) {
  if (!model_.drop_stream(stream)) {
    return error_response(404, "unknown_stream", "no stream '" + stream + "' (GET /v1/streams lists them)");
  }
  return json_response({{"dropped", stream}});
}

HttpResponse Service::get_model() const {
  json j = options_.model_info;
  j["untrained"] = model_.untrained();
  j["classes"] = model_.class_names();
  j["config_summary"] = model_.config_summary();
  j["server"] = {{"workers", options_.workers},
                 {"max_batch", options_.max_batch},
                 {"batch_delay_seconds", options_.batch_delay_seconds},
                 {"queue_capacity", options_.queue_capacity},
                 {"request_timeout_seconds", options_.request_timeout_seconds},
                 {"max_body_bytes", options_.max_body_bytes},
                 {"max_inflight_bytes", options_.max_inflight_bytes},
                 {"max_cameras", options_.limits.max_cameras},
                 {"max_image_width", options_.limits.max_image_width},
                 {"max_image_height", options_.limits.max_image_height}};
  j["fleet"] = {{"instance", fleet_->instance()},
                {"fingerprint", model_.fingerprint()},
                {"model_name", options_.oip.model_name},
                {"handoff_via", options_.fleet.handoff_via},
                {"max_sequence_idle_seconds", options_.oip.sequences.max_idle_seconds},
                {"handoff_wait_seconds", options_.oip.sequences.handoff_wait_seconds}};
  if (model_.untrained()) j["warning"] = "seeded random weights: detections are meaningless";
  return json_response(j);
}

HttpResponse Service::get_metrics() {
  const StreamTotals t = model_.stream_totals();
  const std::vector<Metrics::Sample> sampled = {
      {"bevformer_queue_depth", "Frames waiting for a worker.", "gauge", static_cast<double>(scheduler_.queued())},
      {"bevformer_frames_running", "Frames being processed.", "gauge", static_cast<double>(scheduler_.running())},
      {"bevformer_batches_total", "Batches of two or more frames run together (--max-batch).", "counter",
       static_cast<double>(scheduler_.batches())},
      {"bevformer_batched_frames_total", "Frames that ran in those batches.", "counter",
       static_cast<double>(scheduler_.batched_tasks())},
      {"bevformer_queue_capacity", "Frames that may wait before requests get 429.", "gauge",
       static_cast<double>(options_.queue_capacity)},
      {"bevformer_active_streams", "Streams holding history.", "gauge", static_cast<double>(t.active)},
      {"bevformer_streams_created_total", "Streams created.", "counter", static_cast<double>(t.created)},
      {"bevformer_stream_evictions_lru_total", "Streams evicted because max_streams was reached.", "counter",
       static_cast<double>(t.evicted_lru)},
      {"bevformer_stream_evictions_ttl_total", "Streams evicted after stream_ttl_seconds idle.", "counter",
       static_cast<double>(t.evicted_ttl)},
      {"bevformer_streams_dropped_total", "Streams dropped by DELETE.", "counter", static_cast<double>(t.dropped)},
      {"bevformer_history_resets_total", "History dropped for a time gap, a timestamp going backwards or a new scene.",
       "counter", static_cast<double>(t.resets_gap + t.resets_backwards + t.resets_scene)},
      {"bevformer_frames_nonfinite_total", "Frames refused because a stage produced NaN or infinite values.", "counter",
       static_cast<double>(t.frames_nonfinite)},
      {"bevformer_request_timeouts_total", "Frame requests answered 504.", "counter", static_cast<double>(timeouts_.load())},
      {"bevformer_shutting_down", "1 once SIGTERM was received.", "gauge", shutting_down_ ? 1.0 : 0.0},
      {"bevformer_ready", "1 while /v2/health/ready says ready (0 draining or shutting down).", "gauge", ready() ? 1.0 : 0.0},
      {"bevformer_sequences_live", "Open Inference Protocol sequences with history here.", "gauge",
       static_cast<double>(oip_->sequences().live())},
      {"bevformer_handoffs_sent_total", "Stream histories handed to another server while draining.", "counter",
       static_cast<double>(fleet_->counters().sent)},
      {"bevformer_handoffs_lost_total", "Stream histories a drain could not hand over (lost).", "counter",
       static_cast<double>(fleet_->counters().lost)},
      {"bevformer_handoffs_received_total", "Stream histories installed from a draining server.", "counter",
       static_cast<double>(fleet_->counters().received)},
      {"bevformer_inflight_bytes", "Request bytes held now (bodies, parsed frames, their decoded pixels).", "gauge",
       static_cast<double>(memory_.in_use())},
      {"bevformer_inflight_capacity_bytes", "The bound on bevformer_inflight_bytes (--max-inflight-mb).", "gauge",
       static_cast<double>(memory_.capacity())},
  };
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics_.prometheus_text(sampled);
  return r;
}

}  // namespace bev::server
