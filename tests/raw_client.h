// A raw HTTP/1.1 client connection for hostile-input tests: it sends exactly the bytes a test
// writes (malformed, pipelined, dripped) and reads answers one at a time, so a test sees what a
// client library would hide (two answers in one read, a close with no answer, a reset).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>

namespace bev::server {

struct RawAnswer {
  int status = 0;  // 0: the connection closed (or the wait ran out) before a whole answer came
  std::string head, body;
  std::string header(const std::string& name) const {
    const size_t at = head.find("\r\n" + name + ": ");
    if (at == std::string::npos) return "";
    const size_t from = at + name.size() + 4;
    return head.substr(from, head.find("\r\n", from) - from);
  }
};

class RawConn {
 public:
  explicit RawConn(int port, int timeout_seconds = 30) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return;
    timeval tv{timeout_seconds, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) close();
  }
  ~RawConn() { close(); }
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;

  bool connected() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // All of `bytes` handed to the kernel; false when the server closed or reset first.
  bool send(std::string_view bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Bytes have arrived (or the peer closed) within `ms`.
  bool readable(int ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, ms) > 0;
  }

  // The next answer; `head_only` for an answer to HEAD (its Content-Length has no body behind it).
  RawAnswer answer(bool head_only = false) {
    RawAnswer a;
    size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return a;
    }
    a.head = in_.substr(0, end + 2);
    in_.erase(0, end + 4);
    if (a.head.rfind("HTTP/1.1 ", 0) != 0 || a.head.size() < 12) return a;
    const std::string length = a.header("Content-Length");
    const size_t n = head_only || length.empty() ? 0 : std::stoul(length);
    while (in_.size() < n) {
      if (!fill()) return a;
    }
    a.body = in_.substr(0, n);
    in_.erase(0, n);
    a.status = std::stoi(a.head.substr(9, 3));
    return a;
  }

  // The server closed the connection (EOF or reset) with nothing more to read.
  bool closed_by_server() { return in_.empty() && !fill(); }

 private:
  bool fill() {
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string in_;
};

}  // namespace bev::server
