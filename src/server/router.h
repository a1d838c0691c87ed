// Which route a method and path name, with no model and no sockets: the service dispatches on it,
// the HTTP layer names refusals by it in the metrics, and the connection fuzz target drives it.
//
//   POST   /v1/streams/{id}/frames   GET|HEAD /v1/streams   DELETE /v1/streams/{id}
//   GET|HEAD /v1/model   GET|HEAD /healthz   GET|HEAD /metrics
#pragma once

#include <optional>
#include <string>

#include "server/http_types.h"

namespace bev::server {

enum class RouteId { kHealthz, kMetrics, kModel, kStreams, kStream, kFrames, kNone };

struct Route {
  RouteId id = RouteId::kNone;
  std::string name = "other";           // the metrics label: frames, stream, streams, model, healthz, metrics, other
  std::string stream;                   // {id} of kStream and kFrames
  std::optional<HttpResponse> refusal;  // 404, 405 (with Allow) or 400 invalid_stream_id: answer it as is
};

Route route_request(const std::string& method, const std::string& path);

// The metrics label of a path whatever the method ("other" for no route).
std::string route_name(const std::string& path);

}  // namespace bev::server
