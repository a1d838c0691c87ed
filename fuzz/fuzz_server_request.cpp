// libFuzzer target: the server's request layer — a POST /v1/streams/s/frames body with its
// Content-Type, through multipart parsing, strict frame JSON, base64 and the image structure
// check — everything that runs on a client's bytes before the model. Input: the Content-Type,
// a newline, then the body. A request that parses must give a frame whose JSON reads back and
// whose every camera names one of its attached images.
#include <cstdint>
#include <string>
#include <string_view>

#include "bevformer/error.h"
#include "io/frame_json.h"
#include "server/api_error.h"
#include "server/frame_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  const std::string_view content_type = input.substr(0, newline);
  bev::server::FrameRequest req;
  bev::server::RequestLimits limits;
  limits.max_parts = 16;
  try {
    req = bev::server::parse_frame_request("s", content_type, std::string(input.substr(newline + 1)), limits);
  } catch (const bev::server::ApiError& e) {
    if (e.status() < 400 || e.status() > 499 || std::string_view(e.what()).empty()) __builtin_trap();
    return 0;
  }
  // Anything else escaping (bev::Error, std::exception) is a bug: let libFuzzer report it.
  // What reaches the engine: a frame of this stream whose every camera has image bytes, no path.
  if (req.frame.stream != "s" || req.frame.cameras.empty()) __builtin_trap();
  for (const bev::Camera& cam : req.frame.cameras) {
    if (cam.image_bytes.empty() || !cam.image_path.empty()) __builtin_trap();
  }
  // And it writes out and reads back as itself.
  if (!(bev::parse_frame_json(bev::frame_json_text(req.frame), "fuzz: rewritten frame") == req.frame)) __builtin_trap();
  return 0;
}
