#include "backend/foreign/foreign_backend.h"

#include <cstdint>
#include <cstring>

#include "bevformer/error.h"

namespace bev {
namespace {

// Flipping bit 62 turns a user-space address (below 2^47) into a non-canonical one: any load or
// store through it faults, and adding an offset below 2^47 commutes with the flip, so arena
// slices and views still address the right bytes once decoded.
constexpr uintptr_t kTag = uintptr_t{1} << 62;
void* encode(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) ^ kTag); }
void* decode(void* p) { return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) ^ kTag); }

class ForeignBackend final : public Backend {
 public:
  ForeignBackend(int threads, Precision precision) : cpu_(make_cpu_backend(threads, precision)) {}

  const char* name() const override { return "foreign"; }
  Device device() const override { return Device::kForeign; }
  Precision precision() const override { return cpu_->precision(); }
  Precision float_precision() const override { return cpu_->float_precision(); }
  BackendInfo info() const override {
    BackendInfo i = cpu_->info();
    i.backend = name();
    i.device += " (memory guarded from the host: a test backend)";
    return i;
  }

  std::shared_ptr<Storage> allocate(size_t bytes) override {
    std::shared_ptr<Storage> host = Storage::allocate(bytes);
    void* tagged = encode(host->data());
    // The deleter owns the host memory: it goes when the last view of the foreign storage does.
    return Storage::adopt(tagged, bytes, Device::kForeign, [host](void*) mutable { host.reset(); });
  }

  void write(const Tensor& dst, const Tensor& host_src) override {
    check_write(dst, host_src);
    const Tensor d = host_view(dst, "write");
    std::memcpy(d.raw_data(), host_src.contiguous().raw_data(), host_src.nbytes());
  }

  Tensor read(const Tensor& src) override { return host_view(src, "read").clone(); }

  void copy(const Tensor& dst, const Tensor& src) override {
    check_copy(dst, src);
    const Tensor d = host_view(dst, "copy"), s = host_view(src, "copy");
    cpu_->copy(d, s);
  }

  void synchronize() override {}
  double measure_peak_gflops() override { return cpu_->measure_peak_gflops(); }

  std::shared_ptr<const void> prepare(OpKind kind, const OpAttrs& attrs, const Tensor& weight,
                                      const Tensor* bias) override {
    // Weights arrive as host tensors from the checkpoint by contract; the packed copies the CPU
    // backend makes are this backend's private memory.
    return cpu_->prepare(kind, attrs, weight, bias);
  }

  bool fuses_bottleneck(const Shape& x_nhwc, const BottleneckAttrs& attrs) const override {
    return cpu_->fuses_bottleneck(x_nhwc, attrs);
  }
  bool fuses_deformable_attention() const override { return cpu_->fuses_deformable_attention(); }
  bool fuses_spatial_cross_attention() const override { return cpu_->fuses_spatial_cross_attention(); }
  bool fuses_ffn() const override { return cpu_->fuses_ffn(); }

  void run(const OpNode& node) override {
    OpNode host = node;
    const std::string what = std::string("op ") + op_name(node.kind) + (node.label.empty() ? "" : " '" + node.label + "'");
    for (Tensor& t : host.inputs) t = host_view(t, what + " input");
    for (Tensor& t : host.outputs) t = host_view(t, what + " output");
    cpu_->run(host);
  }

 private:
  // The host view of one of this backend's tensors; anything else is a host tensor that reached
  // the backend without Backend::upload or write: the bug this backend exists to catch.
  static Tensor host_view(const Tensor& t, const std::string& what) {
    if (!t.defined()) return t;
    if (t.device() != Device::kForeign) {
      throw Error(ErrorKind::kInternal, what + " " + t.describe() + " is " + device_name(t.device()) +
                                            " memory, not the foreign backend's")
          .hint("constants go through Backend::upload and frame inputs through Backend::write");
    }
    const std::shared_ptr<Storage>& s = t.storage();
    auto view = Storage::borrow(decode(s->data()), s->bytes(), s, Device::kCpu);
    return Tensor::view_of(std::move(view), t.dtype(), t.shape(), t.strides(), t.offset());
  }

  std::unique_ptr<Backend> cpu_;
};

}  // namespace

std::unique_ptr<Backend> make_foreign_backend(int threads, Precision precision) {
  return std::make_unique<ForeignBackend>(threads, precision);
}

}  // namespace bev
