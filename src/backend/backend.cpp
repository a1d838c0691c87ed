#include "backend/backend.h"

#include <chrono>
#include <cstring>

#include "backend/recorded_stage.h"
#include "bevformer/error.h"
#include "core/small_vector.h"

namespace bev {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The bindings of one execution, undone however it ends (a throwing op included): a stage left
// bound would read and write a stream's history on its next unbound run. Inline storage: an
// execution allocates nothing.
class Bound {
 public:
  Bound(const RecordedStage& stage, std::span<const StageBinding> bindings) {
    for (const StageBinding& b : bindings) {
      stage.check_binding(b);
      b.slot.storage()->bind_to(*b.target.storage(), static_cast<size_t>(b.target.offset()) * dtype_size(b.target.dtype()));
      bound_.push_back(b.slot.storage().get());
    }
  }
  ~Bound() {
    for (Storage* s : bound_) s->unbind();
  }
  Bound(const Bound&) = delete;
  Bound& operator=(const Bound&) = delete;

 private:
  SmallVector<Storage*, 8> bound_;  // a with-history bev stage binds five
};

}  // namespace

std::string BackendInfo::summary() const {
  std::string s = backend + ": " + device;
  if (!isa.empty()) s += ", " + isa;
  if (threads > 0) s += ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  // int8 says what its float parts run in (bf16 on AMX and AMD, else f32: Backend::float_precision).
  if (!float_precision.empty() && float_precision != precision) s += ", " + precision + " with " + float_precision + " floats";
  return s;
}

Tensor Backend::empty(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  return Tensor::view_of(allocate(bytes), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Backend::host_empty(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  std::shared_ptr<Storage> s = allocate_host(bytes);
  s->set_staging_owner(this);
  return Tensor::view_of(std::move(s), dtype, shape, contiguous_strides(shape), 0);
}

void Backend::write_staged(const Tensor& dst, const Tensor& host_src, Tensor& staging) {
  if (!wants_staging() || (host_src.defined() && host_src.storage()->staging_owner() == this)) {
    write(dst, host_src);
    return;
  }
  if (!staging.defined() || staging.shape() != host_src.shape() || staging.dtype() != host_src.dtype()) {
    staging = host_empty(host_src.shape(), host_src.dtype());
  }
  const Tensor src = host_src.contiguous();
  std::memcpy(staging.raw_data(), src.raw_data(), src.nbytes());
  write(dst, staging);
}

Tensor Backend::upload(const Tensor& host) {
  Tensor t = empty(host.shape(), host.dtype());
  write(t, host);
  return t;
}

Tensor Backend::read(const Tensor& src) {
  Tensor out = Tensor::empty(src.shape(), src.dtype());
  read_into(out, src);
  synchronize();
  return out;
}

std::vector<Tensor> Backend::read_all(std::span<const Tensor> srcs) {
  std::vector<Tensor> out;
  out.reserve(srcs.size());
  for (const Tensor& t : srcs) {
    out.push_back(Tensor::empty(t.shape(), t.dtype()));
    read_into(out.back(), t);
  }
  synchronize();
  return out;
}

void Backend::check_read(const Tensor& host_dst, const Tensor& src) const {
  if (!host_dst.defined() || !src.defined() || host_dst.shape() != src.shape() || host_dst.dtype() != src.dtype() ||
      !host_dst.is_contiguous() || host_dst.device() != Device::kCpu || src.device() != device()) {
    throw Error(ErrorKind::kInternal, std::string(name()) + " backend: read of " +
                                          (src.defined() ? src.describe() : std::string("nothing")) + " into " +
                                          (host_dst.defined() ? host_dst.describe() : std::string("nothing")))
        .expected("a tensor of this backend into a contiguous host tensor of the same shape and dtype");
  }
}

void Backend::check_write(const Tensor& dst, const Tensor& host_src) const {
  if (!dst.defined() || !host_src.defined() || dst.shape() != host_src.shape() || dst.dtype() != host_src.dtype() ||
      !dst.is_contiguous() || dst.device() != device() || host_src.device() != Device::kCpu) {
    throw Error(ErrorKind::kInternal, std::string(name()) + " backend: write of " +
                                          (host_src.defined() ? host_src.describe() : std::string("nothing")) + " into " +
                                          (dst.defined() ? dst.describe() : std::string("nothing")))
        .expected("a host tensor into a contiguous backend tensor of the same shape and dtype");
  }
}

void Backend::check_copy(const Tensor& dst, const Tensor& src) const {
  if (!dst.defined() || !src.defined() || dst.shape() != src.shape() || dst.dtype() != src.dtype() ||
      !dst.is_contiguous() || dst.device() != device() || src.device() != device()) {
    throw Error(ErrorKind::kInternal, std::string(name()) + " backend: copy of " +
                                          (src.defined() ? src.describe() : std::string("nothing")) + " into " +
                                          (dst.defined() ? dst.describe() : std::string("nothing")))
        .expected("two tensors of this backend with the same shape and dtype, the destination contiguous");
  }
}

void Backend::execute(const RecordedStage& stage, std::span<const StageBinding> bindings, std::vector<OpTime>* times) {
  const Bound bound(stage, bindings);
  if (times == nullptr) {
    for (const OpNode& n : stage.nodes()) run(n);
  } else {
    times->reserve(times->size() + stage.nodes().size());
    for (const OpNode& n : stage.nodes()) times->push_back(run_timed(n));
  }
  // Node by node through run() (a decorator's, over an asynchronous backend), the nodes may still
  // be queued: the bindings must hold until they have run. (A backend that queues whole stages
  // overrides execute and binds on its queue.) On the CPU this waits for nothing.
  if (!bindings.empty()) synchronize();
}

OpTime Backend::run_timed(const OpNode& node) {
  const int64_t t0 = steady_ns();
  run(node);
  return {t0, steady_ns() - t0};
}

}  // namespace bev
