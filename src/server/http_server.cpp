#include "server/http_server.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <httplib.h>

#include "bevformer/error.h"
#include "server/api_error.h"

namespace bev::server {
namespace {

// cpp-httplib 0.11 parses multipart/form-data bodies itself (and never fills Request::body for
// them); we rename the header before routing so every body reaches our own parser (the fuzzed
// one) in raw form, and read the original back from here.
constexpr const char* kOriginalContentType = "X-Bev-Original-Content-Type";

void write_back(const HttpResponse& r, httplib::Response& res) {
  res.status = r.status;
  for (const auto& [k, v] : r.headers) res.set_header(k, v);
  res.set_content(r.body, r.content_type);
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server http;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> running{false};  // inside run()
};

HttpServer::HttpServer(Service& service, HttpOptions options)
    : impl_(std::make_unique<Impl>()), service_(service), options_(std::move(options)) {
  httplib::Server& http = impl_->http;
  const size_t threads = options_.threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(service_.options().max_body_bytes);
  http.set_read_timeout(options_.read_timeout_seconds, 0);
  http.set_keep_alive_max_count(1000);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    size_t header_bytes = 0;
    for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
    if (header_bytes > options_.max_header_bytes) {
      write_back(error_response(431, "headers_too_large", "the request headers are " + std::to_string(header_bytes) +
                                                              " bytes; this server takes at most " +
                                                              std::to_string(options_.max_header_bytes)),
                 res);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.has_header("Content-Encoding") && req.get_header_value("Content-Encoding") != "identity") {
      write_back(error_response(415, "unsupported_encoding", "Content-Encoding '" + req.get_header_value("Content-Encoding") +
                                                                 "' is not accepted; send the body uncompressed"),
                 res);
      return httplib::Server::HandlerResponse::Handled;
    }
    // A chunked body would be read whole before the size check (httplib 0.11 applies its limit to
    // Content-Length only): ask for a length instead.
    if (req.has_header("Transfer-Encoding")) {
      write_back(error_response(411, "length_required", "chunked bodies are not accepted; send a Content-Length"), res);
      return httplib::Server::HandlerResponse::Handled;
    }
    // See kOriginalContentType. The Request is the server's own non-const object.
    auto& headers = const_cast<httplib::Request&>(req).headers;
    if (const auto it = headers.find("Content-Type"); it != headers.end()) {
      headers.emplace(kOriginalContentType, it->second);
      headers.erase(it);
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    r.content_type = req.get_header_value(kOriginalContentType);
    r.body = req.body;
    write_back(service_.handle(std::move(r)), res);
  };
  // Every path goes to the service, which routes (one place decides 404 vs 405).
  http.Get(".*", handler);
  http.Post(".*", handler);
  http.Delete(".*", handler);
  http.Put(".*", handler);
  http.Patch(".*", handler);

  // Errors httplib raises itself (413 past the body limit, 400 for an unparsable request, ...)
  // arrive here with an empty body: give them the JSON error shape too.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string kind = "malformed_request";
    std::string message = "the request line or headers could not be read (malformed, or a line over 8 KiB)";
    if (res.status == 413) {
      kind = "body_too_large";
      message = "the body is larger than this server takes (" + std::to_string(service_.options().max_body_bytes) + " bytes)";
    } else if (res.status == 414) {
      kind = "uri_too_long";
      message = "the request URI is too long";
    } else if (res.status == 404) {
      kind = "not_found";
      message = "no route for this method and path (see docs/API.md)";
    } else if (res.status != 400) {
      kind = "http_error";
      message = "the request was refused (HTTP " + std::to_string(res.status) + ")";
    }
    write_back(error_response(res.status, kind, message), res);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    write_back(error_response(500, "internal", "internal error: " + what), res);
  });
}

HttpServer::~HttpServer() { shutdown(); }

int HttpServer::bind() {
  httplib::Server& http = impl_->http;
  if (options_.port == 0) {
    port_ = http.bind_to_any_port(options_.host);
  } else {
    port_ = http.bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    throw Error(ErrorKind::kIo, "cannot listen on " + options_.host + ":" + std::to_string(options_.port))
        .hint("is the port in use? --port 0 picks a free one");
  }
  return port_;
}

void HttpServer::run() {
  impl_->running = true;
  if (!impl_->stop_requested) impl_->http.listen_after_bind();
  impl_->running = false;
}

void HttpServer::shutdown() {
  service_.begin_shutdown();
  impl_->stop_requested = true;
  // httplib's stop() does nothing before its accept loop has started: wait for it to start (or
  // for run() to see the request and return) so a stop right after run() is not lost.
  for (int i = 0; i < 2000 && impl_->running && !impl_->http.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->http.stop();
}

}  // namespace bev::server
