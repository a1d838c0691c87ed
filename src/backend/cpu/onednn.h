// The oneDNN side of the CPU backend: one cpu engine per process, a stream per calling thread,
// thread-count control and zero-copy views of bev::Tensor as dnnl::memory.
//
// Threads: oneDNN (Debian's 2.6 build) runs its kernels on the OpenMP runtime (libgomp). That pool
// is the one hidden thread pool of the CPU backend; Knobs size it through set_num_threads(), just
// as they size bev::ThreadPool, so the two never oversubscribe by more than the caller intends.
//
// Precision (the op interface's bev::Precision, re-exported here):
//   kF32  - f32 everywhere, strict fp math (no implicit down-conversion).
//   kBF16 - weights and the source are bf16, products accumulate in f32, the destination is f32.
//           Tensors at the interface stay f32: the source is converted inside the op.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/kernel_check.h"
#include "backend/op.h"
#include "core/tensor.h"

namespace bev::cpu {

using bev::Precision;

// The process-wide cpu engine (created on first use; thread-safe).
const dnnl::engine& engine();
// An in-order stream on engine(), one per calling thread (CPU streams are synchronous).
dnnl::stream& stream();

// Sizes oneDNN's OpenMP pool (omp_set_num_threads). threads <= 0: one per hardware thread.
// OpenMP's setting is per calling thread, so call it from the thread that runs the ops.
void set_num_threads(int threads);
int num_threads();

// While it lives, oneDNN calls from this thread make and run primitives on one thread (OpenMP's
// team size is a per-thread setting), as inside a pool participant. For products that run one per
// participant: oneDNN fixes a primitive's work split when it is made, and below AVX-512 its
// gemm:jit splits K over the team, so a product made on the caller's team had sums that followed
// --threads (the decoder's attention, made once per process).
class OneThreadTeam {
 public:
  OneThreadTeam() : team_(num_threads()) { set_num_threads(1); }
  ~OneThreadTeam() { set_num_threads(team_); }
  OneThreadTeam(const OneThreadTeam&) = delete;
  OneThreadTeam& operator=(const OneThreadTeam&) = delete;

 private:
  int team_;
};

// Name of the ISA oneDNN dispatches to on this machine, e.g. "avx512_core_bf16" (for reports).
std::string isa_name();
// Whether oneDNN runs on AMX tiles here (bf16 and int8): some fusions that pay on AVX-512 do not.
bool isa_has_amx();
// Whether the CPU is AMD's: its bf16 rate and its L3 differ from Intel's at the same ISA.
bool cpu_is_amd();
// Whether oneDNN's bf16 runs at about twice its f32 rate here: on AMX tiles, and on AMD's
// avx512_bf16 (Zen 4 and 5); not on Intel's avx512_bf16 without AMX.
bool bf16_outruns_f32();
// Whether this machine's oneDNN multiplies u8 by s8 exactly (VNNI or AMX-int8).
bool has_int8_dot();
// What precision `p` lacks on this CPU, or "" where it runs: bf16 needs AVX-512 (oneDNN 2.6 has
// no bf16 kernels below avx512_core; it emulates bf16 arithmetic there), int8 an exact int8 dot
// product (has_int8_dot: VNNI or AMX). Under ONEDNN_MAX_CPU_ISA the capped CPU's answer.
std::string precision_lacks(Precision p);
// The precisions that run here, for hints: "f32", "f32 or bf16", "f32, bf16 or int8".
std::string precisions_that_run();
// Throws kUnsupported naming the precision, what the CPU lacks and what runs instead.
void require_precision(Precision p);
// The arithmetic of the ops that are not int8 in `p` (Backend::float_precision): p itself in f32
// and bf16; in int8 bf16 where bf16_outruns_f32(), else f32.
Precision float_arithmetic(Precision p);

dnnl::memory::data_type to_dnnl(DType dtype);  // throws kUnsupported for dtypes oneDNN lacks
dnnl::memory::dims to_dims(const Shape& shape);

// A plain (strided) memory descriptor with the tensor's own shape, strides and dtype.
dnnl::memory::desc plain_desc(const Tensor& t);
// The tensor's memory as dnnl::memory with descriptor `md`, without copying. `md` must describe
// exactly the tensor's bytes (checked: size and host device). oneDNN takes a non-const handle;
// inputs are only read.
dnnl::memory wrap(const Tensor& t, const dnnl::memory::desc& md);
inline dnnl::memory wrap(const Tensor& t) { return wrap(t, plain_desc(t)); }

// How a cached primitive runs on new tensors (a replayed plan) without our code allocating: a
// dnnl::memory made once with no buffer (`unbound(md)`), pointed at the tensor by bind() before
// each run, and execute() with the arguments in a list on the stack. Creating a dnnl::memory
// allocates, and so do the C++ wrapper's std::unordered_map of arguments and its
// primitive::execute (which copies the map into an std::vector); set_data_handle and the C entry
// point do not. bind() checks what wrap() checks: a host tensor with at least the descriptor's
// bytes.
//
// oneDNN itself still allocates inside every execution, and no public entry point of 2.6 avoids
// it: dnnl_primitive_execute copies the arguments into an std::unordered_map (a node each plus
// the bucket array), creates a scratchpad grantor with new, and some kernels' parallel loops wrap
// their lambdas in std::function (measured: n_args + 2 small allocations per matmul, about 7 to
// 10 per convolution, none of them buffers).
dnnl::memory unbound(const dnnl::memory::desc& md);
void bind(const dnnl::memory& mem, const Tensor& t);
void bind(const dnnl::memory& mem, void* data);  // plan-owned buffers (no checks)

// The calling thread's scratch for an operand converted to bf16 within one op call (slot 0: the
// source, 1: a second operand), 64-byte aligned. It grows to the largest request and is then
// reused, so replays after the first frame allocate nothing; the pointer is valid until the
// next request for that slot on this thread. One buffer per thread, not one per primitive
// state: base in bf16 kept 3.9 GB of per-state copies (convolutions 1.6, linears 2.3). It
// never shrinks: each thread that runs bf16 ops keeps its largest (base: about 95 MB), and a
// thread's first run of the largest op allocates it (so a replay on a new thread allocates).
void* conversion_scratch(int slot, size_t bytes);
// Points `mem` (made unbound) at the calling thread's conversion scratch of `slot`.
void bind_conversion_scratch(const dnnl::memory& mem, int slot);
void execute(const dnnl::primitive& prim, dnnl::stream& stream, std::span<const dnnl_exec_arg_t> args);
inline void execute(const dnnl::primitive& prim, dnnl::stream& stream, std::initializer_list<dnnl_exec_arg_t> args) {
  execute(prim, stream, std::span<const dnnl_exec_arg_t>(args.begin(), args.size()));
}
// A reorder from `src` to `dst`.
inline void execute_reorder(const dnnl::reorder& r, dnnl::stream& stream, const dnnl::memory& src,
                            const dnnl::memory& dst) {
  execute(r, stream, {{DNNL_ARG_FROM, src.get()}, {DNNL_ARG_TO, dst.get()}});
}

// `from` reordered into a new buffer of layout `to` (and dtype: bf16 weights are rounded here).
dnnl::memory reordered(const dnnl::memory& from, const dnnl::memory::desc& to);

// Weights kept in every layout a primitive has asked for. With format_tag::any oneDNN names, per
// input shape, the layout its kernel runs fastest on; the shapes of one op almost always agree, so
// owners make the first layout at construction and any other only when a later shape asks for it,
// reordered from the source (exact: same dtype). Not thread-safe: the owner's lock covers it.
// Copies share the buffers.
class PackedWeights {
 public:
  PackedWeights() = default;
  // `source`: the weights in some layout, kept as the reorder source of every other.
  explicit PackedWeights(dnnl::memory source) { layouts_.push_back(std::move(source)); }
  dnnl::memory in(const dnnl::memory::desc& want);
  // The weights reordered into `want` once, for a caller that keeps its own copy (not cached here).
  dnnl::memory copy_in(const dnnl::memory::desc& want) const;

 private:
  std::vector<dnnl::memory> layouts_;  // [0] the source
};

// Argument checks shared by the ops; they throw kInvalidInput with `op` as the place.
void expect_f32_host(const char* op, const char* name, const Tensor& t);        // defined, f32, cpu
void expect_f32_contiguous(const char* op, const char* name, const Tensor& t);  // ... and contiguous
// overlaps(a, b): backend/cpu/kernel_check.h.

// This machine's measured matmul rate in GFLOP/s: the best of `repeats` runs of a size^3 oneDNN
// matmul and of 4 x repeats runs of (size/2)^3 and (size/4)^3 (f32; bf16 sources with f32
// accumulation and output; int8: u8 x s8 into s32, in GOP/s but named GFLOP/s like the others).
// The denominator for "% of peak" in benchmarks and profiles. Best-of rather than median, because
// on a shared machine the best run is the one closest to what the cores can do; the smaller cubes
// because on AMX the largest is bound by memory (onednn.cpp). About two seconds at the defaults.
double measure_peak_gflops(Precision precision, int64_t size = 2048, int repeats = 10);

// Implementation name oneDNN picked for a primitive descriptor, e.g. "brg:avx512_core" (reports).
std::string impl_name(const dnnl::primitive_desc_base& pd);

}  // namespace bev::cpu
