// One HTTP/1.1 connection's protocol, without sockets: bytes in, requests and response heads out.
// The request parser is Boost.Beast's (strict RFC 9112 framing: a malformed Content-Length, two
// different ones, a field line without a colon, an obsolete version are errors); this class adds
// the server's policy on top — limits checked before a body is read, the in-flight memory budget,
// keep-alive, pipelining (bytes after one request stay buffered for the next), HEAD, and
// Expect: 100-continue — so the socket layer (http_server.cpp) only moves bytes and keeps time,
// and fuzz/fuzz_http_connection.cpp drives exactly this code.
//
// Memory: at most max_header_bytes plus one read's bytes are buffered before a request's header
// is complete; a body is read only once its Content-Length is within max_body_bytes and leased
// from the budget.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/http_types.h"
#include "server/memory_budget.h"

namespace bev::server {

struct HttpLimits {
  size_t max_header_bytes = 16384;   // request line and header fields; past it 431 (414 for the line alone)
  size_t max_body_bytes = 64u << 20;  // Content-Length; past it 413 before the body is read
};

class HttpConnection {
 public:
  enum class Step {
    kRead,      // more bytes are needed
    kContinue,  // write continue_bytes() (the client waits for it before sending its body), then advance()
    kHandle,    // a whole request: take_request(), then write head() of its answer and the answer's body
    kRefuse,    // refused before it was read whole: write head(refusal()) and its body, then close
  };

  HttpConnection(HttpLimits limits, MemoryBudget* budget);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void received(std::string_view bytes);
  Step advance();
  HttpRequest take_request();
  const HttpResponse& refusal() const { return refusal_; }
  // The metrics label of the request being read or refused ("other" before its path is known).
  const std::string& route() const { return route_; }
  static std::string_view continue_bytes() { return "HTTP/1.1 100 Continue\r\n\r\n"; }

  // The status line and header fields of the answer to the last request (or the refusal).
  // `closing`: the server is going away, so the connection closes after this answer whatever the
  // client asked. Sets *close when it does; *with_body is false for HEAD, whose answer is the
  // GET answer's header alone (its Content-Length included).
  std::string head(const HttpResponse& r, bool closing, bool* close, bool* with_body) const;

  // The read deadline passed (or the server is shutting down): the answer to send before
  // closing when a request had begun (408, or 503 when shutting down); nullopt when the
  // connection was idle between requests.
  std::optional<HttpResponse> stop_reading(bool shutting_down, double deadline_seconds);

  // Refuses the connection before any request is read (the server is at its connection limit).
  Step refuse(HttpResponse r);

  bool mid_request() const;  // some bytes of a request have arrived and it is not whole yet
  size_t buffered() const { return in_.size(); }

 private:
  struct Parser;
  Step header_done();
  HttpResponse header_too_large();

  HttpLimits limits_;
  MemoryBudget* budget_;
  std::string in_;  // received, not yet consumed by the parser
  std::unique_ptr<Parser> parser_;
  MemoryLease lease_;
  HttpResponse refusal_;
  std::string route_ = "other";
  std::string path_;
  unsigned version_ = 11;
  bool head_request_ = false;
  bool keep_alive_ = true;
  bool refused_ = false;
  bool body_started_ = false;
  size_t header_bytes_ = 0;  // of the current request, consumed by the parser
  bool continue_sent_ = false;
};

}  // namespace bev::server
