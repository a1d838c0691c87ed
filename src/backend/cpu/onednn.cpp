#include "backend/cpu/onednn.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <unordered_map>

#include "core/cpu_features.h"

namespace bev::cpu {

const dnnl::engine& engine() {
  // Function-local static: created once, thread-safely, on first use.
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  // dnnl::stream is not documented as safe to share between threads; CPU streams are cheap, so
  // each calling thread gets its own.
  thread_local dnnl::stream s(engine());
  return s;
}

void set_num_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

dnnl::memory reordered(const dnnl::memory& from, const dnnl::memory::desc& to) {
  dnnl::memory out(to, engine());
  dnnl::memory src = from;  // a handle copy: oneDNN takes non-const memory, reorders only read it
  dnnl::reorder(src, out).execute(stream(), src, out);
  stream().wait();
  return out;
}

dnnl::memory PackedWeights::in(const dnnl::memory::desc& want) {
  if (layouts_.empty()) throw Error(ErrorKind::kInternal, "PackedWeights::in before construction");
  for (const dnnl::memory& m : layouts_) {
    if (m.get_desc() == want) return m;
  }
  layouts_.push_back(reordered(layouts_.front(), want));
  return layouts_.back();
}

dnnl::memory PackedWeights::copy_in(const dnnl::memory::desc& want) const {
  if (layouts_.empty()) throw Error(ErrorKind::kInternal, "PackedWeights::copy_in before construction");
  return reordered(layouts_.front(), want);
}

std::string isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

bool has_int8_dot() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx2_vnni:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_amx:
      return true;
    default:
      return false;
  }
}

std::string precision_lacks(Precision p) {
  switch (p) {
    case Precision::kF32: return "";
    case Precision::kBF16: return cpu_features::lacking(cpu_features::Isa::kAvx512);
    case Precision::kInt8:
      return has_int8_dot() ? "" : "an exact int8 dot product (AVX-512 VNNI, AVX2 VNNI or AMX; oneDNN ISA " + isa_name() + ")";
  }
  return "";
}

std::string precisions_that_run() {
  std::vector<std::string> run;
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kInt8}) {
    if (precision_lacks(p).empty()) run.push_back(precision_name(p));
  }
  std::string s;
  for (size_t i = 0; i < run.size(); ++i) s += (i == 0 ? "" : i + 1 == run.size() ? " or " : ", ") + run[i];
  return s;
}

void require_precision(Precision p) {
  const std::string lacks = precision_lacks(p);
  if (lacks.empty()) return;
  throw Error(ErrorKind::kUnsupported, std::string(precision_name(p)) + " precision does not run on this CPU: it lacks " + lacks)
      .hint("--precision " + precisions_that_run() + " runs here");
}

Precision float_arithmetic(Precision p) {
  if (p != Precision::kInt8) return p;
  return bf16_outruns_f32() ? Precision::kBF16 : Precision::kF32;
}

bool bf16_outruns_f32() {
  // 2048^3 matmul, 2 cores: Zen 4 467 vs 233 GFLOP/s, Zen 5 835-893 vs 369-443; Intel's
  // avx512_bf16 without AMX ran bf16 slower than f32 (152-163 vs 246-319).
  static const bool amd_bf16 = cpu_is_amd() && dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_bf16;
  return isa_has_amx() || amd_bf16;
}

bool cpu_is_amd() {
  static const bool amd = (__builtin_cpu_init(), __builtin_cpu_is("amd") != 0);
  return amd;
}

bool isa_has_amx() {
  static const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  return amx && cpu_features::has(cpu_features::Isa::kAmx);  // a test's cap too
}

dnnl::memory::data_type to_dnnl(DType dtype) {
  using dt = dnnl::memory::data_type;
  switch (dtype) {
    case DType::kF32: return dt::f32;
    case DType::kBF16: return dt::bf16;
    case DType::kF16: return dt::f16;
    case DType::kI32: return dt::s32;
    case DType::kI8: return dt::s8;
    case DType::kU8: return dt::u8;
    default:
      throw Error(ErrorKind::kUnsupported, std::string("dtype ") + dtype_name(dtype) + " has no oneDNN equivalent")
          .expected("f32, bf16, f16, i32, i8 or u8");
  }
}

dnnl::memory::dims to_dims(const Shape& shape) { return dnnl::memory::dims(shape.begin(), shape.end()); }

dnnl::memory::desc plain_desc(const Tensor& t) {
  return dnnl::memory::desc(to_dims(t.shape()), to_dnnl(t.dtype()), to_dims(t.strides()));
}

dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& md) {
  if (!t.defined()) throw Error(ErrorKind::kInternal, "wrapping an undefined tensor as dnnl::memory");
  if (t.device() != Device::kCpu) {
    throw Error(ErrorKind::kInvalidInput, "tensor " + t.describe() + " is on " + device_name(t.device()))
        .expected("a host (cpu) tensor for the oneDNN backend");
  }
  // A descriptor that spans past the storage would let oneDNN read or write out of bounds.
  const size_t available = t.storage()->bytes() - static_cast<size_t>(t.offset()) * dtype_size(t.dtype());
  if (md.get_size() > available) {
    throw Error(ErrorKind::kInternal, "memory descriptor of " + std::to_string(md.get_size()) +
                                          " bytes wraps tensor " + t.describe() + " with " +
                                          std::to_string(available) + " bytes of storage");
  }
  return dnnl::memory(md, engine(), t.raw_data());
}

dnnl::memory unbound(const dnnl::memory::desc& md) { return dnnl::memory(md, engine(), DNNL_MEMORY_NONE); }

void bind(const dnnl::memory& mem, const Tensor& t) {
  if (!t.defined()) throw Error(ErrorKind::kInternal, "binding an undefined tensor to dnnl::memory");
  if (t.device() != Device::kCpu) {
    throw Error(ErrorKind::kInvalidInput, "tensor " + t.describe() + " is on " + device_name(t.device()))
        .expected("a host (cpu) tensor for the oneDNN backend");
  }
  const size_t available = t.storage()->bytes() - static_cast<size_t>(t.offset()) * dtype_size(t.dtype());
  const size_t needed = mem.get_desc().get_size();
  if (needed > available) {
    throw Error(ErrorKind::kInternal, "memory descriptor of " + std::to_string(needed) + " bytes binds tensor " +
                                          t.describe() + " with " + std::to_string(available) + " bytes of storage");
  }
  mem.set_data_handle(t.raw_data());
}

void bind(const dnnl::memory& mem, void* data) { mem.set_data_handle(data); }

void* conversion_scratch(int slot, size_t bytes) {
  thread_local std::array<std::shared_ptr<Storage>, 2> buffers;
  if (slot < 0 || slot >= static_cast<int>(buffers.size())) {
    throw Error(ErrorKind::kInternal, "conversion scratch slot " + std::to_string(slot));
  }
  std::shared_ptr<Storage>& b = buffers[static_cast<size_t>(slot)];
  if (!b || b->bytes() < bytes) b = Storage::allocate(bytes);
  return b->data();
}

void bind_conversion_scratch(const dnnl::memory& mem, int slot) {
  mem.set_data_handle(conversion_scratch(slot, mem.get_desc().get_size()));
}

void execute(const dnnl::primitive& prim, dnnl::stream& stream, std::span<const dnnl_exec_arg_t> args) {
  const dnnl_status_t status =
      dnnl_primitive_execute(prim.get(), stream.get(), static_cast<int>(args.size()), args.data());
  if (status != dnnl_success) {
    throw Error(ErrorKind::kInternal, "oneDNN primitive execution failed with status " + std::to_string(status));
  }
}

void expect_f32_host(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) throw Error(ErrorKind::kInvalidInput, std::string(name) + " is undefined").where(op).expected("a tensor");
  if (t.dtype() != DType::kF32 || t.device() != Device::kCpu) {
    throw Error(ErrorKind::kInvalidInput, std::string(name) + " is " + t.describe() + " on " + device_name(t.device()))
        .where(op)
        .expected("f32 on cpu");
  }
}

void expect_f32_contiguous(const char* op, const char* name, const Tensor& t) {
  expect_f32_host(op, name, t);
  if (!t.is_contiguous()) {
    throw Error(ErrorKind::kInvalidInput, std::string(name) + " " + t.describe() + " is a strided view")
        .where(op)
        .expected("a contiguous tensor")
        .hint("call contiguous() first");
  }
}

namespace {

// One size^3 matmul's best rate over `repeats` runs.
double matmul_rate(Precision precision, int64_t size, int repeats) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  // int8: u8 x s8 products summed in s32, the int8 convolutions' arithmetic (GOP/s).
  const bool int8 = precision == Precision::kInt8;
  const dt in = precision == Precision::kBF16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc a_md({size, size}, int8 ? dt::u8 : in, tag::ab),
      w_md({size, size}, int8 ? dt::s8 : in, tag::any), c_md({size, size}, int8 ? dt::s32 : dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_md, c_md), engine());
  const dnnl::matmul mm(pd);
  dnnl::memory a(a_md, engine()), w(pd.weights_desc(), engine()), c(c_md, engine());
  // 0x3c bytes: small normal numbers in f32 and bf16 alike (no denormals, no infinities); in
  // int8, 60 x 60 summed 2048 times stays far inside s32.
  std::memset(a.get_data_handle(), 0x3c, a_md.get_size());
  std::memset(w.get_data_handle(), 0x3c, pd.weights_desc().get_size());
  dnnl::stream& st = stream();
  const std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}};
  mm.execute(st, args);  // warm-up: page faults, JIT
  st.wait();
  double best = 1e30;
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    mm.execute(st, args);
    st.wait();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size) / best * 1e-9;
}

}  // namespace

double measure_peak_gflops(Precision precision, int64_t size, int repeats) {
  // The best of size^3 and two smaller cubes. On AMX the large product is bound by memory, not
  // by the tiles: on the AMX Xeon (2 threads) bf16 512^3 ran at 2875 GFLOP/s, 1024^3 at 2008,
  // 2048^3 at 1791, 4096^3 at 1342, while tiny's 3x3 convs ran at up to 3600; a peak below
  // what a conv reaches is no peak. f32 and AVX-512 bf16 change little between these sizes.
  require_precision(precision);
  double best = 0;
  for (int64_t s : {size / 4, size / 2, size}) {
    if (s >= 64 || s == size) best = std::max(best, matmul_rate(precision, s, s == size ? repeats : 4 * repeats));
  }
  return best;
}

std::string impl_name(const dnnl::primitive_desc_base& pd) { return pd.impl_info_str(); }

}  // namespace bev::cpu
