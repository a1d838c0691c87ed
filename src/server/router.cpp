#include "server/router.h"

#include <vector>

#include "server/api_error.h"
#include "server/frame_request.h"

namespace bev::server {
namespace {

// "/v1/streams/abc/frames" -> {"v1", "streams", "abc", "frames"}; empty segments are kept so a
// doubled slash does not alias another route.
std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  if (path.empty() || path[0] != '/') return {};
  size_t start = 1;
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
  HttpResponse r = error_response(405, "method_not_allowed",
                                  method.substr(0, 32) + " is not allowed on " + path.substr(0, 200) + "; use " + allowed);
  r.headers.emplace_back("Allow", allowed);
  return r;
}

// A read-only resource: GET, and HEAD (the same answer without its body, RFC 9110 9.3.2).
void read_only(Route& r, const std::string& method, const std::string& path) {
  if (method != "GET" && method != "HEAD") r.refusal = method_not_allowed(method, path, "GET, HEAD");
}

HttpResponse not_found(const std::string& method, const std::string& path) {
  return error_response(404, "not_found", "no route " + method.substr(0, 32) + " " + path.substr(0, 200) + " (see docs/API.md)");
}

// /v2, /v2/health/{live,ready}, /v2/models/{name}[/versions/{v}][/ready|/infer].
Route route_v2(const std::string& method, const std::string& path, const std::vector<std::string>& seg) {
  Route r;
  r.name = "v2";  // refusals too: answered in the protocol's error shape
  if (seg.size() == 1) {
    r.id = RouteId::kV2Server;
    r.name = "v2";
    read_only(r, method, path);
    return r;
  }
  if (seg.size() == 3 && seg[1] == "health" && (seg[2] == "live" || seg[2] == "ready")) {
    r.id = seg[2] == "live" ? RouteId::kV2Live : RouteId::kV2Ready;
    r.name = "v2_health";
    read_only(r, method, path);
    return r;
  }
  if (seg.size() >= 3 && seg[1] == "models" && !seg[2].empty()) {
    size_t next = 3;
    r.model = seg[2];
    if (seg.size() >= 5 && seg[3] == "versions" && !seg[4].empty()) {
      r.version = seg[4];
      next = 5;
    }
    if (seg.size() == next) {
      r.id = RouteId::kV2Model;
      r.name = "v2_model";
      read_only(r, method, path);
      return r;
    }
    if (seg.size() == next + 1 && (seg[next] == "ready" || seg[next] == "infer")) {
      const bool infer = seg[next] == "infer";
      r.id = infer ? RouteId::kV2Infer : RouteId::kV2ModelReady;
      r.name = infer ? "v2_infer" : "v2_model";
      if (infer && method != "POST") {
        r.refusal = method_not_allowed(method, path, "POST");
      } else if (!infer) {
        read_only(r, method, path);
      }
      return r;
    }
  }
  r.refusal = not_found(method, path);
  return r;
}

}  // namespace

Route route_request(const std::string& method, const std::string& path) {
  const std::vector<std::string> seg = segments(path);
  Route r;
  if (seg.size() == 1 && (seg[0] == "healthz" || seg[0] == "metrics")) {
    r.id = seg[0] == "healthz" ? RouteId::kHealthz : RouteId::kMetrics;
    r.name = seg[0];
    read_only(r, method, path);
    return r;
  }
  if (seg.size() == 2 && seg[0] == "v1" && (seg[1] == "model" || seg[1] == "streams")) {
    r.id = seg[1] == "model" ? RouteId::kModel : RouteId::kStreams;
    r.name = seg[1];
    read_only(r, method, path);
    return r;
  }
  if ((seg.size() == 3 || (seg.size() == 4 && seg[3] == "frames")) && seg[0] == "v1" && seg[1] == "streams") {
    const bool frames = seg.size() == 4;
    r.id = frames ? RouteId::kFrames : RouteId::kStream;
    r.name = frames ? "frames" : "stream";
    r.stream = seg[2];
    if (!valid_stream_id(r.stream)) {
      r.refusal = error_response(400, "invalid_stream_id",
                                 "stream ids are 1 to 128 characters of A-Z a-z 0-9 . _ : - (got '" +
                                     r.stream.substr(0, 140) + "')");
    } else if (frames && method != "POST") {
      r.refusal = method_not_allowed(method, path, "POST");
    } else if (!frames && method != "DELETE") {
      r.refusal = method_not_allowed(method, path, "DELETE");
    }
    return r;
  }
  if (!seg.empty() && seg[0] == "v2") return route_v2(method, path, seg);
  if (seg.size() >= 2 && seg.size() <= 3 && seg[0] == "v1" && seg[1] == "handoff" && (seg.size() == 2 || seg[2] == "owner")) {
    r.name = "handoff";
    if (seg.size() == 2) {
      r.id = RouteId::kHandoff;
      if (method != "POST") r.refusal = method_not_allowed(method, path, "POST");
    } else {
      r.id = RouteId::kHandoffOwner;
      read_only(r, method, path);
    }
    return r;
  }
  r.refusal = not_found(method, path);
  return r;
}

std::string route_name(const std::string& path) { return route_request("GET", path).name; }

}  // namespace bev::server
