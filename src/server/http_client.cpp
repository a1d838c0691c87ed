#include "server/http_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <boost/beast/http.hpp>

namespace bev::server {
namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxAnswerBody = 16u << 20;

class Socket {
 public:
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd_ = -1;
};

// Milliseconds left before `deadline` (at least 1 while any remain).
int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

bool wait_for(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int ms = ms_left(deadline);
    if (ms == 0) return false;
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

bool parse_base_url(const std::string& url, std::string* host, std::string* port, std::string* error) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    *error = "'" + url + "' is not http://HOST:PORT";
    return false;
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    *error = "'" + url + "' has a path; give http://HOST:PORT only";
    return false;
  }
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 == rest.size()) {
    *error = "'" + url + "' has no port";
    return false;
  }
  *host = rest.substr(0, colon);
  *port = rest.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  if (host->empty() || port->find_first_not_of("0123456789") != std::string::npos) {
    *error = "'" + url + "' is not http://HOST:PORT";
    return false;
  }
  return true;
}

ClientAnswer http_call(const std::string& base_url, const std::string& method, const std::string& target,
                       const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                       double timeout_seconds) {
  ClientAnswer out;
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  std::string host, port;
  if (!parse_base_url(base_url, &host, &port, &out.error)) return out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    out.error = "cannot resolve " + host + ": " + gai_strerror(rc);
    return out;
  }
  Socket s;
  for (addrinfo* a = found; a && s.fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 || (errno == EINPROGRESS && wait_for(fd, POLLOUT, deadline))) {
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        s.fd_ = fd;
        break;
      }
      out.error = std::string("cannot connect: ") + std::strerror(err);
    } else {
      out.error = std::string("cannot connect: ") + (errno == EINPROGRESS ? "timed out" : std::strerror(errno));
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (s.fd_ < 0) {
    if (out.error.empty()) out.error = "cannot connect to " + base_url;
    return out;
  }
  std::string request = method + " " + target + " HTTP/1.1\r\nHost: " + host + ":" + port + "\r\nConnection: close\r\n";
  for (const auto& [k, v] : headers) request += k + ": " + v + "\r\n";
  request += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  request.append(body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(s.fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR) && wait_for(s.fd_, POLLOUT, deadline)) {
      continue;
    } else {
      out.error = "sending failed: " + std::string(n < 0 ? std::strerror(errno) : "closed");
      return out;
    }
  }
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxAnswerBody);
  parser.skip(method == "HEAD");
  // Beast consumes whole lines only and keeps nothing: what it leaves waits here for more bytes.
  std::string pending;
  char buf[16384];
  while (!parser.is_done()) {
    const ssize_t n = ::recv(s.fd_, buf, sizeof buf, 0);
    boost::beast::error_code ec;
    if (n > 0) {
      pending.append(buf, static_cast<size_t>(n));
      if (pending.size() > kMaxAnswerBody + 65536) {
        out.error = "the answer is too large";
        return out;
      }
      while (!pending.empty() && !parser.is_done()) {
        const size_t used = parser.put(boost::asio::buffer(pending.data(), pending.size()), ec);
        pending.erase(0, used);
        if (ec == http::error::need_more) break;
        if (ec) {
          out.error = "malformed answer: " + ec.message();
          return out;
        }
        if (used == 0) break;
      }
    } else if (n == 0) {
      parser.put_eof(ec);
      if (ec || !parser.is_done()) {
        out.error = "the connection closed before a whole answer";
        return out;
      }
    } else if ((errno == EAGAIN || errno == EINTR) && wait_for(s.fd_, POLLIN, deadline)) {
      continue;
    } else {
      out.error = errno == EAGAIN ? "timed out waiting for the answer" : std::string("receive failed: ") + std::strerror(errno);
      return out;
    }
  }
  out.status = static_cast<int>(parser.get().result_int());
  out.body = std::move(parser.get().body());
  return out;
}

}  // namespace bev::server
