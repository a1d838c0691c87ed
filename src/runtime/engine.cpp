#include "runtime/engine.h"

#include <chrono>
#include <mutex>

#include "backend/ops.h"
#include "bevformer/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "profile/profiler.h"

namespace bev {

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<Backend> device;              // from the registry
  std::unique_ptr<ProfilingBackend> profiling;  // over `device` when asked
  Backend* backend = nullptr;                   // what ops run on: profiling or device
  std::unique_ptr<BevFormer> model;
  std::unique_ptr<StageRunner> runner;
  std::unique_ptr<StreamRegistry> streams;
  std::unique_ptr<ThreadPool> prepare_pool;  // image decoding and preprocessing
  std::mutex prepare_pool_mu;                // the pool takes one caller at a time
};

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(const ModelConfig& cfg, const Checkpoint& checkpoint,
                                       const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  Impl& s = *e->impl_;
  s.options = options;
  s.device = make_backend(options.backend, options.backend_options);
  s.backend = s.device.get();
  if (options.profiling) {
    s.profiling = std::make_unique<ProfilingBackend>(*s.device);
    s.backend = s.profiling.get();
  }
  {
    Ops load(*s.backend);
    s.model = std::make_unique<BevFormer>(cfg, checkpoint, load);
  }
  s.runner = std::make_unique<StageRunner>(*s.model, *s.backend, options.replay, options.pipelined);
  s.streams = std::make_unique<StreamRegistry>(options.streams);
  s.prepare_pool = std::make_unique<ThreadPool>(options.backend_options.threads);
  return e;
}

const ModelConfig& Engine::config() const { return impl_->model->config(); }
const BevFormer& Engine::model() const { return *impl_->model; }
Backend& Engine::backend() { return *impl_->backend; }
ProfilingBackend* Engine::profiling() { return impl_->profiling.get(); }
BackendInfo Engine::backend_info() const { return impl_->device->info(); }
StageRunner& Engine::runner() { return *impl_->runner; }
StreamRegistry& Engine::streams() { return *impl_->streams; }
const EngineOptions& Engine::options() const { return impl_->options; }

FrameResult Engine::detect(const Frame& spec, const std::string& base_dir, const DetectRequest& request) {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  PreparedFrame frame;
  {
    // ThreadPool::parallel_for is not for concurrent callers (frames of several streams at once
    // deadlock it): a frame that finds the pool taken decodes its images on its own thread, so
    // concurrent frames still overlap their preparation.
    std::unique_lock pool_lock(s.prepare_pool_mu, std::try_to_lock);
    frame = prepare_frame(spec, config(), base_dir, pool_lock.owns_lock() ? s.prepare_pool.get() : nullptr);
  }
  FrameResult r;
  r.prepare_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stream = frame.stream;
  r.timestamp = frame.timestamp;
  r.scene = frame.scene;
  r.token = spec.token;
  if (frame.T_world_from_ego) r.poses = FramePoses{*frame.T_world_from_ego, frame.T_ego_from_lidar};
  FrameReads reads;
  if (request.taps) reads.taps = &r.taps;
  FrameOutput out;
  {
    StreamRegistry::Lease lease = s.streams->acquire(frame.stream);
    r.history_reset = lease.begin_frame(frame.timestamp, frame.input.scene_token);
    if (!r.history_reset.empty()) log_info("stream ", frame.stream, ": history dropped: ", r.history_reset);
    r.frame_index = static_cast<int64_t>(lease.frames());
    out = s.runner->forward(frame.input, lease.history(), reads);
    lease.end_frame(frame.timestamp);
  }
  r.used_history = out.used_history;
  r.detections = std::move(out.detections);
  r.geometry_seconds = out.geometry_seconds;
  r.image_seconds = out.image_seconds;
  r.bev_seconds = out.bev_seconds;
  r.decode_seconds = out.decode_seconds;
  if (request.keep_images) {
    r.camera_names = std::move(frame.camera_names);
    r.images = std::move(frame.images);
    r.lidar2img = std::move(frame.lidar2img_original);
  }
  return r;
}

}  // namespace bev
