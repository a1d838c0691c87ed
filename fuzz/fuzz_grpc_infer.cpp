// libFuzzer target: the Open Inference Protocol over gRPC — a ModelInferRequest's wire bytes, as a
// client sends them, through protobuf's parser and oip_request_from_grpc (raw_input_contents, typed
// contents, shapes, parameters). Only ApiError 4xx may escape; a request that converts has every
// element inside the message.
#include <cstdint>
#include <memory>
#include <string_view>

#include "server/api_error.h"
#include "server/grpc_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = std::make_shared<inference::ModelInferRequest>();
  if (!m->ParseFromArray(data, static_cast<int>(size))) return 0;
  bev::server::OipRequest req;
  try {
    req = bev::server::oip_request_from_grpc(m);
  } catch (const bev::server::ApiError& e) {
    if (e.status() < 400 || e.status() > 499 || std::string_view(e.what()).empty()) __builtin_trap();
    return 0;
  }
  for (const bev::server::OipInput& in : req.inputs) {
    if (in.elements.size() > bev::server::kMaxOipElements) __builtin_trap();
    uint64_t acc = 0;
    for (std::string_view e : in.elements) {
      for (char c : e) acc += static_cast<unsigned char>(c);
    }
    if (acc == 0xffffffffffffffffull) __builtin_trap();
  }
  return 0;
}
