// bevformer serve [--weights W] [--config C] [--host H] [--port P] [--workers N] [--queue N]
// [--timeout S] [--max-body-mb N] [--max-inflight-mb N] [--max-cameras N] [--http-threads N]
// [--max-connections N] [--read-timeout S] [--threads N] [--precision f32|bf16|int8 --calibration FILE] [--max-streams N]
// [--stream-ttl S] [--pipeline] [--max-batch N] [--batch-delay-ms D]: the HTTP API of docs/API.md. SIGTERM or SIGINT stops it
// gracefully: new frames get 503, accepted ones finish, then it exits 0.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "bevformer/model.h"
#include "commands.h"
#include "core/log.h"
#include "server/fleet.h"
#include "server/http_client.h"
#include "server/http_server.h"
#include "server/service.h"
#ifdef BEV_HAVE_GRPC
#include "server/grpc_server.h"
#endif

namespace bev::cli {
namespace {

struct ServeArgs {
  std::string weights;
  // Fleet serving (docs/DEPLOY.md): [--model-name N] [--grpc-port P] [--max-sequence-idle-s S]
  // [--handoff-via URL] [--handoff-wait-s S] [--drain-timeout-s S]: the Open Inference Protocol
  // over HTTP and gRPC; with --handoff-via, SIGTERM first drains (not ready, each stream's
  // history handed over through the balancer), then stops as below.
  std::string model_name = "bevformer";
  int grpc_port = -1;
  double max_sequence_idle = 60;
  std::string handoff_via;
  double handoff_wait = 5;
  double drain_timeout = 60;
  std::string config = "tiny";
  std::string host = "127.0.0.1";
  int port = 8080;
  size_t workers = 2;
  size_t queue = 32;
  double timeout = 30;
  size_t max_body_mb = 64;
  size_t max_inflight_mb = 1024;
  size_t max_connections = 1024;
  double read_timeout = 30;
  size_t max_cameras = 12;
  size_t http_threads = 64;
  EngineKnobs knobs;
  size_t max_streams = 64;
  double stream_ttl = 600;
  bool pipeline = false;
  size_t max_batch = 1;
  double batch_delay_ms = 5;
};

int run(const ServeArgs& a) {
  // Signals are taken by one thread with sigwait: block them before any other thread starts, so
  // the library's and the HTTP layer's threads inherit the mask and never run a handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGUSR2);  // our wake-up call, below
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Knobs knobs;
  static_cast<EngineKnobs&>(knobs) = a.knobs;
  knobs.max_streams = a.max_streams;
  knobs.stream_ttl_seconds = a.stream_ttl;
  knobs.pipeline = a.pipeline;
  knobs.max_batch = static_cast<int>(a.max_batch);
  if (a.max_inflight_mb < 3 * a.max_body_mb) {
    // A body counts three times while it is parsed: a larger one could never be taken, only refused 503.
    throw bev::Error(bev::ErrorKind::kInvalidInput, "--max-inflight-mb " + std::to_string(a.max_inflight_mb) + " is below three times --max-body-mb " +
                                              std::to_string(a.max_body_mb))
        .expected("--max-inflight-mb >= 3 x --max-body-mb");
  }
  if (a.stream_ttl < a.max_sequence_idle) {
    // The engine would drop a sequence's history before the server frees the sequence: its next
    // frame would be refused although the client kept to the idle limit.
    throw bev::Error(bev::ErrorKind::kInvalidInput, "--stream-ttl " + std::to_string(a.stream_ttl) + " is below --max-sequence-idle-s " +
                                              std::to_string(a.max_sequence_idle))
        .expected("--stream-ttl >= --max-sequence-idle-s");
  }
  if (!a.handoff_via.empty()) {
    std::string host, port, error;
    if (!server::parse_base_url(a.handoff_via, &host, &port, &error)) {
      throw bev::Error(bev::ErrorKind::kInvalidInput, "--handoff-via " + error).expected("http://HOST:PORT of the balancer");
    }
  }
#ifndef BEV_HAVE_GRPC
  if (a.grpc_port >= 0) {
    throw bev::Error(bev::ErrorKind::kUnsupported, "--grpc-port: this binary was built without gRPC (-DBEV_GRPC=OFF)");
  }
#endif
  if (a.weights.empty()) {
    log_warn("serve: no --weights: seeded random weights (seed ", knobs.seed, "), UNTRAINED: detections are meaningless");
  }
  const std::unique_ptr<Model> model = Model::load(a.config, a.weights, knobs);

  server::ServiceOptions so;
  so.workers = a.workers;
  so.queue_capacity = a.queue;
  so.max_batch = a.max_batch;
  so.batch_delay_seconds = a.batch_delay_ms * 1e-3;
  so.request_timeout_seconds = a.timeout;
  so.max_body_bytes = a.max_body_mb << 20;
  so.max_inflight_bytes = a.max_inflight_mb << 20;
  so.limits.max_cameras = a.max_cameras;
  so.oip.model_name = a.model_name;
  so.oip.sequences.max_idle_seconds = a.max_sequence_idle;
  so.oip.sequences.handoff_wait_seconds = a.handoff_wait;
  so.oip.sequences.max_sequences = a.max_streams;
  so.fleet.handoff_via = a.handoff_via;
  so.fleet.drain_timeout_seconds = a.drain_timeout;
  so.model_info = {{"config", a.config},
                   {"weights", a.weights.empty() ? "random (seed " + std::to_string(knobs.seed) + ")" : a.weights},
                   {"backend", model->device_info().backend},
                   {"device",
                    {{"backend", model->device_info().backend},
                     {"device", model->device_info().device},
                     {"isa", model->device_info().isa},
                     {"threads", model->device_info().threads},
                     {"precision", model->device_info().precision},
                     {"float_precision", model->device_info().float_precision}}},
                   {"knobs",
                    {{"threads", knobs.threads},
                     {"precision", knobs.precision},
                     {"calibration", knobs.calibration},
                     {"max_streams", knobs.max_streams},
                     {"stream_ttl_seconds", knobs.stream_ttl_seconds},
                     {"max_gap_seconds", knobs.max_gap_seconds},
                     {"replay", knobs.replay},
                     {"pipeline", knobs.pipeline},
                     {"max_batch", knobs.max_batch}}},
                   {"http",
                    {{"threads", a.http_threads},
                     {"max_connections", a.max_connections},
                     {"read_timeout_seconds", a.read_timeout},
                     {"max_header_bytes", server::HttpOptions{}.max_header_bytes}}}};
  server::Service service(*model, so);
  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.threads = a.http_threads;
  ho.max_connections = a.max_connections;
  ho.read_timeout_seconds = a.read_timeout;
  server::HttpServer http(service, ho);
  const int port = http.bind();
  // Scripts and tests read the port from this line (--port 0 picks a free one).
  std::printf("listening on http://%s:%d\n", a.host.c_str(), port);
#ifdef BEV_HAVE_GRPC
  std::unique_ptr<server::GrpcServer> grpc;
  if (a.grpc_port >= 0) {
    grpc = std::make_unique<server::GrpcServer>(
        service, server::GrpcOptions{a.host, a.grpc_port, so.max_body_bytes, static_cast<int>(a.http_threads)});
    std::printf("grpc listening on %s:%d\n", a.host.c_str(), grpc->start());
  }
#endif
  std::fflush(stdout);

  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig == SIGUSR2) return;  // our own wake-up after run() ended for another reason
    if (!a.handoff_via.empty()) {
      // Out of the balancer first, still serving; then each stream's history to its next owner.
      log_info("serve: ", sig == SIGTERM ? "SIGTERM" : "SIGINT", ": draining (not ready; handing streams over)");
      service.begin_drain();
      service.fleet().drain();
    }
    log_info("serve: finishing accepted frames, refusing new ones");
    http.shutdown();
#ifdef BEV_HAVE_GRPC
    if (grpc) grpc->shutdown();
#endif
  });
  http.run();
  // run() also ends when the listening socket fails; wake the signal thread then.
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
#ifdef BEV_HAVE_GRPC
  if (grpc) grpc->shutdown();
#endif
  service.finish();
  log_info("serve: stopped");
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand("serve", "Serve the HTTP API (docs/API.md): frames in, detections out, per stream");
  sub->add_option("--weights", a->weights, "Checkpoint (.pth or .safetensors); without it a seeded UNTRAINED model runs");
  sub->add_option("--config", a->config, "tiny | small | base | upstream-style config JSON")->capture_default_str();
  sub->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->port, "Port (0: any free port, printed at start)")->capture_default_str()->check(CLI::Range(0, 65535));
  sub->add_option("--workers", a->workers, "Frames of different streams processed at once")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("--max-batch", a->max_batch,
                  "Frames of distinct streams run as one batch (dynamic batching, oldest first; 1: one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--batch-delay-ms", a->batch_delay_ms, "How long a frame may wait for others to join its batch")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10000.0));
  sub->add_option("--queue", a->queue, "Frames that may wait for a worker; past it requests get 429")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--timeout", a->timeout, "Seconds a frame request may take (queue + run); past it 504")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-body-mb", a->max_body_mb, "Largest request body (MiB); past it 413")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--max-inflight-mb", a->max_inflight_mb,
                  "Request bytes held at once (bodies, frames and their decoded pixels, MiB); past it 503")
      ->capture_default_str()
      ->check(CLI::Range(3, 1 << 20));
  sub->add_option("--max-cameras", a->max_cameras, "Most cameras per frame")->capture_default_str()->check(CLI::Range(1, 64));
  sub->add_option("--http-threads", a->http_threads, "Requests handled at once (a frame request holds one until answered)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-connections", a->max_connections, "Connections open at once; past it 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--read-timeout", a->read_timeout,
                  "Seconds a client has to send a whole request (and to take its answer); also the keep-alive idle time")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_engine_options(sub, a->knobs);
  sub->add_option("--max-streams", a->max_streams, "Streams kept; past it the least recently used is evicted")->capture_default_str();
  sub->add_option("--stream-ttl", a->stream_ttl, "Seconds an idle stream is kept")->capture_default_str();
  sub->add_option("--model-name", a->model_name, "The model's name in the Open Inference Protocol (/v2/models/{name})")
      ->capture_default_str();
  sub->add_option("--grpc-port", a->grpc_port, "Serve the Open Inference Protocol over gRPC on this port too (0: any free port; -1: off)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  sub->add_option("--max-sequence-idle-s", a->max_sequence_idle,
                  "Seconds without a frame after which a sequence's history is freed (its next frame must restart it)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--handoff-via", a->handoff_via,
                  "http://HOST:PORT of the balancer: on SIGTERM, drain and hand each stream's history over through it")
      ->capture_default_str();
  sub->add_option("--handoff-wait-s", a->handoff_wait,
                  "Seconds a frame of an unknown sequence waits for its history to be handed over before it is refused")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 600.0));
  sub->add_option("--drain-timeout-s", a->drain_timeout, "Seconds a drain may take; streams not handed over by then are lost")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_flag("--pipeline", a->pipeline,
                "Two frames in flight: one frame's image stage runs while another's bev stage runs (needs --workers >= 2)");
  return [a]() { return run(*a); };
}

}  // namespace bev::cli
