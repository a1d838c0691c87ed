// Checkpoint load speed from the page cache, on a ~560 MB checkpoint this benchmark writes
// itself: every tensor of the BEVFormer-base preset (69 M parameters, ~1,000 tensors), twice (the
// second copy under `ema.`, as EMA checkpoints carry), as .pth and as .safetensors.
//
//   build/bin/bench_checkpoint_load [--benchmark_repetitions=5] [--benchmark_report_aggregates_only]
//   BEV_BENCH_DIR=/path keeps the files elsewhere (default /tmp/bevformer-bench).
//
// "open" = parse and build zero-copy tensor views; "+read" also reads every tensor byte once,
// which is what loading weights into a model costs at the least. .pth opens verify CRC-32 of
// every entry (the default), so they read all bytes anyway; "nocrc" skips that.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "io/checkpoint.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/param_spec.h"

namespace {

std::string bench_dir() {
  const char* d = std::getenv("BEV_BENCH_DIR");
  return d ? d : "/tmp/bevformer-bench";
}

const std::string& pth_path() {
  static const std::string p = bench_dir() + "/base_x2.pth";
  return p;
}
const std::string& st_path() {
  static const std::string p = bench_dir() + "/base_x2.safetensors";
  return p;
}

void make_files() {
  if (std::filesystem::exists(pth_path()) && std::filesystem::exists(st_path())) return;
  std::filesystem::create_directories(bench_dir());
  std::vector<std::pair<std::string, bev::Tensor>> tensors;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  for (const char* prefix : {"", "ema."}) {
    for (const auto& spec : bev::expected_params(bev::config_preset("base"))) {
      bev::Tensor t = bev::Tensor::empty(spec.shape, spec.dtype);
      if (spec.dtype == bev::DType::kF32) {
        float* p = t.data<float>();
        for (int64_t i = 0; i < t.numel(); ++i) p[i] = (i % 97 == 0) ? nd(rng) : static_cast<float>(i % 1013) * 1e-3f;
      } else {
        std::memset(t.raw_data(), 0, t.nbytes());
      }
      tensors.emplace_back(prefix + spec.name, std::move(t));
    }
  }
  bev::write_pth(pth_path(), tensors);
  bev::write_safetensors(st_path(), tensors);
}

uint64_t read_all(const bev::Checkpoint& ck) {
  uint64_t acc = 0;
  for (const auto& [name, t] : ck.tensors()) {
    const auto* p = reinterpret_cast<const uint64_t*>(t.raw_data());
    const size_t n = t.nbytes() / 8;
    for (size_t i = 0; i < n; ++i) acc += p[i];
  }
  return acc;
}

void run(benchmark::State& state, const std::string& path, bool verify_crc, bool read) {
  make_files();
  bev::LoadOptions o;
  o.verify_crc = verify_crc;
  uint64_t bytes = 0;
  for (auto _ : state) {
    bev::Checkpoint ck = bev::load_checkpoint(path, o);
    if (read) benchmark::DoNotOptimize(read_all(ck));
    bytes = ck.tensor_bytes();
    benchmark::DoNotOptimize(ck);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  state.counters["MB"] = static_cast<double>(bytes) / 1e6;
}

void BM_Safetensors_Open(benchmark::State& s) { run(s, st_path(), false, false); }
void BM_Safetensors_OpenRead(benchmark::State& s) { run(s, st_path(), false, true); }
void BM_Pth_Open(benchmark::State& s) { run(s, pth_path(), true, false); }
void BM_Pth_OpenRead(benchmark::State& s) { run(s, pth_path(), true, true); }
void BM_Pth_OpenNoCrc(benchmark::State& s) { run(s, pth_path(), false, false); }
void BM_Pth_OpenNoCrcRead(benchmark::State& s) { run(s, pth_path(), false, true); }

BENCHMARK(BM_Safetensors_Open)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Safetensors_OpenRead)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pth_Open)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pth_OpenRead)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pth_OpenNoCrc)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Pth_OpenNoCrcRead)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
