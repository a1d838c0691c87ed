// A minimal blocking HTTP/1.1 client for the server's own calls to its balancer (the drain's
// probes and history handoffs, fleet.h): one request per connection, a deadline on every
// socket operation, Boost.Beast's parser for the answer, a bounded answer body.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bev::server {

struct ClientAnswer {
  int status = 0;     // 0: no answer (error says why: unreachable, reset, timed out, malformed)
  std::string body;
  std::string error;
};

// `base_url`: http://HOST:PORT (IPv4/IPv6 literal or a name). Never throws.
ClientAnswer http_call(const std::string& base_url, const std::string& method, const std::string& target,
                       const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                       double timeout_seconds);

// Splits http://HOST:PORT; false (with *error) for anything else (https, a path, no port).
bool parse_base_url(const std::string& url, std::string* host, std::string* port, std::string* error);

}  // namespace bev::server
