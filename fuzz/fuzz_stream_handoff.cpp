// libFuzzer target: a stream's history as handed over between the servers of a fleet
// (runtime/stream_handoff.h) — bytes off the network into decode_stream_handoff. Only bev::Error
// may escape; a snapshot that decodes must encode back to the very same bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "bevformer/error.h"
#include "runtime/stream_handoff.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  bev::StreamSnapshot s;
  try {
    s = bev::decode_stream_handoff(input);
  } catch (const bev::Error& e) {
    if (std::string_view(e.what()).empty()) __builtin_trap();
    return 0;
  }
  if (bev::encode_stream_handoff(s) != input) __builtin_trap();
  return 0;
}
