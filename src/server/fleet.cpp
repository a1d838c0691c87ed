#include "server/fleet.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/frame_request.h"
#include "server/http_client.h"

namespace bev::server {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// After the balancer stops sending this server a key, a request it forwarded just before may
// still be on its way (in a socket buffer, in the handler pool): a stream is exported only after
// this long, so such a frame is queued on its FIFO before the export and runs first.
constexpr double kSettleSeconds = 0.25;
// Between rounds of probes while the balancer still routes here (its health checks run every
// few hundred ms in deploy/haproxy.cfg).
constexpr double kRoundSeconds = 0.1;
constexpr double kCallTimeoutSeconds = 10;
// How long a drain waits when no other server answers through the balancer at all.
constexpr double kNoOwnerSeconds = 3;

std::string random_instance() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof buf, "srv-%016llx", static_cast<unsigned long long>(v));
  return buf;
}

HttpResponse json_answer(const json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return r;
}

void sleep_for(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

std::string error_kind(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) return j["error"].value("kind", "");
  return "";
}

}  // namespace

Fleet::Fleet(Model& model, StreamWork& work, SequenceTable& sequences, const FleetOptions& options)
    : model_(model),
      work_(work),
      sequences_(sequences),
      via_(options.handoff_via),
      drain_timeout_seconds_(options.drain_timeout_seconds),
      instance_(options.instance.empty() ? random_instance() : options.instance) {}

HttpResponse Fleet::handle(const Route& route, HttpRequest& request) {
  try {
    if (route.id == RouteId::kHandoffOwner) {
      return json_answer({{"instance", instance_}, {"ready", work_.ready()}, {"fingerprint", model_.fingerprint()}});
    }
    const std::string* from = request.header("X-Handoff-From");
    if (from && *from == instance_) {
      return error_response(409, "handoff_to_self",
                            "the balancer still routes this key to the server handing it over; retry once it has taken it out");
    }
    if (!work_.ready()) {
      HttpResponse r = error_response(503, "not_ready", "this server is leaving the fleet itself; it takes no handoff");
      r.headers.emplace_back("Retry-After", "1");
      return r;
    }
    // The bytes, and the BEV copied out of them, until it is uploaded to the backend.
    if (!request.lease.resize(2 * request.body.size())) {
      HttpResponse r = error_response(503, "busy", "the handoff does not fit --max-inflight-mb now; retry");
      r.headers.emplace_back("Retry-After", "1");
      return r;
    }
    std::pair<std::string, bool> result;
    bool decoded = false;  // the bytes were read: a kUnsupported after this is the model's, before it the format's
    try {
      // The id is checked before anything is installed: a refused handoff changes nothing (it
      // used to import first, evicting a stream of a full table, and drop the import after).
      result = model_.import_stream(request.body, [&](const std::string& id) {
        decoded = true;
        if (!valid_stream_id(id)) {
          throw ApiError(400, "invalid_handoff", "the handed-over stream id is not 1 to 128 characters of A-Z a-z 0-9 . _ : -");
        }
      });
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kUnsupported && !decoded) return error_response(422, "unsupported_format", e.what());
      if (e.kind() == ErrorKind::kUnsupported) return error_response(422, "model_mismatch", e.what());
      if (e.kind() == ErrorKind::kInvalidInput) return error_response(400, "invalid_handoff", e.what());
      throw;
    }
    const auto& [id, imported] = result;
    if (!imported) {
      return error_response(409, "stream_exists", "stream " + id + " already ran frames here (restarted by its client); "
                                                  "its newer history is kept and the handed-over one dropped");
    }
    uint64_t frames = 0;
    double last = 0;
    for (const StreamStatus& s : model_.streams()) {
      if (s.id == id) {
        frames = s.frames;
        last = s.last_timestamp;
      }
    }
    sequences_.adopt(id, frames, last);
    ++received_;
    log_info("serve: stream ", id, " handed over to this server (", frames, " frames of history)");
    return json_answer({{"imported", id}, {"frames", frames}});
  } catch (const ApiError& e) {
    return error_response(e);
  } catch (const Error& e) {
    return error_response(api_error_from(e, ErrorStage::kModel));
  } catch (const std::exception& e) {
    return error_response(500, "internal", std::string("internal error: ") + e.what());
  }
}

Fleet::Rotation Fleet::rotation(const std::vector<std::string>& keys) {
  bool answered = false;
  for (const std::string& key : keys) {
    const ClientAnswer a = http_call(via_, "GET", "/v1/handoff/owner", {{"X-Sequence-Id", key}}, "", kCallTimeoutSeconds);
    if (a.status != 200) continue;
    const json j = json::parse(a.body, nullptr, false);
    if (!j.is_object() || !j.contains("instance") || !j["instance"].is_string()) continue;
    if (j["instance"] == instance_) return Rotation::kHere;
    answered = true;
  }
  return answered ? Rotation::kElsewhere : Rotation::kNoAnswer;
}

Fleet::Outcome Fleet::hand_over(const std::string& id) {
  if (!sequences_.begin_move(id)) return Outcome::kRetry;  // a frame of it is in flight: after it
  // Exported on the stream's FIFO: after every frame of it accepted before the move began.
  auto bytes = std::make_shared<std::optional<std::string>>();
  try {
    work_.run_on_stream(id, [this, bytes, id] {
      try {
        *bytes = model_.export_stream(id);
      } catch (const std::exception& e) {
        log_error("serve: drain: exporting stream ", id, " failed: ", e.what());
      }
    });
  } catch (const ApiError& e) {
    sequences_.end_move(id, false);
    log_warn("serve: drain: stream ", id, ": ", e.what(), "; retrying");
    return Outcome::kRetry;
  }
  if (!*bytes) {
    // No history to hand over (it never completed a frame, or was dropped meanwhile).
    model_.drop_stream(id);
    sequences_.end_move(id, true);
    return Outcome::kDone;
  }
  const ClientAnswer a = http_call(via_, "POST", "/v1/handoff",
                                   {{"X-Sequence-Id", id}, {"X-Handoff-From", instance_}, {"Content-Type", "application/octet-stream"}},
                                   **bytes, kCallTimeoutSeconds);
  const std::string kind = a.status ? error_kind(a.body) : "";
  if (a.status == 200) {
    model_.drop_stream(id);
    sequences_.end_move(id, true);
    ++sent_;
    log_info("serve: drain: stream ", id, " handed over (", (*bytes)->size(), " bytes)");
    return Outcome::kDone;
  }
  if (a.status == 409 && kind == "handoff_to_self") {
    sequences_.end_move(id, false);
    return Outcome::kStillRoutedHere;
  }
  if (a.status == 409 && kind == "stream_exists") {
    model_.drop_stream(id);
    sequences_.end_move(id, true);
    log_info("serve: drain: stream ", id, " was restarted by its client on its new server; nothing to hand over");
    return Outcome::kDone;
  }
  if (a.status == 0 || a.status == 503 || a.status == 429 || a.status >= 500) {
    sequences_.end_move(id, false);
    log_warn("serve: drain: stream ", id, ": ", a.status ? std::to_string(a.status) + " " + a.body : a.error, "; retrying");
    return Outcome::kRetry;
  }
  // Refused for good (another model, a corrupt transfer): the history is lost, never reused wrong.
  model_.drop_stream(id);
  sequences_.end_move(id, true);
  ++lost_;
  log_error("serve: drain: stream ", id, " refused by its new server (", a.status, " ", a.body, "): its history is lost");
  return Outcome::kDone;
}

void Fleet::drain() {
  if (via_.empty()) return;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(drain_timeout_seconds_));
  log_info("serve: draining: handing streams over through ", via_);
  bool outside = false;
  bool silent = false;  // no server answered the last probes, since silent_since
  Clock::time_point silent_since{};
  std::set<std::string> done;
  uint64_t probe = 0;
  while (Clock::now() < deadline) {
    std::vector<std::string> left;
    for (const StreamStatus& s : model_.streams()) {
      if (!done.count(s.id)) left.push_back(s.id);
    }
    if (!outside) {
      // Probe with the streams' own keys; with none, with a few others (a key routes here with
      // probability 1/N while this server is in the balancer's ring).
      std::vector<std::string> keys(left.begin(), left.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(left.size(), 8)));
      while (keys.size() < 8) keys.push_back("drain-probe-" + instance_ + "-" + std::to_string(probe++));
      const Rotation r = rotation(keys);
      if (r == Rotation::kNoAnswer) {
        // No other server answers through the balancer (the whole fleet stops, or the balancer
        // is gone): nobody can take the streams; past kNoOwnerSeconds they are lost.
        if (!silent) silent_since = Clock::now();
        silent = true;
        if (Clock::now() - silent_since > std::chrono::duration<double>(kNoOwnerSeconds)) {
          log_warn("serve: drain: no other server answers through ", via_, " for ", kNoOwnerSeconds, " s; giving up");
          break;
        }
      } else {
        silent = false;
      }
      if (r != Rotation::kElsewhere) {
        sleep_for(kRoundSeconds);
        continue;
      }
      outside = true;
      sleep_for(kSettleSeconds);
      continue;  // list the streams again: frames that were on their way may have made new ones
    }
    if (left.empty()) break;
    bool still_here = false, all_done = true;
    for (const std::string& id : left) {
      if (Clock::now() >= deadline) break;
      const Outcome o = hand_over(id);
      if (o == Outcome::kDone) done.insert(id);
      all_done = all_done && o == Outcome::kDone;
      if (o == Outcome::kStillRoutedHere) {
        still_here = true;  // the balancer put this server back: wait until it is out again
        break;
      }
    }
    if (still_here) outside = false;
    if (!all_done) sleep_for(kRoundSeconds / 2);
  }
  size_t lost = 0;
  for (const StreamStatus& s : model_.streams()) {
    if (!done.count(s.id)) {
      ++lost;
      ++lost_;
      log_error("serve: drain: stream ", s.id, " not handed over within --drain-timeout; its history is lost");
    }
  }
  log_info("serve: drain done: ", sent_.load(), " streams handed over, ", lost, " lost");
}

}  // namespace bev::server
