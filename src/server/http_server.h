// The socket side of the API on cpp-httplib: accepts connections on a thread pool, enforces the
// limits that must be checked before a body is read (header size, body size, encodings), turns
// each request into an HttpRequest for Service::handle and writes its response back.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/service.h"

namespace bev::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (port() tells which)
  size_t max_header_bytes = 16384; // request line excluded; past it: 431
  size_t threads = 64;             // connections served at once (each waits for its frame)
  int read_timeout_seconds = 10;   // a client that stops sending mid-request is dropped
};

class HttpServer {
 public:
  HttpServer(Service& service, HttpOptions options);
  ~HttpServer();

  // Binds the socket (throws Error(kIo) when it cannot); returns the port.
  int bind();
  int port() const { return port_; }
  // Serves until shutdown(); returns after every accepted connection was answered.
  void run();
  // Graceful stop: new frames are refused (503), the listening socket closes, accepted requests
  // finish, then run() returns. Safe from any thread, more than once.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Service& service_;
  HttpOptions options_;
  int port_ = -1;
};

}  // namespace bev::server
