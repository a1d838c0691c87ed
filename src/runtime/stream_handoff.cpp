#include "runtime/stream_handoff.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "bevformer/error.h"
#include "core/number_text.h"
#include "io/frame_json.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "runtime/engine.h"

namespace bev {
namespace {

constexpr char kMagic[8] = {'B', 'E', 'V', 'H', 'I', 'S', 'T', '1'};
constexpr size_t kFixedBytes = 96;
constexpr uint32_t kHasPrevBev = 1, kHasTimestamp = 2, kHasScene = 4;

uint64_t mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  return x;
}

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64): static_assert below
  out.append(b, sizeof(T));
}
static_assert(std::endian::native == std::endian::little, "the handoff format is little-endian");

// Reads the fixed fields in order, each bounded by the bytes that remain.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <typename T>
  T get(const char* field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::string_view bytes(size_t n, const char* field) {
    need(n, field);
    const std::string_view v = b_.substr(at_, n);
    at_ += n;
    return v;
  }
  size_t at() const { return at_; }
  size_t left() const { return b_.size() - at_; }
  [[noreturn]] void fail(const std::string& problem, const std::string& expected = "") const {
    Error e(ErrorKind::kInvalidInput, problem);
    e.where("stream handoff").at_offset(at_);
    if (!expected.empty()) e.expected(expected);
    throw e;
  }

 private:
  void need(size_t n, const char* field) const {
    if (n > left()) fail(std::string("truncated in ") + field, std::to_string(n) + " more bytes, " + std::to_string(left()) + " left");
  }
  std::string_view b_;
  size_t at_ = 0;
};

std::string hex(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = digits[v & 15];
  return s;
}

}  // namespace

uint64_t hash64(std::span<const uint8_t> bytes, uint64_t seed) {
  // Word-wise multiply-xorshift (a few GB/s: hashing base's 270 MB of weights at load costs a
  // tenth of a second); the length is mixed in so that trailing zero bytes change the value.
  uint64_t h = mix(seed ^ 0x9e3779b97f4a7c15ULL ^ (bytes.size() * 0xff51afd7ed558ccdULL));
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ mix(w + i)) * 0x9fb21c651e98df25ULL;
  }
  uint64_t tail = 0;
  if (i < bytes.size()) std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  return mix(h ^ mix(tail ^ 0xc2b2ae3d27d4eb4fULL));
}

std::string encode_stream_handoff(const StreamSnapshot& s) {
  const bool bev = s.state.has_prev_bev;
  if (bev && (!s.bev.defined() || s.bev.dim() != 2 || s.bev.dtype() != DType::kF32 || s.bev.device() != Device::kCpu)) {
    throw Error(ErrorKind::kInternal, "a snapshot's BEV must be a host f32 [rows, channels] tensor (" +
                                          (s.bev.defined() ? s.bev.describe() : std::string("none")) + ")");
  }
  const Tensor values = bev ? s.bev.contiguous() : Tensor();
  const std::string scene = s.state.scene_token.value_or("");
  std::string out;
  out.reserve(kFixedBytes + s.stream.size() + scene.size() + s.fingerprint.size() + (bev ? values.nbytes() : 0) + 8);
  out.append(kMagic, 8);
  put<uint32_t>(out, kStreamHandoffVersion);
  put<uint32_t>(out, (bev ? kHasPrevBev : 0) | (s.has_timestamp ? kHasTimestamp : 0) | (s.state.scene_token ? kHasScene : 0));
  put<uint64_t>(out, s.frames);
  put<double>(out, s.last_timestamp);
  for (double p : s.state.prev_pos) put<double>(out, p);
  put<double>(out, s.state.prev_angle);
  put<uint32_t>(out, static_cast<uint32_t>(s.stream.size()));
  put<uint32_t>(out, static_cast<uint32_t>(scene.size()));
  put<uint32_t>(out, static_cast<uint32_t>(s.fingerprint.size()));
  put<uint32_t>(out, 0);
  put<int64_t>(out, bev ? values.size(0) : 0);
  put<int64_t>(out, bev ? values.size(1) : 0);
  out += s.stream;
  out += scene;
  out += s.fingerprint;
  if (bev) out.append(reinterpret_cast<const char*>(values.bytes().data()), values.nbytes());
  put<uint64_t>(out, hash64({reinterpret_cast<const uint8_t*>(out.data()), out.size()}));
  return out;
}

StreamSnapshot decode_stream_handoff(std::string_view bytes) {
  Reader r(bytes);
  if (r.bytes(8, "magic") != std::string_view(kMagic, 8)) {
    r.fail("not a stream handoff (bad magic)", "\"BEVHIST1\" (bytes from Model::export_stream)");
  }
  const uint32_t version = r.get<uint32_t>("version");
  if (version != kStreamHandoffVersion) {
    throw Error(ErrorKind::kUnsupported, "stream handoff format version " + std::to_string(version))
        .where("stream handoff")
        .expected("version " + std::to_string(kStreamHandoffVersion))
        .hint("every server of a fleet must run the same bevformer.cpp release");
  }
  // The checksum first: nothing below is trusted until every byte is known to be as written.
  if (bytes.size() < kFixedBytes + 8) r.fail("shorter than the fixed header and checksum");
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (hash64({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 8}) != stored) {
    throw Error(ErrorKind::kInvalidInput, "checksum mismatch: the bytes were changed or cut in transit")
        .where("stream handoff")
        .at_offset(bytes.size() - 8);
  }
  StreamSnapshot s;
  const uint32_t flags = r.get<uint32_t>("flags");
  if (flags & ~(kHasPrevBev | kHasTimestamp | kHasScene)) r.fail("unknown flags " + std::to_string(flags));
  s.frames = r.get<uint64_t>("frames");
  s.last_timestamp = r.get<double>("last_timestamp");
  for (double& p : s.state.prev_pos) p = r.get<double>("prev_pos");
  s.state.prev_angle = r.get<double>("prev_angle");
  const uint32_t id_len = r.get<uint32_t>("stream id length");
  const uint32_t scene_len = r.get<uint32_t>("scene length");
  const uint32_t fp_len = r.get<uint32_t>("fingerprint length");
  if (r.get<uint32_t>("reserved") != 0) r.fail("reserved field is not 0");
  const int64_t rows = r.get<int64_t>("BEV rows"), cols = r.get<int64_t>("BEV channels");
  s.has_timestamp = flags & kHasTimestamp;
  s.state.has_prev_bev = flags & kHasPrevBev;
  if (!std::isfinite(s.last_timestamp) || !std::isfinite(s.state.prev_angle) || !std::isfinite(s.state.prev_pos[0]) ||
      !std::isfinite(s.state.prev_pos[1]) || !std::isfinite(s.state.prev_pos[2])) {
    r.fail("a timestamp or CAN-bus value is NaN or infinite");
  }
  if (std::abs(s.last_timestamp) > kMaxTimestampSeconds) {
    r.fail("last timestamp " + number_text(s.last_timestamp), "at most 1e11 s from 0, as a frame's");
  }
  if (id_len == 0 || id_len > kMaxHandoffStreamId) r.fail("stream id of " + std::to_string(id_len) + " bytes", "1 to 1024");
  if (scene_len > kMaxHandoffText || fp_len > kMaxHandoffText) r.fail("scene or fingerprint over 4096 bytes");
  if ((flags & kHasScene) == 0 && scene_len != 0) r.fail("a scene without the scene flag");
  if (s.state.has_prev_bev ? (rows <= 0 || cols <= 0 || rows > kMaxHandoffBevValues / cols)
                           : (rows != 0 || cols != 0)) {
    r.fail("BEV of " + std::to_string(rows) + " x " + std::to_string(cols) + " values",
           s.state.has_prev_bev ? "positive extents, at most 2^28 values" : "0 x 0 without history");
  }
  s.stream = std::string(r.bytes(id_len, "stream id"));
  if (flags & kHasScene) s.state.scene_token = std::string(r.bytes(scene_len, "scene"));
  s.fingerprint = std::string(r.bytes(fp_len, "fingerprint"));
  const size_t bev_bytes = static_cast<size_t>(rows * cols) * sizeof(float);
  if (r.left() != bev_bytes + 8) {
    r.fail(std::to_string(r.left() - std::min<size_t>(r.left(), 8)) + " bytes of BEV values",
           std::to_string(bev_bytes) + " (" + std::to_string(rows) + " x " + std::to_string(cols) + " f32)");
  }
  if (s.state.has_prev_bev) {
    s.bev = Tensor::empty({rows, cols}, DType::kF32);
    std::memcpy(s.bev.raw_data(), r.bytes(bev_bytes, "BEV").data(), bev_bytes);
    const float* v = s.bev.data<float>();
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (!std::isfinite(v[i])) r.fail("BEV value " + std::to_string(i) + " is NaN or infinite");
      if (std::abs(v[i]) > kMaxHandoffBevMagnitude) {
        r.fail("BEV value " + std::to_string(i) + " is " + number_text(v[i]), "at most 1e6 in magnitude");
      }
    }
  }
  return s;
}

std::string model_fingerprint(const ModelConfig& cfg, const Checkpoint& checkpoint, const std::string& backend,
                              const std::string& precision) {
  nlohmann::json c = to_json(cfg);
  c.erase("name");  // the file it was read from: servers of one fleet may keep it in other places
  std::string meta = "bevformer-fingerprint-v1\n" + c.dump() + "\n" + backend + "\n" + precision + "\n";
  uint64_t a = hash64({reinterpret_cast<const uint8_t*>(meta.data()), meta.size()}, 1);
  uint64_t b = hash64({reinterpret_cast<const uint8_t*>(meta.data()), meta.size()}, 2);
  for (const auto& [name, t] : checkpoint.tensors()) {
    const Tensor dense = t.contiguous();
    const std::string head = name + "\n" + dense.describe() + "\n";
    const std::span<const uint8_t> h(reinterpret_cast<const uint8_t*>(head.data()), head.size());
    // Two lanes with other seeds: 128 bits, so that unrelated checkpoints never collide by chance.
    a = mix(a ^ hash64(h, a)) ^ hash64(dense.bytes(), a + 1);
    b = mix(b ^ hash64(h, b)) ^ hash64(dense.bytes(), b + 1);
  }
  return "bevfp1-" + hex(a) + hex(b);
}

std::optional<StreamSnapshot> export_stream(Engine& engine, const std::string& id, const std::string& fingerprint) {
  std::optional<StreamRegistry::Lease> lease = engine.streams().find(id);
  if (!lease) return std::nullopt;
  StreamHistory& h = lease->history();
  if (!h.state.has_prev_bev || !h.prev_bev.defined()) return std::nullopt;
  StreamSnapshot s;
  s.stream = id;
  s.fingerprint = fingerprint;
  s.frames = lease->frames();
  s.has_timestamp = lease->has_timestamp();
  s.last_timestamp = lease->last_timestamp();
  s.state = h.state;
  s.bev = engine.backend().read(h.prev_bev);  // the backend's bytes, as they are
  return s;
}

bool import_stream(Engine& engine, const StreamSnapshot& s, const std::string& fingerprint) {
  if (s.fingerprint != fingerprint) {
    throw Error(ErrorKind::kUnsupported, "the history was computed by model " + s.fingerprint.substr(0, 80) +
                                             ", this server runs " + fingerprint)
        .where("stream handoff of '" + s.stream.substr(0, 200) + "'")
        .expected("the same config, weights, backend and precision on every server of the fleet")
        .hint("a BEV from other weights would be a silently wrong history; restart the sequence instead");
  }
  const ModelConfig& cfg = engine.config();
  const int64_t rows = int64_t{cfg.head.bev_h} * cfg.head.bev_w, cols = cfg.transformer.embed_dims;
  if (s.state.has_prev_bev && (!s.bev.defined() || s.bev.shape() != Shape{rows, cols} || s.bev.dtype() != DType::kF32)) {
    throw Error(ErrorKind::kInvalidInput, "BEV " + (s.bev.defined() ? s.bev.describe() : std::string("none")))
        .where("stream handoff of '" + s.stream.substr(0, 200) + "'")
        .expected("f32[" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
  StreamRegistry::Lease lease = engine.streams().acquire(s.stream);
  if (lease.frames() > 0 || lease.history().state.has_prev_bev) return false;
  // A buffer of its own (upload): the runner's spare and the stream's buffer swap after each
  // frame, so writing into an existing one could reach another stream's output.
  StreamHistory h;
  h.state = s.state;
  if (s.state.has_prev_bev) h.prev_bev = engine.backend().upload(s.bev);
  lease.history() = std::move(h);
  lease.restore(s.frames, s.has_timestamp, s.last_timestamp);
  return true;
}

}  // namespace bev
