#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "backend/ops.h"
#include "bevformer/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "profile/profiler.h"
#include "runtime/calibrate.h"

namespace bev {

struct Engine::Impl {
  EngineOptions options;
  std::unique_ptr<Backend> device;              // from the registry
  std::unique_ptr<ProfilingBackend> profiling;  // over `device` when asked
  std::unique_ptr<CalibratingBackend> calibrating;  // over `device` when recording a calibration
  Backend* backend = nullptr;                   // what ops run on: profiling, calibrating or device
  std::shared_ptr<const Calibration> calibration;  // int8
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
  if (options.record_calibration) {
    if (options.profiling || options.backend_options.precision != Precision::kF32) {
      throw Error(ErrorKind::kInvalidInput, "recording a calibration with profiling or in " +
                                                std::string(precision_name(options.backend_options.precision)))
          .expected("an f32 model without profiling");
    }
    s.options.replay = false;  // eager: each conv's input is there as it runs
    s.calibrating = std::make_unique<CalibratingBackend>(*s.device, options.record_calibration);
    s.backend = s.calibrating.get();
  }
  if (options.profiling) {
    s.profiling = std::make_unique<ProfilingBackend>(*s.device);
    s.backend = s.profiling.get();
  }
  // Measured in this process on these weights (measure_calibration): not hashed again here.
  if (options.calibration_data && (options.backend_options.precision != Precision::kInt8 || options.record_calibration)) {
    throw Error(ErrorKind::kInternal, "measured calibration data outside int8 precision");
  }
  s.calibration = options.calibration_data
                      ? options.calibration_data
                      : load_calibration_for(options.calibration, options.backend_options.precision, cfg, checkpoint);
  {
    Ops load(*s.backend);
    s.model = std::make_unique<BevFormer>(cfg, checkpoint, load, s.calibration.get(), options.calibration);
  }
  s.runner = std::make_unique<StageRunner>(*s.model, *s.backend, s.options.replay, options.pipelined);
  s.runner->set_adaptive_batching(options.adaptive_batching);
  s.streams = std::make_unique<StreamRegistry>(options.streams);
  s.prepare_pool = std::make_unique<ThreadPool>(options.backend_options.threads);
  return e;
}

const ModelConfig& Engine::config() const { return impl_->model->config(); }
const BevFormer& Engine::model() const { return *impl_->model; }
Backend& Engine::backend() { return *impl_->backend; }
ProfilingBackend* Engine::profiling() { return impl_->profiling.get(); }
const Calibration* Engine::calibration() const { return impl_->calibration.get(); }
BackendInfo Engine::backend_info() const { return impl_->device->info(); }
StageRunner& Engine::runner() { return *impl_->runner; }
StreamRegistry& Engine::streams() { return *impl_->streams; }
const EngineOptions& Engine::options() const { return impl_->options; }

namespace {

// The frame's own fields of its result, before it runs.
FrameResult begin_result(const Frame& spec, const PreparedFrame& frame, double prepare_seconds) {
  FrameResult r;
  r.prepare_seconds = prepare_seconds;
  r.stream = frame.stream;
  r.timestamp = frame.timestamp;
  r.scene = frame.scene;
  r.token = spec.token;
  if (frame.T_world_from_ego) r.poses = FramePoses{*frame.T_world_from_ego, frame.T_ego_from_lidar};
  return r;
}

// What the runner answered, into the result.
void finish_result(FrameResult& r, FrameOutput& out, PreparedFrame& frame, const DetectRequest& request) {
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
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

PreparedFrame Engine::prepare(const Frame& spec, const std::string& base_dir) {
  Impl& s = *impl_;
  // ThreadPool::parallel_for is not for concurrent callers (frames of several streams at once
  // deadlock it): a frame that finds the pool taken decodes its images on its own thread, so
  // concurrent frames still overlap their preparation.
  std::unique_lock pool_lock(s.prepare_pool_mu, std::try_to_lock);
  return prepare_frame(spec, config(), base_dir, pool_lock.owns_lock() ? s.prepare_pool.get() : nullptr, &backend());
}

FrameResult Engine::detect(const Frame& spec, const std::string& base_dir, const DetectRequest& request) {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  PreparedFrame frame = prepare(spec, base_dir);
  FrameResult r = begin_result(spec, frame, seconds_since(t0));
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
  finish_result(r, out, frame, request);
  return r;
}

EngineOptions engine_options(const EngineKnobs& knobs, const std::string& where) {
  EngineOptions o;
  o.backend = knobs.backend;
  o.backend_options = {knobs.threads, parse_precision(knobs.precision, where), knobs.device};
  o.calibration = knobs.calibration;
  return o;
}

std::vector<std::vector<size_t>> batch_rounds(const std::vector<std::string>& streams, int max_batch) {
  const size_t cap = static_cast<size_t>(std::max(1, max_batch));
  std::vector<std::vector<size_t>> rounds;
  std::map<std::string, size_t> next_round;  // per stream: the earliest round its next frame may join
  for (size_t i = 0; i < streams.size(); ++i) {
    size_t r = next_round[streams[i]];
    while (r < rounds.size() && rounds[r].size() >= cap) ++r;
    if (r == rounds.size()) rounds.emplace_back();
    rounds[r].push_back(i);
    next_round[streams[i]] = r + 1;
  }
  return rounds;
}

std::vector<Engine::Outcome> Engine::detect_batch(const std::vector<const Frame*>& frames, const std::string& base_dir,
                                                  const DetectRequest& request, int max_batch) {
  Impl& s = *impl_;
  std::vector<Outcome> outcomes(frames.size());
  std::vector<PreparedFrame> prepared(frames.size());
  std::vector<std::string> streams(frames.size());
  std::vector<bool> ready(frames.size(), false);
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      prepared[i] = prepare(*frames[i], base_dir);
      outcomes[i].result = begin_result(*frames[i], prepared[i], seconds_since(t0));
      ready[i] = true;
    } catch (...) {
      outcomes[i].error = std::current_exception();
    }
    // A frame that failed to prepare still holds its stream's place in the order.
    streams[i] = ready[i] ? prepared[i].stream : frames[i]->stream;
  }
  for (const std::vector<size_t>& round : batch_rounds(streams, request.taps ? 1 : max_batch)) {
    std::vector<size_t> run;
    for (const size_t i : round) {
      if (ready[i]) run.push_back(i);
    }
    if (run.empty()) continue;
    // Leases in stream order, so that two callers batching the same streams cannot each hold
    // one the other waits for.
    std::vector<size_t> by_stream = run;
    std::sort(by_stream.begin(), by_stream.end(), [&](size_t a, size_t b) { return streams[a] < streams[b]; });
    std::map<size_t, StreamRegistry::Lease> leases;
    std::vector<size_t> leased;
    for (const size_t i : by_stream) {
      try {
        leases.emplace(i, s.streams->acquire(streams[i]));
        leased.push_back(i);
      } catch (...) {
        outcomes[i].error = std::current_exception();
      }
    }
    std::vector<BatchSample> samples;
    std::vector<size_t> sample_frame;
    for (const size_t i : run) {
      const auto it = leases.find(i);
      if (it == leases.end()) continue;
      FrameResult& r = outcomes[i].result;
      r.history_reset = it->second.begin_frame(prepared[i].timestamp, prepared[i].input.scene_token);
      if (!r.history_reset.empty()) log_info("stream ", streams[i], ": history dropped: ", r.history_reset);
      r.frame_index = static_cast<int64_t>(it->second.frames());
      samples.push_back({&prepared[i].input, &it->second.history()});
      sample_frame.push_back(i);
    }
    if (samples.empty()) continue;
    FrameReads reads;
    if (request.taps) reads.taps = &outcomes[sample_frame[0]].result.taps;  // one frame per round
    std::vector<SampleOutput> out;
    try {
      out = s.runner->forward_batch(samples, reads);
    } catch (...) {
      for (const size_t i : sample_frame) outcomes[i].error = std::current_exception();
      continue;
    }
    for (size_t k = 0; k < samples.size(); ++k) {
      const size_t i = sample_frame[k];
      if (out[k].error) {
        outcomes[i].error = out[k].error;
        continue;
      }
      leases.at(i).end_frame(prepared[i].timestamp);
      outcomes[i].batch_size = out[k].batch_size;
      finish_result(outcomes[i].result, out[k].output, prepared[i], request);
    }
  }
  return outcomes;
}

}  // namespace bev
