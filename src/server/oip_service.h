// The Open Inference Protocol (KServe v2) on the model: health, metadata and inference with
// Triton's sequence parameters, for the REST routes (handle) and the gRPC service (grpc_server.h)
// alike. An inference is a frame of a sequence: FRAME (the frame JSON) and IMAGES in, the frame's
// boxes out; it runs on the Service's scheduler (StreamWork) (the sequence's FIFO, the workers, the queue bound,
// --timeout) and its bytes count against the in-flight budget, as /v1 frames do.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "bevformer/model.h"
#include "server/http_types.h"
#include "server/memory_budget.h"
#include "server/oip.h"
#include "server/router.h"
#include "server/sequences.h"
#include "server/stream_work.h"

namespace bev::server {

struct OipOptions {
  std::string model_name = "bevformer";  // the model's name in /v2/models/{name} (--model-name)
  SequenceOptions sequences;
};

class Oip {
 public:
  Oip(Model& model, StreamWork& work, const OipOptions& options);
  ~Oip();  // stops the idle sweeper

  // The /v2 routes over REST. Never throws: errors are {"error": ...} with their status.
  HttpResponse handle(const Route& route, HttpRequest& request);

  // Shared by REST and gRPC.
  bool live() const;
  bool ready() const;
  nlohmann::json server_metadata() const;
  nlohmann::json model_metadata() const;
  // Throws ApiError 404 unless `name` is this model's name and `version` is "" or "1".
  void check_model(const std::string& name, const std::string& version) const;
  // One frame of a sequence (throws ApiError with the status the REST answer carries; the gRPC
  // layer maps it to a code). `lease` holds the request's bytes and grows to what the frame holds.
  OipResponse infer(const OipRequest& request, MemoryLease& lease);

  SequenceTable& sequences() { return sequences_; }
  const std::string& model_name() const { return model_name_; }

 private:
  struct OipFrame;  // a sequence's frame, alone or batched (oip_service.cpp)
  HttpResponse rest_infer(HttpRequest& request);
  void sweep();  // frees sequences idle past --max-sequence-idle-s

  Model& model_;
  StreamWork& work_;
  const std::string model_name_;
  SequenceTable sequences_;
  const double sweep_seconds_;
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweeper_;
};

}  // namespace bev::server
