#include "server/service.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "bevformer/error.h"
#include "server/api_error.h"

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

// "/v1/streams/abc/frames" -> {"v1", "streams", "abc", "frames"}; empty segments are kept so a
// doubled slash does not alias another route.
std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 1;
  if (path.empty() || path[0] != '/') return {};
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string::npos ? path.size() : slash;
    out.push_back(path.substr(start, end - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

HttpResponse method_not_allowed(const std::string& method, const std::string& path, const std::string& allowed) {
  HttpResponse r = error_response(405, "method_not_allowed", method + " is not allowed on " + path + "; use " + allowed);
  r.headers.emplace_back("Allow", allowed);
  return r;
}

// What a frame's handler thread and the worker running it share.
struct FrameJob {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  HttpResponse response;
};

}  // namespace

Service::Service(Model& model, ServiceOptions options)
    : model_(model), options_(std::move(options)), scheduler_(options_.workers, options_.queue_capacity) {}

Service::~Service() { finish(); }

void Service::begin_shutdown() { shutting_down_ = true; }

void Service::finish() {
  shutting_down_ = true;
  scheduler_.stop();
}

HttpResponse Service::handle(HttpRequest request) {
  const double t0 = now_seconds();
  std::string route_name = "other";
  HttpResponse r;
  try {
    r = route(request, route_name);
  } catch (const ApiError& e) {
    r = error_response(e);
  } catch (const Error& e) {
    r = error_response(api_error_from(e, ErrorStage::kRequest));
  } catch (const std::exception& e) {
    r = error_response(500, "internal", std::string("internal error: ") + e.what());
  }
  metrics_.count_request(route_name, r.status);
  if (r.status >= 400) {
    // The kind is in the body we wrote; read it back rather than thread it through every path.
    const json body = json::parse(r.body, nullptr, false);
    metrics_.count_error(body.is_object() && body.contains("error") ? body["error"].value("kind", "unknown") : "unknown");
  }
  if (route_name == "frames") metrics_.observe("total", now_seconds() - t0);
  return r;
}

HttpResponse Service::route(HttpRequest& request, std::string& route_name) {
  const std::vector<std::string> seg = segments(request.path);
  const std::string& m = request.method;
  if (seg.size() == 1 && seg[0] == "healthz") {
    route_name = "healthz";
    if (m != "GET") return method_not_allowed(m, request.path, "GET");
    if (shutting_down_) return error_response(503, "shutting_down", "the server is shutting down");
    return json_response({{"status", "ok"}});
  }
  if (seg.size() == 1 && seg[0] == "metrics") {
    route_name = "metrics";
    if (m != "GET") return method_not_allowed(m, request.path, "GET");
    return get_metrics();
  }
  if (seg.size() == 2 && seg[0] == "v1" && seg[1] == "model") {
    route_name = "model";
    if (m != "GET") return method_not_allowed(m, request.path, "GET");
    return get_model();
  }
  if (seg.size() == 2 && seg[0] == "v1" && seg[1] == "streams") {
    route_name = "streams";
    if (m != "GET") return method_not_allowed(m, request.path, "GET");
    return get_streams();
  }
  if (seg.size() >= 3 && seg.size() <= 4 && seg[0] == "v1" && seg[1] == "streams") {
    const std::string& id = seg[2];
    if (!valid_stream_id(id)) {
      route_name = seg.size() == 4 ? "frames" : "stream";
      return error_response(400, "invalid_stream_id",
                            "stream ids are 1 to 128 characters of A-Z a-z 0-9 . _ : - (got '" + id.substr(0, 140) + "')");
    }
    if (seg.size() == 3) {
      route_name = "stream";
      if (m != "DELETE") return method_not_allowed(m, request.path, "DELETE");
      return delete_stream(id);
    }
    if (seg[3] == "frames") {
      route_name = "frames";
      if (m != "POST") return method_not_allowed(m, request.path, "POST");
      return post_frame(id, request);
    }
  }
  return error_response(404, "not_found", "no route " + m + " " + request.path.substr(0, 200) + " (see docs/API.md)");
}

HttpResponse Service::post_frame(const std::string& stream, HttpRequest& request) {
  if (shutting_down_) return error_response(503, "shutting_down", "the server is shutting down and takes no new frames");
  if (request.body.size() > options_.max_body_bytes) {
    return error_response(413, "body_too_large", "the body is " + std::to_string(request.body.size()) +
                                                     " bytes; this server takes at most " +
                                                     std::to_string(options_.max_body_bytes));
  }
  const double t0 = now_seconds();
  auto frame = std::make_shared<FrameRequest>(
      parse_frame_request(stream, request.content_type, std::move(request.body), options_.limits));
  const double queued_at = now_seconds();
  metrics_.observe("parse", queued_at - t0);

  auto job = std::make_shared<FrameJob>();
  auto task = std::make_shared<Scheduler::Task>([this, job, frame, queued_at] {
    HttpResponse r = run_frame(*frame, queued_at);
    std::lock_guard lock(job->mu);
    job->response = std::move(r);
    job->done = true;
    job->cv.notify_all();
  });
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

HttpResponse Service::run_frame(const FrameRequest& frame, double queued_at) {
  metrics_.observe("queue", now_seconds() - queued_at);
  try {
    // Frames of one stream run one at a time (the scheduler), so this check cannot race with
    // another frame of the same stream.
    for (const StreamStatus& s : model_.streams()) {
      if (s.id == frame.stream && s.frames > 0 && !(frame.timestamp > s.last_timestamp)) {
        char text[160];
        std::snprintf(text, sizeof text, "timestamp %.6f is not after the stream's last frame (%.6f)", frame.timestamp,
                      s.last_timestamp);
        return error_response(409, "out_of_order",
                              std::string(text) + "; frames of a stream must be sent in time order. DELETE /v1/streams/" +
                                  frame.stream + " to start it again");
      }
    }
    const Detections d = model_.detect(frame.frame_json, frame.images);
    metrics_.observe("prepare", d.prepare_seconds);
    metrics_.observe("geometry", d.geometry_seconds);
    metrics_.observe("image", d.image_seconds);
    metrics_.observe("bev", d.bev_seconds);
    metrics_.observe("output", d.output_seconds);
    HttpResponse r;
    r.body = d.json + "\n";
    return r;
  } catch (const Error& e) {
    return error_response(api_error_from(e, ErrorStage::kModel));
  } catch (const std::exception& e) {
    return error_response(500, "internal", std::string("internal error: ") + e.what());
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
                 {"queue_capacity", options_.queue_capacity},
                 {"request_timeout_seconds", options_.request_timeout_seconds},
                 {"max_body_bytes", options_.max_body_bytes},
                 {"max_cameras", options_.limits.max_cameras},
                 {"max_image_width", options_.limits.max_image_width},
                 {"max_image_height", options_.limits.max_image_height}};
  if (model_.untrained()) j["warning"] = "seeded random weights: detections are meaningless";
  return json_response(j);
}

HttpResponse Service::get_metrics() {
  const StreamTotals t = model_.stream_totals();
  const std::vector<Metrics::Sample> sampled = {
      {"bevformer_queue_depth", "Frames waiting for a worker.", "gauge", static_cast<double>(scheduler_.queued())},
      {"bevformer_frames_running", "Frames being processed.", "gauge", static_cast<double>(scheduler_.running())},
      {"bevformer_queue_capacity", "Frames that may wait before requests get 429.", "gauge",
       static_cast<double>(options_.queue_capacity)},
      {"bevformer_active_streams", "Streams holding history.", "gauge", static_cast<double>(t.active)},
      {"bevformer_streams_created_total", "Streams created.", "counter", static_cast<double>(t.created)},
      {"bevformer_stream_evictions_lru_total", "Streams evicted because max_streams was reached.", "counter",
       static_cast<double>(t.evicted_lru)},
      {"bevformer_stream_evictions_ttl_total", "Streams evicted after stream_ttl_seconds idle.", "counter",
       static_cast<double>(t.evicted_ttl)},
      {"bevformer_streams_dropped_total", "Streams dropped by DELETE.", "counter", static_cast<double>(t.dropped)},
      {"bevformer_history_resets_total", "History dropped for a time gap or a timestamp going backwards.", "counter",
       static_cast<double>(t.resets_gap + t.resets_backwards)},
      {"bevformer_request_timeouts_total", "Frame requests answered 504.", "counter", static_cast<double>(timeouts_.load())},
      {"bevformer_shutting_down", "1 once SIGTERM was received.", "gauge", shutting_down_ ? 1.0 : 0.0},
  };
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics_.prometheus_text(sampled);
  return r;
}

}  // namespace bev::server
