// The socket side of the API on Boost.Asio: an accept loop and one session per connection on a
// few I/O threads, each request's protocol in HttpConnection (Beast's parser with our limits), and
// Service::handle on a separate pool of handler threads, so a slow or silent client holds a
// connection slot and a bounded buffer but never a thread. Every connection runs under a deadline:
// a request must arrive whole (headers and body) within read_timeout_seconds and its answer be
// taken within the same time, or the connection is answered 408 (when a request had begun) and
// closed. Refusals before a body is read close the connection gracefully (lingering: the unread
// bytes are drained for a moment) so the client sees the answer rather than a reset.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/service.h"

namespace bev::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (port() tells which)
  size_t max_header_bytes = 16384;      // request line and header fields; past it: 431 (414: the line alone)
  size_t threads = 64;                  // requests handled at once (a frame request holds one until answered)
  size_t max_connections = 1024;        // open at once; past it a new connection is answered 503 and closed
  double read_timeout_seconds = 30;     // to send a whole request, and to take its answer; also the keep-alive idle time
  double shutdown_grace_seconds = 1;    // after shutdown(): how long a connection may still complete a request
  int backlog = 4096;                   // listen(2) backlog (the kernel caps it at net.core.somaxconn)
  size_t io_threads = 2;                // threads moving bytes (they never run the model)
};

class HttpServer {
 public:
  HttpServer(Service& service, HttpOptions options);
  ~HttpServer();

  // Binds the socket (throws Error(kIo) when it cannot: a port already in use is never shared);
  // returns the port.
  int bind();
  int port() const { return port_; }
  // Serves until shutdown(); returns after every connection was answered and closed.
  void run();
  // Graceful stop: new frames are refused (503); the listening socket stays open while connections
  // are (at most shutdown_grace_seconds), so clients connecting meanwhile are answered 503, not
  // reset, then it closes after accepting what is queued in its backlog; requests that arrive
  // whole within shutdown_grace_seconds are answered (frames already accepted run to their end),
  // every answer says Connection: close, then run() returns. Safe from any thread, more than once.
  void shutdown();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  int port_ = -1;
};

}  // namespace bev::server
