// libFuzzer target: the frame JSON reader (strict parse, base64, matrices, poses) and, for inputs
// that look like JPEG/PNG, the image structure check and decoder. A frame that parses must come
// back equal from its own text (to_json -> parse), so the writer and reader agree.
#include <cstdint>
#include <span>
#include <string_view>

#include "bevformer/error.h"
#include "io/frame_json.h"
#include "io/image.h"

namespace {

void check_image(std::span<const uint8_t> bytes) {
  try {
    bev::inspect_image(bytes, "fuzz image");
    const bev::Tensor t = bev::decode_image(bytes, "fuzz image");
    volatile uint64_t sink = static_cast<uint64_t>(t.numel());
    (void)sink;
  } catch (const bev::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  if (size >= 2 && ((data[0] == 0xFF && data[1] == 0xD8) || data[0] == 0x89)) {
    check_image(bytes);
    return 0;
  }
  bev::Frame spec;
  try {
    spec = bev::parse_frame_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const bev::Error&) {
    return 0;
  }
  for (const bev::Camera& c : spec.cameras) {
    if (!c.image_bytes.empty()) check_image(c.image_bytes.bytes);
  }
  // The writer's text must read back to the same frame.
  const bev::Frame again = bev::parse_frame_json(bev::frame_json_text(spec), "fuzz.json (rewritten)");
  if (!(again == spec)) __builtin_trap();
  return 0;
}
