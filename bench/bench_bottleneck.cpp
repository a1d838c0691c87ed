// ResNet bottleneck blocks at stride 1, as the image stage runs them: cpu::Bottleneck (depth-first
// in strips of rows, `fused`) against the same three convs run one by one on the whole map
// (`conv_by_conv`: conv1 and conv2 into fresh maps, conv3 adding in place over the block input).
//   tiny: ResNet-50 at 6x3x480x800 (layer1 120x200 ... layer4 15x25)
//   base: ResNet-101 at 6x3x928x1600 (layer1 232x400, layer2 116x200)
// Rows `b0` are block 0 of layer1 (64 input channels, with its downsample conv), the others a
// repeated block (the identity added in place).
//
//   bench_bottleneck --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//
// Each in f32, and in bf16 with bf16 activations (as the image stage keeps them in bf16 precision).
// Counters: GFLOP/s of the block and pct_peak (of the row's precision: a 2048^3 matmul measured in
// this process). For `fused`, each member's rate inside the block as well: its FLOPs over its own time
// (summed over the threads, divided by them), e.g. conv3_pct_peak is the expand conv with its
// residual, the conv the 70% goal is hardest on. BEV_THREADS=n sizes the team.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/bottleneck.h"
#include "backend/cpu/conv2d.h"
#include "backend/cpu/onednn.h"
#include "bench_util.h"

namespace {

using bev::DType;
using bev::Shape;
using bev::Tensor;
using bev::cpu::Conv2d;
using bev::cpu::Precision;

using bev::bench::filled;
using bev::bench::peak;

struct BlockCase {
  std::string name;
  int64_t n, h, w, c, planes;  // input NHWC; conv1 output channels (the block outputs 4x)
  bool downsample;
};

std::shared_ptr<const Conv2d> make_conv(int64_t o, int64_t i, int k, bool relu, bool residual, uint32_t seed,
                                        Precision p) {
  bev::cpu::Conv2dAttrs a;
  a.pad_h = a.pad_w = k / 2;
  a.relu = relu;
  a.residual = residual;
  // Small weights keep activations in range through repeated runs in place.
  Tensor w = filled({o, i, k, k}, seed);
  float* wp = w.data<float>();
  for (int64_t j = 0; j < w.numel(); ++j) wp[j] *= 0.05f;
  const Tensor b = filled({o}, seed + 1);
  return std::make_shared<const Conv2d>(w, &b, a, p);
}

void bm_block(benchmark::State& state, const BlockCase& bc, bool fused, Precision p) {
  const DType act = p == Precision::kBF16 ? DType::kBF16 : DType::kF32;
  const int64_t e = 4 * bc.planes;
  auto conv1 = make_conv(bc.planes, bc.c, 1, true, false, 1, p);
  auto conv2 = make_conv(bc.planes, bc.planes, 3, true, false, 3, p);
  auto conv3 = make_conv(e, bc.planes, 1, true, true, 5, p);
  auto ds = bc.downsample ? make_conv(e, bc.c, 1, false, false, 7, p) : nullptr;
  const bev::cpu::Bottleneck block(conv1, conv2, conv3, ds);
  Tensor x = filled({bc.n, bc.h, bc.w, bc.c}, 9).to(act);
  Tensor y = bc.downsample ? Tensor::empty({bc.n, bc.h, bc.w, e}, act) : x;
  Tensor t1 = Tensor::empty({bc.n, bc.h, bc.w, bc.planes}, act);
  Tensor t2 = Tensor::empty({bc.n, bc.h, bc.w, bc.planes}, act);
  auto once = [&] {
    if (fused) {
      block.run(x, y, act);
      return;
    }
    if (ds) ds->run(x, nullptr, y);
    conv1->run(x, nullptr, t1);
    conv2->run(t1, nullptr, t2);
    conv3->run(t2, &y, y);
  };
  once();  // plans for every shape
  double member[5] = {};
  for (auto _ : state) {
    once();
    benchmark::DoNotOptimize(y.raw_data());
    if (fused) {
      const std::vector<double> s = block.last_member_seconds();
      for (int m = 0; m < 5; ++m) member[m] += s[static_cast<size_t>(m)];
    }
  }
  const double px = static_cast<double>(bc.n * bc.h * bc.w);
  const double f1 = 2 * px * static_cast<double>(bc.c * bc.planes), f2 = 2 * px * static_cast<double>(bc.planes * bc.planes * 9);
  const double f3 = 2 * px * static_cast<double>(bc.planes * e), fd = ds ? 2 * px * static_cast<double>(bc.c * e) : 0;
  const double gflop = (f1 + f2 + f3 + fd) * 1e-9;
  const double pk = peak(p);
  state.counters["GFLOP/s"] = benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = benchmark::Counter(gflop / pk * 100.0, benchmark::Counter::kIsIterationInvariantRate);
  if (fused) {
    const double threads = block.last_threads();
    const double iters = static_cast<double>(state.iterations());
    const char* names[] = {"conv1", "conv2", "conv3", "downsample"};
    const double flops[] = {f1, f2, f3, fd};
    for (int m = 0; m < 4; ++m) {
      if (flops[m] == 0) continue;
      const double sec = member[m] / threads / iters;  // wall seconds of the member per run
      state.counters[std::string(names[m]) + "_pct_peak"] = flops[m] * 1e-9 / sec / pk * 100.0;
    }
    state.counters["halo_ms"] = member[4] / threads / iters * 1e3;
  }
}

std::vector<BlockCase> all_cases() {
  std::vector<BlockCase> cases;
  const struct {
    const char* model;
    int64_t h, w;
  } models[] = {{"tiny_r50", 120, 200}, {"base_r101", 232, 400}};
  for (const auto& m : models) {
    int64_t h = m.h, w = m.w;
    const int last = std::string(m.model) == "tiny_r50" ? 4 : 2;
    for (int stage = 0; stage < last; ++stage) {
      const int64_t planes = 64LL << stage;
      const std::string pre = std::string(m.model) + "/layer" + std::to_string(stage + 1);
      if (stage == 0) cases.push_back({pre + "/b0", 6, h, w, 64, planes, true});
      cases.push_back({pre, 6, h, w, 4 * planes, planes, false});
      h = (h - 1) / 2 + 1;
      w = (w - 1) / 2 + 1;
    }
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  bev::bench::start(&argc, argv);
  for (const BlockCase& c : all_cases()) {
    for (Precision p : {Precision::kF32, Precision::kBF16}) {
      if (!bev::bench::runs_here(p)) continue;
      for (bool fused : {false, true}) {
        const std::string name = c.name + (p == Precision::kF32 ? "/f32" : "/bf16") + (fused ? "/fused" : "/conv_by_conv");
        benchmark::RegisterBenchmark(name.c_str(), [c, fused, p](benchmark::State& s) { bm_block(s, c, fused, p); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
