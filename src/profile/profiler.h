// The profiler (DESIGN §3): a Backend decorator that times every op it forwards, named signposts
// around ranges of them, and the FLOPs and bytes each op moves, computed from its shapes.
//
//   Profiler         the records: per op its kind, stage, label, tensor shapes and dtypes, start
//                    and duration (steady clock, ns since the profiler's origin), FLOPs, bytes;
//                    and signposts, tt-metal style: "image" opens a range, "image_end" closes it;
//                    a name without its "_end" (a module stage an eager run entered) marks a time.
//   ProfilingBackend forwards everything to the real backend; while a Profiler is attached it
//                    records each op with the time the backend measured (Backend::run_timed;
//                    recorded stages run op by op then, through Backend::execute's times).
//                    Detached, the only cost is one pointer test per op, and a recorded stage
//                    goes to the backend whole.
//
// Recording is cheap on purpose (strings interned, shapes kept inline, storage reserved), so
// that op times add up to the frame: the gap between ops is what the profiler itself costs.
// Nothing here knows BEVFormer; stage names are whatever the ops carry. Not thread-safe: ops are
// run, and signposts set, from one thread at a time (as BevFormer's frame lock ensures).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "backend/op.h"

namespace bev {

// One tensor of a recorded op: enough to print it and count its bytes (not named TensorMeta:
// model/param_spec.h has a bev::TensorMeta of another layout, and two would break the ODR).
struct RecordedTensor {
  Shape shape;
  DType dtype = DType::kF32;
};

struct OpRecord {
  OpKind kind = OpKind::relu;
  uint32_t stage = 0, label = 0;  // Profiler::text(id)
  uint32_t first_tensor = 0;      // inputs, then outputs, in Profiler::tensors()
  uint16_t inputs = 0, outputs = 0;
  int64_t start_ns = 0, duration_ns = 0;
  double flops = 0, bytes = 0;
};

struct Signpost {
  std::string name;
  int64_t t_ns = 0;
};

// A closed signpost range: [begin_ns, end_ns).
struct SignpostRange {
  int64_t begin_ns = 0, end_ns = 0;
  double ms() const { return static_cast<double>(end_ns - begin_ns) * 1e-6; }
  bool contains(int64_t t) const { return t >= begin_ns && t < end_ns; }
};

class Profiler {
 public:
  Profiler();

  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
  }
  // "x" opens range x, "x_end" closes it.
  void signpost(const std::string& name);
  // `precision` is the backend's: the size of a prepared weight element. Times are on the
  // profiler's clock (now_ns()).
  void record(const OpNode& node, int64_t start_ns, int64_t duration_ns, Precision precision);
  // The same for a backend's measurement (steady-clock ns since its epoch).
  void record(const OpNode& node, const OpTime& t, Precision precision);
  void reserve(size_t ops);

  const std::vector<OpRecord>& ops() const { return ops_; }
  const std::vector<Signpost>& signposts() const { return signposts_; }
  const std::string& text(uint32_t id) const { return texts_[id]; }
  std::span<const RecordedTensor> inputs(const OpRecord& r) const { return {tensors_.data() + r.first_tensor, r.inputs}; }
  std::span<const RecordedTensor> outputs(const OpRecord& r) const {
    return {tensors_.data() + r.first_tensor + r.inputs, r.outputs};
  }
  // Relabels op `index` (labels carried over from an eager run).
  void set_label(size_t index, const std::string& label) { ops_[index].label = intern(label); }

  // Every closed range named `name`, in order.
  std::vector<SignpostRange> ranges(const std::string& name) const;
  // Indices of the ops that start inside `r`, in order.
  std::vector<size_t> ops_in(const SignpostRange& r) const;

 private:
  uint32_t intern(const std::string& s);

  std::chrono::steady_clock::time_point origin_;
  std::vector<OpRecord> ops_;
  std::vector<RecordedTensor> tensors_;
  std::vector<Signpost> signposts_;
  std::vector<std::string> texts_;
  std::unordered_map<std::string, uint32_t> text_ids_;
};

class ProfilingBackend final : public ForwardingBackend {
 public:
  // Weight bytes follow the float arithmetic (int8 convs count one byte a weight whatever it is).
  explicit ProfilingBackend(Backend& inner) : ForwardingBackend(inner), precision_(inner.float_precision()) {}

  // Records into `profiler` from now on; nullptr detaches (the profiler is off).
  void attach(Profiler* profiler) {
    profiler_ = profiler;
    stage_.clear();
  }
  Profiler* attached() const { return profiler_; }

  void run(const OpNode& node) override {
    if (profiler_ == nullptr) {
      inner_.run(node);
      return;
    }
    profiler_->record(node, inner_.run_timed(node), precision_);
  }
  OpTime run_timed(const OpNode& node) override { return inner_.run_timed(node); }
  // Attached, an eager run entering a module stage is a signpost named after it (a stage set
  // again under the same name, as img.stem is by the model and by the backbone, is one).
  void enter_stage(const std::string& stage) override {
    inner_.enter_stage(stage);
    if (profiler_ == nullptr || stage == stage_) return;
    stage_ = stage;
    profiler_->signpost(stage);
  }
  void execute(const RecordedStage& stage, std::span<const StageBinding> bindings = {},
               std::vector<OpTime>* times = nullptr) override;

 private:
  Precision precision_;
  Profiler* profiler_ = nullptr;
  std::string stage_;  // the module stage an attached eager run is in
};

// FLOPs of one node, from its shapes: exact multiply-adds (x2) for conv2d, deform_conv2d,
// linear, batched_matmul and msda's bilinear sampling; a stated per-element count for the rest
// (see profiler.cpp). Bytes: every input and output once, plus weights (at the backend's
// precision), except where an op reads only part of an input (gathers, MSDA's corners).
double op_flops(const OpNode& node);
double op_bytes(const OpNode& node, Precision precision);
// The bytes one weight of `node` takes: 1 in an int8 conv (a calibrated step) or a fused block
// of them, else 2 when `float_precision` is bf16 and 4 in f32.
double weight_element_bytes(const OpNode& node, Precision float_precision);

// An upper bound of what the detached decorator adds per op, in ns: the time of a call through
// it to a backend that does nothing (so the inner call, which runs anyway, is counted too).
// Best of 5 x a million calls.
double detached_overhead_ns_per_op();

// What timing and recording costs per op while attached, in ns: a call through the attached
// decorator to a backend that does nothing, with a conv2d-like node (label, stage, three rank-4
// tensors). Best of 5 x 100,000 calls.
double attached_cost_ns_per_op();

// The machine's copy bandwidth in GB/s (bytes read + written): `threads` threads each copying a
// slice of a 256 MiB buffer, best of `repeats`. The "% of peak" denominator for bytes.
double measure_copy_bandwidth_gbps(int threads, int repeats = 5);

// Resident set and its high-water mark (Linux /proc/self/status VmRSS, VmHWM); 0 if unknown.
size_t resident_bytes();
size_t peak_resident_bytes();

}  // namespace bev
