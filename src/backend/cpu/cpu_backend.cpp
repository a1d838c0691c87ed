// The CPU backend: oneDNN for convolutions and matmuls, our kernels for the rest. One switch over
// OpKind (compiled with -Werror=switch): an op without a CPU kernel does not compile.
#include <cstring>
#include <fstream>
#include <memory>
#include <variant>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/attention_glue.h"
#include "backend/cpu/bottleneck.h"
#include "backend/cpu/conv2d.h"
#include "backend/cpu/deform_conv2d.h"
#include "backend/cpu/deformable_attention.h"
#include "backend/cpu/spatial_cross_attention.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/ffn.h"
#include "backend/cpu/image_preprocess.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/msda.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/pool_resize.h"
#include "backend/cpu/select.h"
#include "bevformer/error.h"
#include "core/thread_pool.h"

namespace bev {
namespace {

// [..., C] as [rows, C] without copying (inputs are contiguous, Ops checks).
Tensor rows_view(const Tensor& t) {
  const int64_t c = t.dim() ? t.size(-1) : 1;
  return t.reshape({c ? t.numel() / c : 0, c});
}

// The processor's name as the kernel reports it ("model name" in /proc/cpuinfo).
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown CPU" : line.substr(start);
  }
  return "unknown CPU";
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, Precision precision)
      : pool_(threads, ThreadPool::Threads::kOpenMP), precision_(precision), float_(cpu::float_arithmetic(precision)) {
    cpu::set_num_threads(pool_.size());
  }

  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  Precision precision() const override { return precision_; }
  Precision float_precision() const override { return float_; }
  BackendInfo info() const override {
    return {name(), cpu_model_name(), cpu::isa_name(), static_cast<int>(pool_.size()), precision_name(precision_),
            precision_name(float_)};
  }

  // Host memory: the CPU's backend memory is the host's, so reads and writes are copies.
  std::shared_ptr<Storage> allocate(size_t bytes) override { return Storage::allocate(bytes); }
  void write(const Tensor& dst, const Tensor& host_src) override {
    check_write(dst, host_src);
    if (host_src.nbytes() > 0) std::memcpy(dst.raw_data(), host_src.contiguous().raw_data(), host_src.nbytes());
  }
  void read_into(const Tensor& host_dst, const Tensor& src) override {
    check_read(host_dst, src);
    std::memcpy(host_dst.raw_data(), src.contiguous().raw_data(), src.nbytes());
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    check_copy(dst, src);
    Tensor y = dst;
    if (src.is_contiguous()) {
      if (src.nbytes() > 0) std::memcpy(y.raw_data(), src.raw_data(), src.nbytes());
    } else {
      cpu::permute_copy(src, y, &pool_);
    }
  }
  void synchronize() override {}
  double measure_peak_gflops() override {
    team_width_on_this_thread();
    return cpu::measure_peak_gflops(precision_);
  }

  std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                      const Tensor* bias) override {
    team_width_on_this_thread();
    switch (kind) {
      case OpKind::conv2d:
        return std::make_shared<const cpu::Conv2d>(weight, bias, std::get<Conv2dAttrs>(attrs), precision_);
      case OpKind::bottleneck: {
        const auto& a = std::get<BottleneckAttrs>(attrs);
        auto member = [&](size_t i) {
          return i < a.members.size() ? std::static_pointer_cast<const cpu::Conv2d>(a.members[i]) : nullptr;
        };
        return std::make_shared<const cpu::Bottleneck>(member(0), member(1), member(2), member(3));
      }
      case OpKind::deform_conv2d: {
        const auto& a = std::get<DeformConv2dAttrs>(attrs);
        return std::make_shared<const cpu::DeformConv2d>(weight, bias, a.stride, a.pad, a.dilation,
                                                         cpu::DeformConv2d::kDefaultColBudgetBytes, float_, a.relu);
      }
      case OpKind::linear:
        return std::make_shared<const cpu::Linear>(weight, bias, std::get<LinearAttrs>(attrs).relu, float_);
      default:
        throw Error(ErrorKind::kInternal, std::string("op ") + op_name(kind) + " has no weights to prepare");
    }
  }

  // Always: base bf16's SCA 118 -> 104 ms a layer, TSA 28 -> 23 ms (docs/PERF.md); tiny's
  // projections sit in cache either way and take the same time.
  bool fuses_deformable_attention() const override { return true; }
  // Always: the projections once per cell, not per slot (base, the bundled nuScenes frame: 40000
  // cells in 57084 slots), and no rebatched rows or slot outputs in memory (docs/PERF.md).
  bool fuses_spatial_cross_attention() const override { return true; }
  // Always: base bf16's FFN and norm 28 -> 13 ms a layer (docs/PERF.md).
  bool fuses_ffn() const override { return true; }

  bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& a) const override {
    if (a.weight_shapes.size() < 3) return false;
    return cpu::Bottleneck::pays(x_nhwc, a.weight_shapes[0][0], a.weight_shapes[2][0], a.act);
  }

  void run(const OpNode& n) override {
    team_width_on_this_thread();
    const auto& in = n.inputs;
    const Tensor& out = n.outputs.front();
    switch (n.kind) {
      case OpKind::conv2d: {
        Tensor y = out;
        static_cast<const cpu::Conv2d*>(n.prepared.get())->run(in[0], in.size() > 1 ? &in[1] : nullptr, y);
        return;
      }
      case OpKind::bottleneck: {
        Tensor y = out;
        static_cast<const cpu::Bottleneck*>(n.prepared.get())->run(in[0], y, std::get<BottleneckAttrs>(n.attrs).act);
        return;
      }
      case OpKind::deform_conv2d: {
        Tensor y = out;
        static_cast<const cpu::DeformConv2d*>(n.prepared.get())->run(in[0], in[1], y, pool_);
        return;
      }
      case OpKind::linear: {
        Tensor y = rows_view(out);
        static_cast<const cpu::Linear*>(n.prepared.get())->run(rows_view(in[0]), y, &pool_);
        return;
      }
      case OpKind::ffn_norm: {
        Tensor y = out;
        cpu::ffn_norm(in[0], in[1], in[2], std::get<FfnNormAttrs>(n.attrs), y, pool_);
        return;
      }
      case OpKind::batched_matmul: {
        const auto& a = std::get<BatchedMatmulAttrs>(n.attrs);
        Tensor y = out;
        cpu::batched_matmul(in[0], in[1], a.transpose_b, a.scale, y, float_);
        return;
      }
      case OpKind::attention: {
        const auto& a = std::get<AttentionAttrs>(n.attrs);
        Tensor y = out;
        cpu::attention(in[0], in[1], in[2], a.heads, a.scale, y, float_, &pool_);
        return;
      }
      case OpKind::layer_norm: {
        Tensor y = rows_view(out);
        const Tensor residual = in.size() > 3 ? rows_view(in[3]) : Tensor();
        cpu::layer_norm(rows_view(in[0]), in[1], in[2], std::get<LayerNormAttrs>(n.attrs).eps, y, &pool_,
                        residual.defined() ? &residual : nullptr);
        return;
      }
      case OpKind::softmax: {
        Tensor y = rows_view(out);
        cpu::softmax(rows_view(in[0]), y, &pool_);
        return;
      }
      case OpKind::relu: {
        Tensor y = out;
        cpu::relu(in[0], y, &pool_);
        return;
      }
      case OpKind::sigmoid: {
        Tensor y = out;
        cpu::sigmoid(in[0], y, &pool_);
        return;
      }
      case OpKind::inverse_sigmoid: {
        Tensor y = out;
        cpu::inverse_sigmoid(in[0], std::get<InverseSigmoidAttrs>(n.attrs).eps, y, &pool_);
        return;
      }
      case OpKind::add: {
        Tensor y = out;
        cpu::add(in[0], in[1], y, &pool_);
        return;
      }
      case OpKind::mul: {
        Tensor y = out;
        cpu::mul(in[0], in[1], y, &pool_);
        return;
      }
      case OpKind::zeros: {
        Tensor y = out;
        cpu::zeros(y, &pool_);
        return;
      }
      case OpKind::add_rows: {
        Tensor y = rows_view(out);
        cpu::add_rows(rows_view(in[0]), in[1], y, &pool_);
        return;
      }
      case OpKind::image_preprocess: {
        Tensor y = out;
        cpu::image_preprocess(in[0], std::get<ImagePreprocessAttrs>(n.attrs), y, &pool_);
        return;
      }
      case OpKind::feat_flatten: {
        const auto& a = std::get<FeatFlattenAttrs>(n.attrs);
        const auto levels = static_cast<size_t>(a.levels);
        const std::span<const Tensor> all(in);
        Tensor y = out;
        cpu::feat_flatten(all.first(levels), all.subspan(levels, levels), a.cams_embeds ? &in[2 * levels] : nullptr, y,
                          &pool_);
        return;
      }
      case OpKind::max_pool2d: {
        Tensor y = out;
        cpu::max_pool2d_3x3_s2_p1(in[0], y, &pool_);
        return;
      }
      case OpKind::upsample_nearest_add: {
        Tensor fine = out;
        cpu::upsample_nearest2x_add(in[0], fine, &pool_);
        return;
      }
      case OpKind::msda: {
        const auto& a = std::get<MsdaAttrs>(n.attrs);
        Tensor y = out;
        cpu::msda(in[0], a.spatial_shapes, a.level_start, in[1], in[2], y, pool_);
        return;
      }
      case OpKind::deformable_attention: {
        Tensor y = out;
        cpu::deformable_attention(in[0], in[1], in[2], std::get<DeformableAttentionAttrs>(n.attrs), y, pool_);
        return;
      }
      case OpKind::spatial_cross_attention: {
        Tensor y = out;
        cpu::spatial_cross_attention(in[0], in[1], in[2], in[3], in[4], std::get<DeformableAttentionAttrs>(n.attrs), y,
                                     pool_);
        return;
      }
      case OpKind::sampling_locations: {
        Tensor y = out;
        cpu::sampling_locations(in[0], in[1], std::get<SamplingLocationsAttrs>(n.attrs).spatial_shapes, y, &pool_);
        return;
      }
      case OpKind::reference_refine: {
        Tensor y = out;
        cpu::reference_refine(in[0], in[1], y, &pool_);
        return;
      }
      case OpKind::bbox_denormalize: {
        Tensor y = out;
        cpu::bbox_denormalize(in[0], in[1], std::get<BboxDenormalizeAttrs>(n.attrs), y, &pool_);
        return;
      }
      case OpKind::topk: {
        Tensor values = n.outputs[0], indices = n.outputs[1];
        cpu::topk(in[0], std::get<TopkAttrs>(n.attrs).k, values, indices);
        return;
      }
      case OpKind::gather_rows: {
        Tensor y = out;
        cpu::gather_rows(in[0], in[1], y, &pool_);
        return;
      }
      case OpKind::scatter_add_rows: {
        Tensor dst = out;
        cpu::scatter_add_rows(in[0], in[1], dst);
        return;
      }
      case OpKind::scatter_mean_rows: {
        Tensor y = out;
        cpu::scatter_mean_rows(in[0], in[1], in[2], y, &pool_);
        return;
      }
      case OpKind::concat: {
        Tensor y = out;
        cpu::concat(in, std::get<ConcatAttrs>(n.attrs).axis, y, &pool_);
        return;
      }
      case OpKind::gather_rows_multi: {
        Tensor y = out;
        cpu::gather_rows_multi(std::span<const Tensor>(in).subspan(1), in[0], y);
        return;
      }
      case OpKind::count_nonfinite: {
        Tensor y = out;
        cpu::count_nonfinite(in[0], y, &pool_);
        return;
      }
      case OpKind::permute: {
        Tensor y = out;
        cpu::permute_copy(in[0].permute(std::get<PermuteAttrs>(n.attrs).order), y, &pool_);
        return;
      }
    }
    throw Error(ErrorKind::kInternal, "unknown op kind");
  }

 private:
  // OpenMP's thread count is per calling thread: a thread that never called omp_set_num_threads
  // (a server worker, the pipelined image stage's thread) would run oneDNN's primitives, and
  // create them, on every hardware thread instead of the backend's `threads`.
  void team_width_on_this_thread() const {
    if (cpu::num_threads() != pool_.size()) cpu::set_num_threads(pool_.size());
  }

  ThreadPool pool_;
  Precision precision_;
  Precision float_;  // float_precision(): precision_, or in int8 bf16 where cpu::bf16_outruns_f32()
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, Precision precision) {
  return std::make_unique<CpuBackend>(threads, precision);
}

}  // namespace bev
