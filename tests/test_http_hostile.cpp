// Hostile clients against the HTTP layer over real sockets on 127.0.0.1 (docs/API.md, "Limits"):
// header floods, slow and silent clients, bursts of connections, pipelining, malformed framing,
// bodies and images over the limits, corrupt images, a second server on a busy port, shutdown
// with requests in every state. Each test names the defect class of issue 25 it keeps fixed.
#include <sys/resource.h>

#include <atomic>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "raw_client.h"
#include "server/api_error.h"
#include "server/http_connection.h"
#include "server_test_util.h"

namespace bev::server {
namespace {

std::string request(const std::string& method, const std::string& path, const std::string& body = "",
                    const std::string& extra_headers = "", const std::string& type = "application/json") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers;
  if (!body.empty() || method == "POST") r += "Content-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

std::string kind_of(const RawAnswer& a) {
  const json j = json::parse(a.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"].value("kind", "") : "";
}

// Resident memory of this process (the server runs in it), in MiB.
long rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  }
  return -1;
}

// One line of the server's /metrics ("name{labels} value"), or "" when absent.
std::string metric_line(Service& service, const std::string& prefix) {
  HttpRequest r;
  r.method = "GET";
  r.path = "/metrics";
  const std::string text = service.handle(std::move(r)).body;
  const size_t at = text.find("\n" + prefix);
  return at == std::string::npos ? "" : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}

uint32_t crc32_of(std::string_view bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (const char ch : bytes) {
    c ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string png_chunk(const std::string& type, const std::string& data) {
  return be32(static_cast<uint32_t>(data.size())) + type + data + be32(crc32_of(type + data));
}

// The frame with camera `cam`'s image replaced by `bytes` (inline base64).
std::string frame_with_image(const json& frame, size_t cam, const std::string& bytes) {
  json f = json::parse(json_body(frame));
  f["cameras"][cam]["image"] = {{"base64", base64_encode({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()})}};
  return f.dump();
}

// #1: one connection streaming header lines is answered 431 at 16 KiB and its bytes are dropped.
TEST(HttpHostile, HeaderFloodIsRefusedAtTheLimitWithBoundedMemory) {
  RunningServer server;
  const long before = rss_mib();
  RawConn c(server.port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  const std::string line = "X-Flood: " + std::string(8192, 'a') + "\r\n";
  size_t sent = 0;
  while (sent < (64u << 20) && c.send(line)) sent += line.size();
  const RawAnswer a = c.answer();
  EXPECT_EQ(a.status, 431) << a.head;
  EXPECT_EQ(kind_of(a), "headers_too_large") << a.body;
  EXPECT_LT(rss_mib() - before, 32) << "MiB grown after " << (sent >> 20) << " MiB of header lines";
  EXPECT_EQ(server.client()->Get("/healthz")->status, 200);
}

// #4: slow clients hold neither a handler thread nor the server past the whole-request deadline.
TEST(HttpHostile, SlowClientsStarveNothingAndAreCutAtTheDeadline) {
  HttpOptions ho;
  ho.threads = 2;
  ho.read_timeout_seconds = 2;
  RunningServer server({}, ho);
  constexpr int kSlow = 20;
  std::vector<std::unique_ptr<RawConn>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<RawConn>(server.port()));
    ASSERT_TRUE(slow.back()->send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  }
  // Every slow client drips a byte each 200 ms (an idle timeout per read would never fire).
  std::atomic<bool> dripping{true};
  std::thread drip([&] {
    for (int round = 0; round < 100 && dripping; ++round) {
      for (auto& c : slow) c->send("a");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  const auto health = server.client()->Get("/healthz");
  EXPECT_TRUE(health && health->status == 200) << "a healthy client was starved by " << kSlow << " slow ones";
  int timed_out = 0;
  for (auto& c : slow) {
    const RawAnswer a = c->answer();
    if (a.status == 408 && kind_of(a) == "request_timeout") ++timed_out;
  }
  dripping = false;
  drip.join();
  EXPECT_EQ(timed_out, kSlow);
}

// #4: a client dripping bytes does not hold a shutdown up until its deadline; it gets a 503.
TEST(HttpHostile, ShutdownCompletesWhileAClientDripsBytes) {
  RunningServer server;  // read timeout 30 s
  RawConn c(server.port());
  ASSERT_TRUE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "));
  std::atomic<bool> dripping{true};
  std::thread drip([&] {
    while (dripping && c.send("a")) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  auto stopped = std::async(std::launch::async, [&] { server.stop(); });
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "shutdown waited for the slow client";
  const RawAnswer a = c.answer();
  dripping = false;
  drip.join();
  stopped.wait();
  EXPECT_EQ(a.status, 503) << a.head;
  EXPECT_EQ(kind_of(a), "shutting_down");
}

// #5: every request sent whole before (or during) the shutdown is answered: 200, 429 or 503.
TEST(HttpHostile, ShutdownAnswersEveryRequestSentWhole) {
  ServiceOptions so;
  so.workers = 1;
  so.queue_capacity = 6;
  RunningServer server(so);
  constexpr int kClients = 60;
  std::vector<std::string> bodies;
  for (int i = 0; i < kClients; ++i) bodies.push_back(json_body(micro_frame(i % 3, "drain-" + std::to_string(i), 1.0)));
  std::vector<int> status(kClients, -1);  // -1: never sent whole (refused connection): no answer owed
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      RawConn c(server.port(), 120);
      if (!c.connected() || !c.send(request("POST", frames_path("drain-" + std::to_string(i)), bodies[i]))) return;
      status[i] = c.answer().status;
    });
  }
  for (int i = 0; i < 20000 && metric_line(server.service(), "bevformer_queue_depth ") != "bevformer_queue_depth 6"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server.stop();
  for (std::thread& t : clients) t.join();
  std::map<int, int> counts;
  for (const int s : status) ++counts[s];
  for (const auto& [s, n] : counts) {
    EXPECT_TRUE(s == -1 || s == 200 || s == 429 || s == 503) << n << " requests got " << (s == 0 ? "no answer" : std::to_string(s));
  }
  EXPECT_GT(counts[200], 0);
}

// #5b: during a shutdown the listener stays open while connections are (up to the grace), so a
// client connecting then is answered 503 instead of refused, or reset with its request sent:
// closing a listening socket resets the connections the kernel completed after the last accept,
// and under load clients still connect then (ShutdownAnswersEveryRequestSentWhole lost one that
// way, 1 run in about 30; 3 in 10 with 20 ms between the last accept and the close).
TEST(HttpHostile, AClientConnectingDuringTheDrainIsAnswered) {
  RunningServer server;  // shutdown grace 1 s
  RawConn busy(server.port());
  // One whole request answered (the server has accepted the connection), then half of another:
  // the connection stays open through the grace.
  ASSERT_TRUE(busy.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  ASSERT_EQ(busy.answer().status, 200);
  ASSERT_TRUE(busy.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  auto stopped = std::async(std::launch::async, [&] { server.stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  RawConn late(server.port());
  ASSERT_TRUE(late.connected()) << "refused while a connection was still open and the grace not over";
  ASSERT_TRUE(late.send(request("POST", frames_path("late"), json_body(micro_frame(0, "late", 1.0)))));
  const RawAnswer a = late.answer();
  EXPECT_EQ(a.status, 503) << a.head;
  EXPECT_EQ(kind_of(a), "shutting_down");
  EXPECT_EQ(a.header("Connection"), "close");
  const RawAnswer b = busy.answer();  // its request never arrived whole: 503 at the grace
  EXPECT_EQ(b.status, 503) << b.head;
  EXPECT_EQ(stopped.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  // The listener is closed once the grace is over.
  RawConn after(server.port());
  EXPECT_FALSE(after.connected() && after.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") &&
               after.answer().status != 0);
}

// #6: a burst of connections is accepted (deep backlog) and every one answered.
TEST(HttpHostile, BurstOf200ConnectionsIsAnswered) {
  RunningServer server;
  constexpr int kConns = 200;
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < kConns; ++i) conns.push_back(std::make_unique<RawConn>(server.port()));
  int answered = 0;
  for (auto& c : conns) {
    if (c->connected() && c->send(request("GET", "/healthz")) && c->answer().status == 200) ++answered;
  }
  EXPECT_EQ(answered, kConns);
}

// #9: pipelined requests are each answered, in order, on the same connection.
TEST(HttpHostile, PipelinedRequestsAreAnsweredInOrder) {
  RunningServer server;
  RawConn c(server.port());
  ASSERT_TRUE(c.send(request("GET", "/healthz") + request("GET", "/v1/model") + request("GET", "/metrics")));
  const RawAnswer a = c.answer(), b = c.answer(), m = c.answer();
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.body.find("\"ok\""), std::string::npos);
  EXPECT_EQ(b.status, 200);
  EXPECT_NE(b.body.find("\"classes\""), std::string::npos);
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("bevformer_http_requests_total"), std::string::npos);
  // Two frames of one stream in one send: both run, the second on the first's history.
  const double t0 = 100.0;
  ASSERT_TRUE(c.send(request("POST", frames_path("piped"), json_body(micro_frame(0, "piped", t0))) +
                     request("POST", frames_path("piped"), json_body(micro_frame(1, "piped", t0 + 0.5)))));
  const RawAnswer f0 = c.answer(), f1 = c.answer();
  ASSERT_EQ(f0.status, 200) << f0.body;
  ASSERT_EQ(f1.status, 200) << f1.body;
  EXPECT_EQ(parse(f1.body)["used_history"], true);
  EXPECT_EQ(parse(f1.body), library_run({micro_frame(0, "piped", t0), micro_frame(1, "piped", t0 + 0.5)})[1]);
}

// #18, #15: framing the parser must refuse, and what each refusal is called.
TEST(HttpHostile, MalformedFramingIsRefusedWithItsStatus) {
  RunningServer server;
  const std::string h = "Host: 127.0.0.1\r\n";
  struct Case {
    std::string bytes;
    int status;
    const char* kind;
  } cases[] = {
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Length: abc\r\n\r\n", 400, "malformed_request"},
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400, "malformed_request"},
      {"GET /healthz HTTP/1.1\r\n" + h + "X-No-Colon\r\n\r\n", 400, "malformed_request"},
      {"GET /healthz HTTP/1.1\r\n\r\n", 400, "malformed_request"},  // no Host
      {"GET /healthz HTTP/1.1\r\n" + h + h + "\r\n", 400, "malformed_request"},
      {"GET /healthz HTTP/2.0\r\n" + h + "\r\n", 400, "malformed_request"},
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "length_required"},
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", 415, "unsupported_encoding"},
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}", 417, "expectation_failed"},
      {"GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n" + h + "\r\n", 414, "uri_too_long"},
      {"POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Length: 999999999999\r\n\r\n", 413, "body_too_large"},
      {request("POST", frames_path("a"), "{}", "", "application/json; charset=utf-16"), 415, "unsupported_media_type"},
      {request("HEAD", frames_path("a")), 405, "method_not_allowed"},
  };
  for (const Case& k : cases) {
    RawConn c(server.port());
    ASSERT_TRUE(c.send(k.bytes));
    const RawAnswer a = c.answer(k.bytes.rfind("HEAD", 0) == 0);
    EXPECT_EQ(a.status, k.status) << k.bytes.substr(0, 120) << "\n" << a.head << a.body;
    if (!a.body.empty()) {
      EXPECT_EQ(kind_of(a), k.kind) << a.body;
    }
  }
  // HEAD: GET's answer without its body; the next pipelined answer follows at once.
  RawConn c(server.port());
  ASSERT_TRUE(c.send(request("HEAD", "/healthz") + request("GET", "/healthz")));
  const RawAnswer head = c.answer(/*head_only=*/true), get = c.answer();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.header("Content-Length"), std::to_string(get.body.size()));
  EXPECT_EQ(get.status, 200);
  EXPECT_NE(get.body.find("\"ok\""), std::string::npos);
}

// #16: refusals made before routing are counted like every other answer.
TEST(HttpHostile, EveryRefusalIsInTheMetrics) {
  HttpOptions ho;
  ho.read_timeout_seconds = 1;
  RunningServer server({}, ho);
  const std::string h = "Host: 127.0.0.1\r\n";
  for (const std::string& bytes : {"GET /healthz HTTP/1.1\r\n" + h + "X: " + std::string(20000, 'a') + "\r\n\r\n",
                                   "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n" + h + "\r\n",
                                   "POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n",
                                   "POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Length: abc\r\n\r\n",
                                   "POST /v1/streams/a/frames HTTP/1.1\r\n" + h + "Content-Length: 999999999999\r\n\r\n",
                                   "GET /healthz HTTP/1.1\r\n" + h}) {  // never finished: 408
    RawConn c(server.port());
    ASSERT_TRUE(c.send(bytes));
    EXPECT_GT(c.answer().status, 0);
  }
  for (const char* line : {"bevformer_http_errors_total{kind=\"headers_too_large\"} 1", "bevformer_http_errors_total{kind=\"uri_too_long\"} 1",
                           "bevformer_http_errors_total{kind=\"length_required\"} 1", "bevformer_http_errors_total{kind=\"malformed_request\"} 1",
                           "bevformer_http_errors_total{kind=\"body_too_large\"} 1", "bevformer_http_errors_total{kind=\"request_timeout\"} 1",
                           "bevformer_http_requests_total{route=\"frames\",code=\"411\"} 1",
                           "bevformer_http_requests_total{route=\"healthz\",code=\"431\"} 1"}) {
    const std::string prefix = std::string(line).substr(0, std::string(line).rfind(' '));
    EXPECT_EQ(metric_line(server.service(), prefix), line);
  }
}

// #10: bodies and what frames decode to are held from one budget; what does not fit is a 503.
TEST(HttpHostile, InflightBudgetRefusesWhatDoesNotFit) {
  ServiceOptions so;
  so.max_inflight_bytes = 4u << 20;
  so.max_body_bytes = 8u << 20;
  RunningServer server(so);
  {
    RawConn c(server.port());
    ASSERT_TRUE(c.send("POST /v1/streams/big/frames HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 5000000\r\n\r\n"));
    const RawAnswer a = c.answer();
    EXPECT_EQ(a.status, 503) << a.head;
    EXPECT_EQ(kind_of(a), "busy");
    EXPECT_EQ(a.header("Retry-After"), "1");
  }
  // A 2048x2048 PNG of one colour: a few KiB that decode to 12 MiB, past the 4 MiB budget.
  Tensor flat = Tensor::empty({2048, 2048, 3}, DType::kU8);
  std::memset(flat.raw_data(), 90, flat.nbytes());
  const std::vector<uint8_t> png = encode_image(flat, ".png");
  const std::string bomb(png.begin(), png.end());
  RawConn c(server.port());
  ASSERT_TRUE(c.send(request("POST", frames_path("big"), frame_with_image(micro_frame(0, "big", 1.0), 0, bomb))));
  const RawAnswer a = c.answer();
  EXPECT_EQ(a.status, 503) << a.body;
  EXPECT_EQ(kind_of(a), "busy");
  // Within the budget a frame runs, and everything taken is given back.
  const auto ok = server.client()->Post(frames_path("small"), json_body(micro_frame(0, "small", 1.0)), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(metric_line(server.service(), "bevformer_inflight_bytes "), "bevformer_inflight_bytes 0");
}

// #11, #15: image data is checked whole before the frame is queued: corrupt 400, too large 413.
TEST(HttpHostile, ImagesAreCheckedWholeBeforeQueueing) {
  RunningServer server;
  const json frame = micro_frame(0, "img", 1.0);
  Tensor tex = Tensor::empty({96, 128, 3}, DType::kU8);
  auto* px = static_cast<uint8_t*>(tex.raw_data());
  for (size_t i = 0; i < tex.nbytes(); ++i) px[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  const std::vector<uint8_t> jpg = encode_image(tex, ".jpg");
  // Cut in the middle of the scan and closed with EOI: structurally complete, half the data gone.
  const std::string cut = std::string(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2)) + "\xFF\xD9";
  // A PNG whose IDAT is damaged but whose CRC was recomputed: only inflating it can tell.
  const std::string& png = file_bytes(frame["cameras"][1]["image"].get<std::string>());
  const size_t idat = png.find("IDAT");
  const uint32_t len = (uint32_t(uint8_t(png[idat - 4])) << 24) | (uint32_t(uint8_t(png[idat - 3])) << 16) |
                       (uint32_t(uint8_t(png[idat - 2])) << 8) | uint8_t(png[idat - 1]);
  std::string bad_png = png;
  for (size_t i = idat + 4 + 2; i < idat + 4 + len; i += 3) bad_png[i] = static_cast<char>(bad_png[i] ^ 0x5A);
  bad_png.replace(idat + 4 + len, 4, be32(crc32_of(std::string_view(bad_png).substr(idat, 4 + len))));
  // 10000 x 10000: over the 64 Mpx any reader takes (a header is enough to say so).
  const std::string huge = std::string("\x89PNG\r\n\x1a\n", 8) +
                           png_chunk("IHDR", be32(10000) + be32(10000) + std::string("\x08\x02\x00\x00\x00", 5)) +
                           png_chunk("IDAT", "") + png_chunk("IEND", "");
  struct Case {
    std::string image;
    int status;
    const char* kind;
  } cases[] = {{cut, 400, "invalid_image"}, {bad_png, 400, "invalid_image"}, {huge, 413, "image_too_large"}};
  for (const Case& k : cases) {
    RawConn c(server.port());
    ASSERT_TRUE(c.send(request("POST", frames_path("img"), frame_with_image(frame, 1, k.image))));
    const RawAnswer a = c.answer();
    EXPECT_EQ(a.status, k.status) << a.body;
    EXPECT_EQ(kind_of(a), k.kind) << a.body;
  }
  EXPECT_EQ(metric_line(server.service(), "bevformer_stage_seconds_count{stage=\"queue\"}"), "") << "a bad image was queued";
}

// #17: a second server on a port in use fails to start instead of sharing it.
TEST(HttpHostile, SecondServerOnAPortInUseFailsToBind) {
  RunningServer first;
  Service service(served_model(), {});
  HttpOptions ho;
  ho.port = first.port();
  HttpServer second(service, ho);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << first.port();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos) << e.what();
  }
  service.finish();
}

// #18: the 409's text is whole; absurd timestamps are refused at parse, not stored.
TEST(HttpHostile, OutOfOrderTextIsWholeAndAbsurdTimestampsAreRefused) {
  RunningServer server;
  auto cli = server.client();
  ASSERT_EQ(cli->Post(frames_path("clock"), json_body(micro_frame(0, "clock", 99999999999.5)), "application/json")->status, 200);
  expect_error(cli->Post(frames_path("clock"), json_body(micro_frame(1, "clock", 99999999999.25)), "application/json"), 409,
               "out_of_order", "(99999999999.5); frames of a stream must be sent in time order. DELETE /v1/streams/clock");
  expect_error(cli->Post(frames_path("clock2"), json_body(micro_frame(0, "clock2", 1e308)), "application/json"), 400,
               "invalid_input", "timestamp");
}

// #14: a library error that says "busy for now" is a retryable 503, wherever it is raised.
TEST(HttpHostile, BusyErrorsAre503WithRetryAfter) {
  const ApiError e = api_error_from(Error(ErrorKind::kBusy, "all stream slots are busy, retry later"), ErrorStage::kModel);
  EXPECT_EQ(e.status(), 503);
  EXPECT_EQ(e.kind(), "busy");
  const HttpResponse r = error_response(e);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0], (std::pair<std::string, std::string>{"Retry-After", "1"}));
}

// The protocol layer alone: byte-at-a-time input and pipelined requests give the same requests.
TEST(HttpHostile, ConnectionParsesByteByByte) {
  const std::string two = request("POST", "/v1/streams/s/frames", "{\"a\": 1}") + request("GET", "/healthz?x=1");
  MemoryBudget budget(1 << 20);
  HttpConnection conn({}, &budget);
  std::vector<HttpRequest> got;
  for (const char ch : two) {
    conn.received(std::string_view(&ch, 1));
    for (HttpConnection::Step s; (s = conn.advance()) != HttpConnection::Step::kRead;) {
      ASSERT_EQ(s, HttpConnection::Step::kHandle);
      got.push_back(conn.take_request());
      EXPECT_EQ(got.back().lease.held(), got.back().body.size());
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].path, "/v1/streams/s/frames");
  EXPECT_EQ(got[0].body, "{\"a\": 1}");
  EXPECT_EQ(got[1].path, "/healthz");
  got.clear();
  EXPECT_EQ(budget.in_use(), 0u);
}

}  // namespace
}  // namespace bev::server
