// A backend owns memory and execution on one device (as ggml's backends and ncnn's upload_model
// do): it allocates every tensor the engine computes (arenas, op outputs, histories), uploads the
// weights and constants, writes per-frame inputs from the host and reads results back, copies on
// the device, and runs ops, one at a time or a whole recorded stage (so a device backend may
// capture a stage as one graph). The runtime and the model never touch backend memory
// themselves; the foreign test backend (backend/foreign) proves it.
//
// prepare() runs once per weighted op at model load (weight packing, primitive creation); run()
// executes a node on its tensors and must be callable again on the same node with the same
// result.
//
// Asynchronous by contract: write, copy, run, execute and read_into are issued in order to the
// backend's queue and may return before they are done (a device runs them later; the CPU backend
// runs them as they come; the foreign test backend runs them on a thread of its own, late). The
// host waits only in read, read_all and synchronize, which return when everything issued before
// them has finished, and rethrow the first error the queue met since the last wait (the queue
// drains past it: a failed op never leaves work waiting forever). A host tensor given to write,
// and the host tensor read_into fills, may be touched until the next wait; their memory stays
// alive through the handle the queue keeps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/op.h"

namespace bev {

class RecordedStage;

// Where one op ran, as its backend measured it: steady-clock ns (CPU: the host clock around the
// op; a device backend: its events, placed on the host clock).
struct OpTime {
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
};

// For one execution, a bindable tensor of a recorded stage (RecordedStage::is_bindable) reads and
// writes `target` instead of its own memory: a stream's history in place of the stage's copy.
struct StageBinding {
  Tensor slot;
  Tensor target;
};

// What a backend runs on, as `describe`, bench JSON, profiles and /v1/model report it.
struct BackendInfo {
  std::string backend;    // "cpu", "foreign", "cuda"
  std::string device;     // "Intel(R) Xeon(R) Processor", "NVIDIA H200"
  std::string isa;        // "avx512_core_bf16", "sm_90"
  int threads = 0;        // host threads running the kernels
  std::string precision;  // "f32" | "bf16" | "int8"
  std::string float_precision;  // what runs in floating point: precision, or in int8 "f32" | "bf16"
  // "cpu: Intel(R) Xeon(R) Processor, avx512_core_bf16, 2 threads" (+ ", int8 with bf16 floats")
  std::string summary() const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual Device device() const = 0;
  virtual Precision precision() const = 0;
  // The arithmetic of everything that is not int8: precision() in f32 and bf16. In int8
  // precision the float this device runs faster: on the CPU bf16 where it has AMX tiles (the ops
  // int8 leaves to floats then take the tile rate, as OpenVINO's int8 models do there), f32
  // elsewhere (bf16 without AMX runs slower than f32: docs/PERF.md).
  virtual Precision float_precision() const { return precision() == Precision::kInt8 ? Precision::kF32 : precision(); }
  virtual BackendInfo info() const = 0;

  // ---- memory ----
  // Uninitialized memory of this backend.
  virtual std::shared_ptr<Storage> allocate(size_t bytes) = 0;
  Tensor empty(const Shape& shape, DType dtype);
  // A host tensor copied into new memory of this backend (weights that are not prepared, every
  // constant an op reads, per-frame inputs of eager runs).
  Tensor upload(const Tensor& host);
  // host -> backend: `dst` is a contiguous tensor of this backend with `host_src`'s shape and
  // dtype; `host_src` is host memory in any layout.
  virtual void write(const Tensor& dst, const Tensor& host_src) = 0;

  // ---- staging: the host memory per-frame inputs cross in ----
  // Host memory this backend copies from and to without a bounce buffer: page-locked on a device
  // (cudaMallocHost: an asynchronous copy from pageable memory is staged and waited for by the
  // driver), ordinary memory on the CPU. It may be asked for every frame: a device caches it.
  virtual std::shared_ptr<Storage> allocate_host(size_t bytes) { return Storage::allocate(bytes); }
  // Whether write and read_into want their host side in allocate_host's memory. The CPU copies
  // from any host memory at the same speed, so it does not.
  virtual bool wants_staging() const { return false; }
  // A contiguous host tensor in allocate_host's memory, marked as this backend's staging.
  Tensor host_empty(const Shape& shape, DType dtype);
  // write through staging: when this backend wants it and `host_src` is not already its staging
  // memory, `host_src` is copied into `staging` first (made by host_empty on first use, reused
  // while its shape and dtype fit: the caller keeps one per input it writes every frame and may
  // not touch it before the next wait).
  void write_staged(const Tensor& dst, const Tensor& host_src, Tensor& staging);
  // backend -> host, issued: `host_dst` (a contiguous host tensor of `src`'s shape and dtype)
  // holds `src` (which may be a strided view) after the next wait.
  virtual void read_into(const Tensor& host_dst, const Tensor& src) = 0;
  // backend -> host, waited for: a new contiguous host tensor holding `src`.
  Tensor read(const Tensor& src);
  // Several results with one wait for all of them: where a frame's results leave the engine.
  std::vector<Tensor> read_all(std::span<const Tensor> srcs);
  // On the device: `dst` (contiguous) = `src`, same shape and dtype.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // Returns when everything issued so far has finished; rethrows the queue's first error since
  // the last wait.
  virtual void synchronize() = 0;

  // ---- ops ----
  // State for conv2d, deform_conv2d and linear: `weight` (a host tensor, PyTorch layout: OIHW or
  // [out, in]), `bias` optional. The returned object is immutable and shared by every node that
  // uses it. bottleneck: `weight` is undefined, the members are in BottleneckAttrs.
  virtual std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                              const Tensor* bias) = 0;
  virtual void run(const OpNode& node) = 0;

  // Whether a stride-1 bottleneck on input x_nhwc runs faster as one fused op (Ops::bottleneck)
  // than conv by conv. Decorators (ForwardingBackend) forward it, so that a model run through one
  // emits the same ops; only the calibration's overrides it, to see every conv's input.
  virtual bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& attrs) const = 0;
  // Whether this backend runs Ops::deformable_attention (the query's projections, softmax,
  // sampling locations and msda as one op); the model runs them op by op otherwise. Decorators
  // forward it, as fuses_bottleneck.
  virtual bool fuses_deformable_attention() const { return false; }
  // Whether it runs Ops::spatial_cross_attention (SCA's per-camera sampling and mean as one op);
  // likewise.
  virtual bool fuses_spatial_cross_attention() const { return false; }
  // Whether it runs Ops::ffn_norm (a layer's FFN, residual and norm as one op); likewise.
  virtual bool fuses_ffn() const { return false; }

  // Runs a recorded stage with `bindings` applied for this execution only. With `times` (a
  // profiled run) one OpTime per node is appended, in node order. The default runs node by node
  // through run() / run_timed(); a device backend may launch the stage as one graph instead.
  virtual void execute(const RecordedStage& stage, std::span<const StageBinding> bindings = {},
                       std::vector<OpTime>* times = nullptr);
  // Runs one node and says when and how long, as this backend measures it (the profiler's hook).
  virtual OpTime run_timed(const OpNode& node);
  // This device's dense matmul rate at the backend's precision, measured now (about a second):
  // the "% of peak" denominator of bench and profile.
  virtual double measure_peak_gflops() = 0;
  // An eager run enters a module stage (Ops::set_stage in eager mode: "img.stem", "enc0.tsa",
  // ...). Backends ignore it; the profiling decorator turns it into a signpost, so an eager
  // frame's stage windows are marked even where a stage has no op, and include the host work
  // (output allocations) between its ops. Recorded stages never call it: their ops carry stages.
  virtual void enter_stage(const std::string& stage) { (void)stage; }

 protected:
  // The contracts of write and copy, checked the same way by every backend (Error(kInternal)).
  void check_write(const Tensor& dst, const Tensor& host_src) const;
  void check_copy(const Tensor& dst, const Tensor& src) const;
  void check_read(const Tensor& host_dst, const Tensor& src) const;
};

// threads <= 0: one per hardware thread. The pool and oneDNN's OpenMP pool are both sized by it.
// (backend/registry.h makes any backend by name; this is the CPU's own entry.)
std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision);

}  // namespace bev
