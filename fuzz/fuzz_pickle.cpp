// libFuzzer target for the restricted unpickler: any input may be rejected with bev::Error, but
// nothing may crash, leak, hang or throw anything else, and what loads must render.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "bevformer/error.h"
#include "io/pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    bev::pickle::Unpickler unpickler(std::span<const uint8_t>(data, size), "fuzz.pkl");
    const bev::pickle::Value* root = unpickler.load();
    const std::string text = bev::pickle::repr(root);
    // dump() throws on invalid UTF-8, so this also checks that every string is clean.
    const std::string json = bev::pickle::to_json(root, 64, 1 << 14).dump();
    (void)root->get("state_dict");
    (void)text;
    (void)json;
  } catch (const bev::Error&) {
  }
  return 0;
}
