// cpu::attention at the decoder's self-attention shape (900 queries and keys, 256 channels, 8
// heads; one sample and the three of a batched frame), and the softmax numerators it runs on one
// block's scores, the op's largest non-matrix part.
//
//   bench_attention --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Counters: GFLOP/s (the two products, 4 * Q * K * C per sample) and pct_peak against the peak of
// the same precision measured in this process; the numerators' rate in elements per second.
// BEV_THREADS=n sizes the pool (default: every core); two-thread rows are wall time.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/elementwise.h"
#include "bench_util.h"

namespace {

using bev::DType;
using bev::Tensor;
using bev::cpu::Precision;

constexpr int64_t kLen = 900, kC = 256;
constexpr int kHeads = 8;

void bm_attention(benchmark::State& state, int64_t batch, Precision p) {
  const Tensor q = bev::bench::filled({batch, kLen, kC}, 1);
  const Tensor k = bev::bench::filled({batch, kLen, kC}, 2);
  const Tensor v = bev::bench::filled({batch, kLen, kC}, 3);
  Tensor y = Tensor::empty({batch, kLen, kC}, DType::kF32);
  // An OpenMP pool, as the CPU backend's: oneDNN's products run on the caller inside its region.
  bev::ThreadPool pool(bev::cpu::num_threads(), bev::ThreadPool::Threads::kOpenMP);
  const float scale = 0.17677669f;  // 1 / sqrt(32)
  bev::cpu::attention(q, k, v, kHeads, scale, y, p, &pool);  // makes the plan
  for (auto _ : state) {
    bev::cpu::attention(q, k, v, kHeads, scale, y, p, &pool);
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double flops = 4.0 * double(batch) * double(kLen) * double(kLen) * double(kC);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = benchmark::Counter(flops * 1e-9 / bev::bench::peak(p) * 100.0,
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// One block's scores as the op sees them (heads x block rows of K scaled scores, in cache), on one
// thread: exp(s - max), the bf16 copy when bf16, the row sums.
void bm_numerators(benchmark::State& state, bool bf16) {
  const int64_t rows = kHeads * bev::cpu::attention_block_rows(kLen, kLen, kHeads);
  const Tensor s0 = bev::bench::filled({rows, kLen}, 4);
  Tensor s = Tensor::empty({rows, kLen}, DType::kF32);
  std::vector<uint16_t> p(static_cast<size_t>(rows * kLen));
  std::vector<float> sums(static_cast<size_t>(rows));
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(s0.data<float>(), s0.data<float>() + s0.numel(), s.data<float>());
    state.ResumeTiming();
    bev::cpu::softmax_numerators(s.data<float>(), bf16 ? p.data() : nullptr, sums.data(), kLen, 0, rows);
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["elements/s"] =
      benchmark::Counter(double(rows * kLen), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  bev::bench::start(&argc, argv);
  for (Precision p : {Precision::kF32, Precision::kBF16}) {
    if (!bev::bench::runs_here(p)) continue;
    const std::string name = p == Precision::kF32 ? "f32" : "bf16";
    for (int64_t batch : {1, 3}) {
      benchmark::RegisterBenchmark(("attention/dec_self/b" + std::to_string(batch) + "/" + name).c_str(),
                                   bm_attention, batch, p)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(("softmax_numerators/block/" + name).c_str(), bm_numerators, p == Precision::kBF16)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
