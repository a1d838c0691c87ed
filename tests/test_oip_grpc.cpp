// The Open Inference Protocol over gRPC (inference.GRPCInferenceService) on loopback, through the
// generated C++ stub: health and metadata, inference with sequence parameters equal to the library,
// errors as gRPC codes with the kind in the message, and malformed messages refused (the message
// parser itself is fuzzed: fuzz/fuzz_grpc_infer.cpp).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc_service.grpc.pb.h"
#include "oip_test_util.h"
#include "server/grpc_server.h"
#include "server_test_util.h"

namespace bev::server {
namespace {

struct GrpcFixture {
  explicit GrpcFixture(ServiceOptions so = {}) : server(std::move(so)) {
    grpc = std::make_unique<GrpcServer>(server.service(), GrpcOptions{"127.0.0.1", 0, 64u << 20, 8});
    const int port = grpc->start();
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    stub = inference::GRPCInferenceService::NewStub(channel);
  }
  RunningServer server;
  std::unique_ptr<GrpcServer> grpc;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
};

// Micro frame `f` of `seq`: FRAME and IMAGES as raw_input_contents (as tritonclient sends them).
inference::ModelInferRequest infer_request(json f, const std::string& seq, bool start, bool end = false) {
  inference::ModelInferRequest m;
  m.set_model_name("bevformer");
  m.set_id("g-" + seq);
  (*m.mutable_parameters())["sequence_id"].set_string_param(seq);
  (*m.mutable_parameters())["sequence_start"].set_bool_param(start);
  (*m.mutable_parameters())["sequence_end"].set_bool_param(end);
  std::string images;
  int n = 0;
  for (json& c : f["cameras"]) {
    images += bytes_element(file_bytes(c["image"].get<std::string>()));
    c["image"] = c["name"];
    ++n;
  }
  auto* frame = m.add_inputs();
  frame->set_name("FRAME");
  frame->set_datatype("BYTES");
  frame->add_shape(1);
  m.add_raw_input_contents(bytes_element(f.dump()));
  auto* imgs = m.add_inputs();
  imgs->set_name("IMAGES");
  imgs->set_datatype("BYTES");
  imgs->add_shape(n);
  m.add_raw_input_contents(images);
  return m;
}

json detections_of(const inference::ModelInferResponse& r) {
  for (int i = 0; i < r.outputs_size(); ++i) {
    if (r.outputs(i).name() != "DETECTIONS") continue;
    const std::string& raw = r.raw_output_contents(i);
    uint32_t n;
    std::memcpy(&n, raw.data(), 4);
    return json::parse(raw.substr(4, n));
  }
  return nullptr;
}

TEST(OipGrpc, HealthAndMetadata) {
  GrpcFixture g;
  grpc::ClientContext c1, c2, c3, c4;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(g.stub->ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(g.stub->ServerReady(&c2, {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  inference::ModelMetadataRequest mreq;
  mreq.set_name("bevformer");
  inference::ModelMetadataResponse meta;
  ASSERT_TRUE(g.stub->ModelMetadata(&c3, mreq, &meta).ok());
  EXPECT_EQ(meta.name(), "bevformer");
  ASSERT_EQ(meta.inputs_size(), 2);
  EXPECT_EQ(meta.inputs(0).name(), "FRAME");
  ASSERT_EQ(meta.outputs_size(), 4);
  EXPECT_EQ(meta.outputs(0).name(), "BOXES");
  ASSERT_EQ(meta.outputs(0).shape_size(), 2);
  EXPECT_EQ(meta.outputs(0).shape(1), 9);
  mreq.set_name("resnet");
  const grpc::Status s = g.stub->ModelMetadata(&c4, mreq, &meta);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message().rfind("[unknown_model]", 0), 0u) << s.error_message();
}

TEST(OipGrpc, SequenceInferenceEqualsTheLibrary) {
  ServiceOptions so;
  so.oip.sequences.handoff_wait_seconds = 0;
  GrpcFixture g(so);
  std::vector<json> f;
  for (int k = 0; k < 3; ++k) f.push_back(micro_frame(k, "grpc-seq", 1533151603.54759 + 0.5 * k));
  const std::vector<json> want = library_run(f);
  {
    // Not started: the history is gone, restart (FAILED_PRECONDITION: not retryable as is).
    grpc::ClientContext c;
    inference::ModelInferResponse r;
    const grpc::Status s = g.stub->ModelInfer(&c, infer_request(f[0], "grpc-seq", false), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(s.error_message().rfind("[sequence_unknown]", 0), 0u) << s.error_message();
  }
  for (int k = 0; k < 3; ++k) {
    grpc::ClientContext c;
    inference::ModelInferResponse r;
    const grpc::Status s = g.stub->ModelInfer(&c, infer_request(f[k], "grpc-seq", k == 0, k == 2), &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(detections_of(r), want[k]) << "frame " << k;
    EXPECT_EQ(r.id(), "g-grpc-seq");
    ASSERT_EQ(r.outputs_size(), 4);
    EXPECT_EQ(r.raw_output_contents_size(), 4);
    EXPECT_EQ(r.parameters().at("used_history").bool_param(), k > 0);
    EXPECT_EQ(r.parameters().at("frame_index").int64_param(), k);
    EXPECT_EQ(r.outputs(0).shape(0), static_cast<int64_t>(want[k]["detections"].size()));
    EXPECT_EQ(r.raw_output_contents(0).size(), 9 * 4 * want[k]["detections"].size());
  }
  {
    // Ended with the last frame: freed.
    grpc::ClientContext c;
    inference::ModelInferResponse r;
    const grpc::Status s = g.stub->ModelInfer(&c, infer_request(f[2], "grpc-seq", false), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
}

TEST(OipGrpc, MalformedMessagesAreInvalidArgument) {
  GrpcFixture g;
  const json f = micro_frame(0, "grpc-bad", 1533151603.54759);
  std::vector<inference::ModelInferRequest> bad;
  inference::ModelInferRequest m = infer_request(f, "grpc-bad", true);
  m.mutable_raw_input_contents(0)->resize(2);  // cut inside the element's length
  bad.push_back(m);
  m = infer_request(f, "grpc-bad", true);
  m.mutable_inputs(1)->set_shape(0, 5);  // not the element count
  bad.push_back(m);
  m = infer_request(f, "grpc-bad", true);
  m.mutable_inputs(0)->set_datatype("FP32");
  bad.push_back(m);
  m = infer_request(f, "grpc-bad", true);
  m.add_raw_input_contents("extra");  // more raw entries than inputs
  bad.push_back(m);
  m = infer_request(f, "grpc-bad", true);
  (*m.mutable_parameters())["sequence_start"].set_string_param("yes");
  bad.push_back(m);
  m = infer_request(f, "grpc-bad", true);
  std::string huge(4, '\xff');
  m.set_raw_input_contents(1, huge + "png");  // an element longer than what remains
  bad.push_back(m);
  for (size_t i = 0; i < bad.size(); ++i) {
    grpc::ClientContext c;
    inference::ModelInferResponse r;
    const grpc::Status s = g.stub->ModelInfer(&c, bad[i], &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "case " << i << ": " << s.error_message();
  }
  // Still serving.
  grpc::ClientContext c;
  inference::ModelInferResponse r;
  EXPECT_TRUE(g.stub->ModelInfer(&c, infer_request(f, "grpc-bad", true), &r).ok());
}

}  // namespace
}  // namespace bev::server
