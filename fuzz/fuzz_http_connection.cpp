// libFuzzer target: bytes on one connection through the server's whole request path without
// sockets or a model — HttpConnection (Beast's parser, our limits, the in-flight budget,
// pipelining, 100-continue), the router, and for a frame POST the body parser of
// fuzz_server_request. Input: one byte choosing how the bytes are split into reads (the parser
// must give the same answers however they arrive), then the bytes. Every request gets exactly
// one answer, in order, each a well-formed head; a refusal ends the connection; every leased
// byte is given back.
#include <cstdint>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/frame_request.h"
#include "server/http_connection.h"
#include "server/router.h"

namespace {

using bev::server::HttpConnection;
using bev::server::HttpResponse;

HttpResponse answer(bev::server::HttpRequest& req) {
  const bev::server::Route route = bev::server::route_request(req.method, req.path);
  if (route.refusal) return *route.refusal;
  if (route.id != bev::server::RouteId::kFrames) return {};
  bev::server::RequestLimits limits;
  limits.max_parts = 16;
  try {
    bev::server::parse_frame_request(route.stream, req.content_type, std::move(req.body), limits);
  } catch (const bev::server::ApiError& e) {
    if (e.status() < 400 || e.status() > 499 || std::string_view(e.what()).empty()) __builtin_trap();
    return bev::server::error_response(e);
  }
  return {};
}

void check_head(const std::string& head, const HttpResponse& r) {
  if (head.rfind("HTTP/1.1 " + std::to_string(r.status) + " ", 0) != 0) __builtin_trap();
  if (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0) __builtin_trap();
  if (head.find("\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n") == std::string::npos) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunk = 1 + data[0] % 64 * (data[0] >= 128 ? 97 : 1);
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  bev::server::MemoryBudget budget(1 << 20);
  bev::server::HttpLimits limits;
  limits.max_header_bytes = 2048;
  limits.max_body_bytes = 1 << 19;
  {
    HttpConnection conn(limits, &budget);
    bool refused = false;
    for (size_t at = 0; at < bytes.size() && !refused; at += chunk) {
      conn.received(bytes.substr(at, chunk));
      for (bool more = true; more && !refused;) {
        switch (conn.advance()) {
          case HttpConnection::Step::kRead: more = false; break;
          case HttpConnection::Step::kContinue: break;
          case HttpConnection::Step::kHandle: {
            bev::server::HttpRequest req = conn.take_request();
            if (req.lease.held() != req.body.size()) __builtin_trap();
            const HttpResponse r = answer(req);
            bool close = false, with_body = true;
            check_head(conn.head(r, false, &close, &with_body), r);
            if (with_body != (req.method != "HEAD")) __builtin_trap();
            refused = close;  // the client asked to close (or spoke HTTP/1.0): nothing more is read
            break;
          }
          case HttpConnection::Step::kRefuse: {
            const HttpResponse& r = conn.refusal();
            if (r.status < 400 || r.status > 599 || bev::server::error_kind_of(r).empty()) __builtin_trap();
            bool close = false, with_body = true;
            check_head(conn.head(r, false, &close, &with_body), r);
            if (!close) __builtin_trap();
            refused = true;
            break;
          }
        }
      }
    }
    if (!refused && conn.mid_request()) {
      const auto r = conn.stop_reading(false, 30);
      if (!r || r->status != 408) __builtin_trap();
    }
  }
  if (budget.in_use() != 0) __builtin_trap();
  return 0;
}
