// The HTTP server (docs/API.md): the request parsers and the scheduler on their own, then the
// whole API over real HTTP on 127.0.0.1 with the golden micro model — round trips equal to the
// library, 8 concurrent streams equal to each run alone, malformed requests answered 4xx while
// other streams carry on, backpressure, timeouts, metrics — and `bevformer serve` as a process
// stopped with SIGTERM while a frame is in flight.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bevformer/model.h"
#include "io/frame_json.h"
#include "io/image.h"
#include "micro_frames.h"
#include "server_test_util.h"
#include "server/api_error.h"
#include "server/frame_request.h"
#include "server/http_server.h"
#include "server/multipart.h"
#include "server/scheduler.h"
#include "server/service.h"

extern char** environ;

namespace bev::server {
namespace {

// ---------------------------------------------------------------------------------------------
// Parsers and scheduler, without sockets

TEST(ServerMultipart, PartsNamesAndBytes) {
  const std::string body = "preamble\r\n" + multipart_body("b0", {{"frame", "application/json", "{}"},
                                                                    {"cam0", "image/png", std::string("\x89PNG\r\n--b", 9)}});
  const std::vector<MultipartPart> parts = parse_multipart(body, "b0", 8);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "frame");
  EXPECT_EQ(parts[0].content_type, "application/json");
  EXPECT_EQ(parts[0].body, "{}");
  EXPECT_EQ(parts[1].name, "cam0");
  EXPECT_EQ(parts[1].filename, "cam0.png");
  EXPECT_EQ(parts[1].body, std::string("\x89PNG\r\n--b", 9));  // a near-boundary inside the bytes
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=\"a b\""), "a b");
  EXPECT_EQ(media_type(" Multipart/Form-Data ; boundary=x"), "multipart/form-data");
}

TEST(ServerMultipart, MalformedBodiesAreRefused) {
  const std::string good = multipart_body("b0", {{"frame", "", "{}"}});
  auto fails = [](const std::string& body, const std::string& what) {
    try {
      parse_multipart(body, "b0", 2);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << what;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  };
  fails(good.substr(0, good.size() - 6), "no closing boundary");
  fails(good.substr(0, 20), "cut inside the headers");
  fails("", "empty");
  fails("--b0\r\nX-Other: 1\r\n\r\n{}\r\n--b0--\r\n", "no Content-Disposition");
  fails(multipart_body("b0", {{"a", "", "1"}, {"a", "", "2"}}), "duplicate names");
  fails(multipart_body("b0", {{"a", "", "1"}, {"b", "", "2"}, {"c", "", "3"}}), "too many parts");
  EXPECT_THROW(multipart_boundary("multipart/form-data"), ApiError);
}

TEST(ServerFrameRequest, JsonAndMultipartGiveTheSameFrame) {
  const json f = micro_frame(1, "cam-rig", 10.5);
  const FrameRequest a = parse_frame_request("cam-rig", "application/json; charset=utf-8", json_body(f), {});
  const FrameRequest b = parse_frame_request("cam-rig", kMultipartType, multipart_frame(f), {});
  EXPECT_EQ(a.frame.stream, "cam-rig");
  EXPECT_EQ(a.frame.timestamp, 10.5);
  ASSERT_EQ(a.frame.cameras.size(), 6u);
  // The same frame either way, image bytes included; no camera names a file.
  EXPECT_TRUE(a.frame == b.frame);
  for (size_t i = 0; i < 6; ++i) {
    const std::string want = file_bytes(f["cameras"][i]["image"].get<std::string>());
    const ImageBytes& got = b.frame.cameras[i].image_bytes;
    EXPECT_TRUE(a.frame.cameras[i].image_path.empty() && b.frame.cameras[i].image_path.empty());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.bytes.data()), got.size()), want);
  }
  // Multipart images are views of the request body, not copies of it.
  const ImageBytes& first = b.frame.cameras[0].image_bytes;
  const auto* body = static_cast<const std::string*>(first.owner.get());
  ASSERT_NE(body, nullptr);
  EXPECT_GE(reinterpret_cast<const char*>(first.bytes.data()), body->data());
  EXPECT_LE(reinterpret_cast<const char*>(first.bytes.data()) + first.size(), body->data() + body->size());
}

TEST(ServerFrameRequest, RefusesWhatIsNotAFrameForThisStream) {
  const json f = micro_frame(0, "s", 1.0);
  auto status_of = [](std::string_view stream, std::string_view type, std::string body, RequestLimits limits = {}) {
    try {
      parse_frame_request(stream, type, std::move(body), limits);
    } catch (const ApiError& e) {
      return e.status();
    }
    return 200;
  };
  EXPECT_EQ(status_of("s", "text/plain", json_body(f)), 415);
  EXPECT_EQ(status_of("other", "application/json", json_body(f)), 400);      // stream mismatch
  EXPECT_EQ(status_of("s", "application/json", f.dump()), 400);              // image file paths
  EXPECT_EQ(status_of("s", "application/json", "{\"stream\": "), 400);      // bad JSON
  RequestLimits two;
  two.max_cameras = 2;
  EXPECT_EQ(status_of("s", "application/json", json_body(f), two), 413);
  RequestLimits tiny_images;
  tiny_images.max_image_width = 8;
  EXPECT_EQ(status_of("s", "application/json", json_body(f), tiny_images), 413);
  EXPECT_TRUE(valid_stream_id("car-7.front_1:a"));
  EXPECT_FALSE(valid_stream_id(""));
  EXPECT_FALSE(valid_stream_id("a/b"));
  EXPECT_FALSE(valid_stream_id(std::string(129, 'a')));
}

// Model::detect with attached images (what multipart bodies use): the same detections as inline
// base64; names must match both ways; files are never read in their place.
TEST(ServerModelApi, AttachedImagesActLikeInlineImages) {
  const json f = micro_frame(0, "attached", 1.0);
  json named = f;
  AttachedImages images;
  for (size_t i = 0; i < named["cameras"].size(); ++i) {
    const std::string name = "part" + std::to_string(i);
    images.emplace(name, file_bytes(named["cameras"][i]["image"].get<std::string>()));
    named["cameras"][i]["image"] = name;
  }
  const json got = parse(served_model().detect(named.dump(), images).json);
  EXPECT_EQ(got, parse(reference_model().detect(json_body(f), "").json));
  EXPECT_GT(got["num_detections"].get<int>(), 0);

  auto kind_of = [](const std::string& text, const AttachedImages& imgs) {
    try {
      served_model().detect(text, imgs);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attached"), std::string::npos) << e.what();
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  json later = named;
  later["timestamp"] = 2.0;
  AttachedImages missing = images;
  missing.erase("part3");
  EXPECT_EQ(kind_of(later.dump(), missing), static_cast<int>(ErrorKind::kInvalidInput));
  AttachedImages extra = images;
  extra.emplace("nobody", images.at("part0"));
  EXPECT_EQ(kind_of(later.dump(), extra), static_cast<int>(ErrorKind::kInvalidInput));
  // A real file's path is not read when images are attached.
  EXPECT_EQ(kind_of(micro_frame(0, "attached", 2.0).dump(), images), static_cast<int>(ErrorKind::kInvalidInput));
}

TEST(ServerScheduler, OneStreamRunsInOrderAndAlone) {
  Scheduler s(4, 100);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> inside{0}, overlap{0};
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(s.submit("a", std::make_shared<Scheduler::Task>([&, i] {
      if (inside.fetch_add(1) != 0) ++overlap;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      {
        std::lock_guard lock(mu);
        order.push_back(i);
      }
      inside.fetch_sub(1);
    })));
  }
  s.stop();  // runs what is queued
  ASSERT_EQ(order.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  EXPECT_EQ(overlap.load(), 0);
}

TEST(ServerScheduler, BoundedQueueAndCancel) {
  Scheduler s(1, 2);
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<bool> started{false};
  ASSERT_TRUE(s.submit("a", std::make_shared<Scheduler::Task>([&] {
    started = true;
    open.wait();
  })));
  while (!started) std::this_thread::yield();
  std::atomic<int> ran{0};
  auto count = std::make_shared<Scheduler::Task>([&] { ++ran; });
  auto cancelled = std::make_shared<Scheduler::Task>([&] { ran += 100; });
  EXPECT_TRUE(s.submit("b", count));
  EXPECT_TRUE(s.submit("c", cancelled));
  EXPECT_EQ(s.queued(), 2u);
  EXPECT_FALSE(s.submit("d", std::make_shared<Scheduler::Task>([] {})));  // full
  EXPECT_TRUE(cancelled->cancel());
  gate.set_value();
  s.stop();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(count->cancel());  // it ran
  EXPECT_FALSE(s.submit("e", std::make_shared<Scheduler::Task>([] {})));  // stopped
}

// Dynamic batching: the oldest waiting frames of distinct streams form a batch (each stream's
// frames stay in order, one per batch); a frame with no company runs alone.
TEST(ServerScheduler, BatchesTakeTheOldestFramesOfDistinctStreams) {
  std::mutex mu;
  std::vector<std::vector<int>> batches;
  std::vector<int> alone;
  Scheduler::Batching b;
  b.max_batch = 3;
  b.max_delay_seconds = 0.2;
  b.run_batch = [&](const std::vector<std::shared_ptr<Scheduler::Task>>& tasks) {
    std::vector<int> ids;
    for (const auto& t : tasks) ids.push_back(*static_cast<int*>(t->payload().get()));
    std::lock_guard lock(mu);
    batches.push_back(ids);
  };
  Scheduler s(1, 100, b);
  auto task = [&](int id) {
    return std::make_shared<Scheduler::Task>(
        [&, id] {
          std::lock_guard lock(mu);
          alone.push_back(id);
        },
        std::make_shared<int>(id));
  };
  // Hold the only worker so that the frames below all wait.
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<bool> started{false};
  ASSERT_TRUE(s.submit("x", std::make_shared<Scheduler::Task>([&] {
    started = true;
    open.wait();
  })));
  while (!started) std::this_thread::yield();
  ASSERT_TRUE(s.submit("a", task(1)));
  ASSERT_TRUE(s.submit("a", task(2)));  // behind a's first: never in its batch
  ASSERT_TRUE(s.submit("b", task(3)));
  // A job without a payload (not a frame) never joins a batch: it runs alone on its turn.
  ASSERT_TRUE(s.submit("n", std::make_shared<Scheduler::Task>([&] {
    std::lock_guard lock(mu);
    alone.push_back(7);
  })));
  ASSERT_TRUE(s.submit("c", task(4)));
  ASSERT_TRUE(s.submit("d", task(5)));
  gate.set_value();
  while (true) {
    {
      std::lock_guard lock(mu);
      if (batches.size() == 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(s.submit("z", task(6)));  // alone: runs by itself once its delay is over
  s.stop();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0], (std::vector<int>{1, 3, 4}));  // a, b, c: the oldest three frames' streams
  EXPECT_EQ(batches[1], (std::vector<int>{5, 2}));     // d, then a's second frame
  EXPECT_EQ(alone, (std::vector<int>{7, 6}));
  EXPECT_EQ(s.batches(), 2u);
  EXPECT_EQ(s.batched_tasks(), 5u);
}

// ---------------------------------------------------------------------------------------------
// Over HTTP

TEST(Server, RoundTripEqualsTheLibrary) {
  RunningServer server;
  auto cli = server.client();
  const double t0 = 1533151603.54759;
  std::vector<json> frames_json, frames_mp;
  for (int k = 0; k < 3; ++k) {
    frames_json.push_back(micro_frame(k, "round-json", t0 + 0.5 * k));
    frames_mp.push_back(micro_frame(k, "round-mp", t0 + 0.5 * k));
  }
  const std::vector<json> want_json = library_run(frames_json), want_mp = library_run(frames_mp);
  for (int k = 0; k < 3; ++k) {
    const auto a = cli->Post(frames_path("round-json"), json_body(frames_json[k]), "application/json");
    ASSERT_TRUE(a);
    ASSERT_EQ(a->status, 200) << a->body;
    EXPECT_EQ(parse(a->body), want_json[k]) << "frame " << k;
    const auto b = cli->Post(frames_path("round-mp"), multipart_frame(frames_mp[k]), kMultipartType);
    ASSERT_TRUE(b);
    ASSERT_EQ(b->status, 200) << b->body;
    EXPECT_EQ(parse(b->body), want_mp[k]) << "frame " << k;
  }
  // Not vacuous: boxes came out, and the later frames used the stream's history.
  EXPECT_GT(want_json[2]["num_detections"].get<int>(), 0);
  EXPECT_TRUE(want_json[2]["used_history"].get<bool>());
  EXPECT_FALSE(want_json[0]["used_history"].get<bool>());

  const auto streams = cli->Get("/v1/streams");
  ASSERT_TRUE(streams);
  ASSERT_EQ(streams->status, 200);
  int seen = 0;
  const json listed = parse(streams->body);
  for (const json& s : listed["streams"]) {
    if (s["id"] == "round-json" || s["id"] == "round-mp") {
      EXPECT_EQ(s["frames"], 3);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2) << streams->body;
  const auto dropped = cli->Delete("/v1/streams/round-json");
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->status, 200) << dropped->body;
  expect_error(cli->Delete("/v1/streams/round-json"), 404, "unknown_stream");
}

TEST(Server, EightConcurrentStreamsKeepTheirOwnHistory) {
  constexpr int kStreams = 8, kFrames = 10;
  ServiceOptions so;
  so.workers = 4;
  RunningServer server(so);
  // Each stream its own sequence: another rotation of the micro frames and its own clock.
  std::vector<std::vector<json>> frames(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    for (int k = 0; k < kFrames; ++k) {
      frames[s].push_back(micro_frame((k + s) % 3, "fleet-" + std::to_string(s), 1000.0 + 37.0 * s + 0.5 * k));
    }
  }
  const auto [got, failures] =
      post_streams_concurrently(server, frames, [](size_t s, size_t k) { return (s + k) % 2 == 0; });
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(failures[s], "") << "stream " << s;
    const std::vector<json> want = library_run(frames[s]);
    ASSERT_EQ(got[s].size(), want.size());
    for (int k = 0; k < kFrames; ++k) {
      EXPECT_EQ(got[s][k], want[k]) << "stream " << s << " frame " << k;
      EXPECT_EQ(got[s][k]["used_history"].get<bool>(), k > 0) << "stream " << s << " frame " << k;
    }
  }
}

// The pipelined server on the foreign-memory backend (whose memory the host must not touch)
// answers every stream as the CPU library does alone: the server's path reaches memory only
// through the backend too.
TEST(Server, OnTheForeignBackendEqualsTheCpuLibrary) {
  Knobs knobs;
  knobs.threads = 2;
  knobs.pipeline = true;
  knobs.backend = "foreign";
  const std::unique_ptr<Model> foreign = Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", knobs);
  ASSERT_EQ(foreign->device_info().backend, "foreign");
  ServiceOptions so;
  so.workers = 2;
  RunningServer server(so, {}, foreign.get());
  constexpr int kStreams = 3, kFrames = 4;
  std::vector<std::vector<json>> frames(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    for (int k = 0; k < kFrames; ++k) {
      frames[s].push_back(micro_frame((k + s) % 3, "foreign-" + std::to_string(s), 2000.0 + 41.0 * s + 0.5 * k));
    }
  }
  const auto [got, failures] = post_streams_concurrently(server, frames);
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(failures[s], "") << "stream " << s;
    const std::vector<json> want = library_run(frames[s]);
    ASSERT_EQ(got[s].size(), want.size());
    for (int k = 0; k < kFrames; ++k) EXPECT_EQ(got[s][k], want[k]) << "stream " << s << " frame " << k;
    EXPECT_GT(want[kFrames - 1]["num_detections"].get<int>(), 0);
  }
}

// With --max-batch the server runs frames of different streams as batches: every answer is
// still the library's for that stream alone, and the metrics say batches ran.
TEST(Server, BatchedFramesEqualTheLibrary) {
  constexpr int kStreams = 4, kFrames = 3;
  ServiceOptions so;
  so.workers = 1;
  so.max_batch = 4;
  so.batch_delay_seconds = 0.5;
  RunningServer server(so);
  std::vector<std::vector<json>> frames(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    for (int k = 0; k < kFrames; ++k) {
      frames[s].push_back(micro_frame((k + s) % 3, "batched-" + std::to_string(s), 2000.0 + 11.0 * s + 0.5 * k));
    }
  }
  const auto [got, failures] = post_streams_concurrently(server, frames);
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(failures[s], "") << "stream " << s;
    const std::vector<json> want = library_run(frames[s]);
    for (int k = 0; k < kFrames; ++k) EXPECT_EQ(got[s][k], want[k]) << "stream " << s << " frame " << k;
  }
  auto cli = server.client();
  // The four clients' frames arrive within the half-second delay of the first: batches ran.
  EXPECT_GE(metric(*cli, "bevformer_batches_total"), 1.0);
  const auto model = cli->Get("/v1/model");
  ASSERT_TRUE(model);
  EXPECT_EQ(parse(model->body)["server"]["max_batch"], 4);
}

// Issue 25's probe #3 over a socket: a value that overflows float32 is refused naming the field,
// a frame whose bev stage overflows is refused naming the stage and counted, and neither is
// answered as success nor changes the stream's history.
TEST(Server, NonFiniteNumbersAreRefusedAndCountedAndKeepTheHistory) {
  RunningServer server;
  auto cli = server.client();
  const double t0 = 1533151603.54759;
  std::vector<json> frames;
  for (int k = 0; k < 3; ++k) frames.push_back(micro_frame(k, "overflow", t0 + 0.5 * k));
  const std::vector<json> want = library_run(frames);
  const auto first = cli->Post(frames_path("overflow"), json_body(frames[0]), "application/json");
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const double nonfinite_before = metric(*cli, "bevformer_frames_nonfinite_total");
  ASSERT_GE(nonfinite_before, 0);
  json f = frames[1];
  f["can_bus"][13] = 1e308;
  expect_error(cli->Post(frames_path("overflow"), json_body(f), "application/json"), 422, "invalid_input", "can_bus[13]");
  f["can_bus"][13] = 3e38;  // within float32, but the CAN-bus MLP overflows in the bev stage
  expect_error(cli->Post(frames_path("overflow"), json_body(f), "application/json"), 422, "invalid_input",
               "bev stage produced");
  EXPECT_EQ(metric(*cli, "bevformer_frames_nonfinite_total"), nonfinite_before + 1);
  for (int k = 1; k < 3; ++k) {
    const auto r = cli->Post(frames_path("overflow"), json_body(frames[k]), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(parse(r->body), want[k]) << "frame " << k;
  }
}

TEST(Server, MalformedRequestsGet4xxAndOtherStreamsCarryOn) {
  ServiceOptions so;
  so.max_body_bytes = 2u << 20;
  so.limits.max_cameras = 6;
  RunningServer server(so);
  auto cli = server.client();
  const double t0 = 500.0;
  const std::vector<json> steady = {micro_frame(0, "steady", t0), micro_frame(1, "steady", t0 + 0.5)};
  const std::vector<json> want = library_run(steady);
  ASSERT_EQ(cli->Post(frames_path("steady"), json_body(steady[0]), "application/json")->status, 200);

  const std::string good = json_body(micro_frame(2, "bad", 1.0));
  const std::string path = frames_path("bad");
  expect_error(cli->Post(path, "{\"stream\": \"bad\", ", "application/json"), 400, "invalid_input", "not valid JSON");
  expect_error(cli->Post(path, good, "text/plain"), 415, "unsupported_media_type");
  expect_error(cli->Post(path, good, "application/x-www-form-urlencoded"), 415, "unsupported_media_type");
  const std::string mp = multipart_frame(micro_frame(2, "bad", 1.0));
  expect_error(cli->Post(path, mp.substr(0, mp.size() / 2), kMultipartType), 400, "invalid_multipart", "truncated");
  expect_error(cli->Post(path, mp, "multipart/form-data"), 400, "invalid_multipart", "boundary");
  // Invalid images: not an image at all, and a PNG cut in half.
  {
    json f = micro_frame(2, "bad", 1.0);
    const std::string png = file_bytes(f["cameras"][0]["image"].get<std::string>());
    json g = json::parse(json_body(f));
    g["cameras"][0]["image"] = {{"base64", base64_encode({reinterpret_cast<const uint8_t*>("hello"), 5})}};
    expect_error(cli->Post(path, g.dump(), "application/json"), 400, "invalid_image", "cameras[0].image");
    const std::string half = png.substr(0, png.size() / 2);
    g["cameras"][0]["image"] = {{"base64", base64_encode({reinterpret_cast<const uint8_t*>(half.data()), half.size()})}};
    expect_error(cli->Post(path, g.dump(), "application/json"), 400, "invalid_image", "cameras[0].image");
  }
  // NaN and infinite poses.
  {
    std::string nan = good;
    const size_t at = nan.find("\"T_world_from_ego\":[[") + 21;
    nan.replace(at, nan.find(',', at) - at, "NaN");
    expect_error(cli->Post(path, nan, "application/json"), 400, "invalid_input");
    std::string inf = good;
    inf.replace(at, inf.find(',', at) - at, "1e999");
    expect_error(cli->Post(path, inf, "application/json"), 400, "invalid_input");
  }
  expect_error(cli->Post(path, micro_frame(2, "bad", 1.0).dump(), "application/json"), 400, "missing_image", "file path");
  expect_error(cli->Post(frames_path("someone-else"), good, "application/json"), 400, "stream_mismatch");
  expect_error(cli->Post("/v1/streams/a%20b/frames", good, "application/json"), 400, "invalid_stream_id");
  expect_error(cli->Delete("/v1/streams/never-seen"), 404, "unknown_stream");
  expect_error(cli->Get("/v1/nothing"), 404, "not_found");
  expect_error(cli->Get(path), 405, "method_not_allowed");
  // Over the limits: body, headers, cameras. The cases the server refuses before reading the
  // whole request go over raw sockets: the server answers and closes with bytes still unread, the
  // kernel resets the connection, and a client library that is still writing reports a failed
  // write instead of the answer (httplib's does, under load). The raw socket reads the answer,
  // which arrived before the reset.
  const std::string head = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  // A 3 MiB body: refused from its Content-Length, before any of it is read.
  expect_raw_error(raw_exchange(server.port(), head + "Content-Length: " + std::to_string(3u << 20) + "\r\n\r\n" +
                                                   std::string(3u << 20, ' ')),
                   413, "body_too_large");
  // Chunked: refused before any of the body is read.
  expect_raw_error(raw_exchange(server.port(), head + "Transfer-Encoding: chunked\r\n\r\n400\r\n" +
                                                   std::string(1024, ' ') + "\r\n0\r\n\r\n"),
                   411, "length_required");
  {
    httplib::Headers many;
    for (int i = 0; i < 12; ++i) many.emplace("X-Padding-" + std::to_string(i), std::string(2000, 'a'));
    expect_error(cli->Get("/healthz", many), 431, "headers_too_large");
    // One header line past the whole header limit is refused before routing.
    expect_raw_error(raw_exchange(server.port(), "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " +
                                                     std::string(100000, 'a') + "\r\n\r\n"),
                     431, "headers_too_large");
  }
  {
    json f = json::parse(good);
    f["cameras"].push_back(f["cameras"][0]);
    f["cameras"].back()["name"] = "CAM_EXTRA";
    expect_error(cli->Post(path, f.dump(), "application/json"), 413, "too_many_cameras");
  }
  // Well-formed but not for this model: the rig's image size.
  {
    Tensor small = Tensor::empty({12, 20, 3}, DType::kU8);
    auto* px = static_cast<uint8_t*>(small.raw_data());
    for (size_t i = 0; i < small.nbytes(); ++i) px[i] = static_cast<uint8_t>(i * 7);
    const std::vector<uint8_t> png = encode_image(small, ".png");
    json f = json::parse(good);
    f["cameras"][3]["image"] = {{"base64", base64_encode(png)}};
    expect_error(cli->Post(path, f.dump(), "application/json"), 422, "invalid_input", "20x12");
  }
  // Out of order: a frame not after the stream's last one is refused and changes nothing.
  expect_error(cli->Post(frames_path("steady"), json_body(steady[0]), "application/json"), 409, "out_of_order");

  // The server is up and the steady stream continues exactly as if nothing happened.
  const auto health = cli->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const auto next = cli->Post(frames_path("steady"), multipart_frame(steady[1]), kMultipartType);
  ASSERT_TRUE(next);
  ASSERT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(parse(next->body), want[1]);
  EXPECT_TRUE(parse(next->body)["used_history"].get<bool>());
}

TEST(Server, FullQueueAnswers429WithRetryAfter) {
  ServiceOptions so;
  so.workers = 1;
  so.queue_capacity = 1;
  RunningServer server(so);
  constexpr int kClients = 8;
  std::vector<std::string> bodies;
  for (int c = 0; c < kClients; ++c) bodies.push_back(json_body(micro_frame(c % 3, "burst-" + std::to_string(c), 1.0)));
  int ok = 0, full = 0, other = 0;
  bool retry_after = true;
  for (int round = 0; round < 5 && full == 0; ++round) {
    std::vector<int> status(kClients, 0);
    std::vector<std::string> retry(kClients);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        auto cli = server.client();
        ++ready;
        while (ready < kClients) std::this_thread::yield();
        json f = json::parse(bodies[c]);
        f["timestamp"] = 1.0 + round;
        const auto r = cli->Post(frames_path("burst-" + std::to_string(c)), f.dump(), "application/json");
        status[c] = r ? r->status : -1;
        if (r) retry[c] = r->get_header_value("Retry-After");
      });
    }
    for (std::thread& t : threads) t.join();
    for (int c = 0; c < kClients; ++c) {
      if (status[c] == 200) ++ok;
      else if (status[c] == 429) {
        ++full;
        retry_after = retry_after && !retry[c].empty();
      } else {
        ++other;
      }
    }
  }
  EXPECT_GT(full, 0);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(other, 0);
  EXPECT_TRUE(retry_after);
  const auto metrics = server.client()->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("bevformer_http_errors_total{kind=\"queue_full\"}"), std::string::npos);
}

TEST(Server, SlowFrameAnswers504AndTheServerCarriesOn) {
  ServiceOptions so;
  so.request_timeout_seconds = 1e-6;
  RunningServer server(so);
  auto cli = server.client();
  expect_error(cli->Post(frames_path("slow"), json_body(micro_frame(0, "slow", 1.0)), "application/json"), 504, "timeout");
  const auto health = cli->Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(Server, ModelHealthAndMetrics) {
  ServiceOptions so;
  so.model_info = {{"config", "micro"}, {"backend", "cpu"}};
  RunningServer server(so);
  auto cli = server.client();
  ASSERT_EQ(cli->Post(frames_path("metered"), json_body(micro_frame(0, "metered", 1.0)), "application/json")->status, 200);
  expect_error(cli->Post(frames_path("metered"), "[", "application/json"), 400, "invalid_input");

  const auto model = cli->Get("/v1/model");
  ASSERT_TRUE(model);
  ASSERT_EQ(model->status, 200);
  const json m = parse(model->body);
  EXPECT_EQ(m["config"], "micro");
  EXPECT_EQ(m["untrained"], false);
  EXPECT_EQ(m["classes"], json(served_model().class_names()));
  EXPECT_EQ(m["server"]["workers"], so.workers);

  const auto metrics = cli->Get("/metrics");
  ASSERT_TRUE(metrics);
  ASSERT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  for (const char* line : {"bevformer_http_requests_total{route=\"frames\",code=\"200\"} 1",
                           "bevformer_http_requests_total{route=\"frames\",code=\"400\"} 1",
                           "bevformer_http_errors_total{kind=\"invalid_input\"} 1",
                           "bevformer_stage_seconds_count{stage=\"bev\"} 1",
                           "bevformer_stage_seconds_bucket{stage=\"total\",le=\"+Inf\"} 2",
                           "# TYPE bevformer_queue_depth gauge", "bevformer_queue_depth 0",
                           "# TYPE bevformer_active_streams gauge", "bevformer_stream_evictions_lru_total"}) {
    EXPECT_NE(metrics->body.find(line), std::string::npos) << line << "\n" << metrics->body;
  }
}

// ---------------------------------------------------------------------------------------------
// `bevformer serve` as a process: SIGTERM while a frame runs; the frame is answered, exit 0.

TEST(ServerProcess, SigtermFinishesInFlightFrameAndExitsZero) {
  const std::string exe = std::string(BEV_BINARY_DIR) + "/bin/bevformer";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  const std::string config = kMicroDir + "/config.json", weights = kMicroDir + "/checkpoint.pth";
  std::vector<std::string> args = {exe, "-q", "serve", "--config", config, "--weights", weights, "--port", "0", "--threads", "2"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string line;
  char c = 0;
  while (read(out[0], &c, 1) == 1 && c != '\n') line += c;
  close(out[0]);
  const size_t colon = line.rfind(':');
  ASSERT_NE(colon, std::string::npos) << "first line: " << line;
  const int port = std::stoi(line.substr(colon + 1));

  // The first frame of a fresh process records the plans: slow enough to be caught running.
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  int frame_status = 0;
  std::string frame_body;
  std::atomic<bool> answered{false};
  std::thread frame([&] {
    const auto r = cli.Post(frames_path("term"), multipart_frame(micro_frame(0, "term", 1.0)), kMultipartType);
    frame_status = r ? r->status : -1;
    if (r) frame_body = r->body;
    answered = true;
  });
  httplib::Client probe("127.0.0.1", port);
  bool caught_running = false;
  for (int i = 0; i < 20000 && !answered; ++i) {
    const auto m = probe.Get("/metrics");
    if (m && m->body.find("\nbevformer_frames_running 1\n") != std::string::npos) {
      caught_running = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  frame.join();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(frame_status, 200) << frame_body;
  EXPECT_GT(parse(frame_body)["num_detections"].get<int>(), 0);
  if (!caught_running) GTEST_LOG_(INFO) << "the frame finished before SIGTERM; only the clean exit was checked";
  // Gone: nothing listens any more.
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(1, 0);
  EXPECT_FALSE(after.Get("/healthz"));
}

// Twice a table's capacity of vehicles at once (issue 45): 6 clients, each its own stream of 6
// frames, on a server that keeps 3 streams. Every request is answered (503 busy, retried, only
// while all 3 slots run a frame); a frame that lost its history says so ("history evicted"),
// and between such frames each stream's answers equal the library running that stretch alone.
TEST(Server, TwiceTheStreamCapacityEachStreamAsAloneBetweenEvictions) {
  constexpr int kStreams = 6, kFrames = 6;
  Knobs k;
  k.threads = 2;
  k.max_streams = 3;
  auto model = Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k);
  RunningServer server({}, {}, model.get());
  std::vector<std::vector<json>> frames(kStreams);
  std::vector<std::vector<json>> got(kStreams);
  std::vector<std::string> failures(kStreams);
  std::atomic<int> busy{0};
  std::vector<std::thread> clients;
  for (int s = 0; s < kStreams; ++s) {
    for (int f = 0; f < kFrames; ++f) {
      frames[s].push_back(micro_frame((f + s) % 3, "twice-" + std::to_string(s), 3000.0 + 13.0 * s + 0.5 * f));
    }
    clients.emplace_back([&, s] {
      auto cli = server.client();
      for (int f = 0; f < kFrames; ++f) {
        // Two vehicles send back to back, four pause: the pausing ones fall to the table's end.
        if (s >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(60));
        for (int attempt = 0;; ++attempt) {
          const auto r = cli->Post(frames_path(frames[s][f]["stream"].get<std::string>()), json_body(frames[s][f]),
                                   "application/json");
          if (r && r->status == 503 && attempt < 200) {
            ++busy;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
          }
          if (!r || r->status != 200) {
            failures[s] = r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error());
            return;
          }
          got[s].push_back(parse(r->body));
          break;
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  // The reference: the library alone, each stretch between evictions on a fresh stream.
  auto reference = load_micro_model(/*pipeline=*/false);
  int evicted = 0, kept = 0;
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(failures[s], "") << "stream " << s;
    ASSERT_EQ(got[s].size(), static_cast<size_t>(kFrames));
    const std::string id = frames[s][0]["stream"].get<std::string>();
    for (int f = 0; f < kFrames; ++f) {
      json answer = got[s][static_cast<size_t>(f)];
      if (f > 0 && !answer["used_history"].get<bool>()) {
        ASSERT_TRUE(answer.contains("history_reset")) << "stream " << s << " frame " << f << " lost its history silently";
        EXPECT_EQ(answer["history_reset"].get<std::string>().rfind("history evicted", 0), 0u) << answer["history_reset"];
        ++evicted;
        reference->drop_stream(id);  // the stretch starts again
        answer.erase("history_reset");
      } else if (f > 0) {
        ++kept;
      }
      const json want = parse(reference->detect(json_body(frames[s][static_cast<size_t>(f)]), "").json);
      EXPECT_EQ(answer, want) << "stream " << s << " frame " << f;
    }
  }
  std::printf("[ capacity ] %d streams in a table of 3: %d frames kept their history, %d were told it was evicted, "
              "%d busy retries\n", kStreams, kept, evicted, busy.load());
  EXPECT_EQ(kept + evicted, kStreams * (kFrames - 1));
}

}  // namespace
}  // namespace bev::server
