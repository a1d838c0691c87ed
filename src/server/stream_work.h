// What the protocol front ends — the Open Inference Protocol (oip_service.h) and the fleet's
// handoff (fleet.h) — run on: the Service's per-stream FIFO, its metrics and limits, and whether
// it still takes work. The Service implements it and owns the front ends; they see only this, so
// the dependency points one way (service -> oip_service, fleet -> stream_work).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "bevformer/model.h"  // Detections
#include "server/api_error.h"
#include "server/frame_request.h"
#include "server/metrics.h"

namespace bev::server {

// A frame that may run in a batch with other streams' frames (--max-batch): what it checks
// before it runs, and what it does with its detections or its error, the same whether it runs
// alone or in a batch. /v1 frames and the Open Inference Protocol's (HTTP and gRPC) are both such
// frames. before() may throw (the frame is then answered through failed()); done() and failed()
// must not.
struct BatchFrame {
  virtual ~BatchFrame() = default;
  virtual const Frame& frame() const = 0;
  virtual bool before() = 0;  // false: it answered itself (refused) and does not run
  virtual void done(Detections d) = 0;
  virtual void failed(ApiError e) = 0;  // the model refused it: its stream's history is unchanged
};

class StreamWork {
 public:
  // Not ready: shutting down, or draining out of a fleet (the balancer stops sending).
  virtual bool ready() const = 0;
  // New frames get 503 from now on.
  virtual bool shutting_down() const = 0;
  virtual Metrics& metrics() = 0;
  // What a request's images may be (frame_request.h's checks).
  virtual const RequestLimits& limits() const = 0;
  // Runs `job` on `stream`'s worker FIFO (after the stream's frames queued before it) and waits
  // for it within --timeout. Throws ApiError: 429 queue_full, 503 shutting_down, 504 timeout;
  // `*never_ran` then tells whether the job was dropped from the queue (it never runs) or still
  // runs to its end. `job` must not throw.
  virtual void run_on_stream(const std::string& stream, std::function<void()> job, bool* never_ran = nullptr) = 0;
  // The same for a frame, which may run alone or, with --max-batch, in a batch of other streams'.
  virtual void run_frame_on_stream(const std::string& stream, std::shared_ptr<BatchFrame> frame,
                                   bool* never_ran = nullptr) = 0;

 protected:
  ~StreamWork() = default;  // not owned through this interface
};

}  // namespace bev::server
