#include "runtime/streams.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "bevformer/error.h"
#include "core/number_text.h"

namespace bev {

struct StreamRegistry::Entry {
  std::string id;
  std::mutex run;            // held by the lease for the whole frame
  // Guarded by the registry's mu_:
  int leases = 0;            // taken or waiting
  double last_used = 0;      // wall clock
  bool evicted = false;
  bool running = false;      // a lease holds `run`
  // What list() shows: the bookkeeping below as the last lease left it. A listing reads these,
  // never `run`, so readers never look busy to one another and a running frame's stream shows
  // its completed frames, not zeros.
  uint64_t shown_frames = 0;
  double shown_last_timestamp = 0;
  bool shown_has_history = false;
  // Guarded by `run`:
  StreamHistory history;
  std::string lost;  // why this id's earlier stream was evicted, said by its first frame
  uint64_t frames = 0;
  bool has_timestamp = false;
  double last_timestamp = 0;
};

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

StreamRegistry::StreamRegistry(StreamLimits limits, std::function<double()> clock)
    : limits_(limits), clock_(clock ? std::move(clock) : std::function<double()>(steady_seconds)) {
  if (limits_.max_streams == 0) {
    throw Error(ErrorKind::kInvalidInput, "max_streams is 0").where("stream limits").expected("at least 1");
  }
}

StreamRegistry::~StreamRegistry() = default;

// ---- Lease ----

StreamRegistry::Lease::Lease(StreamRegistry* owner, std::shared_ptr<Entry> entry)
    : owner_(owner), entry_(std::move(entry)), lock_(entry_->run) {
  const std::lock_guard<std::mutex> g(owner_->mu_);
  entry_->running = true;
}

StreamRegistry::Lease::Lease(Lease&& other) noexcept
    : owner_(other.owner_), entry_(std::move(other.entry_)), lock_(std::move(other.lock_)) {
  other.owner_ = nullptr;
}

StreamRegistry::Lease::~Lease() {
  if (owner_ && entry_) {
    owner_->released(*entry_);  // publishes while `run` is still held: no other lease wrote since
    lock_.unlock();
  }
}

const std::string& StreamRegistry::Lease::id() const { return entry_->id; }

StreamHistory& StreamRegistry::Lease::history() { return entry_->history; }

uint64_t StreamRegistry::Lease::frames() const { return entry_->frames; }

bool StreamRegistry::Lease::has_timestamp() const { return entry_->has_timestamp; }

double StreamRegistry::Lease::last_timestamp() const { return entry_->last_timestamp; }

void StreamRegistry::Lease::restore(uint64_t frames, bool has_timestamp, double last_timestamp) {
  entry_->lost.clear();  // its history is back
  entry_->frames = frames;
  entry_->has_timestamp = has_timestamp;
  entry_->last_timestamp = last_timestamp;
}

std::string StreamRegistry::Lease::begin_frame(double timestamp, const std::string& scene_token) {
  Entry& e = *entry_;
  if (!e.lost.empty()) return std::exchange(e.lost, {});  // a history the table threw away
  if (!e.has_timestamp || !e.history.state.has_prev_bev) return {};
  std::string reason;
  const std::optional<std::string>& scene = e.history.state.scene_token;
  if (scene && *scene != scene_token) {
    // forward_test would drop the history for this itself; saying so is the engine's part.
    reason = "scene changed from '" + *scene + "' to '" + scene_token + "'";
    const std::lock_guard<std::mutex> g(owner_->mu_);
    ++owner_->stats_.resets_scene;
  } else if (!(timestamp > e.last_timestamp)) {
    reason = "timestamp did not increase (" + number_text(timestamp) + " after " + number_text(e.last_timestamp) + ")";
    const std::lock_guard<std::mutex> g(owner_->mu_);
    ++owner_->stats_.resets_backwards;
  } else if (timestamp - e.last_timestamp > owner_->limits_.max_gap_seconds) {
    reason = "time gap of " + seconds_text(timestamp - e.last_timestamp) + " (limit " +
             seconds_text(owner_->limits_.max_gap_seconds) + ")";
    const std::lock_guard<std::mutex> g(owner_->mu_);
    ++owner_->stats_.resets_gap;
  }
  if (!reason.empty()) e.history.state = TemporalState{};
  return reason;
}

void StreamRegistry::Lease::end_frame(double timestamp) {
  entry_->has_timestamp = true;
  entry_->last_timestamp = timestamp;
  ++entry_->frames;
}

// ---- registry ----

void StreamRegistry::released(Entry& e) {
  const std::lock_guard<std::mutex> g(mu_);
  --e.leases;
  e.last_used = clock_();
  e.running = false;
  e.shown_frames = e.frames;
  e.shown_last_timestamp = e.last_timestamp;
  e.shown_has_history = e.history.state.has_prev_bev;
}

void StreamRegistry::expire_locked(double now, const std::string& keep) const {
  for (auto it = streams_.begin(); it != streams_.end();) {
    Entry& e = *it->second;
    if (it->first != keep && e.leases == 0 && now - e.last_used > limits_.idle_ttl_seconds) {
      e.evicted = true;
      ++stats_.evicted_ttl;
      remember_eviction_locked(it->first, "history evicted: the stream was idle " + seconds_text(now - e.last_used) +
                                              " (stream TTL " + seconds_text(limits_.idle_ttl_seconds) + ")");
      it = streams_.erase(it);
    } else {
      ++it;
    }
  }
}

void StreamRegistry::evict_locked(double now, const std::string& keep) {
  expire_locked(now, keep);
  while (streams_.size() >= limits_.max_streams) {
    auto oldest = streams_.end();
    double oldest_use = std::numeric_limits<double>::infinity();
    for (auto it = streams_.begin(); it != streams_.end(); ++it) {
      if (it->first != keep && it->second->leases == 0 && it->second->last_used < oldest_use) {
        oldest = it;
        oldest_use = it->second->last_used;
      }
    }
    if (oldest == streams_.end()) {
      throw Error(ErrorKind::kBusy, "all " + std::to_string(limits_.max_streams) + " stream slots are busy")
          .where("streams")
          .hint("retry later, or raise the stream limit");
    }
    oldest->second->evicted = true;
    ++stats_.evicted_lru;
    remember_eviction_locked(oldest->first, "history evicted: all " + std::to_string(limits_.max_streams) +
                                                " stream slots were taken and this stream was the least recently used");
    streams_.erase(oldest);
  }
}

void StreamRegistry::remember_eviction_locked(const std::string& id, std::string reason) const {
  // Bounded: the ids of the last few table-fulls of evictions, oldest forgotten first (a vehicle
  // gone for good must not grow the table's memory).
  const size_t bound = 4 * limits_.max_streams + 64;
  if (evictions_.insert_or_assign(id, std::move(reason)).second) eviction_order_.push_back(id);
  while (evictions_.size() > bound && !eviction_order_.empty()) {
    evictions_.erase(eviction_order_.front());
    eviction_order_.pop_front();
  }
  if (eviction_order_.size() > 2 * bound) {  // ids re-evicted or re-created: compact the order
    std::deque<std::string> kept;
    for (const std::string& i : eviction_order_)
      if (evictions_.count(i) && std::find(kept.begin(), kept.end(), i) == kept.end()) kept.push_back(i);
    eviction_order_ = std::move(kept);
  }
}

StreamRegistry::Lease StreamRegistry::acquire(const std::string& id) {
  if (id.empty()) throw Error(ErrorKind::kInvalidInput, "empty stream id").where("streams").expected("a non-empty id");
  std::shared_ptr<Entry> entry;
  {
    const std::lock_guard<std::mutex> g(mu_);
    const double now = clock_();
    auto it = streams_.find(id);
    if (it == streams_.end()) {
      evict_locked(now, id);
      entry = std::make_shared<Entry>();
      entry->id = id;
      if (auto lost = evictions_.find(id); lost != evictions_.end()) {
        entry->lost = std::move(lost->second);  // no one else holds the entry yet
        evictions_.erase(lost);
      }
      streams_.emplace(id, entry);
      ++stats_.created;
    } else {
      // An existing stream takes no new slot: only the TTL applies to the others. (Evicting for
      // it, as until 2026-12-07, held max_streams - 1 streams: a full table of vehicles lost
      // half its histories every round, and --max-streams 1 answered its one client busy.)
      entry = it->second;
      expire_locked(now, id);
    }
    ++entry->leases;
    entry->last_used = now;
  }
  return Lease(this, std::move(entry));  // waits for the stream's running frame, if any
}

std::optional<StreamRegistry::Lease> StreamRegistry::find(const std::string& id) {
  std::shared_ptr<Entry> entry;
  {
    const std::lock_guard<std::mutex> g(mu_);
    const double now = clock_();
    expire_locked(now, {});
    auto it = streams_.find(id);
    if (it == streams_.end()) return std::nullopt;
    entry = it->second;
    ++entry->leases;
    entry->last_used = now;
  }
  return Lease(this, std::move(entry));  // waits for the stream's running frame, if any
}

bool StreamRegistry::drop(const std::string& id) {
  std::shared_ptr<Entry> entry;
  {
    const std::lock_guard<std::mutex> g(mu_);
    expire_locked(clock_(), {});  // a stream past its TTL is gone, as a listing says
    auto it = streams_.find(id);
    if (it == streams_.end()) return false;
    entry = it->second;
    streams_.erase(it);
    evictions_.erase(id);  // asked for: its next frame starts fresh, with nothing to report
    ++stats_.dropped;
  }
  // A frame in flight finishes on its entry; the next acquire starts a fresh stream.
  return true;
}

std::vector<StreamInfo> StreamRegistry::list() const {
  const std::lock_guard<std::mutex> g(mu_);
  const double now = clock_();
  expire_locked(now, {});  // a stream past its TTL is gone whether or not another arrived
  std::vector<StreamInfo> out;
  out.reserve(streams_.size());
  for (const auto& [id, e] : streams_) {
    StreamInfo i;
    i.id = id;
    i.frames = e->shown_frames;
    i.last_timestamp = e->shown_last_timestamp;
    i.has_history = e->shown_has_history;
    i.busy = e->running;
    i.idle_seconds = e->leases > 0 ? 0.0 : now - e->last_used;
    out.push_back(std::move(i));
  }
  return out;
}

StreamStats StreamRegistry::stats() const {
  const std::lock_guard<std::mutex> g(mu_);
  expire_locked(clock_(), {});
  StreamStats s = stats_;
  s.active = streams_.size();
  return s;
}

}  // namespace bev
