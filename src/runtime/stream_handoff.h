// One stream's history as bytes, so that a server leaving a fleet hands its streams to the one
// that owns them next (docs/DEPLOY.md, "History handoff"): the previous BEV read back from the
// backend bit for bit, the CAN-bus state forward_test carries (has_prev_bev, scene, prev_pos,
// prev_angle), the registry's frame count and last timestamp, and the model fingerprint of the
// engine that computed them — so an importer with other weights, config, backend or precision
// refuses it rather than run frames on a BEV that is not its own.
//
// The bytes (little-endian, version 1):
//   0   magic "BEVHIST1"
//   8   u32 format version (1)                 12  u32 flags: 1 has_prev_bev, 2 has_timestamp, 4 scene
//   16  u64 frames completed                   24  f64 last timestamp
//   32  f64 prev_pos[3]                        56  f64 prev_angle (degrees)
//   64  u32 stream id bytes, u32 scene bytes, u32 fingerprint bytes, u32 zero
//   80  i64 BEV rows (bev_h * bev_w), i64 BEV channels (embed_dims)
//   96  stream id, scene, fingerprint, then rows * channels f32 values
//   end u64 checksum (hash64 of every byte before it)
// decode_stream_handoff checks every length against the bytes that remain before reading (the
// bytes come off the network; fuzz/fuzz_stream_handoff.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "model/geometry.h"

namespace bev {

class Checkpoint;
class Engine;
struct ModelConfig;

inline constexpr uint32_t kStreamHandoffVersion = 1;
// Bounds on what a handoff may declare (checked before anything is allocated).
inline constexpr size_t kMaxHandoffStreamId = 1024;
inline constexpr size_t kMaxHandoffText = 4096;
inline constexpr int64_t kMaxHandoffBevValues = int64_t{1} << 28;  // 1 GiB of f32
// Held to what a frame may carry: a last timestamp within a frame's limit (kMaxTimestampSeconds,
// 1e11 s: one beyond it would refuse every later frame of the sequence as out of order), and BEV
// values within 1e6. The encoder's last layer norm bounds a BEV value by |gamma| sqrt(C - 1) +
// |beta|, 16 |gamma| + |beta| at 256 channels; trained weights keep both near 1, and values near
// float32's limit would overflow in the next frame's attention.
inline constexpr double kMaxHandoffBevMagnitude = 1e6;

struct StreamSnapshot {
  std::string stream;
  std::string fingerprint;   // of the engine that exported it
  uint64_t frames = 0;       // frames the stream completed
  bool has_timestamp = false;
  double last_timestamp = 0;
  TemporalState state;       // has_prev_bev, scene token, prev_pos, prev_angle
  Tensor bev;                // host f32 [rows, channels]; undefined when !state.has_prev_bev
};

// A 64-bit hash of bytes (not cryptographic: it catches corruption and tells weights apart;
// docs/DEPLOY.md says what it does not protect against).
uint64_t hash64(std::span<const uint8_t> bytes, uint64_t seed = 0);

std::string encode_stream_handoff(const StreamSnapshot& snapshot);
// The structure, bounds, finiteness and checksum; not the fingerprint (import_stream compares
// it with its engine's). Error(kInvalidInput) naming the field and byte offset; another format
// version is Error(kUnsupported).
StreamSnapshot decode_stream_handoff(std::string_view bytes);

// The identity of a loaded model: its config (without the file name it came from), every weight
// tensor's name, dtype, shape and bytes, the backend and the precision. "bevfp1-" and 32 hex digits.
std::string model_fingerprint(const ModelConfig& cfg, const Checkpoint& checkpoint, const std::string& backend,
                              const std::string& precision);

// Stream `id`'s history, taken under its lease (so never in the middle of a frame); nullopt when
// the stream does not exist or holds no previous BEV.
std::optional<StreamSnapshot> export_stream(Engine& engine, const std::string& id, const std::string& fingerprint);

// Installs a snapshot as a new stream of `engine` under the stream's lease. Refuses (Error
// kUnsupported) another fingerprint and (kInvalidInput) a BEV of another shape. Returns false,
// changing nothing, when a stream of that id already completed frames here: its history is newer
// than the handed-over one (the client restarted it here) and is kept.
bool import_stream(Engine& engine, const StreamSnapshot& snapshot, const std::string& fingerprint);

}  // namespace bev
