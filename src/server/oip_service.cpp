#include "server/oip_service.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "bevformer/error.h"
#include "core/log.h"
#include "io/frame_json.h"
#include "server/api_error.h"
#include "server/frame_request.h"

namespace bev::server {
namespace {

using json = nlohmann::json;

HttpResponse json_answer(const json& j) {
  HttpResponse r;
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return r;
}

HttpResponse oip_error(const ApiError& e) {
  HttpResponse r = oip_error_response(e.status(), e.kind(), e.what());
  if (e.retry_after_seconds() > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_seconds()));
  return r;
}

// What a frame's worker hands back to the request that waits for it.
struct FrameOutcome {
  std::optional<Detections> detections;
  std::optional<ApiError> error;
};

bool requested(const OipRequest& req, const std::string& name, bool* binary) {
  if (req.outputs.empty()) {
    *binary = req.binary_outputs;
    return true;
  }
  for (const OipRequest::Output& o : req.outputs) {
    if (o.name == name) {
      *binary = o.binary;
      return true;
    }
  }
  return false;
}

}  // namespace

Oip::Oip(Model& model, StreamWork& work, const OipOptions& options)
    : model_(model),
      work_(work),
      model_name_(options.model_name),
      sequences_(options.sequences),
      // Often enough that a sequence is freed within a few percent of its idle limit.
      sweep_seconds_(std::clamp(options.sequences.max_idle_seconds / 20, 0.05, 5.0)) {
  sweeper_ = std::thread([this] {
    std::unique_lock lock(sweep_mu_);
    while (!stopping_) {
      sweep_cv_.wait_for(lock, std::chrono::duration<double>(sweep_seconds_), [&] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      sweep();
      lock.lock();
    }
  });
}

Oip::~Oip() {
  {
    std::lock_guard lock(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  sweeper_.join();
}

void Oip::sweep() {
  for (const std::string& id : sequences_.take_expired()) {
    // An abandoned sequence: its history is freed here, and its next frame is told to restart.
    model_.drop_stream(id);
    log_info("serve: sequence ", id, " idle past --max-sequence-idle-s: freed");
  }
}

bool Oip::live() const { return true; }  // the process answers; draining is readiness, not liveness

bool Oip::ready() const { return work_.ready(); }

json Oip::server_metadata() const {
  return {{"name", "bevformer.cpp"}, {"version", "0.1.0"}, {"extensions", {"binary_tensor_data", "sequence"}}};
}

json Oip::model_metadata() const {
  auto specs = [](const std::vector<OipTensorSpec>& v) {
    json a = json::array();
    for (const OipTensorSpec& t : v) a.push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
    return a;
  };
  return {{"name", model_name_},
          {"versions", {"1"}},
          {"platform", "bevformer.cpp"},
          {"inputs", specs(oip_inputs())},
          {"outputs", specs(oip_outputs())}};
}

void Oip::check_model(const std::string& name, const std::string& version) const {
  if (name != model_name_) {
    throw ApiError(404, "unknown_model", "no model '" + name.substr(0, 100) + "' here; this server serves '" + model_name_ + "'");
  }
  if (!version.empty() && version != "1") {
    throw ApiError(404, "unknown_version", "model '" + model_name_ + "' has version 1 only (got '" + version.substr(0, 40) + "')");
  }
}

HttpResponse Oip::handle(const Route& route, HttpRequest& request) {
  try {
    switch (route.id) {
      case RouteId::kV2Server: return json_answer(server_metadata());
      case RouteId::kV2Live: return json_answer({{"live", live()}});
      case RouteId::kV2Ready:
        if (!ready()) {
          return oip_error_response(400, "not_ready", "not ready: the server is draining or shutting down (the balancer stops sending)");
        }
        return json_answer({{"ready", true}});
      case RouteId::kV2Model: check_model(route.model, route.version); return json_answer(model_metadata());
      case RouteId::kV2ModelReady:
        check_model(route.model, route.version);
        if (!ready()) return oip_error_response(400, "not_ready", "not ready: the server is draining or shutting down");
        return json_answer({{"name", model_name_}, {"ready", true}});
      case RouteId::kV2Infer: check_model(route.model, route.version); return rest_infer(request);
      default: break;
    }
    return oip_error_response(404, "not_found", "no such route");
  } catch (const ApiError& e) {
    return oip_error(e);
  } catch (const Error& e) {
    return oip_error(api_error_from(e, ErrorStage::kRequest));
  } catch (const std::exception& e) {
    return oip_error_response(500, "internal", std::string("internal error: ") + e.what());
  }
}

HttpResponse Oip::rest_infer(HttpRequest& request) {
  if (work_.shutting_down()) throw ApiError(503, "shutting_down", "the server is shutting down and takes no new frames");
  // While the JSON header is parsed, its strings (a FRAME with base64 images) are held twice more.
  if (!request.lease.resize(3 * request.body.size())) {
    throw ApiError(503, "busy", "the server holds all of --max-inflight-mb in requests; retry after the Retry-After seconds", 1);
  }
  const OipRequest req = parse_oip_rest_request(std::move(request.body), request.header("Inference-Header-Content-Length"));
  return oip_rest_response(infer(req, request.lease));
}

// A sequence's frame on its stream's FIFO: the sequence checks before it runs, the sequence's
// bookkeeping after; alone or in a batch of other sequences' frames (BatchFrame).
struct Oip::OipFrame final : BatchFrame {
  Oip* oip = nullptr;
  std::shared_ptr<FrameRequest> request;
  std::shared_ptr<MemoryLease> held;  // the request's bytes and its images' pixels, until answered
  std::string id;
  double timestamp = 0;
  bool end = false;
  SequenceTable::Claim claim;
  std::shared_ptr<FrameOutcome> outcome = std::make_shared<FrameOutcome>();

  const Frame& frame() const override { return request->frame; }
  bool before() override {
    if (claim.start) {
      oip->model_.drop_stream(id);  // a new scene, even when the frame's "scene" did not change
      return true;
    }
    bool found = false;
    for (const StreamStatus& s : oip->model_.streams()) found = found || (s.id == id && s.frames == claim.frames);
    if (found) return true;
    oip->sequences_.forget(id);
    refuse(ApiError(409, "sequence_unknown",
                    "sequence " + id + "'s history was evicted from the engine (--max-streams, --stream-ttl, or "
                    "a DELETE): the history is gone; restart the sequence (sequence_start true)"));
    return false;
  }
  void done(Detections d) override {
    try {
      if (static_cast<uint64_t>(d.frame_index) != claim.frames) {
        // The stream was evicted between the check and the frame: it ran without its history.
        oip->model_.drop_stream(id);
        oip->sequences_.forget(id);
        refuse(ApiError(409, "sequence_unknown", "sequence " + id + "'s history was evicted while its frame waited; "
                                                 "the history is gone: restart the sequence (sequence_start true)"));
        return;
      }
      oip->sequences_.finish(id, claim.frames + 1, timestamp, end);
      if (end) oip->model_.drop_stream(id);
      Metrics& m = oip->work_.metrics();
      m.observe("prepare", d.prepare_seconds);
      m.observe("geometry", d.geometry_seconds);
      m.observe("image", d.image_seconds);
      m.observe("bev", d.bev_seconds);
      m.observe("output", d.output_seconds);
      outcome->detections = std::move(d);
    } catch (const std::exception& e) {
      oip->sequences_.release(id, claim.start);
      outcome->error = ApiError(500, "internal", std::string("internal error: ") + e.what());
    }
    release_bytes();
  }
  void failed(ApiError e) override {
    oip->sequences_.release(id, claim.start);  // the engine left the history as it was
    refuse(std::move(e));
  }
  void refuse(ApiError e) {
    outcome->error = std::move(e);
    release_bytes();
  }
  void release_bytes() {
    request.reset();
    held.reset();
  }
};

OipResponse Oip::infer(const OipRequest& req, MemoryLease& lease) {
  if (work_.shutting_down()) throw ApiError(503, "shutting_down", "the server is shutting down and takes no new frames");
  if (!req.sequence_id) {
    throw ApiError(400, "sequence_required",
                   "this model keeps a BEV history per vehicle: every inference names its sequence (parameters "
                   "sequence_id, a uint64 or a string, and sequence_start true on its first frame)");
  }
  const std::string id = *req.sequence_id;
  for (const OipInput& in : req.inputs) {
    if (in.name != "FRAME" && in.name != "IMAGES") throw ApiError(400, "invalid_input", "unknown input " + in.name + " (FRAME, IMAGES)");
  }
  for (const OipRequest::Output& o : req.outputs) {
    bool known = false;
    for (const OipTensorSpec& t : oip_outputs()) known = known || o.name == t.name;
    if (!known) throw ApiError(400, "invalid_input", "unknown output " + o.name + " (BOXES, SCORES, LABELS, DETECTIONS)");
  }
  const OipInput* frame_in = req.input("FRAME");
  if (!frame_in || frame_in->elements.size() != 1) {
    throw ApiError(400, "invalid_input", "FRAME (BYTES, shape [1]: the frame JSON) is required, with one element");
  }
  Frame frame;
  try {
    frame = parse_frame_json_owned(std::string(frame_in->elements[0]), "FRAME");
  } catch (const Error& e) {
    throw api_error_from(e, ErrorStage::kRequest);
  }
  if (frame.stream != id) {
    throw ApiError(400, "stream_mismatch", "the frame's \"stream\" is '" + frame.stream.substr(0, 200) +
                                               "' but the request's sequence_id is '" + id + "': they must be equal");
  }
  if (const OipInput* images = req.input("IMAGES")) {
    if (images->elements.size() != frame.cameras.size()) {
      throw ApiError(400, "invalid_input", "IMAGES has " + std::to_string(images->elements.size()) + " images but the frame has " +
                                               std::to_string(frame.cameras.size()) + " cameras (one image per camera, in order)");
    }
    // Views into what keeps the bytes alive: the request body (binary data), or a copy of the
    // JSON strings (the request itself may be gone before a timed-out frame finishes).
    std::shared_ptr<const void> owner = images->owner;
    std::vector<std::string_view> views = images->elements;
    if (!owner) {
      auto copy = std::make_shared<std::vector<std::string>>(images->owned);
      views.assign(copy->begin(), copy->end());
      owner = copy;
    }
    for (size_t i = 0; i < frame.cameras.size(); ++i) {
      Camera& cam = frame.cameras[i];
      if (!cam.image_bytes.empty()) {
        throw ApiError(400, "invalid_input", "cameras[" + std::to_string(i) + "] has its image inline and IMAGES gives one too");
      }
      cam.image_bytes.owner = owner;
      cam.image_bytes.bytes = {reinterpret_cast<const uint8_t*>(views[i].data()), views[i].size()};
      cam.image_path.clear();
    }
  }
  auto fr = std::make_shared<FrameRequest>(check_frame_images(std::move(frame), work_.limits()));
  // From here until it is answered the frame holds the request's bytes and its images' pixels.
  if (!lease.resize(req.body_bytes + fr->decoded_bytes)) {
    throw ApiError(503, "busy", "the frame does not fit --max-inflight-mb now; retry after the Retry-After seconds", 1);
  }
  auto held = std::make_shared<MemoryLease>(std::move(lease));

  auto job = std::make_shared<OipFrame>();
  job->oip = this;
  job->request = std::move(fr);
  job->held = std::move(held);
  job->id = id;
  job->timestamp = job->request->frame.timestamp;
  job->end = req.sequence_end;
  job->claim = sequences_.claim(id, req.sequence_start, job->timestamp);
  auto outcome = job->outcome;
  const SequenceTable::Claim claim = job->claim;
  bool never_ran = false;
  try {
    work_.run_frame_on_stream(id, std::move(job), &never_ran);
  } catch (const ApiError&) {
    if (never_ran) sequences_.release(id, claim.start);
    throw;
  }
  if (outcome->error) throw *outcome->error;
  const Detections& d = *outcome->detections;

  OipResponse r;
  r.model_name = model_name_;
  r.model_version = "1";
  r.id = req.id;
  r.parameters = {{"sequence_id", id}, {"used_history", d.used_history}, {"frame_index", d.frame_index}};
  if (!d.history_reset.empty()) r.parameters["history_reset"] = d.history_reset;
  if (d.untrained) r.parameters["untrained"] = true;
  const int64_t k = static_cast<int64_t>(d.boxes.size());
  for (const OipTensorSpec& spec : oip_outputs()) {
    OipOutput o;
    if (!requested(req, spec.name, &o.binary)) continue;
    o.name = spec.name;
    o.datatype = spec.datatype;
    if (o.name == "BOXES") {
      o.shape = {k, 9};
      for (const Box& b : d.boxes) {
        for (double v : {b.center[0], b.center[1], b.center[2], b.size[0], b.size[1], b.size[2], b.yaw, b.velocity[0], b.velocity[1]}) {
          o.fp32.push_back(static_cast<float>(v));
        }
      }
    } else if (o.name == "SCORES") {
      o.shape = {k};
      for (const Box& b : d.boxes) o.fp32.push_back(static_cast<float>(b.score));
    } else if (o.name == "LABELS") {
      o.shape = {k};
      for (const Box& b : d.boxes) o.int32.push_back(b.label);
    } else {
      o.shape = {1};
      o.bytes = {d.json};
    }
    r.outputs.push_back(std::move(o));
  }
  return r;
}

}  // namespace bev::server
