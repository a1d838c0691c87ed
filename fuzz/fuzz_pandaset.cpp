// libFuzzer target: the PandaSet devkit files convert-pandaset reads (poses.json,
// timestamps.json, intrinsics.json). The first byte picks the reader, the rest is the file. A
// parse either throws bev::Error or gives finite numbers: rigid poses (orthonormal rotations) and
// positive focal lengths, which the conversion then inverts and multiplies.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "bevformer/error.h"
#include "io/pandaset.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0:
        for (const bev::Mat4& m : bev::parse_pandaset_poses(text, "poses.json")) {
          for (double v : m) require(std::isfinite(v));
          for (int r = 0; r < 3; ++r) {  // rows of the rotation: unit length
            const double n = m[r * 4] * m[r * 4] + m[r * 4 + 1] * m[r * 4 + 1] + m[r * 4 + 2] * m[r * 4 + 2];
            require(std::abs(n - 1) < 1e-9);
          }
        }
        break;
      case 1:
        for (double t : bev::parse_pandaset_timestamps(text, "timestamps.json")) require(std::isfinite(t));
        break;
      default: {
        const bev::Mat3 k = bev::parse_pandaset_intrinsics(text, "intrinsics.json");
        for (double v : k) require(std::isfinite(v));
        require(k[0] > 0 && k[4] > 0);
      }
    }
  } catch (const bev::Error&) {
  }
  return 0;
}
