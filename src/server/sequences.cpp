#include "server/sequences.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "server/api_error.h"
#include "core/number_text.h"

namespace bev::server {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}


std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

SequenceTable::SequenceTable(SequenceOptions options, std::function<double()> clock)
    : options_(options), clock_(clock ? std::move(clock) : std::function<double()>(steady_seconds)) {}

size_t SequenceTable::live_locked() const {
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.state == State::kLive;
  return n;
}

SequenceTable::Claim SequenceTable::claim(const std::string& id, bool start, double timestamp) {
  std::unique_lock lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.state != State::kLive) {
    throw ApiError(503, "sequence_moved",
                   "sequence " + id + " is being handed to the server that owns it now (this one is leaving the fleet); "
                   "retry: the balancer sends it there",
                   1);
  }
  if (start) {
    if (it != entries_.end() && it->second.busy) {
      throw ApiError(409, "sequence_busy", "a frame of sequence " + id + " is still in flight; a sequence's frames go one after another");
    }
    if (it == entries_.end()) {
      if (live_locked() >= options_.max_sequences) {
        throw ApiError(503, "busy",
                       "all " + std::to_string(options_.max_sequences) +
                           " sequence slots are in use; end sequences with sequence_end, or retry once idle ones expire",
                       1);
      }
      it = entries_.emplace(id, Entry{}).first;
    }
    it->second = Entry{};
    it->second.busy = true;
    it->second.last_used = clock_();
    return {true, 0};
  }
  if (it == entries_.end()) {
    // Its history may be on its way from a server leaving the fleet: that server hands it over
    // only once the balancer sends this sequence here, so its next frame can arrive first.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(std::max(options_.handoff_wait_seconds, 0.0)));
    changed_.wait_until(lock, deadline, [&] { return entries_.count(id) > 0; });
    it = entries_.find(id);
    if (it == entries_.end()) {
      throw ApiError(409, "sequence_unknown",
                     "sequence " + id + " has no history on this server: it never started here, it ended, it idled out (" +
                         seconds_text(options_.max_idle_seconds) +
                         " s), or the server that held it failed. The history is gone: restart the sequence "
                         "(sequence_start true)");
    }
    if (it->second.state != State::kLive) {
      throw ApiError(503, "sequence_moved", "sequence " + id + " is being handed to another server; retry", 1);
    }
  }
  Entry& e = it->second;
  if (e.busy) {
    throw ApiError(409, "sequence_busy", "a frame of sequence " + id + " is still in flight; a sequence's frames go one after another");
  }
  if (!(timestamp > e.last_timestamp)) {
    throw ApiError(409, "out_of_order", "timestamp " + number_text(timestamp) + " is not after sequence " + id + "'s last frame (" +
                                            number_text(e.last_timestamp) +
                                            "); frames of a sequence must be sent in time order, or restart it (sequence_start)");
  }
  e.busy = true;
  e.last_used = clock_();
  return {false, e.frames};
}

void SequenceTable::finish(const std::string& id, uint64_t frames, double timestamp, bool end) {
  {
    const std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (end) {
      entries_.erase(it);
    } else {
      Entry& e = it->second;
      e.busy = false;
      e.started = true;
      e.frames = frames;
      e.last_timestamp = timestamp;
      e.last_used = clock_();
    }
  }
  changed_.notify_all();
}

void SequenceTable::release(const std::string& id, bool was_start) {
  {
    const std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (was_start || !it->second.started) {
      entries_.erase(it);
    } else {
      it->second.busy = false;
      it->second.last_used = clock_();
    }
  }
  changed_.notify_all();
}

void SequenceTable::forget(const std::string& id) {
  const std::lock_guard lock(mu_);
  entries_.erase(id);
}

std::vector<std::string> SequenceTable::take_expired() {
  std::vector<std::string> out;
  const std::lock_guard lock(mu_);
  const double now = clock_();
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = it->second;
    if (!e.busy && e.state != State::kMoving && now - e.last_used > options_.max_idle_seconds) {
      if (e.state == State::kLive) out.push_back(it->first);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void SequenceTable::adopt(const std::string& id, uint64_t frames, double last_timestamp) {
  {
    const std::lock_guard lock(mu_);
    Entry& e = entries_[id];
    if (e.busy) return;  // a sequence_start of it runs here already and resets it anyway
    e = Entry{};
    e.frames = frames;
    e.last_timestamp = last_timestamp;
    e.started = true;
    e.last_used = clock_();
  }
  changed_.notify_all();
}

bool SequenceTable::begin_move(const std::string& id) {
  const std::lock_guard lock(mu_);
  auto [it, created] = entries_.try_emplace(id);
  Entry& e = it->second;
  if (created) {
    e.sequence = false;  // a stream of the /v1 API: the table knows it only while it moves
    e.last_used = clock_();
  }
  if (e.busy) return false;
  e.state = State::kMoving;
  return true;
}

void SequenceTable::end_move(const std::string& id, bool moved) {
  {
    const std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (moved) {
      it->second.state = State::kMoved;
      it->second.last_used = clock_();  // remembered for max_idle_seconds, so late frames hear where it went
    } else if (!it->second.sequence) {
      entries_.erase(it);
    } else {
      it->second.state = State::kLive;
    }
  }
  changed_.notify_all();
}

bool SequenceTable::moved(const std::string& id) const {
  const std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  return it != entries_.end() && it->second.state != State::kLive;
}

std::vector<SequenceTable::Info> SequenceTable::list() const {
  const std::lock_guard lock(mu_);
  const double now = clock_();
  std::vector<Info> out;
  for (const auto& [id, e] : entries_) {
    out.push_back({id, e.frames, e.last_timestamp, e.busy ? 0.0 : now - e.last_used, e.busy,
                   e.state == State::kLive ? "live" : e.state == State::kMoving ? "moving" : "moved"});
  }
  return out;
}

size_t SequenceTable::live() const {
  const std::lock_guard lock(mu_);
  return live_locked();
}

}  // namespace bev::server
