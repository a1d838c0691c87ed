// The Open Inference Protocol (v2) over HTTP: the request parser and the answer writer without a
// model, the sequence table with an injected clock, the /v2 routes of a real server on loopback
// (metadata, health, binary and JSON inference equal to the library, Triton's sequence rules and
// their errors), and the fleet's history handoff (export, import, refusals, and a drain from one
// server to another that keeps every stream's history bit for bit).
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "oip_test_util.h"
#include "runtime/stream_handoff.h"
#include "server/api_error.h"
#include "server/fleet.h"
#include "server/oip.h"
#include "server/oip_service.h"
#include "server/router.h"
#include "server/sequences.h"
#include "server_test_util.h"
#include "precision_test_util.h"

namespace bev::server {
namespace {

constexpr double kT0 = 1533151603.54759;

// The kind of the ApiError `f` throws ("" when it throws none).
template <typename F>
std::string thrown_kind(F&& f, int* status = nullptr) {
  try {
    f();
  } catch (const ApiError& e) {
    if (status) *status = e.status();
    return e.kind();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// The REST request parser and answer writer (no model)

std::string header_len(const std::string& j) { return std::to_string(j.size()); }

TEST(OipParse, BinaryAndJsonInputs) {
  const std::string frame = bytes_element("{\"a\":1}");
  const std::string images = bytes_element("img0") + bytes_element("") + bytes_element("img2");
  const json j = {{"id", "r1"},
                  {"parameters", {{"sequence_id", 42}, {"sequence_start", true}, {"binary_data_output", true}}},
                  {"inputs",
                   {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"parameters", {{"binary_data_size", frame.size()}}}},
                    {{"name", "IMAGES"}, {"datatype", "BYTES"}, {"shape", {3}}, {"parameters", {{"binary_data_size", images.size()}}}}}},
                  {"outputs", {{{"name", "BOXES"}}, {{"name", "DETECTIONS"}, {"parameters", {{"binary_data", false}}}}}}};
  const std::string head = j.dump();
  const std::string len = header_len(head);
  const OipRequest r = parse_oip_rest_request(head + frame + images, &len);
  EXPECT_EQ(r.id, "r1");
  EXPECT_EQ(r.sequence_id, "42");
  EXPECT_TRUE(r.sequence_start);
  EXPECT_FALSE(r.sequence_end);
  ASSERT_EQ(r.inputs.size(), 2u);
  ASSERT_EQ(r.input("FRAME")->elements.size(), 1u);
  EXPECT_EQ(r.input("FRAME")->elements[0], "{\"a\":1}");
  ASSERT_EQ(r.input("IMAGES")->elements.size(), 3u);
  EXPECT_EQ(r.input("IMAGES")->elements[0], "img0");
  EXPECT_EQ(r.input("IMAGES")->elements[1], "");
  EXPECT_EQ(r.input("IMAGES")->elements[2], "img2");
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_TRUE(r.outputs[0].binary);  // binary_data_output is the default
  EXPECT_FALSE(r.outputs[1].binary);

  // The same as JSON data, the sequence id a string; nested data lists are flattened.
  const json k = {{"parameters", {{"sequence_id", "car-7"}, {"sequence_end", true}}},
                  {"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1, 1}}, {"data", {{"{}"}}}}}}};
  const OipRequest s = parse_oip_rest_request(k.dump(), nullptr);
  EXPECT_EQ(s.sequence_id, "car-7");
  EXPECT_TRUE(s.sequence_end);
  ASSERT_EQ(s.input("FRAME")->elements.size(), 1u);
  EXPECT_EQ(s.input("FRAME")->elements[0], "{}");
}

TEST(OipParse, SequenceIdsAsTritonHasThem) {
  EXPECT_EQ(oip_sequence_id(json(0)), std::nullopt);   // 0: no sequence
  EXPECT_EQ(oip_sequence_id(json("")), std::nullopt);  // "": no sequence
  EXPECT_EQ(oip_sequence_id(json(18446744073709551615ull)), "18446744073709551615");
  EXPECT_EQ(oip_sequence_id(json("a.b_c:d-1")), "a.b_c:d-1");
  EXPECT_EQ(thrown_kind([] { oip_sequence_id(json(-1)); }), "invalid_input");
  EXPECT_EQ(thrown_kind([] { oip_sequence_id(json(1.5)); }), "invalid_input");
  EXPECT_EQ(thrown_kind([] { oip_sequence_id(json("a/b")); }), "invalid_input");
  EXPECT_EQ(thrown_kind([] { oip_sequence_id(json(std::string(200, 'x'))); }), "invalid_input");
  EXPECT_EQ(thrown_kind([] { oip_sequence_id(json::array()); }), "invalid_input");
}

TEST(OipParse, MalformedRequestsAre400WithWhatIsWrong) {
  const json ok_frame = {{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"data", {"{}"}}};
  struct Case {
    std::string body;
    std::optional<std::string> header;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", std::nullopt, "inference request"},
      {"[1]", std::nullopt, "JSON object"},
      {"{\"inputs\": []}", std::nullopt, "inputs must be"},
      {json{{"inputs", {ok_frame}}, {"extra", 1}}.dump(), std::nullopt, "unknown field 'extra'"},
      {json{{"inputs", {ok_frame, ok_frame}}}.dump(), std::nullopt, "appears twice"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "FP32"}, {"shape", {1}}, {"data", {1.0}}}}}}.dump(), std::nullopt,
       "BYTES"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {2}}, {"data", {"{}"}}}}}}.dump(), std::nullopt,
       "has shape [2] but 1 elements"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {-1}}, {"data", {"{}"}}}}}}.dump(), std::nullopt,
       "non-negative"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"data", {1}}}}}}.dump(), std::nullopt,
       "strings"},
      {json{{"inputs", {ok_frame}}, {"parameters", {{"sequence_start", "yes"}}}}.dump(), std::nullopt, "true or false"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"parameters", {{"binary_data_size", 8}}}}}}}.dump(),
       std::nullopt, "no Inference-Header-Content-Length"},
      // The header says more bytes than the body has; letters; more elements than the bound.
      {"{}", std::string("99"), "but the body has 2 bytes"},
      {"{}", std::string("1x"), "Inference-Header-Content-Length"},
      {json{{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {100000000000}}, {"data", {"{}"}}}}}}.dump(),
       std::nullopt, "elements"},
  };
  for (const Case& c : cases) {
    int status = 0;
    std::string message;
    try {
      parse_oip_rest_request(c.body, c.header ? &*c.header : nullptr);
    } catch (const ApiError& e) {
      status = e.status();
      message = e.what();
    }
    EXPECT_EQ(status, 400) << c.body;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.body << " -> " << message;
  }

  // The binary section: an element longer than what remains, a length cut short, bytes left over.
  auto binary_case = [](const std::string& section, size_t declared) {
    const json j = {{"inputs", {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"parameters", {{"binary_data_size", declared}}}}}}};
    const std::string head = j.dump(), len = header_len(head);
    std::string message;
    try {
      parse_oip_rest_request(head + section, &len);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      message = e.what();
    }
    return message;
  };
  std::string huge(4, '\xff');
  EXPECT_NE(binary_case(huge + "ab", 6).find("remain"), std::string::npos);
  EXPECT_NE(binary_case("ab", 2).find("4-byte length"), std::string::npos);
  EXPECT_NE(binary_case(bytes_element("{}") + "zz", 6).find("bytes after"), std::string::npos);
  EXPECT_NE(binary_case(bytes_element("{}"), 60).find("remain"), std::string::npos);
}

TEST(OipParse, AnswersBinaryAndJson) {
  OipResponse r;
  r.model_name = "bevformer";
  r.model_version = "1";
  r.id = "x";
  OipOutput boxes{"BOXES", "FP32", {1, 2}, {1.5f, -2.0f}, {}, {}, true};
  OipOutput labels{"LABELS", "INT32", {2}, {}, {3, 7}, {}, false};
  OipOutput det{"DETECTIONS", "BYTES", {1}, {}, {}, {"{\"k\":1}"}, true};
  r.outputs = {boxes, labels, det};
  const HttpResponse h = oip_rest_response(r);
  std::string len;
  for (const auto& [k, v] : h.headers) {
    if (k == "Inference-Header-Content-Length") len = v;
  }
  ASSERT_FALSE(len.empty());
  const size_t n = std::stoul(len);
  const json head = json::parse(h.body.substr(0, n));
  EXPECT_EQ(head["model_name"], "bevformer");
  EXPECT_EQ(head["id"], "x");
  EXPECT_EQ(head["outputs"][0]["parameters"]["binary_data_size"], 8);
  EXPECT_EQ(head["outputs"][1]["data"], json({3, 7}));
  EXPECT_EQ(head["outputs"][2]["parameters"]["binary_data_size"], 4 + 7);
  float f[2];
  std::memcpy(f, h.body.data() + n, 8);
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(h.body.substr(n + 8), bytes_element("{\"k\":1}"));

  const HttpResponse e = oip_error_response(409, "sequence_unknown", "restart it");
  EXPECT_EQ(e.status, 409);
  EXPECT_EQ(json::parse(e.body), json({{"error", "restart it"}, {"kind", "sequence_unknown"}}));
}

TEST(OipRouter, V2Routes) {
  EXPECT_EQ(route_request("GET", "/v2").id, RouteId::kV2Server);
  EXPECT_EQ(route_request("GET", "/v2/health/live").id, RouteId::kV2Live);
  EXPECT_EQ(route_request("HEAD", "/v2/health/ready").id, RouteId::kV2Ready);
  const Route m = route_request("GET", "/v2/models/bev/versions/1");
  EXPECT_EQ(m.id, RouteId::kV2Model);
  EXPECT_EQ(m.model, "bev");
  EXPECT_EQ(m.version, "1");
  EXPECT_EQ(route_request("GET", "/v2/models/bev/ready").id, RouteId::kV2ModelReady);
  const Route infer = route_request("POST", "/v2/models/bev/infer");
  EXPECT_EQ(infer.id, RouteId::kV2Infer);
  EXPECT_FALSE(infer.refusal);
  const Route get_infer = route_request("GET", "/v2/models/bev/infer");
  ASSERT_TRUE(get_infer.refusal);
  EXPECT_EQ(get_infer.refusal->status, 405);
  ASSERT_TRUE(route_request("GET", "/v2/models").refusal);
  EXPECT_EQ(route_request("GET", "/v2/models").refusal->status, 404);
  EXPECT_EQ(route_request("POST", "/v1/handoff").id, RouteId::kHandoff);
  EXPECT_EQ(route_request("GET", "/v1/handoff/owner").id, RouteId::kHandoffOwner);
  ASSERT_TRUE(route_request("GET", "/v1/handoff").refusal);
}

// ---------------------------------------------------------------------------------------------
// The sequence table (an injected clock; no handoff wait)

struct Clock {
  double now = 100;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

SequenceOptions table_options(double idle = 10) {
  SequenceOptions o;
  o.max_idle_seconds = idle;
  o.handoff_wait_seconds = 0;
  o.max_sequences = 2;
  return o;
}

TEST(OipSequences, StartContinueEndAndTheirRefusals) {
  Clock clock;
  SequenceTable t(table_options(), clock.fn());
  // A frame of a sequence never started: the history is gone, restart it.
  int status = 0;
  EXPECT_EQ(thrown_kind([&] { t.claim("a", false, 1.0); }, &status), "sequence_unknown");
  EXPECT_EQ(status, 409);

  SequenceTable::Claim c = t.claim("a", true, 1.0);
  EXPECT_TRUE(c.start);
  EXPECT_EQ(c.frames, 0u);
  // A second frame while the first is in flight, either kind.
  EXPECT_EQ(thrown_kind([&] { t.claim("a", false, 2.0); }), "sequence_busy");
  EXPECT_EQ(thrown_kind([&] { t.claim("a", true, 2.0); }), "sequence_busy");
  t.finish("a", 1, 1.0, false);

  // Not later than the last frame: out of order (not queued, not reordered).
  EXPECT_EQ(thrown_kind([&] { t.claim("a", false, 1.0); }, &status), "out_of_order");
  EXPECT_EQ(status, 409);
  c = t.claim("a", false, 1.5);
  EXPECT_FALSE(c.start);
  EXPECT_EQ(c.frames, 1u);
  // A frame that failed leaves the sequence where it was.
  t.release("a", false);
  c = t.claim("a", false, 1.5);
  EXPECT_EQ(c.frames, 1u);
  t.finish("a", 2, 1.5, /*end=*/true);
  EXPECT_EQ(thrown_kind([&] { t.claim("a", false, 2.0); }), "sequence_unknown");

  // A failed start leaves no sequence.
  t.claim("b", true, 1.0);
  t.release("b", true);
  EXPECT_EQ(thrown_kind([&] { t.claim("b", false, 2.0); }), "sequence_unknown");

  // Bounded: a third live sequence waits for a slot.
  t.claim("c", true, 1.0);
  t.finish("c", 1, 1.0, false);
  t.claim("d", true, 1.0);
  t.finish("d", 1, 1.0, false);
  EXPECT_EQ(thrown_kind([&] { t.claim("e", true, 1.0); }, &status), "busy");
  EXPECT_EQ(status, 503);
  EXPECT_EQ(t.live(), 2u);
}

TEST(OipSequences, IdleSequencesExpire) {
  Clock clock;
  SequenceTable t(table_options(/*idle=*/10), clock.fn());
  t.claim("a", true, 1.0);
  t.finish("a", 1, 1.0, false);
  t.claim("b", true, 1.0);  // in flight: never expires under its frame
  clock.now += 11;
  const std::vector<std::string> expired = t.take_expired();
  EXPECT_EQ(expired, std::vector<std::string>{"a"});
  EXPECT_EQ(thrown_kind([&] { t.claim("a", false, 2.0); }), "sequence_unknown");
  t.finish("b", 1, 1.0, false);
  EXPECT_TRUE(t.take_expired().empty());
}

TEST(OipSequences, MovesAndHandoffs) {
  Clock clock;
  SequenceOptions o = table_options();
  o.handoff_wait_seconds = 30;  // a waiting frame is woken by the adopt, long before this
  SequenceTable t(o, clock.fn());
  // A frame of an unknown sequence waits for its history to arrive.
  std::thread adopter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t.adopt("h", 4, 7.0);
  });
  const SequenceTable::Claim c = t.claim("h", false, 7.5);
  adopter.join();
  EXPECT_FALSE(c.start);
  EXPECT_EQ(c.frames, 4u);
  // Not movable while its frame runs; then moving, then moved: frames hear it went elsewhere.
  EXPECT_FALSE(t.begin_move("h"));
  t.finish("h", 5, 7.5, false);
  ASSERT_TRUE(t.begin_move("h"));
  int status = 0;
  EXPECT_EQ(thrown_kind([&] { t.claim("h", false, 8.0); }, &status), "sequence_moved");
  EXPECT_EQ(status, 503);
  t.end_move("h", true);
  EXPECT_TRUE(t.moved("h"));
  EXPECT_EQ(thrown_kind([&] { t.claim("h", true, 8.0); }), "sequence_moved");
  // A /v1 stream the table did not know: put back, it is forgotten again.
  ASSERT_TRUE(t.begin_move("v1-stream"));
  EXPECT_TRUE(t.moved("v1-stream"));
  t.end_move("v1-stream", false);
  EXPECT_FALSE(t.moved("v1-stream"));
}

// ---------------------------------------------------------------------------------------------
// The /v2 routes of a server

std::vector<json> sequence_frames(const std::string& seq, int n, double t0 = kT0) {
  std::vector<json> frames;
  for (int k = 0; k < n; ++k) frames.push_back(micro_frame(k % 3, seq, t0 + 0.5 * k));
  return frames;
}

void expect_oip_error(const OipAnswer& a, int status, const std::string& kind, const std::string& says = "") {
  EXPECT_EQ(a.status, status) << a.error;
  EXPECT_EQ(a.kind, kind) << a.error;
  EXPECT_FALSE(a.error.empty());
  if (!says.empty()) {
    EXPECT_NE(a.error.find(says), std::string::npos) << a.error;
  }
}

TEST(OipServer, HealthAndMetadata) {
  ServiceOptions so;
  so.oip.model_name = "bev-micro";
  RunningServer server(so);
  auto cli = server.client();
  const auto v2 = cli->Get("/v2");
  ASSERT_TRUE(v2);
  EXPECT_EQ(v2->status, 200);
  EXPECT_EQ(parse(v2->body)["extensions"], json({"binary_tensor_data", "sequence"}));
  EXPECT_EQ(cli->Get("/v2/health/live")->status, 200);
  EXPECT_EQ(cli->Get("/v2/health/ready")->status, 200);
  EXPECT_EQ(cli->Get("/v2/models/bev-micro/ready")->status, 200);
  const auto meta = cli->Get("/v2/models/bev-micro");
  ASSERT_EQ(meta->status, 200);
  const json m = parse(meta->body);
  EXPECT_EQ(m["name"], "bev-micro");
  EXPECT_EQ(m["inputs"][0], json({{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}}));
  EXPECT_EQ(m["outputs"][0], json({{"name", "BOXES"}, {"datatype", "FP32"}, {"shape", {-1, 9}}}));
  EXPECT_EQ(cli->Get("/v2/models/bev-micro/versions/1")->status, 200);

  // Another model or version, an unknown route: 404 in the protocol's shape.
  for (const std::string path : {"/v2/models/bevformer", "/v2/models/bev-micro/versions/2", "/v2/nothing"}) {
    const auto r = cli->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
    const json e = parse(r->body);
    EXPECT_TRUE(e["error"].is_string()) << r->body;
  }
  // Draining: not ready (the balancer takes it out), still live.
  server.service().begin_drain();
  EXPECT_EQ(cli->Get("/v2/health/ready")->status, 400);
  EXPECT_EQ(cli->Get("/v2/models/bev-micro/ready")->status, 400);
  EXPECT_EQ(cli->Get("/v2/health/live")->status, 200);
}

TEST(OipServer, BinaryAndJsonInferenceEqualTheLibrary) {
  RunningServer server;
  auto cli = server.client();
  const std::vector<json> bin = sequence_frames("oip-bin", 3), js = sequence_frames("oip-json", 3);
  const std::vector<json> want_bin = library_run(bin), want_js = library_run(js);
  for (int k = 0; k < 3; ++k) {
    const OipAnswer a = post_oip(*cli, oip_binary_call(bin[k], "oip-bin", k == 0));
    ASSERT_EQ(a.status, 200) << a.error;
    EXPECT_EQ(a.detections(), want_bin[k]) << "frame " << k;
    EXPECT_EQ(a.parameters()["used_history"], k > 0);
    EXPECT_EQ(a.parameters()["frame_index"], k);
    EXPECT_EQ(a.parameters()["sequence_id"], "oip-bin");
    EXPECT_EQ(a.header["id"], "req-oip-bin");
    // BOXES, SCORES and LABELS say what DETECTIONS says (its numbers are the model's floats in
    // their shortest decimal form, which read back as the same floats).
    const json& boxes = want_bin[k]["detections"];
    ASSERT_EQ(a.binary.at("SCORES").size(), 4 * boxes.size());
    ASSERT_EQ(a.binary.at("BOXES").size(), 4 * 9 * boxes.size());
    ASSERT_EQ(a.binary.at("LABELS").size(), 4 * boxes.size());
    for (size_t i = 0; i < boxes.size(); ++i) {
      float score, box[9];
      int32_t label;
      std::memcpy(&score, a.binary.at("SCORES").data() + 4 * i, 4);
      std::memcpy(&label, a.binary.at("LABELS").data() + 4 * i, 4);
      std::memcpy(box, a.binary.at("BOXES").data() + 36 * i, 36);
      const json& b = boxes[i];
      EXPECT_EQ(score, static_cast<float>(b["score"].get<double>()));
      EXPECT_EQ(label, b["label"].get<int>());
      for (int d = 0; d < 3; ++d) EXPECT_EQ(box[3 + d], static_cast<float>(b["size"][d].get<double>()));
      EXPECT_EQ(box[6], static_cast<float>(b["yaw"].get<double>()));
      EXPECT_EQ(box[7], static_cast<float>(b["velocity"][0].get<double>()));
      EXPECT_EQ(box[8], static_cast<float>(b["velocity"][1].get<double>()));
    }

    const OipAnswer b = post_oip(*cli, oip_json_call(js[k], "oip-json", k == 0));
    ASSERT_EQ(b.status, 200) << b.error;
    EXPECT_EQ(b.detections(), want_js[k]) << "frame " << k;
    EXPECT_TRUE(b.binary.empty());  // JSON in, JSON out unless asked
  }
  EXPECT_GT(want_bin[2]["num_detections"].get<int>(), 0);
}

// With --max-batch, the protocol's frames of several sequences run as batches (as /v1's do), each
// answered as the library answers its stream alone; a sequence that ends in a batch is freed.
TEST(OipServer, BatchedSequencesEqualTheLibrary) {
  constexpr int kSequences = 4, kFrames = 3;
  ServiceOptions so;
  so.workers = 1;
  so.max_batch = 4;
  so.batch_delay_seconds = 0.5;
  RunningServer server(so);
  std::vector<std::vector<json>> frames;
  for (int q = 0; q < kSequences; ++q) frames.push_back(sequence_frames("oip-batched-" + std::to_string(q), kFrames, kT0 + 13.0 * q));
  std::vector<std::vector<OipAnswer>> got(kSequences);
  std::vector<std::thread> clients;
  for (int q = 0; q < kSequences; ++q) {
    clients.emplace_back([&, q] {
      auto cli = server.client();
      const std::string seq = "oip-batched-" + std::to_string(q);
      for (int k = 0; k < kFrames; ++k) got[q].push_back(post_oip(*cli, oip_binary_call(frames[q][k], seq, k == 0, k == kFrames - 1)));
    });
  }
  for (std::thread& t : clients) t.join();
  for (int q = 0; q < kSequences; ++q) {
    const std::vector<json> want = library_run(frames[q]);
    for (int k = 0; k < kFrames; ++k) {
      ASSERT_EQ(got[q][k].status, 200) << got[q][k].error;
      EXPECT_EQ(got[q][k].detections(), want[k]) << "sequence " << q << " frame " << k;
      EXPECT_EQ(got[q][k].parameters()["frame_index"], k);
    }
  }
  // The four clients' frames arrive within the half-second delay of the first: batches ran.
  EXPECT_GE(metric(*server.client(), "bevformer_batched_frames_total"), 2.0);
  for (const StreamStatus& st : server.service().model().streams()) {
    EXPECT_EQ(st.id.rfind("oip-batched-", 0), std::string::npos) << st.id << " was not freed at its sequence's end";
  }
}

TEST(OipServer, SequenceRulesAndClearErrors) {
  ServiceOptions so;
  so.oip.sequences.handoff_wait_seconds = 0;
  RunningServer server(so);
  auto cli = server.client();
  const std::vector<json> f = sequence_frames("oip-seq", 4);

  // A frame of a sequence never started here: the history is gone, restart.
  expect_oip_error(post_oip(*cli, oip_binary_call(f[0], "oip-seq", false)), 409, "sequence_unknown", "restart the sequence");
  ASSERT_EQ(post_oip(*cli, oip_binary_call(f[0], "oip-seq", true)).status, 200);
  // Out of order: the same timestamp again.
  expect_oip_error(post_oip(*cli, oip_binary_call(f[0], "oip-seq", false)), 409, "out_of_order");
  ASSERT_EQ(post_oip(*cli, oip_binary_call(f[1], "oip-seq", false)).status, 200);
  // The end frees it after the frame: the next one must restart.
  const OipAnswer end = post_oip(*cli, oip_binary_call(f[2], "oip-seq", false, /*end=*/true));
  ASSERT_EQ(end.status, 200) << end.error;
  EXPECT_EQ(end.parameters()["used_history"], true);
  expect_oip_error(post_oip(*cli, oip_binary_call(f[3], "oip-seq", false)), 409, "sequence_unknown");
  // A start resets the history even though the scene and the clock go on.
  const OipAnswer restart = post_oip(*cli, oip_binary_call(f[3], "oip-seq", true));
  ASSERT_EQ(restart.status, 200) << restart.error;
  EXPECT_EQ(restart.parameters()["used_history"], false);
  EXPECT_EQ(restart.parameters()["frame_index"], 0);

  // No sequence id; the frame's stream another than the sequence; another model.
  OipCall no_seq = oip_json_call(f[0], "oip-seq", true);
  json body = json::parse(no_seq.body);
  body["parameters"].erase("sequence_id");
  no_seq.body = body.dump();
  expect_oip_error(post_oip(*cli, no_seq), 400, "sequence_required");
  expect_oip_error(post_oip(*cli, oip_json_call(f[0], "other-seq", true)), 400, "stream_mismatch");
  expect_oip_error(post_oip(*cli, oip_json_call(f[0], "oip-seq", true), "resnet"), 404, "unknown_model");
  // Images in the frame's camera paths and no IMAGES: a server never reads a path.
  OipCall paths = oip_json_call(f[0], "oip-seq", true);
  body = json::parse(paths.body);
  body["inputs"][0]["data"][0] = f[0].dump();
  paths.body = body.dump();
  expect_oip_error(post_oip(*cli, paths), 400, "missing_image");
  // An IMAGES count that is not the camera count; images that are not images.
  json named = f[0];
  for (json& c : named["cameras"]) c["image"] = c["name"];
  const size_t cams = named["cameras"].size();
  auto images_call = [&](size_t n) {
    json req = {{"parameters", {{"sequence_id", "oip-seq"}, {"sequence_start", true}}},
                {"inputs",
                 {{{"name", "FRAME"}, {"datatype", "BYTES"}, {"shape", {1}}, {"data", {named.dump()}}},
                  {{"name", "IMAGES"}, {"datatype", "BYTES"}, {"shape", {n}}, {"data", std::vector<std::string>(n, "not a png")}}}}};
    return OipCall{req.dump(), {}};
  };
  expect_oip_error(post_oip(*cli, images_call(cams - 1)), 400, "invalid_input", "one image per camera");
  expect_oip_error(post_oip(*cli, images_call(cams)), 400, "invalid_image");

  // The /v1 view of the same server is unchanged, and the server still answers.
  EXPECT_EQ(cli->Get("/healthz")->status, 200);
  const auto metrics = cli->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("bevformer_sequences_live 1"), std::string::npos) << metrics->body;
}

TEST(OipServer, AnAbandonedSequenceIsFreedAndItsNextFrameMustRestart) {
  ServiceOptions so;
  so.oip.sequences.max_idle_seconds = 0.2;
  so.oip.sequences.handoff_wait_seconds = 0;
  RunningServer server(so);
  auto cli = server.client();
  const std::vector<json> f = sequence_frames("oip-idle", 2);
  ASSERT_EQ(post_oip(*cli, oip_binary_call(f[0], "oip-idle", true)).status, 200);
  // The sweeper frees it (and its engine stream) once idle past the limit; waited for, not timed.
  auto freed = [&] {
    for (const StreamStatus& s : served_model().streams()) {
      if (s.id == "oip-idle") return false;
    }
    return server.service().oip().sequences().live() == 0;
  };
  for (int i = 0; i < 600 && !freed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(freed());
  expect_oip_error(post_oip(*cli, oip_binary_call(f[1], "oip-idle", false)), 409, "sequence_unknown", "restart the sequence");
  const OipAnswer restarted = post_oip(*cli, oip_binary_call(f[1], "oip-idle", true));
  ASSERT_EQ(restarted.status, 200) << restarted.error;
  EXPECT_EQ(restarted.parameters()["used_history"], false);
}

TEST(OipServer, HostileBodiesNeverHurtTheServer) {
  RunningServer server;
  auto cli = server.client();
  const std::vector<std::string> bodies = {
      "", "{", "null", "{\"inputs\": 5}", std::string(1000, '['), "{\"inputs\":[{\"name\":\"FRAME\"}]}",
      "{\"parameters\":{\"sequence_id\":1,\"sequence_start\":true},\"inputs\":[{\"name\":\"FRAME\",\"datatype\":\"BYTES\","
      "\"shape\":[1],\"data\":[\"{\\\"stream\\\": 3}\"]}]}"};
  for (const std::string& b : bodies) {
    const auto r = cli->Post("/v2/models/bevformer/infer", b, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << b.substr(0, 80) << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e["error"].is_string()) << r->body;
  }
  // A header length past the body, and one that is not a number.
  httplib::Headers h = {{"Inference-Header-Content-Length", "100000"}};
  auto r = cli->Post("/v2/models/bevformer/infer", h, "{}", "application/octet-stream");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  h = {{"Inference-Header-Content-Length", "-1"}};
  r = cli->Post("/v2/models/bevformer/infer", h, "{}", "application/octet-stream");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  // Still serving.
  const std::vector<json> f = sequence_frames("oip-after-hostile", 1);
  EXPECT_EQ(post_oip(*cli, oip_binary_call(f[0], "oip-after-hostile", true)).status, 200);
}

// ---------------------------------------------------------------------------------------------
// History handoff

// A model of its own (each server of a fleet has one), the micro set's weights.
std::unique_ptr<Model> fleet_model() { return load_micro_model(/*pipeline=*/false); }

TEST(OipHandoff, ExportImportContinuesBitForBit) {
  auto a = fleet_model(), b = fleet_model();
  ASSERT_EQ(a->fingerprint(), b->fingerprint());
  EXPECT_EQ(a->fingerprint().rfind("bevfp1-", 0), 0u);
  const std::vector<json> f = sequence_frames("handoff-lib", 3);
  const std::vector<json> want = library_run(f);
  EXPECT_EQ(a->export_stream("handoff-lib"), std::nullopt);  // no such stream yet
  for (int k = 0; k < 2; ++k) ASSERT_EQ(parse(a->detect(json_body(f[k]), "").json), want[k]);
  const std::optional<std::string> bytes = a->export_stream("handoff-lib");
  ASSERT_TRUE(bytes);

  // Corrupt anywhere: refused, never installed.
  for (size_t at : {size_t{0}, size_t{20}, bytes->size() / 2, bytes->size() - 1}) {
    std::string bad = *bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    EXPECT_THROW(b->import_stream(bad), Error) << "byte " << at;
  }
  EXPECT_THROW(b->import_stream(bytes->substr(0, bytes->size() - 9)), Error);
  EXPECT_THROW(b->import_stream(""), Error);
  // Another model's history (another fingerprint, the bytes otherwise sound): kUnsupported.
  StreamSnapshot other = decode_stream_handoff(*bytes);
  other.fingerprint = "bevfp1-00000000000000000000000000000000";
  try {
    b->import_stream(encode_stream_handoff(other));
    ADD_FAILURE() << "another fingerprint was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  EXPECT_TRUE(b->streams().empty());

  const auto [id, imported] = b->import_stream(*bytes);
  EXPECT_EQ(id, "handoff-lib");
  EXPECT_TRUE(imported);
  const json third = parse(b->detect(json_body(f[2]), "").json);
  EXPECT_EQ(third, want[2]);
  EXPECT_TRUE(third["used_history"].get<bool>());
  // A stream that already ran frames here keeps its newer history.
  EXPECT_FALSE(b->import_stream(*bytes).second);
}

// Two servers, each over its own model; A drains straight to B (B stands for the balancer: every
// key A probes answers from B, so A is out of rotation at once).
TEST(OipHandoff, DrainHandsEveryStreamToTheNextOwner) {
  auto ma = fleet_model(), mb = fleet_model();
  ServiceOptions sb;
  sb.oip.sequences.handoff_wait_seconds = 0;
  ModelServer b(*mb, sb);
  ServiceOptions sa;
  sa.fleet.handoff_via = b.url();
  sa.fleet.drain_timeout_seconds = 60;
  ModelServer a(*ma, sa);
  auto ca = a.client(), cb = b.client();

  constexpr int kSeq = 3, kFrames = 4, kBefore = 2;
  std::vector<std::vector<json>> frames;
  std::vector<std::vector<json>> want;
  for (int s = 0; s < kSeq; ++s) {
    frames.push_back(sequence_frames("drain-" + std::to_string(s), kFrames, kT0 + 40.0 * s));
    want.push_back(library_run(frames.back()));
  }
  for (int s = 0; s < kSeq; ++s) {
    for (int k = 0; k < kBefore; ++k) {
      const OipAnswer r = post_oip(*ca, oip_binary_call(frames[s][k], "drain-" + std::to_string(s), k == 0));
      ASSERT_EQ(r.status, 200) << r.error;
      ASSERT_EQ(r.detections(), want[s][k]);
    }
  }
  // A /v1 stream moves too.
  const std::vector<json> v1 = sequence_frames("drain-v1", 2, kT0 + 500);
  const std::vector<json> want_v1 = library_run(v1);
  ASSERT_EQ(ca->Post(frames_path("drain-v1"), json_body(v1[0]), "application/json")->status, 200);

  a.service().begin_drain();
  a.service().fleet().drain();
  EXPECT_EQ(a.service().fleet().counters().sent, kSeq + 1u);
  EXPECT_EQ(a.service().fleet().counters().lost, 0u);
  EXPECT_EQ(b.service().fleet().counters().received, kSeq + 1u);
  // A late frame at A hears that the sequence moved (retryable), never runs without history.
  expect_oip_error(post_oip(*ca, oip_binary_call(frames[0][kBefore], "drain-0", false)), 503, "sequence_moved");
  // At B each sequence continues with its history, equal to the run that never moved.
  for (int s = 0; s < kSeq; ++s) {
    for (int k = kBefore; k < kFrames; ++k) {
      const OipAnswer r = post_oip(*cb, oip_binary_call(frames[s][k], "drain-" + std::to_string(s), false));
      ASSERT_EQ(r.status, 200) << r.error;
      EXPECT_EQ(r.detections(), want[s][k]) << "sequence " << s << " frame " << k;
      EXPECT_EQ(r.parameters()["used_history"], true);
    }
  }
  const auto r = cb->Post(frames_path("drain-v1"), json_body(v1[1]), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(parse(r->body), want_v1[1]);
}

TEST(OipHandoff, HandoffEndpointRefusals) {
  auto ma = fleet_model();
  ModelServer a(*ma, {});
  auto cli = a.client();
  // Bytes that are not a history; a handoff from this very server (the balancer still routes here).
  auto r = cli->Post("/v1/handoff", "not a history", "application/octet-stream");
  ASSERT_TRUE(r);
  expect_error(r, 400, "invalid_handoff");
  httplib::Headers self = {{"X-Handoff-From", a.service().fleet().instance()}};
  expect_error(cli->Post("/v1/handoff", self, "x", "application/octet-stream"), 409, "handoff_to_self");
  const auto owner = cli->Get("/v1/handoff/owner");
  ASSERT_EQ(owner->status, 200);
  EXPECT_EQ(parse(owner->body)["instance"], a.service().fleet().instance());
  EXPECT_EQ(parse(owner->body)["fingerprint"], ma->fingerprint());
}

// A refused handoff changes nothing, and each refusal says what it is (issue 45): an id the
// server would not take from a client (until 2026-12-07 imported first, evicting a stream of a
// full table, then dropped), another format version (422 unsupported_format, not
// model_mismatch), a last timestamp past a frame's limit (installed, it answered every later
// frame 409), BEV values near float32's limit.
TEST(OipHandoff, RefusedHandoffsChangeNothing) {
  auto src = fleet_model();
  const std::vector<json> f = sequence_frames("handoff-src", 2);
  ASSERT_EQ(parse(src->detect(json_body(f[0]), "").json)["used_history"], false);
  const std::optional<std::string> bytes = src->export_stream("handoff-src");
  ASSERT_TRUE(bytes);
  const StreamSnapshot good = decode_stream_handoff(*bytes);

  Knobs k;
  k.threads = 2;
  k.max_streams = 1;  // full with one stream: an import would have to evict it
  auto m = Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k);
  ModelServer server(*m, {});
  auto cli = server.client();
  const std::vector<json> kept = sequence_frames("kept", 2, kT0 + 100);
  ASSERT_EQ(cli->Post(frames_path("kept"), json_body(kept[0]), "application/json")->status, 200);

  StreamSnapshot bad_id = good;
  bad_id.stream = "not a valid id!";
  StreamSnapshot late = good;
  late.last_timestamp = 1e300;
  StreamSnapshot huge = good;
  huge.bev = good.bev.clone();  // a copy shares the tensor's storage
  huge.bev.data<float>()[7] = 3e38f;
  std::string other_version = encode_stream_handoff(good);
  // The version is the u32 after the 8-byte magic; the checksum (last 8 bytes) covers it, so
  // the reader must say "version" before it would say "checksum".
  other_version[8] = 2;
  const struct {
    std::string body;
    int status;
    const char* code;
    const char* says;
  } cases[] = {
      {encode_stream_handoff(bad_id), 400, "invalid_handoff", "stream id"},
      {other_version, 422, "unsupported_format", "version 2"},
      {encode_stream_handoff(late), 400, "invalid_handoff", "last timestamp 1e+300"},
      {encode_stream_handoff(huge), 400, "invalid_handoff", "is 3e+38"},
  };
  for (const auto& c : cases) {
    const auto r = cli->Post("/v1/handoff", c.body, "application/octet-stream");
    ASSERT_TRUE(r);
    expect_error(r, c.status, c.code);
    EXPECT_NE(r->body.find(c.says), std::string::npos) << c.says << " in " << r->body;
    EXPECT_LT(r->body.size(), 600u) << r->body;  // no number printed in full
  }
  // Nothing changed: "kept" is still the one stream, with its history.
  const std::vector<StreamStatus> streams = m->streams();
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0].id, "kept");
  const auto r = cli->Post(frames_path("kept"), json_body(kept[1]), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(parse(r->body)["used_history"], true);
}

// Servers of one fleet must run one model: the fingerprint tells apart other weights (one value
// changed), another precision and another backend, and /v1/handoff refuses a history from any of
// them with 422 model_mismatch, installing nothing.
TEST(OipHandoff, AnotherModelsHistoryIs422ModelMismatch) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  auto a = fleet_model();
  const std::vector<json> f = sequence_frames("handoff-other-model", 1);
  ASSERT_EQ(parse(a->detect(json_body(f[0]), "").json), library_run(f)[0]);
  const std::optional<std::string> bytes = a->export_stream("handoff-other-model");
  ASSERT_TRUE(bytes);

  const Checkpoint ck = load_checkpoint(kMicroDir + "/checkpoint.pth");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : ck.tensors()) tensors.emplace_back(name, t.contiguous().clone());
  Tensor& changed = tensors.back().second;
  ASSERT_EQ(changed.dtype(), DType::kF32);
  changed.data<float>()[0] += 0.5f;
  const std::string dir = std::filesystem::temp_directory_path().string() + "/oip-fp-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/other.safetensors", tensors);
  // The same weights in the other format are the same model.
  write_safetensors(dir + "/same.safetensors", [&] {
    std::vector<std::pair<std::string, Tensor>> same;
    for (const auto& [name, t] : ck.tensors()) same.emplace_back(name, t);
    return same;
  }());
  Knobs same_knobs;
  same_knobs.threads = 2;
  EXPECT_EQ(Model::load(kMicroDir + "/config.json", dir + "/same.safetensors", same_knobs)->fingerprint(),
            a->fingerprint());

  std::vector<std::pair<std::string, std::unique_ptr<Model>>> others;
  Knobs k;
  k.threads = 2;
  others.emplace_back("other weights", Model::load(kMicroDir + "/config.json", dir + "/other.safetensors", k));
  k.precision = "bf16";
  others.emplace_back("bf16", Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k));
  k.precision = "f32";
  k.backend = "foreign";
  others.emplace_back("foreign backend", Model::load(kMicroDir + "/config.json", kMicroDir + "/checkpoint.pth", k));
  for (auto& [what, m] : others) {
    EXPECT_NE(m->fingerprint(), a->fingerprint()) << what;
    ModelServer b(*m, {});
    expect_error(b.client()->Post("/v1/handoff", *bytes, "application/octet-stream"), 422, "model_mismatch");
    EXPECT_TRUE(m->streams().empty()) << what;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace bev::server
