// Sequences as Triton's stateful models have them (docs/API.md, "Sequences"), over the engine's
// streams: a sequence id names a stream; sequence_start resets its history (a new scene), a frame
// without it continues a sequence this server knows, sequence_end frees it after the frame, and a
// sequence idle past max_idle_seconds is freed. One frame of a sequence at a time, in time order:
// a second concurrent frame and a frame not later than the last are refused (409), never queued
// or reordered. A frame of a sequence this server does not know waits up to
// handoff_wait_seconds for its history to arrive from a server leaving the fleet (docs/DEPLOY.md),
// then is refused: the history is gone and the client must restart the sequence.
//
// The engine keeps its own rules per stream (a time gap or a new scene resets the history, and
// the answer says so); this table only decides whether a frame may run and what it may assume.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace bev::server {

struct SequenceOptions {
  double max_idle_seconds = 60;      // a sequence without frames this long is freed (2 Hz keyframes: 120 periods)
  double handoff_wait_seconds = 5;   // how long a frame of an unknown sequence waits for a handoff
  size_t max_sequences = 64;         // live sequences (the engine's --max-streams)
};

class SequenceTable {
 public:
  // `clock`: monotonic seconds (tests inject their own).
  explicit SequenceTable(SequenceOptions options, std::function<double()> clock = {});

  // What a frame may assume once claimed: the frames the sequence completed (0 for a start).
  struct Claim {
    bool start = false;
    uint64_t frames = 0;
  };

  // Claims sequence `id` for one frame stamped `timestamp`; the caller runs it and calls
  // finish() (or release() when it never ran). Throws ApiError: 409 sequence_busy (a frame of it
  // is in flight), 409 out_of_order, 409 sequence_unknown (no history here after the handoff
  // wait), 503 sequence_moved (handed to another server: retry reaches it), 503 busy (every
  // sequence slot is in use).
  Claim claim(const std::string& id, bool start, double timestamp);
  // The claimed frame completed: the sequence has `frames` frames, the last at `timestamp`;
  // `end` frees it.
  void finish(const std::string& id, uint64_t frames, double timestamp, bool end);
  // The claimed frame did not complete (refused, failed, dropped from the queue): a continuing
  // sequence keeps its history; a start that failed leaves no sequence.
  void release(const std::string& id, bool was_start);
  // Forgets a sequence whose engine stream is gone (evicted): its next frame is refused as unknown.
  void forget(const std::string& id);

  // The sequences idle past max_idle_seconds, removed from the table (the caller frees their streams).
  std::vector<std::string> take_expired();

  // ---- fleet (server/fleet.h) ----
  // A history handed over by another server: the sequence continues here after `frames` frames.
  // Wakes the frames of it that wait.
  void adopt(const std::string& id, uint64_t frames, double last_timestamp);
  // Marks `id` as moving (false when a frame of it is in flight: try again after it); its frames
  // get 503 sequence_moved until end_move(id, false) puts it back.
  bool begin_move(const std::string& id);
  void end_move(const std::string& id, bool moved);
  // Handed to another server: frames of this stream (through either API) get 503 sequence_moved.
  bool moved(const std::string& id) const;

  struct Info {
    std::string id;
    uint64_t frames = 0;
    double last_timestamp = 0, idle_seconds = 0;
    bool busy = false;
    std::string state;  // "live", "moving", "moved"
  };
  std::vector<Info> list() const;
  size_t live() const;

 private:
  enum class State { kLive, kMoving, kMoved };
  struct Entry {
    uint64_t frames = 0;
    double last_timestamp = 0;
    double last_used = 0;
    bool busy = false;
    bool started = false;  // its first frame completed (a failed start leaves no history)
    bool sequence = true;  // false: a /v1 stream the table holds only while it is handed over
    State state = State::kLive;
  };
  size_t live_locked() const;

  const SequenceOptions options_;
  std::function<double()> clock_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // an adopt or a release: waiting frames look again
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace bev::server
