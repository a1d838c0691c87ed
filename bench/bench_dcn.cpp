// DCNv2 (bev::cpu::DeformConv2d) at BEVFormer's conv2 shapes: layer3 (256 -> 256) and layer4
// (512 -> 512), 3x3, stride 1 (caffe style puts the stride on conv1), 6 cameras.
//   base  1600x928: layer3 58x100, layer4 29x50  (23 + 3 DCN blocks in R101)
//   small 1280x736: layer3 46x80,  layer4 23x40
// tiny (R50, no DCN) has none. GFLOP/s counts 2*Ho*Wo*Cout*Cin*9 per image (the matmul; the
// bilinear sampling is extra work not counted). "matmul_only" runs oneDNN's f32 matmul of the
// same [Ho*Wo*N, 9*Cin] x [9*Cin, Cout] at once: the ceiling the tiled DCN can approach. The
// bf16 rows run the backend's bf16 precision as the model does: a bf16 input (conv1's output),
// bf16 columns and weight, a bf16 output (conv3 reads it). Until 2026-12-05 they read and wrote
// f32, which the model never does.
//
//   bench_dcn [--benchmark_min_time=2] [--benchmark_repetitions=3]
// The machine is shared: the load average is printed in the context, read it with the numbers.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include <dnnl.hpp>

#include "backend/cpu/deform_conv2d.h"
#include "backend/cpu/onednn.h"

namespace {

using bev::DType;
using bev::Tensor;

Tensor random_tensor(const bev::Shape& shape, uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

// 2*Ho*Wo*Cout*Cin*9 per image, as a rate over the timed iterations.
benchmark::Counter gflops_counter(int64_t n, int64_t h, int64_t w, int64_t c) {
  const double gflop = 2e-9 * static_cast<double>(n * h * w) * static_cast<double>(c * c * 9);
  return benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
}

// args: cameras, H, W, C (Cin = Cout), column budget in MiB, bf16 (0/1: the backend's bf16
// precision with the model's bf16 input and output).
void BM_dcn(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1), w = state.range(2), c = state.range(3);
  const size_t budget = static_cast<size_t>(state.range(4)) << 20;
  const bev::Precision precision = state.range(5) ? bev::Precision::kBF16 : bev::Precision::kF32;
  if (const std::string lacks = bev::cpu::precision_lacks(precision); !lacks.empty()) {
    state.SkipWithError(("bf16 does not run on this CPU: it lacks " + lacks).c_str());  // rows are registered statically
    return;
  }
  const DType act = precision == bev::Precision::kBF16 ? DType::kBF16 : DType::kF32;
  const Tensor x = random_tensor({n, h, w, c}, 1, -1.0f, 1.0f).to(act);
  const Tensor wt = random_tensor({c, c, 3, 3}, 2, -0.05f, 0.05f);
  const Tensor om = random_tensor({n, h, w, 27}, 3, -2.0f, 2.0f);  // offsets within ±2 px, moderate masks
  Tensor y = Tensor::empty({n, h, w, c}, act);
  // The sampling on the OpenMP team that runs oneDNN's matmul, as the CPU backend does: with a
  // pool of its own threads, oneDNN's spinning OpenMP worker takes a core from the sampling
  // (measured: 20% of the profile in libgomp).
  bev::ThreadPool pool(0, bev::ThreadPool::Threads::kOpenMP);
  const bev::cpu::DeformConv2d dcn(wt, nullptr, 1, 1, 1, budget, precision);
  dcn.run(x, om, y, pool);  // warm: primitives and scratch
  for (auto _ : state) {
    dcn.run(x, om, y, pool);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = gflops_counter(n, h, w, c);
  state.counters["threads"] = pool.size();
}

void BM_matmul_only(benchmark::State& state) {
  const int64_t n = state.range(0), h = state.range(1), w = state.range(2), c = state.range(3);
  const bool bf16 = state.range(4) != 0;
  if (const std::string lacks = bev::cpu::precision_lacks(bf16 ? bev::Precision::kBF16 : bev::Precision::kF32); !lacks.empty()) {
    state.SkipWithError(("bf16 does not run on this CPU: it lacks " + lacks).c_str());
    return;
  }
  const int64_t m = n * h * w, k = 9 * c;
  const Tensor a = random_tensor({m, k}, 1, -1.0f, 1.0f), b = random_tensor({k, c}, 2, -0.05f, 0.05f);
  Tensor y = Tensor::empty({m, c}, DType::kF32);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const dt in_dt = bf16 ? dt::bf16 : dt::f32;
  // Packed weights (tag::any, reordered once), as the DCN's own matmul has them.
  const dnnl::memory::desc amd({m, k}, in_dt, tag::ab), bmd({k, c}, in_dt, tag::any), ymd({m, c}, dt::f32, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, ymd), eng);
  const dnnl::matmul mm(pd);
  dnnl::memory a32({{m, k}, dt::f32, tag::ab}, eng, a.raw_data()), b32({{k, c}, dt::f32, tag::ab}, eng, b.raw_data());
  dnnl::memory am = a32, bm(pd.weights_desc(), eng), ym(ymd, eng, y.raw_data());
  if (bf16) {
    am = dnnl::memory(amd, eng);
    dnnl::reorder(a32, am).execute(stream, a32, am);
  }
  dnnl::reorder(b32, bm).execute(stream, b32, bm);
  stream.wait();
  for (auto _ : state) {
    mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, ym}});
    stream.wait();
  }
  state.counters["GFLOP/s"] = gflops_counter(n, h, w, c);
  state.SetLabel(bev::cpu::impl_name(pd));
}

// Budgets: 2, 8 (the default) and 32 MiB of column tile.
BENCHMARK(BM_dcn)
    ->ArgNames({"cams", "H", "W", "C", "MiB", "bf16"})
    ->Args({6, 58, 100, 256, 8, 0})   // base layer3
    ->Args({6, 58, 100, 256, 2, 0})
    ->Args({6, 58, 100, 256, 32, 0})
    ->Args({6, 29, 50, 512, 8, 0})    // base layer4
    ->Args({6, 29, 50, 512, 2, 0})
    ->Args({6, 29, 50, 512, 32, 0})
    ->Args({6, 46, 80, 256, 8, 0})    // small layer3
    ->Args({6, 23, 40, 512, 8, 0})    // small layer4
    ->Args({6, 58, 100, 256, 8, 1})   // bf16: base layer3, layer4; small layer3, layer4
    ->Args({6, 58, 100, 256, 2, 1})
    ->Args({6, 58, 100, 256, 32, 1})
    ->Args({6, 29, 50, 512, 8, 1})
    ->Args({6, 46, 80, 256, 8, 1})
    ->Args({6, 23, 40, 512, 8, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_matmul_only)
    ->ArgNames({"cams", "H", "W", "C", "bf16"})
    ->Args({6, 58, 100, 256, 0})
    ->Args({6, 29, 50, 512, 0})
    ->Args({6, 58, 100, 256, 1})
    ->Args({6, 29, 50, 512, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::ifstream load("/proc/loadavg");
  std::string avg;
  std::getline(load, avg);
  benchmark::AddCustomContext("loadavg_at_start", avg);
  benchmark::RunSpecifiedBenchmarks();
  std::ifstream load_end("/proc/loadavg");
  std::getline(load_end, avg);
  std::fprintf(stderr, "loadavg at end: %s\n", avg.c_str());
  benchmark::Shutdown();
  return 0;
}
