// Benchmarking, the public face of `bevformer bench`: a model at full size (seeded random
// weights of the config unless a checkpoint is given) runs a synthetic six-camera drive the way
// a user's stream does: warm-up frames (the first records the plans, the second is the first
// with history) until the steady state, then timed frames through forward(): host geometry,
// both stages, the box decode. Reported: median and p90 frame latency, throughput, the median
// time of each part, a per-stage breakdown of one extra frame from the profiler, the FLOPs of a
// frame against this machine's measured peak (the "floor"), and the peak resident set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bevformer/engine_knobs.h"

namespace bev {

struct BenchOptions : EngineKnobs {
  std::string config = "tiny";    // preset (tiny | small | base) or upstream-style config JSON
  std::string weights;            // checkpoint (.pth / .safetensors); "" for seeded random weights
  uint64_t seed = 2026;           // random weights and synthetic frames
  int frames = 10;                // timed frames (>= 1)
  int warmup = 3;                 // untimed frames first (>= 2: the second is the first with history)
  bool eager = false;             // run every frame eagerly instead of replaying recorded plans
  // The image stage of frame k+1 on a second thread while the bev stage of frame k runs (the
  // model keeps two image lanes); latency is then from a frame's image start to its bev end,
  // and fps is over the timed span. Needs warmup >= 3.
  bool pipeline = false;
  bool stages = true;             // profile one extra frame for the per-stage breakdown
  bool measure_peak = true;       // measure this machine's matmul peak (about a second)
  // A fleet: `streams` synthetic vehicles (each on its own rig, pose and images) drive at once;
  // each step runs every vehicle's next frame, `batch` vehicles per batch (Model::detect_batch's
  // path). A frame's latency is its batch's wall time; parts and stages are per frame (a batch's
  // time over its frames). streams 1, batch 1 is the single-stream drive above.
  int streams = 1;
  int batch = 1;
};

// One stage of DESIGN §3 (img.layer1, enc0.tsa, ...) in the profiled frame.
struct BenchStage {
  std::string name;
  std::string group;  // "image" | "bev"
  double ms = 0;      // summed op time
  double percent = 0;  // of the profiled frame's op time
  double gflop = 0;
  double gflops = 0;
  double percent_of_peak = 0;  // gflops against the measured matmul peak (0 without it)
};

struct BenchReport {
  std::string config, weights, precision;
  std::string device;          // "cpu: <CPU model>, <ISA>, <threads> threads"
  std::string backend, cpu, isa;  // its parts: the backend's name, the processor, the ISA dispatched to
  int threads = 0, frames = 0, warmup = 0;
  std::string mode;  // "replay" | "eager", then ", pipelined" when it was
  int streams = 1, batch = 1;  // vehicles, and frames per batch
  double slot_mb = 0;          // batch > 1: memory of the batched stages per batch slot (arenas, MiB)
  double first_frame_ms = 0;  // warm-up frame 0: recording the image and first-frame bev plans
  std::vector<double> frame_ms;  // each timed frame, wall clock
  double median_ms = 0, p90_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;
  double fps = 0;  // timed frames / their total wall time
  // Medians of each frame's parts: host geometry, the two stages, the box decode.
  double geometry_ms = 0, image_ms = 0, bev_ms = 0, decode_ms = 0;
  std::vector<BenchStage> stages;  // empty without BenchOptions::stages
  double stage_sum_ms = 0;         // the profiled frame's op time
  double gflop_per_frame = 0;      // from the profiled frame's shapes (0 without stages)
  double backbone_ms = 0, backbone_gflops = 0;  // img.stem .. img.layer4 of the profiled frame
  double peak_gflops = 0;          // measured matmul rate at this precision (0 without measure_peak)
  double floor_ms = 0;             // gflop_per_frame at peak_gflops
  double percent_of_floor = 0;     // floor_ms / median_ms
  double achieved_gflops = 0;      // gflop_per_frame / median frame
  double peak_rss_mb = 0;          // the process's peak resident set (MiB), after the timed frames
  double weight_mb = 0;            // the checkpoint's tensors
};

// Throws bev::Error for bad options, config or weights.
BenchReport run_bench(const BenchOptions& options);

// One JSON object (median_ms, p90_ms, fps, stages, peak_rss_mb and everything above).
std::string bench_json(const BenchReport& report);
// A few lines for a person.
std::string format_bench(const BenchReport& report);

}  // namespace bev
