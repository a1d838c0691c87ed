// Per-stream history for many vehicles at once: for every stream id the previous BEV, pose and
// timestamp (StreamHistory), with the reset rules of a real deployment beside upstream's scene
// rule (a time gap over a knob, or a timestamp that does not increase), and bounded memory
// (least-recently-used eviction past max_streams, idle streams evicted after a TTL). Streams are
// used concurrently from several threads; each stream's frames run one at a time, in the order
// their leases are taken.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/stage_runner.h"

namespace bev {

struct StreamLimits {
  size_t max_streams = 64;        // past this, the least recently used idle stream is evicted
  double idle_ttl_seconds = 600;  // a stream unused this long (wall clock) is evicted
  double max_gap_seconds = 10.0;  // a frame this much later than the stream's last resets history
};

struct StreamInfo {
  std::string id;
  uint64_t frames = 0;          // frames completed
  double last_timestamp = 0;    // of the last completed frame (frame time, seconds)
  double idle_seconds = 0;      // wall clock since last use
  bool has_history = false;     // the next frame can use the previous BEV
  bool busy = false;            // a frame is running
};

struct StreamStats {
  size_t active = 0;
  uint64_t created = 0, evicted_lru = 0, evicted_ttl = 0, dropped = 0;
  uint64_t resets_gap = 0, resets_backwards = 0, resets_scene = 0;
};

class StreamRegistry {
  struct Entry;

 public:
  // `clock` returns wall-clock seconds (monotonic); tests inject their own.
  explicit StreamRegistry(StreamLimits limits = {}, std::function<double()> clock = {});
  ~StreamRegistry();

  // Exclusive use of one stream while a frame runs.
  class Lease {
   public:
    Lease(Lease&&) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    const std::string& id() const;
    StreamHistory& history();
    // Applies the reset rules for a frame stamped `timestamp` of scene `scene_token` before it
    // runs; returns why the history was dropped ("time gap of 12.5 s", "timestamp did not
    // increase ...", "scene changed from 'a' to 'b'"), or "" if kept. The stream keeps its
    // history buffer (it is reused), not its contents.
    std::string begin_frame(double timestamp, const std::string& scene_token);
    // Records a completed frame.
    void end_frame(double timestamp);
    // Frames this stream completed before the current one.
    uint64_t frames() const;
    // Whether a frame completed, and the last one's timestamp (a history handoff carries both).
    bool has_timestamp() const;
    double last_timestamp() const;
    // Installs a handed-over stream's bookkeeping (runtime/stream_handoff.h): the frames it
    // completed and its last frame's timestamp, as the exporting engine had them.
    void restore(uint64_t frames, bool has_timestamp, double last_timestamp);

   private:
    friend class StreamRegistry;
    Lease(StreamRegistry* owner, std::shared_ptr<Entry> entry);
    StreamRegistry* owner_;
    std::shared_ptr<Entry> entry_;
    std::unique_lock<std::mutex> lock_;
  };

  // Creates the stream on first use (evicting as the limits say). Blocks while another thread
  // runs a frame of the same stream. Throws Error(kUnsupported) when every slot is busy.
  Lease acquire(const std::string& id);
  // The lease of a stream that exists (blocks while its frame runs), never creating one; nullopt
  // when there is no such stream (or it is past its TTL). A history export takes it.
  std::optional<Lease> find(const std::string& id);
  // Forgets a stream's history; false when there is no such stream.
  bool drop(const std::string& id);
  // Every stream as its last lease left it, without waiting: a stream whose frame runs shows
  // busy with the frames it completed before. Never blocks on a running frame.
  std::vector<StreamInfo> list() const;
  StreamStats stats() const;
  const StreamLimits& limits() const { return limits_; }

 private:
  void evict_locked(double now, const std::string& keep);
  // Drops the streams idle past the TTL. Reading the registry expires too (a listing never shows
  // a stream that is already gone), hence the mutable state.
  void expire_locked(double now, const std::string& keep) const;
  void released(Entry& e);
  // Keeps why `id` was evicted, for its next frame to say (Lease::begin_frame).
  void remember_eviction_locked(const std::string& id, std::string reason) const;

  StreamLimits limits_;
  std::function<double()> clock_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<Entry>> streams_;
  mutable StreamStats stats_;
  // Evicted ids and why, bounded (remember_eviction_locked), and their order of eviction.
  mutable std::unordered_map<std::string, std::string> evictions_;
  mutable std::deque<std::string> eviction_order_;
};

}  // namespace bev
