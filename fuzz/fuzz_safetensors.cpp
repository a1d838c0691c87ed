// libFuzzer target: the safetensors reader.
#include <cstdint>
#include <vector>

#include "bevformer/error.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto src = bev::ByteSource::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    const bev::Checkpoint ck = bev::read_safetensors(src);
    volatile uint64_t sink = bev::fuzz::touch_all(ck);
    (void)sink;
  } catch (const bev::Error&) {
  }
  return 0;
}
