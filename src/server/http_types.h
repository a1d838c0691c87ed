// The server's view of one HTTP exchange, independent of the socket library: the HTTP layer
// (http_server.cpp) fills an HttpRequest and writes back an HttpResponse, so routing, parsing
// and error mapping (service.h) run — and are tested and fuzzed — without sockets.
#pragma once

#include <cctype>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/memory_budget.h"

namespace bev::server {

struct HttpRequest {
  std::string method;        // "GET", "HEAD", "POST", "DELETE", ...
  std::string path;          // without the query string
  std::string content_type;  // the Content-Type header as sent ("" when absent)
  std::string body;
  MemoryLease lease;         // holds body.size() from the in-flight budget (the service may grow it)
  // Every header field as sent, in order (the Open Inference Protocol's
  // Inference-Header-Content-Length, the fleet's X-Handoff-From).
  std::vector<std::pair<std::string, std::string>> headers;

  // The first field named `name` (ASCII case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (k.size() != name.size()) continue;
      bool same = true;
      for (size_t i = 0; i < k.size() && same; ++i) {
        same = std::tolower(static_cast<unsigned char>(k[i])) == std::tolower(static_cast<unsigned char>(name[i]));
      }
      if (same) return &v;
    }
    return nullptr;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After, Allow, ...)
};

}  // namespace bev::server
