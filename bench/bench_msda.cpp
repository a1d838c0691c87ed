// MSDA at BEVFormer's shapes: the scalar reference (one thread) against the fast kernel per ISA
// and thread count, plus the head-major value layout [bs, heads, Lv, hd] passed as a permuted view
// and the AVX-512 path with its value-row prefetching forced off and on. Maps are f32 except
// base_sca_cam_bf16's: the frame's SCA maps in bf16 and int8 precision.
//
// Bytes per call (the rate counter): every sample reads 4 corners x hd floats, its (x, y) and its
// weight; every output element is written once. Samples whose corners fall outside the map are
// counted as read too, so the rate is comparable across kernels, not a measured DRAM traffic.
//
// Locations model the real access pattern, which decides cache behaviour: TSA and decoder samples
// sit a few pixels around the query's reference point; SCA queries (BEV cells in raster order)
// map smoothly onto the camera image, the 4 pillar heights spread vertically, ~10% land outside.
//
// Run: bench_msda --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/msda.h"

namespace bev::cpu {
namespace {

enum class Kind { kTsa, kSca, kDecoder };

struct Config {
  std::string name;
  Kind kind;
  int64_t bs, lq, points;
  SpatialShapes shapes;
  DType value_dtype = DType::kF32;  // the frame's maps are bf16 in bf16 and int8 precision
};

struct Data {
  Config cfg;
  std::vector<int64_t> level_start;
  Tensor value, value_head_major_view, loc, attn, out;
  double bytes = 0;
  int64_t samples = 0;
};

constexpr int64_t kHeads = 8, kHd = 32;

std::unique_ptr<Data> make_data(const Config& c) {
  auto d = std::make_unique<Data>();
  d->cfg = c;
  int64_t lv = 0;
  for (auto [h, w] : c.shapes) {
    d->level_start.push_back(lv);
    lv += h * w;
  }
  const auto L = static_cast<int64_t>(c.shapes.size());
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::normal_distribution<float> px_noise(0.0f, 2.0f);  // offsets of a few pixels
  d->value = Tensor::empty({c.bs, lv, kHeads, kHd}, DType::kF32);
  for (int64_t i = 0; i < d->value.numel(); ++i) d->value.data<float>()[i] = uni(rng) - 0.5f;
  if (c.value_dtype != DType::kF32) d->value = d->value.to(c.value_dtype);
  d->value_head_major_view = d->value.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3});
  d->loc = Tensor::empty({c.bs, c.lq, kHeads, L, c.points, 2}, DType::kF32);
  d->attn = Tensor::empty({c.bs, c.lq, kHeads, L, c.points}, DType::kF32);
  float* loc = d->loc.data<float>();
  float* w = d->attn.data<float>();
  const auto side = static_cast<int64_t>(std::ceil(std::sqrt(double(c.lq))));
  for (int64_t b = 0; b < c.bs; ++b)
    for (int64_t q = 0; q < c.lq; ++q) {
      // Reference point: the BEV cell for TSA and SCA (raster order), anywhere for the decoder.
      float rx = (float(q % side) + 0.5f) / float(side), ry = (float(q / side) + 0.5f) / float(side);
      if (c.kind == Kind::kDecoder) rx = uni(rng), ry = uni(rng);
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < c.points; ++p) {
            const int64_t i = (((b * c.lq + q) * kHeads + h) * L + l) * c.points + p;
            const auto H = float(c.shapes[size_t(l)].first), W = float(c.shapes[size_t(l)].second);
            float y = ry;
            if (c.kind == Kind::kSca) y = 0.35f + 0.5f * ry + 0.08f * float(p % 4) - 0.12f;  // pillar heights
            loc[2 * i] = rx + px_noise(rng) / W;
            loc[2 * i + 1] = y + px_noise(rng) / H;
            w[i] = 1.0f / float(L * c.points);
          }
    }
  d->out = Tensor::empty({c.bs, c.lq, kHeads * kHd}, DType::kF32);
  d->samples = c.bs * c.lq * kHeads * L * c.points;
  d->bytes = double(d->samples) * (4.0 * kHd * double(dtype_size(c.value_dtype)) + 2 * 4 + 4) + double(c.bs * c.lq * kHeads * kHd * 4);
  return d;
}

void set_counters(benchmark::State& st, const Data& d) {
  st.SetBytesProcessed(static_cast<int64_t>(d.bytes * double(st.iterations())));
  st.counters["samples/s"] = benchmark::Counter(double(d.samples) * double(st.iterations()), benchmark::Counter::kIsRate);
}

void bm_reference(benchmark::State& st, const Data* d) {
  Tensor out = d->out;
  for (auto _ : st) {
    msda_reference(d->value, d->cfg.shapes, d->level_start, d->loc, d->attn, out);
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_counters(st, *d);
}

void bm_fast(benchmark::State& st, const Data* d, MsdaIsa isa, int threads, bool head_major,
             MsdaPrefetch prefetch) {
  if (!msda_isa_supported(isa)) {
    st.SkipWithError("ISA not supported on this CPU");
    return;
  }
  ThreadPool pool(threads);
  Tensor out = d->out;
  const Tensor& value = head_major ? d->value_head_major_view : d->value;
  for (auto _ : st) {
    msda_with_isa(isa, value, d->cfg.shapes, d->level_start, d->loc, d->attn, out, pool, prefetch);
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_counters(st, *d);
}

}  // namespace
}  // namespace bev::cpu

int main(int argc, char** argv) {
  using namespace bev::cpu;
  const SpatialShapes base_sca = {{116, 200}, {58, 100}, {29, 50}, {15, 25}};
  const std::vector<Config> configs = {
      {"tiny_tsa", Kind::kTsa, 2, 2500, 4, {{50, 50}}},  // bs 2: the two queue branches
      {"tiny_sca_cam", Kind::kSca, 1, 2500, 8, {{15, 25}}},
      {"tiny_decoder", Kind::kDecoder, 1, 900, 4, {{50, 50}}},
      {"base_tsa", Kind::kTsa, 2, 40000, 4, {{200, 200}}},
      {"base_sca_cam", Kind::kSca, 1, 40000, 8, base_sca},
      {"base_sca_cam_bf16", Kind::kSca, 1, 40000, 8, base_sca, bev::DType::kBF16},
      {"base_decoder", Kind::kDecoder, 1, 900, 4, {{200, 200}}},
  };
  static std::vector<std::unique_ptr<Data>> data;  // outlives the benchmarks
  for (const Config& c : configs) {
    data.push_back(make_data(c));
    const Data* d = data.back().get();
    // One thread: timed in CPU time, which the other processes on this shared machine disturb
    // least. Two threads: wall time (the pool's workers are not in the main thread's CPU time).
    benchmark::RegisterBenchmark((c.name + "/reference").c_str(), bm_reference, d)->Unit(benchmark::kMillisecond);
    for (MsdaIsa isa : {MsdaIsa::kScalar, MsdaIsa::kAvx2, MsdaIsa::kAvx512})
      if (msda_isa_supported(isa)) benchmark::RegisterBenchmark((c.name + "/" + msda_isa_name(isa) + "/threads:1").c_str(), bm_fast, d, isa, 1, false, MsdaPrefetch::kAuto)
          ->Unit(benchmark::kMillisecond);
    if (!msda_isa_supported(MsdaIsa::kAvx512)) continue;  // the rows below are AVX-512's
    benchmark::RegisterBenchmark((c.name + "/avx512_head_major/threads:1").c_str(), bm_fast, d, MsdaIsa::kAvx512, 1, true, MsdaPrefetch::kAuto)
        ->Unit(benchmark::kMillisecond);
    for (bool head_major : {false, true})
      benchmark::RegisterBenchmark((c.name + (head_major ? "/avx512_head_major" : "/avx512") + "/threads:2").c_str(),
                                   bm_fast, d, MsdaIsa::kAvx512, 2, head_major, MsdaPrefetch::kAuto)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    // The prefetch switch forced each way (kAuto above picks by map size): the data behind
    // msda_prefetch_bytes().
    for (MsdaPrefetch pf : {MsdaPrefetch::kOff, MsdaPrefetch::kOn})
      benchmark::RegisterBenchmark(
          (c.name + "/avx512_prefetch_" + (pf == MsdaPrefetch::kOn ? "on" : "off") + "/threads:2").c_str(), bm_fast, d,
          MsdaIsa::kAvx512, 2, false, pf)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
