// libFuzzer target: the PyTorch checkpoint reader (ZIP container + restricted unpickler).
#include <cstdint>
#include <vector>

#include "bevformer/error.h"
#include "fuzz_common.h"
#include "io/pth_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto src = bev::ByteSource::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.pth");
    bev::LoadOptions o;
    o.verify_crc = (size % 2) == 0;  // half the inputs skip the CRC so mutations reach the parser
    const bev::Checkpoint ck = bev::read_pth(src, o);
    volatile uint64_t sink = bev::fuzz::touch_all(ck);
    (void)sink;
  } catch (const bev::Error&) {
  }
  return 0;
}
