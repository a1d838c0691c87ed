#include "server/grpc_server.h"

#include <chrono>
#include <mutex>

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include "bevformer/error.h"
#include "grpc_service.grpc.pb.h"
#include "server/grpc_convert.h"
#include "server/oip_service.h"
#include "server/service.h"

namespace bev::server {
namespace {

// Counted in the Prometheus metrics like the REST routes, under route "grpc", with the HTTP status
// the same error has over REST.
void count(Service& service, int status, const std::string& kind = "") {
  service.metrics().count_request("grpc", status);
  if (status >= 400) service.metrics().count_error(kind.empty() ? "unknown" : kind);
}

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  explicit InferenceService(bev::server::Service& service) : service_(service), oip_(service.oip()) {}

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*, inference::ServerLiveResponse* out) override {
    out->set_live(oip_.live());
    count(service_, 200);
    return grpc::Status::OK;
  }

  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*, inference::ServerReadyResponse* out) override {
    out->set_ready(oip_.ready());
    count(service_, 200);
    return grpc::Status::OK;
  }

  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest* in, inference::ModelReadyResponse* out) override {
    return guarded([&] {
      oip_.check_model(in->name(), in->version());
      out->set_ready(oip_.ready());
    });
  }

  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* out) override {
    const nlohmann::json m = oip_.server_metadata();
    out->set_name(m["name"].get<std::string>());
    out->set_version(m["version"].get<std::string>());
    for (const auto& e : m["extensions"]) out->add_extensions(e.get<std::string>());
    count(service_, 200);
    return grpc::Status::OK;
  }

  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* in,
                             inference::ModelMetadataResponse* out) override {
    return guarded([&] {
      oip_.check_model(in->name(), in->version());
      const nlohmann::json m = oip_.model_metadata();
      out->set_name(m["name"].get<std::string>());
      out->add_versions("1");
      out->set_platform(m["platform"].get<std::string>());
      for (const char* side : {"inputs", "outputs"}) {
        for (const auto& t : m[side]) {
          auto* meta = std::string(side) == "inputs" ? out->add_inputs() : out->add_outputs();
          meta->set_name(t["name"].get<std::string>());
          meta->set_datatype(t["datatype"].get<std::string>());
          for (const auto& d : t["shape"]) meta->add_shape(d.get<int64_t>());
        }
      }
    });
  }

  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest* in, inference::ModelInferResponse* out) override {
    return guarded([&] {
      oip_.check_model(in->model_name(), in->model_version());
      MemoryLease lease(&service_.memory());
      if (!lease.resize(2 * in->ByteSizeLong())) {  // the message, and our copy of it
        throw ApiError(503, "busy", "the request does not fit --max-inflight-mb now; retry", 1);
      }
      // A copy the frame owns: a frame that outlives its call (a timeout) must not read gRPC's message.
      auto message = std::make_shared<const inference::ModelInferRequest>(*in);
      const OipRequest req = oip_request_from_grpc(std::move(message));
      grpc_response_from_oip(oip_.infer(req, lease), out);
    });
  }

 private:
  template <typename F>
  grpc::Status guarded(F&& f) {
    try {
      f();
      count(service_, 200);
      return grpc::Status::OK;
    } catch (const ApiError& e) {
      count(service_, e.status(), e.kind());
      return grpc_status_from(e);
    } catch (const Error& e) {
      const ApiError a = api_error_from(e, ErrorStage::kRequest);
      count(service_, a.status(), a.kind());
      return grpc_status_from(a);
    } catch (const std::exception& e) {
      count(service_, 500, "internal");
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string("[internal] ") + e.what());
    }
  }

  bev::server::Service& service_;
  Oip& oip_;
};

}  // namespace

struct GrpcServer::Impl {
  Impl(Service& s, GrpcOptions o) : service(s), options(std::move(o)), handler(s) {}
  Service& service;
  GrpcOptions options;
  InferenceService handler;
  std::unique_ptr<grpc::Server> server;
  std::mutex mu;
};

GrpcServer::GrpcServer(Service& service, GrpcOptions options) : impl_(std::make_unique<Impl>(service, std::move(options))) {}

GrpcServer::~GrpcServer() { shutdown(); }

int GrpcServer::start() {
  Impl& s = *impl_;
  const std::string host = s.options.host.find(':') != std::string::npos ? "[" + s.options.host + "]" : s.options.host;
  const std::string address = host + ":" + std::to_string(s.options.port);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(s.options.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(64 << 20);
  grpc::ResourceQuota quota("bevformer-grpc");
  quota.SetMaxThreads(std::max(s.options.max_threads, 2));
  builder.SetResourceQuota(quota);
  // A port in use is never shared (as the HTTP side: SO_REUSEPORT would split the sequences).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&s.handler);
  std::lock_guard lock(s.mu);
  s.server = builder.BuildAndStart();
  if (!s.server || port == 0) {
    s.server.reset();
    throw Error(ErrorKind::kIo, "cannot listen for gRPC on " + address).hint("another server listens there; --grpc-port 0 picks a free port");
  }
  return port;
}

void GrpcServer::shutdown() {
  Impl& s = *impl_;
  std::lock_guard lock(s.mu);
  if (!s.server) return;
  // Calls in flight get as long as a frame may take; then they are cancelled.
  s.server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(1000 * (s.service.options().request_timeout_seconds + 5))));
  s.server->Wait();
  s.server.reset();
}

}  // namespace bev::server
