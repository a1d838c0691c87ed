// A server as one of a fleet behind a balancer that routes by sequence id (docs/DEPLOY.md):
//
//   POST /v1/handoff         installs a stream's history handed over by a draining server (the
//                            bytes of Model::export_stream; the model fingerprint must be ours)
//   GET  /v1/handoff/owner   which server answers, through the balancer, for X-Sequence-Id
//
// and the drain on SIGTERM: the server stops being ready (the balancer takes it out), keeps
// serving what still reaches it, and once the balancer sends a stream's key elsewhere hands each
// stream's history, through the balancer, to the server that owns it now — exported on the
// stream's FIFO after its accepted frames, refused by a server with another fingerprint, never
// sent twice. A handoff that lands back here (the balancer still routes here) is retried later.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "bevformer/model.h"
#include "server/http_types.h"
#include "server/router.h"
#include "server/sequences.h"
#include "server/stream_work.h"

namespace bev::server {

struct FleetOptions {
  // The balancer through which a draining server hands its streams to their next owners
  // (http://HOST:PORT, docs/DEPLOY.md); "" hands nothing over (SIGTERM then stops as before).
  std::string handoff_via;
  double drain_timeout_seconds = 60;  // past it the drain gives up on the streams left (they are lost)
  std::string instance;               // this server's id in the fleet ("" : a random one)
};

class Fleet {
 public:
  Fleet(Model& model, StreamWork& work, SequenceTable& sequences, const FleetOptions& options);

  const std::string& instance() const { return instance_; }
  // /v1/handoff and /v1/handoff/owner. Never throws.
  HttpResponse handle(const Route& route, HttpRequest& request);

  // Hands every stream over through --handoff-via (a no-op without it). Blocking; returns when
  // every stream was handed over (or found nothing to hand over) or the drain timeout passed
  // (the streams left are lost: their next frame elsewhere is told to restart). The caller has
  // called Service::begin_drain() and stops the server afterwards.
  void drain();

  struct Counters {
    uint64_t sent = 0, lost = 0, received = 0;
  };
  Counters counters() const { return {sent_.load(), lost_.load(), received_.load()}; }

 private:
  enum class Outcome { kDone, kRetry, kStillRoutedHere };
  Outcome hand_over(const std::string& id);
  // Where the balancer sends `keys` now: one of them here, all elsewhere, or nowhere (no server
  // answered any probe: the balancer is gone or has no server up).
  enum class Rotation { kHere, kElsewhere, kNoAnswer };
  Rotation rotation(const std::vector<std::string>& keys);

  Model& model_;
  StreamWork& work_;
  SequenceTable& sequences_;
  std::string via_;
  double drain_timeout_seconds_;
  std::string instance_;
  std::atomic<uint64_t> sent_{0}, lost_{0}, received_{0};
};

}  // namespace bev::server
