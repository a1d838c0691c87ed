// Which route a method and path name, with no model and no sockets: the service dispatches on it,
// the HTTP layer names refusals by it in the metrics, and the connection fuzz target drives it.
//
//   POST   /v1/streams/{id}/frames   GET|HEAD /v1/streams   DELETE /v1/streams/{id}
//   GET|HEAD /v1/model   GET|HEAD /healthz   GET|HEAD /metrics
// The Open Inference Protocol (v2, docs/API.md) and the fleet's handoff (docs/DEPLOY.md):
//   GET|HEAD /v2   /v2/health/live   /v2/health/ready
//   GET|HEAD /v2/models/{name}[/versions/{v}]   .../ready        POST .../infer
//   POST /v1/handoff   GET|HEAD /v1/handoff/owner
#pragma once

#include <optional>
#include <string>

#include "server/http_types.h"

namespace bev::server {

enum class RouteId {
  kHealthz, kMetrics, kModel, kStreams, kStream, kFrames,
  kV2Server, kV2Live, kV2Ready, kV2Model, kV2ModelReady, kV2Infer,
  kHandoff, kHandoffOwner,
  kNone
};

struct Route {
  RouteId id = RouteId::kNone;
  // The metrics label: frames, stream, streams, model, healthz, metrics, v2, v2_health, v2_model,
  // v2_infer, handoff, other.
  std::string name = "other";
  std::string stream;                   // {id} of kStream and kFrames
  std::string model, version;           // {name} and {v} of the v2 model routes ("" when no version)
  std::optional<HttpResponse> refusal;  // 404, 405 (with Allow) or 400 invalid_stream_id: answer it as is
};

Route route_request(const std::string& method, const std::string& path);

// The metrics label of a path whatever the method ("other" for no route).
std::string route_name(const std::string& path);

}  // namespace bev::server
