// oneDNN matmul on this machine: the f32 and bf16 peaks (a 2048^3 matmul), cpu::Linear at
// BEVFormer's shapes and cpu::batched_matmul at the decoder's self-attention shapes (which the
// model now runs as one attention op: test_backend_ops --perf --op attention).
//
//   bench_linear --benchmark_repetitions=3 --benchmark_min_time=0.2 [--benchmark_report_aggregates_only]
//
// Counters: GFLOP/s (2*M*K*N per run) and pct_peak, the rate as a percentage of the peak measured
// in this same process (f32 rows against the f32 peak, bf16 rows against the bf16 peak), so a
// loaded machine lowers both alike. BEV_THREADS=n sizes oneDNN's pool (default: all cores).
// fma_loop_f32_roofline is the FMA-issue bound (2 x 512-bit FMA pipes per Zen 5 core): the
// measured sgemm peak sits a little under it.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/onednn.h"
#include "core/cpu_features.h"
#include "bench_util.h"

namespace {

using bev::DType;
using bev::Shape;
using bev::Tensor;
using bev::cpu::Precision;

using bev::bench::filled;
using bev::bench::peak;

void set_counters(benchmark::State& state, double flops, Precision p) {
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] =
      benchmark::Counter(flops * 1e-9 / peak(p) * 100.0, benchmark::Counter::kIsIterationInvariantRate);
}

const char* name_of(Precision p) { return p == Precision::kF32 ? "f32" : "bf16"; }

void bm_linear(benchmark::State& state, int64_t m, int64_t in, int64_t out, bool relu, Precision p) {
  const Tensor w = filled({out, in}, 1);
  const Tensor b = filled({out}, 2);
  const Tensor x = filled({m, in}, 3);
  Tensor y = Tensor::empty({m, out}, DType::kF32);
  const bev::cpu::Linear lin(w, &b, relu, p);
  bev::ThreadPool pool(bev::cpu::num_threads(), bev::ThreadPool::Threads::kOpenMP);  // the CPU backend's
  lin.run(x, y, &pool);  // creates the plan for this M
  state.SetLabel(lin.impl_name(m));
  for (auto _ : state) {
    lin.run(x, y, &pool);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, 2.0 * static_cast<double>(m) * static_cast<double>(in) * static_cast<double>(out), p);
}

void bm_batched(benchmark::State& state, int64_t batch, int64_t m, int64_t k, int64_t n, bool transpose_b, Precision p) {
  const Tensor a = filled({batch, m, k}, 4);
  const Tensor b = filled(transpose_b ? Shape{batch, n, k} : Shape{batch, k, n}, 5);
  Tensor y = Tensor::empty({batch, m, n}, DType::kF32);
  const float scale = transpose_b ? 0.1767767f : 1.0f;
  bev::cpu::batched_matmul(a, b, transpose_b, scale, y, p);
  for (auto _ : state) {
    bev::cpu::batched_matmul(a, b, transpose_b, scale, y, p);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, 2.0 * static_cast<double>(batch * m) * static_cast<double>(k) * static_cast<double>(n), p);
}

// The FMA roofline: every oneDNN thread runs independent chains of 512-bit FMAs (12 accumulators
// hide the 4-cycle latency on two FMA pipes). Compiled for AVX-512 by attribute, run only where
// the CPU has it; the rest of the binary needs no -march.
__attribute__((target("avx512f"))) double fma_loop(int64_t iters) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12  // keeps acc[] in registers
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
    __m512 sum = acc[0];
    for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);  // (_mm512_reduce_add_ps trips a GCC 12 -Wuninitialized false positive)
    for (float v : lanes) total += static_cast<double>(v);
  }
  return total;
}

void bm_fma_peak(benchmark::State& state) {
  const int64_t iters = 1 << 20;
  for (auto _ : state) benchmark::DoNotOptimize(fma_loop(iters));
  const double flops = static_cast<double>(iters) * 12 * 16 * 2 * omp_get_max_threads();
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] =
      benchmark::Counter(flops * 1e-9 / peak(Precision::kF32) * 100.0, benchmark::Counter::kIsIterationInvariantRate);
}

struct LinearCase {
  const char* name;
  int64_t m, in, out;
  bool relu;
};

// tiny: bev 50x50 (2500 queries), 6 cameras x 15x25 = 2250 value tokens, 900 object queries.
// base: bev 200x200 (40000 queries), 6 x 30825 value tokens.
const LinearCase kLinearCases[] = {
    {"sgemm_2048", 2048, 2048, 2048, false},
    {"tiny/ffn_up_2500x256x512", 2500, 256, 512, true},
    {"tiny/ffn_down_2500x512x256", 2500, 512, 256, false},
    {"tiny/sca_value_2250x256x256", 2250, 256, 256, false},
    {"tiny/sca_offsets_2500x256x128", 2500, 256, 128, false},
    {"tiny/tsa_value_5000x256x256", 5000, 256, 256, false},
    {"tiny/dec_ffn_up_900x256x512", 900, 256, 512, true},
    {"tiny/dec_proj_900x256x256", 900, 256, 256, false},
    {"tiny/can_bus_1x18x128", 1, 18, 128, true},
    {"base/proj_40000x256x256", 40000, 256, 256, false},
    {"base/ffn_up_40000x256x512", 40000, 256, 512, true},
    {"base/sca_value_184950x256x256", 184950, 256, 256, false},
};

}  // namespace

int main(int argc, char** argv) {
  bev::bench::start(&argc, argv);
  if (bev::cpu_features::has(bev::cpu_features::Isa::kAvx512))
    benchmark::RegisterBenchmark("fma_loop_f32_roofline", bm_fma_peak)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    if (!bev::bench::runs_here(p)) continue;
    for (const LinearCase& c : kLinearCases) {
      benchmark::RegisterBenchmark((std::string("linear/") + c.name + "/" + name_of(p)).c_str(),
                                   [c, p](benchmark::State& s) { bm_linear(s, c.m, c.in, c.out, c.relu, p); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    // Decoder self-attention, 8 heads x 900 queries x 32 dims: scores q k^T and attn @ v.
    benchmark::RegisterBenchmark((std::string("bmm/scores_8x900x32x900_bT/") + name_of(p)).c_str(),
                                 [p](benchmark::State& s) { bm_batched(s, 8, 900, 32, 900, true, p); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark((std::string("bmm/attn_v_8x900x900x32/") + name_of(p)).c_str(),
                                 [p](benchmark::State& s) { bm_batched(s, 8, 900, 900, 32, false, p); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
