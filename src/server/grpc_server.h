// The Open Inference Protocol over gRPC (inference.GRPCInferenceService: ServerLive, ServerReady,
// ModelReady, ServerMetadata, ModelMetadata, ModelInfer) on Debian's gRPC C++, beside the HTTP
// API on its own port. Every call goes to the same Oip (server/oip_service.h) as the REST routes:
// the same sequences, scheduler, limits and in-flight budget; errors map to gRPC codes
// (grpc_convert.h). Built only with BEV_GRPC (CMake; the default where gRPC is installed).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace bev::server {

class Service;

struct GrpcOptions {
  std::string host = "127.0.0.1";
  int port = 8001;                  // 0: any free port (start() returns it)
  size_t max_message_bytes = 64u << 20;
  int max_threads = 64;             // calls handled at once (a frame holds one until answered)
};

class GrpcServer {
 public:
  GrpcServer(Service& service, GrpcOptions options);
  ~GrpcServer();  // shutdown()

  // Binds and starts serving on gRPC's own threads; returns the port. Throws Error(kIo) when the
  // port cannot be bound.
  int start();
  // Graceful: calls in flight finish (up to the service's request timeout), new ones are refused.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bev::server
