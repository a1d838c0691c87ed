#include "server/http_connection.h"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>

#include "server/api_error.h"
#include "server/router.h"

namespace bev::server {
namespace {

namespace http = boost::beast::http;
using boost::beast::iequals;

std::string text(boost::beast::string_view s) { return std::string(s.data(), s.size()); }

HttpResponse malformed(const std::string& message) { return error_response(400, "malformed_request", message); }

// origin-form "/a/b?q" -> "/a/b"; absolute-form "http://host/a?q" -> "/a" (RFC 9112 3.2.2: a
// server must accept it); anything else (authority-form, "*") is kept and routes nowhere.
std::string path_of(std::string_view target) {
  if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0) {
    const size_t slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  return std::string(target.substr(0, std::min(target.find('?'), target.find('#'))));
}

}  // namespace

struct HttpConnection::Parser {
  http::request_parser<http::string_body> p;
};

HttpConnection::HttpConnection(HttpLimits limits, MemoryBudget* budget)
    : limits_(limits), budget_(budget), lease_(budget) {}

HttpConnection::~HttpConnection() = default;

void HttpConnection::received(std::string_view bytes) { in_.append(bytes); }

bool HttpConnection::mid_request() const { return !refused_ && (!in_.empty() || parser_ != nullptr); }

HttpConnection::Step HttpConnection::refuse(HttpResponse r) {
  refused_ = true;
  keep_alive_ = false;
  refusal_ = std::move(r);
  parser_.reset();
  in_.clear();
  lease_.resize(0);
  return Step::kRefuse;
}

HttpConnection::Step HttpConnection::advance() {
  if (refused_) return Step::kRefuse;
  if (!parser_) {
    if (in_.empty()) return Step::kRead;
    parser_ = std::make_unique<Parser>();
    parser_->p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(limits_.max_header_bytes, UINT32_MAX)));
    parser_->p.body_limit(boost::none);  // header_done() compares Content-Length with the limit itself
    parser_->p.eager(false);             // stop after the header: limits and budget come before the body
    head_request_ = false;
    body_started_ = false;
    header_bytes_ = 0;
    continue_sent_ = false;
    route_ = "other";
  }
  http::request_parser<http::string_body>& p = parser_->p;
  while (!p.is_done()) {
    if (in_.empty()) return Step::kRead;
    boost::beast::error_code ec;
    const size_t used = p.put(boost::asio::buffer(in_.data(), in_.size()), ec);
    in_.erase(0, used);
    // Beast consumes the request line and whole field lines as they complete, and its own limit
    // does not count what earlier calls consumed: the header's size is counted here.
    if (!body_started_) header_bytes_ += used;
    if (ec == http::error::need_more) {
      if (!body_started_ && header_bytes_ + in_.size() > limits_.max_header_bytes) return refuse(header_too_large());
      return Step::kRead;
    }
    if (ec == http::error::header_limit) return refuse(header_too_large());
    if (ec) return refuse(malformed("the request cannot be parsed (RFC 9112): " + ec.message()));
    if (p.is_header_done() && !body_started_) {
      if (header_bytes_ > limits_.max_header_bytes) return refuse(header_too_large());
      body_started_ = true;
      const Step s = header_done();
      if (s != Step::kRead) return s;
    }
  }
  return Step::kHandle;
}

// Nothing consumed yet means the request line itself never ended within the limit.
HttpResponse HttpConnection::header_too_large() {
  const std::string limit = std::to_string(limits_.max_header_bytes);
  if (header_bytes_ == 0) return error_response(414, "uri_too_long", "the request line is over " + limit + " bytes");
  const auto target = parser_->p.get().target();  // the request line was parsed: name the route
  route_ = route_name(path_of(std::string_view(target.data(), target.size())));
  return error_response(431, "headers_too_large",
                        "the request line and headers are over " + limit + " bytes; this server takes at most " + limit);
}

HttpConnection::Step HttpConnection::header_done() {
  http::request_parser<http::string_body>& p = parser_->p;
  const auto& req = p.get();
  path_ = path_of(std::string_view(req.target().data(), req.target().size()));
  route_ = route_name(path_);
  head_request_ = req.method() == http::verb::head;
  keep_alive_ = req.keep_alive();
  version_ = req.version();
  if (req.version() >= 11 && req.count(http::field::host) != 1) {
    return refuse(malformed("an HTTP/1.1 request needs exactly one Host header (RFC 9112 3.2)"));
  }
  if (req.count(http::field::content_length) > 1) {
    return refuse(malformed("the request has more than one Content-Length header"));
  }
  // A chunked body would arrive without a size to check or lease first.
  if (req.count(http::field::transfer_encoding) > 0) {
    return refuse(error_response(411, "length_required", "chunked bodies (Transfer-Encoding) are not accepted; send a Content-Length"));
  }
  if (const auto it = req.find(http::field::content_encoding); it != req.end() && !iequals(it->value(), "identity")) {
    return refuse(error_response(415, "unsupported_encoding", "Content-Encoding '" + text(it->value()).substr(0, 100) +
                                                                  "' is not accepted; send the body uncompressed"));
  }
  bool want_continue = false;
  if (const auto it = req.find(http::field::expect); it != req.end()) {
    if (!iequals(it->value(), "100-continue")) {
      return refuse(error_response(417, "expectation_failed",
                                   "Expect '" + text(it->value()).substr(0, 100) + "' is not supported (only 100-continue)"));
    }
    want_continue = true;
  }
  const uint64_t length = p.content_length().value_or(0);
  if (length > limits_.max_body_bytes) {
    return refuse(error_response(413, "body_too_large", "the body is " + std::to_string(length) +
                                                            " bytes; this server takes at most " +
                                                            std::to_string(limits_.max_body_bytes)));
  }
  if (!lease_.resize(static_cast<size_t>(length))) {
    HttpResponse r = error_response(
        503, "busy",
        "the server already holds " + std::to_string(budget_ ? budget_->in_use() >> 20 : 0) + " MiB of requests (--max-inflight-mb " +
            std::to_string(budget_ ? budget_->capacity() >> 20 : 0) + "); retry after the Retry-After seconds");
    r.headers.emplace_back("Retry-After", "1");
    return refuse(std::move(r));
  }
  p.eager(true);
  if (want_continue && length > 0 && in_.empty() && !continue_sent_) {
    continue_sent_ = true;
    return Step::kContinue;
  }
  return Step::kRead;
}

HttpRequest HttpConnection::take_request() {
  auto& req = parser_->p.get();
  HttpRequest r;
  r.method = text(req.method_string());
  r.path = std::move(path_);
  r.content_type = text(req[http::field::content_type]);
  r.body = std::move(req.body());
  for (const auto& field : req) r.headers.emplace_back(text(field.name_string()), text(field.value()));
  r.lease = std::move(lease_);
  lease_ = MemoryLease(budget_);
  parser_.reset();
  return r;
}

std::string HttpConnection::head(const HttpResponse& r, bool closing, bool* close, bool* with_body) const {
  *close = closing || refused_ || !keep_alive_;
  *with_body = !head_request_;
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(r.status)));
  std::string h = "HTTP/1.1 " + std::to_string(r.status) + " " + text(reason) + "\r\n";
  h += "Content-Type: " + r.content_type + "\r\n";
  h += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  for (const auto& [k, v] : r.headers) h += k + ": " + v + "\r\n";
  if (*close) {
    h += "Connection: close\r\n";
  } else if (version_ < 11) {
    h += "Connection: keep-alive\r\n";
  }
  h += "\r\n";
  return h;
}

std::optional<HttpResponse> HttpConnection::stop_reading(bool shutting_down, double deadline_seconds) {
  if (!mid_request()) {
    refused_ = true;
    return std::nullopt;
  }
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", deadline_seconds);
  refuse(shutting_down ? error_response(503, "shutting_down", "the server is shutting down; the request had not arrived whole")
                       : error_response(408, "request_timeout",
                                        std::string("the request did not arrive whole within ") + limit + " s (--read-timeout)"));
  return refusal_;
}

}  // namespace bev::server
