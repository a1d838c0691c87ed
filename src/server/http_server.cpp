#include "server/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio.hpp>

#include "bevformer/error.h"
#include "server/api_error.h"
#include "server/http_connection.h"

namespace bev::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(s, 0.0)));
}

// How long a connection answered with "close" keeps draining what the client still sends, so it
// reads the answer instead of a reset (RFC 9112 9.6).
constexpr double kLingerSeconds = 2;

class Session;

}  // namespace

struct HttpServer::Impl {
  Impl(Service& s, HttpOptions o)
      : service(s), options(std::move(o)), handlers(std::max<size_t>(options.threads, 1)) {
    limits.max_header_bytes = options.max_header_bytes;
    limits.max_body_bytes = service.options().max_body_bytes;
  }

  void accept();
  void on_accept(const boost::system::error_code& ec, tcp::socket socket);
  void start_session(tcp::socket socket);
  void watch_close();
  void close_listener();

  Service& service;
  const HttpOptions options;
  HttpLimits limits;
  // Before ioc, so destroyed after it: a handler still queued when run() has returned (shutdown()
  // posts each session's on_shutdown, and run() may finish its last work before the post) holds
  // its session, and ~io_context destroys it, whose destructor takes mu and leaves `sessions`.
  std::mutex mu;  // guards sessions
  std::list<std::weak_ptr<Session>> sessions;
  asio::io_context ioc;
  asio::strand<asio::io_context::executor_type> accept_strand{asio::make_strand(ioc)};
  tcp::acceptor acceptor{accept_strand};
  asio::steady_timer accept_retry{accept_strand};
  // After shutdown() the listener stays open while connections are (up to shutdown_grace_seconds
  // after it began): closing a listening socket resets every connection the kernel completed
  // after our last accept, with its request possibly sent, and during a drain under load clients
  // are still connecting. Open, it answers them 503; the reset's window moves to when the server
  // is idle.
  asio::steady_timer close_watch{accept_strand};
  Clock::time_point close_by{};
  asio::thread_pool handlers;
  std::atomic<bool> closing{false};
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl& server, tcp::socket socket)
      : srv_(server),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        conn_(server.limits, &server.service.memory()) {}

  ~Session() {
    std::lock_guard lock(srv_.mu);
    srv_.sessions.erase(self_);
  }

  void registered(std::list<std::weak_ptr<Session>>::iterator it) { self_ = it; }
  asio::any_io_executor executor() { return socket_.get_executor(); }

  void start(bool over_capacity) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    if (over_capacity) {
      HttpResponse r = error_response(503, "busy", "the server has " + std::to_string(srv_.options.max_connections) +
                                                       " connections open (its limit); retry after the Retry-After seconds");
      r.headers.emplace_back("Retry-After", "1");
      conn_.refuse(r);
      refused(std::move(r));
      return;
    }
    read_from(Clock::now());
  }

  // The server stops: a connection between requests (or inside one) gets the grace period at most.
  void on_shutdown() {
    if (state_ != State::kReading) return;
    set_deadline(std::min(deadline_, Clock::now() + seconds(srv_.options.shutdown_grace_seconds)));
  }

 private:
  enum class State { kReading, kHandling, kWriting, kLingering, kDone };

  void read_from(Clock::time_point now) {
    Clock::duration allowed = seconds(srv_.options.read_timeout_seconds);
    if (srv_.closing) allowed = std::min(allowed, seconds(srv_.options.shutdown_grace_seconds));
    set_deadline(now + allowed);
    step();
  }

  void set_deadline(Clock::time_point t) {
    deadline_ = t;
    deadline_passed_ = false;
    timer_.expires_at(t);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->on_timer();
    });
  }

  void on_timer() {
    if (Clock::now() < deadline_) return;  // re-armed meanwhile: a newer wait is pending
    switch (state_) {
      case State::kReading: {
        // The pending read completes (cancelled, or with bytes that arrived just in time: a
        // request they complete is still answered) and step() stops reading after it.
        deadline_passed_ = true;
        boost::system::error_code ec;
        socket_.cancel(ec);
        return;
      }
      case State::kHandling: return;  // the service answers within its own --timeout
      case State::kWriting:
      case State::kLingering: finish(); return;
      case State::kDone: return;
    }
  }

  void step() {
    switch (conn_.advance()) {
      case HttpConnection::Step::kRead:
        if (deadline_passed_) return stop_reading();
        read();
        return;
      case HttpConnection::Step::kContinue: write_continue(); return;
      case HttpConnection::Step::kHandle: handle(conn_.take_request()); return;
      case HttpConnection::Step::kRefuse: refused(conn_.refusal()); return;
    }
  }

  void read() {
    state_ = State::kReading;
    socket_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
      if (self->state_ != State::kReading) return;
      if (ec && !(ec == asio::error::operation_aborted && self->deadline_passed_)) {
        // The client closed or the socket failed: nobody is left to answer.
        self->finish();
        return;
      }
      if (!ec) self->conn_.received(std::string_view(self->buf_.data(), n));
      self->step();
    });
  }

  // The deadline passed with no whole request: a request that had begun is answered (408, or
  // 503 when shutting down); a connection idle between requests is closed.
  void stop_reading() {
    const std::optional<HttpResponse> r = conn_.stop_reading(srv_.closing, srv_.options.read_timeout_seconds);
    if (r) return refused(*r);
    finish();
  }

  void write_continue() {
    state_ = State::kWriting;
    asio::async_write(socket_, asio::buffer(HttpConnection::continue_bytes().data(), HttpConnection::continue_bytes().size()),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        if (self->state_ != State::kWriting) return;
                        if (ec) return self->finish();
                        self->state_ = State::kReading;
                        self->step();
                      });
  }

  // The service runs on the handler pool: a frame request blocks there until it is answered.
  void handle(HttpRequest request) {
    state_ = State::kHandling;
    auto work = asio::make_work_guard(socket_.get_executor());  // keeps run() going meanwhile
    asio::post(srv_.handlers, [self = shared_from_this(), request = std::move(request), work = std::move(work)]() mutable {
      HttpResponse r = self->srv_.service.handle(std::move(request));
      asio::post(self->socket_.get_executor(), [self, r = std::move(r)]() mutable { self->write(std::move(r)); });
    });
  }

  // An answer the HTTP layer made itself (the service never saw the request): counted here.
  void refused(HttpResponse r) {
    srv_.service.count_refusal(conn_.route(), r);
    write(std::move(r));
  }

  void write(HttpResponse r) {
    state_ = State::kWriting;
    response_ = std::move(r);
    bool with_body = true;
    head_ = conn_.head(response_, srv_.closing, &close_after_, &with_body);
    set_deadline(Clock::now() + seconds(srv_.options.read_timeout_seconds));
    const std::array<asio::const_buffer, 2> bufs = {asio::buffer(head_),
                                                    with_body ? asio::buffer(response_.body) : asio::const_buffer()};
    asio::async_write(socket_, bufs, [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      if (self->state_ != State::kWriting) return;
      self->response_ = {};
      if (ec) return self->finish();
      if (self->close_after_) return self->linger();
      self->read_from(Clock::now());
    });
  }

  void linger() {
    state_ = State::kLingering;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    set_deadline(Clock::now() + seconds(std::min(kLingerSeconds, srv_.options.read_timeout_seconds)));
    drain();
  }

  void drain() {
    socket_.async_read_some(asio::buffer(buf_), [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      if (self->state_ != State::kLingering) return;
      if (ec) return self->finish();
      self->drain();
    });
  }

  void finish() {
    state_ = State::kDone;
    boost::system::error_code ec;
    timer_.cancel();
    socket_.close(ec);
  }

  HttpServer::Impl& srv_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  HttpConnection conn_;
  std::array<char, 16384> buf_{};
  State state_ = State::kReading;
  Clock::time_point deadline_{};
  HttpResponse response_;  // kept while it is written
  std::string head_;
  bool close_after_ = false;
  bool deadline_passed_ = false;  // while reading: stop once the pending read completes
  std::list<std::weak_ptr<Session>>::iterator self_;
};

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](const boost::system::error_code& ec, tcp::socket socket) {
    on_accept(ec, std::move(socket));
  });
}

void HttpServer::Impl::on_accept(const boost::system::error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted) return;
  if (ec) {
    if (!acceptor.is_open()) return;
    // Out of descriptors or buffers: retrying at once would spin; connections wait in the backlog.
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](const boost::system::error_code& e) {
      if (!e && acceptor.is_open()) accept();
    });
    return;
  }
  // Served even when the listener closed meanwhile: this connection was accepted before it did.
  // While shutting down too (see close_watch): its request is answered 503.
  start_session(std::move(socket));
  if (acceptor.is_open()) accept();
}

void HttpServer::Impl::start_session(tcp::socket socket) {
  auto session = std::make_shared<Session>(*this, std::move(socket));
  bool over_capacity = false;
  {
    std::lock_guard lock(mu);
    over_capacity = sessions.size() >= options.max_connections;
    sessions.push_front(session);
    session->registered(sessions.begin());
  }
  asio::dispatch(session->executor(), [session, over_capacity] { session->start(over_capacity); });
}

// On the accept strand, from shutdown(): every 5 ms until no connection is open or the grace has
// passed. (A session's destructor could say when the last one closes, but it may run inside
// ~io_context, where posting is not safe.)
void HttpServer::Impl::watch_close() {
  bool idle = false;
  {
    std::lock_guard lock(mu);
    idle = sessions.empty();
  }
  if (idle || Clock::now() >= close_by || !acceptor.is_open()) return close_listener();
  close_watch.expires_after(std::chrono::milliseconds(5));
  close_watch.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) watch_close();
  });
}

void HttpServer::Impl::close_listener() {
  boost::system::error_code ec;
  close_watch.cancel();
  acceptor.cancel(ec);
  accept_retry.cancel();
  // Connections the kernel completed but we have not accepted would be reset by close(): their
  // requests may already be sent. Accept them (they get the shutdown answers) before closing.
  if (acceptor.is_open()) {
    acceptor.non_blocking(true, ec);
    while (!ec) {
      tcp::socket s(asio::make_strand(ioc));
      acceptor.accept(s, ec);
      if (!ec) start_session(std::move(s));
    }
  }
  acceptor.close(ec);
}

HttpServer::HttpServer(Service& service, HttpOptions options)
    : impl_(std::make_shared<Impl>(service, std::move(options))) {}

HttpServer::~HttpServer() {
  shutdown();
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  impl_->handlers.join();
}

int HttpServer::bind() {
  Impl& s = *impl_;
  const std::string where = s.options.host + ":" + std::to_string(s.options.port);
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(s.options.host, ec);
  if (ec) {
    tcp::resolver resolver(s.ioc);
    const auto found = resolver.resolve(s.options.host, "", ec);
    if (ec || found.empty()) {
      throw Error(ErrorKind::kInvalidInput, "cannot resolve the host '" + s.options.host + "': " + ec.message());
    }
    address = found.begin()->endpoint().address();
  }
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(s.options.port));
  // SO_REUSEADDR only (a restart may bind while old connections sit in TIME_WAIT); never
  // SO_REUSEPORT, which would let a second server share the port and split the streams.
  if (s.acceptor.open(endpoint.protocol(), ec) || s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec) ||
      s.acceptor.bind(endpoint, ec) || s.acceptor.listen(s.options.backlog, ec)) {
    s.acceptor.close();
    throw Error(ErrorKind::kIo, "cannot listen on " + where + ": " + ec.message())
        .hint(ec == asio::error::address_in_use ? "another server listens there; --port 0 picks a free port" : "");
  }
  port_ = s.acceptor.local_endpoint().port();
  return port_;
}

void HttpServer::run() {
  Impl& s = *impl_;
  asio::post(s.accept_strand, [&s] {
    if (!s.closing && s.acceptor.is_open()) s.accept();
  });
  std::vector<std::thread> extra;
  for (size_t i = 1; i < std::max<size_t>(s.options.io_threads, 1); ++i) extra.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (std::thread& t : extra) t.join();
}

void HttpServer::shutdown() {
  Impl& s = *impl_;
  s.service.begin_shutdown();
  if (s.closing.exchange(true)) return;
  asio::post(s.accept_strand, [&s] {
    s.close_by = Clock::now() + seconds(s.options.shutdown_grace_seconds);
    s.watch_close();
  });
  std::vector<std::shared_ptr<Session>> open;
  {
    // Collected first: the last reference to a session may drop here, and its destructor takes mu.
    std::lock_guard lock(s.mu);
    for (const std::weak_ptr<Session>& w : s.sessions) {
      if (auto session = w.lock()) open.push_back(std::move(session));
    }
  }
  for (const std::shared_ptr<Session>& session : open) {
    asio::post(session->executor(), [session] { session->on_shutdown(); });
  }
}

}  // namespace bev::server
