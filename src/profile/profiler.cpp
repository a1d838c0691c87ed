#include "profile/profiler.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>

#include "backend/recorded_stage.h"
#include "core/thread_pool.h"

namespace bev {

// ---- records ----

Profiler::Profiler() : origin_(std::chrono::steady_clock::now()) { intern(""); }

uint32_t Profiler::intern(const std::string& s) {
  const auto it = text_ids_.find(s);
  if (it != text_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(texts_.size());
  texts_.push_back(s);
  text_ids_.emplace(s, id);
  return id;
}

void Profiler::reserve(size_t ops) {
  ops_.reserve(ops);
  tensors_.reserve(ops * 4);
}

void Profiler::signpost(const std::string& name) { signposts_.push_back({name, now_ns()}); }

void Profiler::record(const OpNode& node, int64_t start_ns, int64_t duration_ns, Precision precision) {
  OpRecord r;
  r.kind = node.kind;
  r.stage = intern(node.stage);
  r.label = intern(node.label);
  r.first_tensor = static_cast<uint32_t>(tensors_.size());
  r.inputs = static_cast<uint16_t>(node.inputs.size());
  r.outputs = static_cast<uint16_t>(node.outputs.size());
  for (const Tensor& t : node.inputs) tensors_.push_back({t.shape(), t.dtype()});
  for (const Tensor& t : node.outputs) tensors_.push_back({t.shape(), t.dtype()});
  r.start_ns = start_ns;
  r.duration_ns = duration_ns;
  r.flops = op_flops(node);
  r.bytes = op_bytes(node, precision);
  ops_.push_back(r);
}

void Profiler::record(const OpNode& node, const OpTime& t, Precision precision) {
  const int64_t origin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count();
  record(node, t.start_ns - origin_ns, t.duration_ns, precision);
}

void ProfilingBackend::execute(const RecordedStage& stage, std::span<const StageBinding> bindings,
                               std::vector<OpTime>* times) {
  if (profiler_ == nullptr) {
    inner_.execute(stage, bindings, times);
    return;
  }
  std::vector<OpTime> measured;
  inner_.execute(stage, bindings, &measured);
  const std::vector<OpNode>& nodes = stage.nodes();
  for (size_t i = 0; i < nodes.size() && i < measured.size(); ++i) profiler_->record(nodes[i], measured[i], precision_);
  if (times) times->insert(times->end(), measured.begin(), measured.end());
}

std::vector<SignpostRange> Profiler::ranges(const std::string& name) const {
  const std::string end = name + "_end";
  std::vector<SignpostRange> out;
  int64_t open = -1;
  for (const Signpost& s : signposts_) {
    if (s.name == name) {
      open = s.t_ns;
    } else if (s.name == end && open >= 0) {
      out.push_back({open, s.t_ns});
      open = -1;
    }
  }
  return out;
}

std::vector<size_t> Profiler::ops_in(const SignpostRange& r) const {
  auto it = std::lower_bound(ops_.begin(), ops_.end(), r.begin_ns,
                             [](const OpRecord& op, int64_t t) { return op.start_ns < t; });
  std::vector<size_t> out;
  for (; it != ops_.end() && it->start_ns < r.end_ns; ++it) out.push_back(static_cast<size_t>(it - ops_.begin()));
  return out;
}

// ---- FLOPs and bytes from shapes ----

namespace {

double numel(const Tensor& t) { return static_cast<double>(t.numel()); }
double nbytes(const Tensor& t) { return static_cast<double>(t.nbytes()); }
double product(const Shape& s) {
  double p = 1;
  for (int64_t d : s) p *= static_cast<double>(d);
  return p;
}

// Per output element, for the ops whose cost is not a product of shapes. Transcendentals count
// as one FLOP; pure data movement (copies, gathers, zeroing, top-k's comparisons) as none.
double flops_per_output_element(OpKind kind) {
  switch (kind) {
    case OpKind::relu:
    case OpKind::add:
    case OpKind::mul:
    case OpKind::add_rows:
    case OpKind::upsample_nearest_add:
      return 1;
    case OpKind::feat_flatten:
      return 2;  // + cams_embeds, + level_embeds (one fewer without cams_embeds: op_flops)
    case OpKind::sampling_locations:
      return 2;  // offset / size + reference
    case OpKind::sigmoid:
      return 4;  // exp, add, divide, negate
    case OpKind::inverse_sigmoid:
      return 6;  // clamps, divide, log
    case OpKind::softmax:
      return 5;  // max, subtract, exp, sum, divide
    case OpKind::layer_norm:
      return 8;  // mean, variance, normalize, affine
    case OpKind::max_pool2d:
      return 9;  // 3x3 window comparisons
    case OpKind::reference_refine:
      return 12;  // per coordinate: logit, add, sigmoid
    case OpKind::conv2d:
    case OpKind::bottleneck:
    case OpKind::deform_conv2d:
    case OpKind::linear:
    case OpKind::ffn_norm:
    case OpKind::batched_matmul:
    case OpKind::attention:
    case OpKind::msda:
    case OpKind::deformable_attention:
    case OpKind::spatial_cross_attention:
    case OpKind::scatter_add_rows:
    case OpKind::scatter_mean_rows:
    case OpKind::bbox_denormalize:
    case OpKind::zeros:
    case OpKind::topk:
    case OpKind::gather_rows:
    case OpKind::gather_rows_multi:
    case OpKind::concat:
    case OpKind::permute:
    case OpKind::count_nonfinite:  // one integer test per input value, no arithmetic
    case OpKind::image_preprocess:  // op_flops
      return 0;
  }
  return 0;
}

}  // namespace

double op_flops(const OpNode& n) {
  const double out = n.outputs.empty() ? 0 : numel(n.outputs[0]);
  switch (n.kind) {
    case OpKind::conv2d: {  // out [N, Ho, Wo, O], weight [O, I/groups, kh, kw]
      if (n.weight_shape.size() != 4) return 0;
      double f = 2 * out * static_cast<double>(n.weight_shape[1] * n.weight_shape[2] * n.weight_shape[3]);
      if (n.inputs.size() > 1) f += out;  // the fused residual sum
      return f;
    }
    case OpKind::bottleneck: {  // each member conv over the map (all stride 1), + the residual sum
      const auto* a = std::get_if<BottleneckAttrs>(&n.attrs);
      if (!a || a->weight_shapes.size() < 3 || n.outputs.empty()) return 0;
      const double pixels = out / static_cast<double>(n.outputs[0].size(-1));
      double f = out;
      for (const Shape& w : a->weight_shapes) f += 2 * pixels * product(w);
      return f;
    }
    case OpKind::deform_conv2d: {  // + bilinear sampling: 4 corners per input channel and tap
      if (n.weight_shape.size() != 4) return 0;
      const double taps = static_cast<double>(n.weight_shape[2] * n.weight_shape[3]);
      const double c_in = static_cast<double>(n.weight_shape[1]);
      const double positions = out / static_cast<double>(n.weight_shape[0]);
      return 2 * out * c_in * taps + 8 * positions * taps * c_in;
    }
    case OpKind::linear:  // out [M, N], weight [N, K]
      return n.weight_shape.size() == 2 ? 2 * out * static_cast<double>(n.weight_shape[1]) : 0;
    case OpKind::ffn_norm: {  // both linears, the ReLU, the residual sum and the norm
      const auto* a = std::get_if<FfnNormAttrs>(&n.attrs);
      if (!a || a->fc1_weight_shape.size() != 2) return 0;
      const double rows = static_cast<double>(n.inputs[0].size(0)), hidden = static_cast<double>(a->fc1_weight_shape[0]);
      return 4 * rows * hidden * static_cast<double>(a->fc1_weight_shape[1]) + rows * hidden +
             (flops_per_output_element(OpKind::layer_norm) + 1) * out;
    }
    case OpKind::batched_matmul:  // a [B, M, K] -> out [B, M, N]
      return 2 * out * static_cast<double>(n.inputs[0].size(2));
    case OpKind::attention: {  // q k^T and p v, 2 * Q * K * C each, + softmax's 5 per score
      const double scores = static_cast<double>(n.inputs[0].size(0)) * n.inputs[0].size(1) * n.inputs[1].size(1);
      const auto* a = std::get_if<AttentionAttrs>(&n.attrs);
      return 4 * scores * static_cast<double>(n.inputs[0].size(2)) + 5 * scores * (a ? a->heads : 1);
    }
    case OpKind::msda: {  // per sample: 4 corners x head_dim multiply-adds
      const double samples = numel(n.inputs[1]) / 2;
      return 8 * samples * static_cast<double>(n.inputs[0].size(3));
    }
    case OpKind::deformable_attention: {  // the two linears, softmax, locations, msda's corners
      const auto* a = std::get_if<DeformableAttentionAttrs>(&n.attrs);
      if (!a || a->offsets_weight_shape.size() != 2 || n.inputs.size() < 3) return 0;
      const double rows = static_cast<double>(n.inputs[0].size(0));
      const double samples = static_cast<double>(a->weights_weight_shape[0]);
      const double in = static_cast<double>(a->offsets_weight_shape[1]);
      return 2 * rows * in * 3 * samples + flops_per_output_element(OpKind::softmax) * rows * samples +
             2 * 2 * rows * samples + 8 * rows * samples * static_cast<double>(n.inputs[2].size(3));
    }
    // The linears per cell, softmax; per slot the locations and corners; the mean. Every slot
    // counts, padding included: which hold a cell is in the index's values, and a recorded
    // stage's inputs are bound to memory only while it executes.
    case OpKind::spatial_cross_attention: {
      const auto* a = std::get_if<DeformableAttentionAttrs>(&n.attrs);
      if (!a || a->offsets_weight_shape.size() != 2 || n.inputs.size() < 5) return 0;
      const double cells = static_cast<double>(n.inputs[0].size(0)), slots = numel(n.inputs[1]);
      const double samples = static_cast<double>(a->weights_weight_shape[0]);
      const double in = static_cast<double>(a->offsets_weight_shape[1]);
      return 2 * cells * in * 3 * samples + flops_per_output_element(OpKind::softmax) * cells * samples +
             2 * 2 * slots * samples + 8 * slots * samples * static_cast<double>(n.inputs[4].size(3)) +
             (slots + cells) * static_cast<double>(n.outputs[0].size(1));
    }
    case OpKind::scatter_add_rows:
      return numel(n.inputs[0]);
    case OpKind::scatter_mean_rows:  // the sums, and one multiply per output
      return numel(n.inputs[0]) + out;
    case OpKind::layer_norm:  // + the residual's sum when it has one
      return (flops_per_output_element(n.kind) + (n.inputs.size() > 3 ? 1 : 0)) * out;
    case OpKind::feat_flatten: {
      const auto* a = std::get_if<FeatFlattenAttrs>(&n.attrs);
      return (a && !a->cams_embeds ? 1 : flops_per_output_element(n.kind)) * out;
    }
    case OpKind::bbox_denormalize:  // 3 of `code` channels: x * scale + offset
      return 2 * 3 * static_cast<double>(n.outputs[0].size(0));
    case OpKind::image_preprocess: {  // subtract and multiply per pixel value; 6 per resized value (2 lerps)
      const auto* a = std::get_if<ImagePreprocessAttrs>(&n.attrs);
      if (!a || n.inputs.empty() || n.inputs[0].dim() != 4) return 0;
      const Tensor& x = n.inputs[0];
      const bool resized = a->resized_height != x.size(1) || a->resized_width != x.size(2);
      return 2 * numel(x) + (resized ? 6.0 * static_cast<double>(x.size(0) * a->resized_height * a->resized_width * 3) : 0);
    }
    default:
      return flops_per_output_element(n.kind) * out;
  }
}

double weight_element_bytes(const OpNode& n, Precision float_precision) {
  const auto* conv = std::get_if<Conv2dAttrs>(&n.attrs);
  const auto* block = std::get_if<BottleneckAttrs>(&n.attrs);
  if ((conv && conv->int8_step > 0) || (block && block->int8)) return 1;
  return float_precision == Precision::kBF16 ? 2 : 4;
}

double op_bytes(const OpNode& n, Precision precision) {
  const double weight_element = weight_element_bytes(n, precision);
  double in = 0, out = 0;
  for (const Tensor& t : n.inputs) in += nbytes(t);
  for (const Tensor& t : n.outputs) out += nbytes(t);
  switch (n.kind) {
    case OpKind::conv2d:
    case OpKind::deform_conv2d:
    case OpKind::linear: {
      const double w = product(n.weight_shape) * weight_element;
      const double bias = n.weight_shape.empty() ? 0 : static_cast<double>(n.weight_shape[0]) * 4;
      return in + out + w + bias;
    }
    case OpKind::ffn_norm: {  // x and y once (the hidden rows stay in cache), both weights and biases
      const auto* a = std::get_if<FfnNormAttrs>(&n.attrs);
      double w = 0;
      if (a) {
        for (const Shape* s : {&a->fc1_weight_shape, &a->fc2_weight_shape})
          if (s->size() == 2) w += product(*s) * weight_element + static_cast<double>((*s)[0]) * 4;
      }
      return in + out + w;
    }
    case OpKind::bottleneck: {  // x and y once (fused, the intermediates stay in cache), the weights
      const auto* a = std::get_if<BottleneckAttrs>(&n.attrs);
      double w = 0;
      if (a) {
        for (const Shape& s : a->weight_shapes) w += product(s) * weight_element + static_cast<double>(s[0]) * 4;
      }
      return in + out + w;
    }
    case OpKind::msda: {  // the corners gathered, locations, weights, output (as docs/PERF.md)
      const double samples = numel(n.inputs[1]) / 2;
      const double corner_bytes =
          4 * samples * static_cast<double>(n.inputs[0].size(3)) * static_cast<double>(dtype_size(n.inputs[0].dtype()));
      return corner_bytes + nbytes(n.inputs[1]) + nbytes(n.inputs[2]) + out;
    }
    case OpKind::deformable_attention: {  // query, reference, the corners gathered (as msda), output, weights
      const auto* a = std::get_if<DeformableAttentionAttrs>(&n.attrs);
      if (!a || n.inputs.size() < 3) return in + out;
      const double samples = static_cast<double>(n.inputs[0].size(0)) * static_cast<double>(a->weights_weight_shape[0]);
      const double corner_bytes = 4 * samples * static_cast<double>(n.inputs[2].size(3)) *
                                  static_cast<double>(dtype_size(n.inputs[2].dtype()));
      const double w = (product(a->offsets_weight_shape) + product(a->weights_weight_shape)) * weight_element +
                       static_cast<double>(a->offsets_weight_shape[0] + a->weights_weight_shape[0]) * 4;
      return nbytes(n.inputs[0]) + nbytes(n.inputs[1]) + corner_bytes + out + w;
    }
    case OpKind::spatial_cross_attention: {  // query, index, reference, scales, the slots' corners, output, weights
      const auto* a = std::get_if<DeformableAttentionAttrs>(&n.attrs);
      if (!a || n.inputs.size() < 5) return in + out;
      const double samples = numel(n.inputs[1]) * static_cast<double>(a->weights_weight_shape[0]);
      const double corner_bytes = 4 * samples * static_cast<double>(n.inputs[4].size(3)) *
                                  static_cast<double>(dtype_size(n.inputs[4].dtype()));
      const double w = (product(a->offsets_weight_shape) + product(a->weights_weight_shape)) * weight_element +
                       static_cast<double>(a->offsets_weight_shape[0] + a->weights_weight_shape[0]) * 4;
      return in - nbytes(n.inputs[4]) + corner_bytes + out + w;
    }
    case OpKind::gather_rows:  // the index, the rows read (in src's dtype), the rows written
      return nbytes(n.inputs[1]) + out + numel(n.outputs[0]) * static_cast<double>(dtype_size(n.inputs[0].dtype()));
    case OpKind::gather_rows_multi:  // inputs[0] is the index
      return nbytes(n.inputs[0]) + 2 * out;
    case OpKind::scatter_add_rows:  // src, index, and the destination rows read and written
      return in + 2 * nbytes(n.inputs[0]);
    default:
      return in + out;
  }
}

// ---- the machine and the process ----

namespace {

class NullBackend final : public Backend {
 public:
  const char* name() const override { return "null"; }
  Device device() const override { return Device::kCpu; }
  Precision precision() const override { return Precision::kF32; }
  BackendInfo info() const override { return {"null", "none", "", 0, "f32", "f32"}; }
  std::shared_ptr<Storage> allocate(size_t bytes) override { return Storage::allocate(bytes); }
  void write(const Tensor&, const Tensor&) override {}
  void read_into(const Tensor&, const Tensor&) override {}
  void copy(const Tensor&, const Tensor&) override {}
  void synchronize() override {}
  double measure_peak_gflops() override { return 0; }
  std::shared_ptr<const void> prepare(OpKind, const OpAttrs&, const Tensor&, const Tensor*) override { return {}; }
  bool fuses_bottleneck(const Shape&, const BottleneckAttrs&) const override { return false; }
  void run(const OpNode&) override { asm volatile("" ::: "memory"); }
};

double ns_per_run(Backend* backend, const OpNode& node, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) backend->run(node);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls;
}

size_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0) return std::strtoull(line.c_str() + n, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace

double detached_overhead_ns_per_op() {
  NullBackend null;
  ProfilingBackend decorated(null);
  const OpNode node;
  // Through a volatile pointer, so the call is neither devirtualized nor hoisted out of the loop.
  Backend* volatile through = &decorated;
  double best = std::numeric_limits<double>::max();
  for (int rep = 0; rep < 5; ++rep) best = std::min(best, ns_per_run(through, node, 1'000'000));
  return best;
}

double attached_cost_ns_per_op() {
  NullBackend null;
  ProfilingBackend decorated(null);
  OpNode node;
  node.kind = OpKind::conv2d;
  node.stage = "img.layer1";
  node.label = "img_backbone.layer1.0.conv3";
  node.inputs = {Tensor::empty({6, 12, 20, 64}, DType::kF32), Tensor::empty({6, 12, 20, 256}, DType::kF32)};
  node.outputs = {Tensor::empty({6, 12, 20, 256}, DType::kF32)};
  node.weight_shape = {256, 64, 1, 1};
  Backend* volatile through = &decorated;
  constexpr int kCalls = 100'000;
  double best = std::numeric_limits<double>::max();
  for (int rep = 0; rep < 5; ++rep) {
    Profiler profiler;
    profiler.reserve(kCalls);
    decorated.attach(&profiler);
    best = std::min(best, ns_per_run(through, node, kCalls));
    decorated.attach(nullptr);
  }
  return best;
}

double measure_copy_bandwidth_gbps(int threads, int repeats) {
  constexpr size_t kBytes = size_t{256} << 20;
  constexpr int64_t kSlices = 64;
  std::unique_ptr<char[]> src(new char[kBytes]), dst(new char[kBytes]);
  std::memset(src.get(), 1, kBytes);  // fault every page in before timing
  std::memset(dst.get(), 2, kBytes);
  ThreadPool pool(threads);
  const size_t slice = kBytes / kSlices;
  double best = std::numeric_limits<double>::max();
  for (int rep = 0; rep < std::max(1, repeats); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(kSlices, 1, [&](int64_t b, int64_t e) {
      const size_t at = static_cast<size_t>(b) * slice;
      std::memcpy(dst.get() + at, src.get() + at, static_cast<size_t>(e - b) * slice);
    });
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(kBytes) / best * 1e-9;
}

size_t resident_bytes() { return status_kib("VmRSS:"); }
size_t peak_resident_bytes() { return status_kib("VmHWM:"); }

}  // namespace bev
