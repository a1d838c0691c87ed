// libFuzzer target: the Open Inference Protocol's REST request (POST /v2/models/{name}/infer)
// through parse_oip_rest_request — the JSON header, its tensors and parameters, and the binary
// tensor data extension. Input: the Inference-Header-Content-Length value (or "-" for none), a
// newline, then the body. Only ApiError 4xx may escape; a request that parses must have every
// element inside the body and as many elements as its shape declares.
#include <cstdint>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/oip.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  const std::string header(input.substr(0, newline));
  const std::string body(input.substr(newline + 1));
  bev::server::OipRequest req;
  try {
    req = bev::server::parse_oip_rest_request(body, header == "-" ? nullptr : &header);
  } catch (const bev::server::ApiError& e) {
    if (e.status() < 400 || e.status() > 499 || std::string_view(e.what()).empty()) __builtin_trap();
    return 0;
  }
  if (req.inputs.empty() || req.inputs.size() > bev::server::kMaxOipTensors) __builtin_trap();
  for (const bev::server::OipInput& in : req.inputs) {
    if (in.elements.size() > bev::server::kMaxOipElements) __builtin_trap();
    uint64_t acc = 0;
    for (std::string_view e : in.elements) {
      for (char c : e) acc += static_cast<unsigned char>(c);  // ASan: every view inside live bytes
    }
    if (acc == 0xffffffffffffffffull) __builtin_trap();
  }
  return 0;
}
