#include "backend/cpu/linear.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <tuple>
#include <span>
#include <vector>

#include "backend/cpu/onednn.h"
#include "backend/cpu/row_gemm.h"

namespace bev::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

[[noreturn]] void invalid(const char* op, const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where(op).expected(expected);
}

dt compute_dt(Precision p) { return p == Precision::kBF16 ? dt::bf16 : dt::f32; }

// A primitive plus the buffers it needs, created once per shape.
struct MatmulPlan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory scratchpad;
  dnnl::memory::desc src_f32_md, dst_md;
  // bf16 mode: the f32 source (and, for batched_matmul, the f32 right operand) converted in place
  // into plan-owned bf16 buffers.
  dnnl::reorder src_to_bf16, b_to_bf16;
  dnnl::memory src_bf16, b_bf16;
  // The run's tensors, bound to these before each run (made once: see cpu::bind). `b` is the
  // right operand of batched_matmul.
  dnnl::memory src, b, dst;
};

// Runs a plan's matmul; `bias` only when the primitive has one (it goes last in the list). dst and
// scratchpad: the plan's own, or a chunk lane's (Linear::run on chunks).
void run_matmul(const MatmulPlan& p, dnnl::stream& st, dnnl_memory_t src, dnnl_memory_t weights, dnnl_memory_t bias,
                dnnl_memory_t dst = nullptr, dnnl_memory_t scratchpad = nullptr) {
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_WEIGHTS, weights},
                                  {DNNL_ARG_DST, dst ? dst : p.dst.get()},
                                  {DNNL_ARG_SCRATCHPAD, scratchpad ? scratchpad : p.scratchpad.get()},
                                  {DNNL_ARG_BIAS, bias}};
  execute(p.prim, st, std::span(args, bias ? 5 : 4));
}

// bf16 precision, f32 x of many rows: each thread converts a chunk of rows to bf16 and multiplies
// it while it is in its L2, instead of one conversion of the whole x to memory and one matmul
// reading it back (base's output_proj, [40000, 256] -> [40000, 256]: the bf16 copy was 20 MB
// written and read again). The rows of a chunk are those of one matmul call (oneDNN's brgemm
// kernels for these M compute a row as for any other M: the test compares the bits with one call
// over the bf16 input). A chunk's f32 rows, bf16 rows and output rows take about kChunkBytes;
// from kChunkMinRows rows on (tiny's 2500-row maps stay in L2 either way). bench_linear on the AMX
// Xeon, 2 threads, medians of three interleaved runs, f32 in and out, against one conversion and
// one matmul: base proj 7.6-8.1 -> 6.6-7.8 ms, ffn_up 13.1-13.9 -> 9.6-11.8, sca_value (184950
// rows) 44.0-44.9 -> 34.3-35.6; chunks of 1 MiB: 6.3-7.0, 12.8-13.8, 35.7-36.8.
constexpr int64_t kChunkBytes = int64_t{512} << 10;
constexpr int64_t kChunkMinRows = 8192;

}  // namespace

// ---- Linear ----

struct Linear::State {
  int64_t in = 0, out = 0;
  bool relu = false;
  Precision precision = Precision::kF32;
  dnnl::memory bias;  // f32 [1, out]; empty without bias
  PackedWeights weights;  // the first layout made at construction, for a representative M
  // f32 where oneDNN's matmul would make a row depend on M (row_gemm_needed): every run goes
  // here instead, and the oneDNN members above stay empty.
  std::optional<RowGemm> row_gemm;
  struct Plan : MatmulPlan {
    dnnl::memory weights;
    // Chunked runs (run_chunks, RowRunner): per pool participant, handles for its chunk's x and
    // output rows, its own scratchpad and, where x is converted, its own bf16 rows (the lane's
    // memory, not the thread's conversion scratch: the pool's threads take chunks in any order,
    // so a thread's scratch could first grow during a replay). Made on the first chunked run.
    struct Lane {
      dnnl::memory src, src_bf16, dst, scratchpad;
    };
    std::vector<Lane> lanes;
    void add_lanes(int n) {
      const bool converts = src_to_bf16.get(true) != nullptr;
      while (static_cast<int>(lanes.size()) < n) {
        lanes.push_back({unbound(src_f32_md),
                         converts ? dnnl::memory(pd.src_desc(), engine()) : unbound(pd.src_desc()),
                         unbound(dst_md), dnnl::memory(pd.scratchpad_desc(), engine())});
      }
    }
  };
  std::mutex mu;
  std::map<std::tuple<int64_t, bool, bool>, Plan> plans;  // by M and whether x, y are bf16

  dnnl::matmul::primitive_desc make_pd(int64_t m, bool bf16_out = false) const {
    const dnnl::memory::desc src_md({m, in}, compute_dt(precision), tag::ab);
    const dnnl::memory::desc w_md({in, out}, compute_dt(precision), tag::any);
    const dnnl::memory::desc dst_md({m, out}, bf16_out ? dt::bf16 : dt::f32, tag::ab);
    const dnnl::memory::desc bias_md = bias ? dnnl::memory::desc({1, out}, dt::f32, tag::ab) : dnnl::memory::desc();
    dnnl::post_ops ops;
    if (relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return {dnnl::matmul::desc(src_md, w_md, bias_md, dst_md), attr, engine()};
  }

  Plan& plan_for(int64_t m, bool bf16_in, bool bf16_out) {
    auto it = plans.find({m, bf16_in, bf16_out});
    if (it != plans.end()) return it->second;
    Plan p;
    p.pd = make_pd(m, bf16_out);
    p.weights = weights.in(p.pd.weights_desc());
    p.prim = dnnl::matmul(p.pd);
    p.scratchpad = dnnl::memory(p.pd.scratchpad_desc(), engine());
    p.src_f32_md = dnnl::memory::desc({m, in}, dt::f32, tag::ab);
    p.dst_md = p.pd.dst_desc();
    if (bf16_in) {
      // x is already the bf16 [M, in] the primitive reads: bound directly, nothing converted.
      p.src = unbound(p.pd.src_desc());
      p.dst = unbound(p.dst_md);
      return plans.emplace(std::make_tuple(m, bf16_in, bf16_out), std::move(p)).first->second;
    }
    if (precision == Precision::kBF16) {
      p.src_bf16 = unbound(p.pd.src_desc());  // bound to this thread's conversion scratch per run
      p.src_to_bf16 = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p.src_f32_md, engine(), p.pd.src_desc()));
    }
    p.src = unbound(p.src_f32_md);
    p.dst = unbound(p.dst_md);
    return plans.emplace(std::make_tuple(m, bf16_in, bf16_out), std::move(p)).first->second;
  }

  // One chunk of p's rows on the calling thread and lane l: x's rows (bf16 as they lie, f32
  // multiplied as they lie, or f32 converted into the lane's bf16 rows) into y's.
  void run_lane(Plan& p, Plan::Lane& l, const void* x, void* y) const {
    dnnl::stream& st = stream();
    l.dst.set_data_handle(y);
    dnnl_memory_t src = nullptr;
    if (p.src_to_bf16.get(true) != nullptr) {
      l.src.set_data_handle(const_cast<void*>(x));
      execute_reorder(p.src_to_bf16, st, l.src, l.src_bf16);
      src = l.src_bf16.get();
    } else {
      // The plan's source descriptor is x's as it lies (bf16 rows, or f32 in f32 precision).
      l.src_bf16.set_data_handle(const_cast<void*>(x));
      src = l.src_bf16.get();
    }
    run_matmul(p, st, src, p.weights.get(), bias ? bias.get() : nullptr, l.dst.get(), l.scratchpad.get());
    st.wait();
  }
};

Linear::Linear(const Tensor& weight, const Tensor* bias, bool relu, Precision precision)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  const char* op = "cpu::Linear";
  expect_f32_host(op, "weight", weight);
  if (weight.dim() != 2 || weight.size(0) < 1 || weight.size(1) < 1) {
    invalid(op, "weight is " + weight.describe(), "f32[out, in] with out, in >= 1");
  }
  s.out = weight.size(0);
  s.in = weight.size(1);
  s.relu = relu;
  s.precision = precision;
  if (bias) {
    expect_f32_host(op, "bias", *bias);
    if (bias->shape() != Shape{s.out}) invalid(op, "bias is " + bias->describe(), "f32[" + std::to_string(s.out) + "]");
    const Tensor b = bias->contiguous();
    s.bias = dnnl::memory({{1, s.out}, dt::f32, tag::ab}, engine());
    std::memcpy(s.bias.get_data_handle(), b.raw_data(), b.nbytes());
  }
  const Tensor w = weight.contiguous();
  if (precision != Precision::kBF16 && row_gemm_needed()) {
    s.row_gemm.emplace(w.data<float>(), s.out, s.in, bias ? bias->contiguous().data<float>() : nullptr, relu);
    return;
  }
  // PyTorch's [out, in] row-major is the [in, out] matrix oneDNN wants, stored column-major (ba).
  dnnl::memory user = wrap(w, dnnl::memory::desc({s.in, s.out}, dt::f32, tag::ba));
  const auto pd = s.make_pd(256);  // representative M; other M almost always share the layout
  s.weights = PackedWeights(reordered(user, pd.weights_desc()));
}

Linear::~Linear() = default;
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;

int64_t Linear::in_features() const { return state_->in; }
int64_t Linear::out_features() const { return state_->out; }

std::string Linear::impl_name(int64_t m) const {
  if (m < 1) invalid("cpu::Linear", "row count " + std::to_string(m), "M >= 1");
  if (state_->row_gemm) return RowGemm::impl_name();
  std::lock_guard<std::mutex> lock(state_->mu);
  return cpu::impl_name(state_->plan_for(m, false, false).pd);
}

void Linear::run(const Tensor& x, Tensor& y, ThreadPool* pool) const {
  State& s = *state_;
  const char* op = "cpu::Linear";
  // x and y are f32, or either bf16 in bf16 precision (a bf16 x is read as it lies; a bf16 y is
  // oneDNN's f32 sums rounded once on the way out).
  const bool bf16 = s.precision == Precision::kBF16;
  const bool bf16_in = bf16 && x.defined() && x.dtype() == DType::kBF16;
  const bool bf16_out = bf16 && y.defined() && y.dtype() == DType::kBF16;
  const auto expect_contiguous = [&](const char* name, const Tensor& t, bool is_bf16) {
    if (!is_bf16)
      expect_f32_contiguous(op, name, t);
    else if (t.device() != Device::kCpu || !t.is_contiguous())
      invalid(op, std::string(name) + " is " + t.describe(), "a contiguous host tensor");
  };
  expect_contiguous("input", x, bf16_in);
  if (x.dim() < 2 || x.size(-1) != s.in) {
    invalid(op, "input is " + x.describe(), std::string(dtype_name(x.dtype())) + "[M, " + std::to_string(s.in) + "]");
  }
  Shape out_shape = x.shape();
  out_shape.back() = s.out;
  const int64_t m = x.numel() / s.in;
  if (m < 1) invalid(op, "input is " + x.describe(), "at least one row");
  expect_contiguous("output", y, bf16_out);
  if (y.shape() != out_shape)
    invalid(op, "output is " + y.describe() + " for input " + x.describe(), dtype_name(y.dtype()) + shape_str(out_shape));
  if (overlaps(x, y)) invalid(op, "output " + y.describe() + " overlaps input " + x.describe(), "disjoint tensors");

  if (s.row_gemm) return s.row_gemm->run(x.data<float>(), m, y.data<float>(), pool);  // f32 only: no lock needed
  std::lock_guard<std::mutex> lock(s.mu);
  if (bf16 && !bf16_in && pool != nullptr && pool->size() > 1 && m >= kChunkMinRows) {
    const int64_t row_bytes = s.in * 6 + s.out * (bf16_out ? 2 : 4);
    // At most a thread's share, so that narrow layers still give every thread chunks.
    const int64_t share = ((m + pool->size() - 1) / pool->size() + 31) / 32 * 32;
    const int64_t rows = std::clamp<int64_t>(kChunkBytes / row_bytes / 32 * 32, 32, std::min(m, share));
    return run_chunks(x, y, m, rows, *pool, bf16_out);
  }
  State::Plan& p = s.plan_for(m, bf16_in, bf16_out);
  dnnl::stream& st = stream();
  bind(p.src, x);
  bind(p.dst, y);
  dnnl_memory_t src = p.src.get();
  if (bf16 && !bf16_in) {
    bind_conversion_scratch(p.src_bf16, 0);
    execute_reorder(p.src_to_bf16, st, p.src, p.src_bf16);
    src = p.src_bf16.get();
  }
  run_matmul(p, st, src, p.weights.get(), s.bias ? s.bias.get() : nullptr);
  st.wait();
}

void Linear::run_chunks(const Tensor& x, Tensor& y, int64_t m, int64_t rows, ThreadPool& pool, bool bf16_out) const {
  State& s = *state_;
  const int64_t chunks = (m + rows - 1) / rows, tail = m - (chunks - 1) * rows;
  State::Plan& full = s.plan_for(rows, false, bf16_out);
  State::Plan& last = s.plan_for(tail, false, bf16_out);
  full.add_lanes(pool.size());
  last.add_lanes(pool.size());
  const auto* xp = static_cast<const char*>(x.raw_data());
  auto* yp = static_cast<char*>(y.raw_data());
  const size_t x_row = static_cast<size_t>(s.in) * 4, y_row = static_cast<size_t>(s.out) * dtype_size(y.dtype());
  // One contiguous run of chunks per participant (each streams its own part of x and y; the pool's
  // default of four smaller runs each measured 2-8% slower), every oneDNN call on its participant
  // alone (the CPU backend's pool is an OpenMP one, and oneDNN runs a primitive called inside an
  // OpenMP region on its caller).
  // (The pool makes at most chunks / grain pieces: a grain of chunks / size gives size pieces.)
  const int64_t grain = std::max<int64_t>(1, chunks / pool.size());
  pool.parallel_for_indexed(chunks, grain, [&](int64_t c0, int64_t c1, int lane) {
    for (int64_t c = c0; c < c1; ++c) {
      State::Plan& p = c + 1 == chunks ? last : full;
      s.run_lane(p, p.lanes[static_cast<size_t>(lane)], xp + static_cast<size_t>(c * rows) * x_row,
                 yp + static_cast<size_t>(c * rows) * y_row);
    }
  });
}

Linear::RowRunner::RowRunner(const Linear& linear, bool bf16_in, int64_t chunk_rows, int64_t last_rows, int lanes,
                             bool bf16_out)
    : s_(*linear.state_), lock_(linear.state_->mu), rows_{chunk_rows, last_rows} {
  if ((bf16_in || bf16_out) && s_.precision != Precision::kBF16)
    invalid("cpu::Linear", "bf16 rows for a linear in " + std::string(precision_name(s_.precision)), "f32 rows");
  for (int i = 0; i < 2; ++i) {
    if (rows_[i] < 1) invalid("cpu::Linear", "chunk of " + std::to_string(rows_[i]) + " rows", "at least one row");
    if (s_.row_gemm) continue;  // any row count, no plans
    State::Plan& p = s_.plan_for(rows_[i], bf16_in, bf16_out);
    p.add_lanes(lanes);
    plans_[i] = &p;
  }
}

void Linear::RowRunner::run(const void* x, int64_t rows, void* y, int lane) const {
  const int i = rows == rows_[0] ? 0 : rows == rows_[1] ? 1 : -1;
  if (i < 0) throw Error(ErrorKind::kInternal, "chunk of " + std::to_string(rows) + " rows was not announced").where("cpu::Linear");
  if (s_.row_gemm) return s_.row_gemm->run_rows(static_cast<const float*>(x), rows, static_cast<float*>(y));
  State::Plan& p = *static_cast<State::Plan*>(plans_[i]);
  s_.run_lane(p, p.lanes.at(static_cast<size_t>(lane)), x, y);
}

// ---- batched_matmul ----

namespace {

struct BatchedKey {
  int64_t batch, m, k, n;
  bool transpose_b;
  Precision precision;
  float scale;
  auto tie() const { return std::tie(batch, m, k, n, transpose_b, precision, scale); }
  bool operator<(const BatchedKey& o) const { return tie() < o.tie(); }
};

struct BatchedCache {
  std::mutex mu;
  std::map<BatchedKey, MatmulPlan> plans;
};

BatchedCache& batched_cache() {
  static BatchedCache cache;
  return cache;
}

dnnl::memory::desc b_f32_desc(const BatchedKey& key) {
  // Logical [B, K, N]; a transposed right operand is stored [B, N, K], i.e. with K fastest.
  const dnnl::memory::dims strides = key.transpose_b ? dnnl::memory::dims{key.n * key.k, 1, key.k}
                                                     : dnnl::memory::dims{key.k * key.n, key.n, 1};
  return {{key.batch, key.k, key.n}, dt::f32, strides};
}

MatmulPlan make_batched_plan(const BatchedKey& key) {
  MatmulPlan p;
  const bool bf16 = key.precision == Precision::kBF16;
  p.src_f32_md = dnnl::memory::desc({key.batch, key.m, key.k}, dt::f32, tag::abc);
  const dnnl::memory::desc a_md({key.batch, key.m, key.k}, compute_dt(key.precision), tag::abc);
  // bf16 converts b anyway, so let the kernel choose b's layout; f32 reads b where it lies.
  const dnnl::memory::desc b_md =
      bf16 ? dnnl::memory::desc({key.batch, key.k, key.n}, dt::bf16, tag::any) : b_f32_desc(key);
  const dnnl::memory::desc y_md({key.batch, key.m, key.n}, dt::f32, tag::abc);
  dnnl::primitive_attr attr;
  if (key.scale != 1.0f) attr.set_output_scales(0, {key.scale});
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  p.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, y_md), attr, engine());
  p.prim = dnnl::matmul(p.pd);
  p.scratchpad = dnnl::memory(p.pd.scratchpad_desc(), engine());
  p.dst_md = y_md;
  if (bf16) {
    p.src_bf16 = unbound(p.pd.src_desc());  // the thread's conversion scratch, slot 0

    p.src_to_bf16 = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p.src_f32_md, engine(), p.pd.src_desc()));
    p.b_bf16 = unbound(p.pd.weights_desc());  // slot 1
    p.b_to_bf16 = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), b_f32_desc(key), engine(), p.pd.weights_desc()));
  }
  p.src = unbound(p.src_f32_md);
  p.b = unbound(b_f32_desc(key));
  p.dst = unbound(p.dst_md);
  return p;
}

}  // namespace

void batched_matmul(const Tensor& a, const Tensor& b, bool transpose_b, float scale, Tensor& y, Precision precision) {
  const char* op = "cpu::batched_matmul";
  expect_f32_contiguous(op, "a", a);
  expect_f32_contiguous(op, "b", b);
  expect_f32_contiguous(op, "y", y);
  if (a.dim() != 3) invalid(op, "a is " + a.describe(), "f32[B, M, K]");
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2);
  if (batch < 1 || m < 1 || k < 1) invalid(op, "a is " + a.describe(), "non-empty [B, M, K]");
  const int64_t n = b.dim() == 3 ? b.size(transpose_b ? 1 : 2) : -1;
  const Shape want_b = transpose_b ? Shape{batch, n, k} : Shape{batch, k, n};
  if (b.dim() != 3 || n < 1 || b.shape() != want_b) {
    invalid(op, "b is " + b.describe() + " for a " + a.describe(),
            transpose_b ? "f32[B, N, K] = [" + std::to_string(batch) + ", N, " + std::to_string(k) + "] (transpose_b)"
                        : "f32[B, K, N] = [" + std::to_string(batch) + ", " + std::to_string(k) + ", N]");
  }
  const Shape want_y = {batch, m, n};
  if (y.shape() != want_y) invalid(op, "y is " + y.describe(), "f32" + shape_str(want_y));
  if (overlaps(y, a) || overlaps(y, b)) invalid(op, "y overlaps an operand", "disjoint tensors");

  const BatchedKey key{batch, m, k, n, transpose_b, precision, scale};
  BatchedCache& cache = batched_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) it = cache.plans.emplace(key, make_batched_plan(key)).first;
  MatmulPlan& p = it->second;
  dnnl::stream& st = stream();
  bind(p.src, a);
  bind(p.b, b);
  bind(p.dst, y);
  dnnl_memory_t a_mem = p.src.get(), b_mem = p.b.get();
  if (precision == Precision::kBF16) {
    bind_conversion_scratch(p.src_bf16, 0);
    bind_conversion_scratch(p.b_bf16, 1);
    execute_reorder(p.src_to_bf16, st, p.src, p.src_bf16);
    execute_reorder(p.b_to_bf16, st, p.b, p.b_bf16);
    a_mem = p.src_bf16.get();
    b_mem = p.b_bf16.get();
  }
  run_matmul(p, st, a_mem, b_mem, nullptr);
  st.wait();
}

}  // namespace bev::cpu
