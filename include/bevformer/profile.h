// Profiling, the public face of `bevformer profile`: a model runs warm-up frames until its
// history is in use (the steady state every later frame of a stream is in), then its recorded
// stages are replayed `rounds` times between signposts (`trace` > `image`, `bev`) with every op
// timed; optionally one eager frame adds the stage signposts of DESIGN §3 (`img.stem` ...
// `dec.pack`) around the ops. The result is per-op records (name, stage, label, shapes, dtype,
// start, duration, FLOPs and bytes from the shapes), per-stage totals against the machine's
// measured peaks, a memory report and the profiler's own cost, written as files:
//
//   DIR/trace.json     Chrome trace events (open in https://ui.perfetto.dev or chrome://tracing)
//   DIR/summary.json   everything below, machine-readable
//   DIR/summary.md     the same for a person: stages, top ops, op kinds, memory, overhead
//   DIR/memory.json    the memory report alone
//
// Optionally the run's metadata as one JSON file (ProfileOptions::json_path) and a graph report
// per recorded variant (`image`, `bev`: ops, tensors, arena buffers and their lives, weights, and
// an HTML page with the arena's occupancy; ProfileOptions::graph_report).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bevformer/engine_knobs.h"

namespace bev {

struct ProfileOptions : EngineKnobs {
  std::string config = "tiny";    // preset (tiny | small | base) or upstream-style config JSON
  std::string weights;            // checkpoint (.pth / .safetensors); "" for seeded random weights
  uint64_t seed = 2026;           // random weights and synthetic frames
  int frames = 3;                 // warm-up frames through forward() (>= 2: the second uses the history)
  int rounds = 3;                 // replays of each stage, timed op by op (and as many untimed)
  bool eager = false;             // add one eager frame with the stage signposts (a second, eager model)
  std::string out_dir;            // where the files go (created); "" writes nothing
  int top_ops = 15;               // ops listed in summary.md
  // A frame JSON (docs/FORMATS.md) run as every warm-up frame, a parked vehicle's stream; "":
  // synthetic frames of a drive. Its cameras must fit the config (count, image size).
  std::string input;
  std::string json_path;     // also write the run's metadata here ("" : not)
  std::string graph_report;  // also write a graph report per variant into this directory ("" : not)
  // Host memory guard: the run stops with an error, files written so far kept, before its
  // resident set passes this many GB (checked after loading, after the warm-up, and before and
  // after each graph report). <= 0: 3/4 of this machine's memory.
  double max_rss_gb = 0;
};

// One stage of DESIGN §3 in a replayed frame (means over the rounds).
struct ProfileStage {
  std::string name;   // "img.layer1", "enc0.tsa", ...
  std::string group;  // "image" | "bev"
  size_t ops = 0;
  double ms = 0;       // summed op durations per frame
  double best_ms = 0;  // the same in the stage's fastest round (what it costs undisturbed)
  double percent_of_frame = 0;
  double gflop = 0;   // per frame, from shapes
  double gbyte = 0;   // bytes moved per frame, from shapes
  double gflops = 0;  // achieved GFLOP/s
  double gbps = 0;    // achieved GB/s
  double percent_of_peak_flops = 0;
  double percent_of_peak_bandwidth = 0;
  double bound_ms = 0;  // its ops' bound_ms summed: what the stage costs with every op at its bound
  size_t output_bytes = 0;  // activations its ops write per frame (before arena reuse)
  size_t largest_output_bytes = 0;
  double eager_ms = -1;  // the same stage in the eager frame; < 0 without --eager
};

// One op of a replayed frame (means over the rounds).
struct ProfileOp {
  size_t index = 0;  // position in the frame (image ops, then bev ops)
  std::string name;  // the op kind, "conv2d"
  std::string stage;
  std::string label;            // upstream module path, "img_backbone.layer1.0.conv1"
  std::string inputs, outputs;  // "f32[6, 64, 120, 200] f32[...]"
  double start_ms = 0;          // from the start of its stage group in round 0
  double ms = 0;
  double gflop = 0, gbyte = 0;
  double gflops = 0, gbps = 0;
  double percent_of_peak_flops = 0;
  // The op's bound: the slower of its arithmetic at the measured peak (gflop / peak_gflops) and
  // its bytes at the measured bandwidth (gbyte / peak_gbps). 0 when the peaks are unknown.
  double bound_ms = 0;
};

// Time per op kind (conv2d, msda, ...) in a replayed frame.
struct ProfileOpKind {
  std::string name;
  size_t count = 0;
  double ms = 0;
  double percent_of_frame = 0;
  double gflop = 0, gbyte = 0;
  double gflops = 0, gbps = 0;
};

struct ProfilePlanMemory {
  std::string name;  // "image", "bev (with history)", ...
  size_t ops = 0, buffers = 0;
  size_t arena_bytes = 0, no_reuse_bytes = 0;
  std::string description;  // every op with its shapes and where its outputs live in the arena
};

struct ProfileMemory {
  size_t weight_bytes = 0;  // the checkpoint's tensors as loaded
  std::vector<ProfilePlanMemory> plans;
  size_t arena_bytes = 0;     // all plans' arenas
  size_t rss_bytes = 0;       // resident set after the replayed rounds
  size_t peak_rss_bytes = 0;  // high-water mark then (VmHWM), before any eager model
};

struct ProfileOverhead {
  // Off: the decorator detached costs a call and a pointer test per op. Bounded from above by
  // the time of a call through the detached decorator to a backend that does nothing (best of
  // 5 x a million calls), times the ops of a frame.
  double off_ns_per_op = 0;
  double off_percent = 0;
  // On, by construction: timing and recording one op (two clock reads, interned strings, shapes
  // copied) through the attached decorator to a backend that does nothing, times the ops of a
  // frame. Best of 5 x 100,000 calls.
  double recording_ns_per_op = 0;
  double recording_percent = 0;
  // On, end to end: the median profiled frame against the median of as many unprofiled rounds
  // (same model, interleaved with the profiled ones). On a shared machine this is mostly noise.
  std::vector<double> unprofiled_round_ms;
  double unprofiled_frame_ms = 0;  // median
  double profiled_frame_ms = 0;    // median of round_frame_ms
  double on_percent = 0;
};

struct ProfileReport {
  std::string config;   // the config's name
  std::string weights;  // path, or "random (seed N)"
  std::string precision;
  std::string device;  // "cpu: <CPU model>, avx512_core_bf16, 2 threads"
  std::string backend, cpu, isa;  // its parts
  int threads = 0;
  int rounds = 0;
  size_t ops_per_frame = 0;
  double frame_ms = 0;                 // mean over rounds of (image_end - image) + (bev_end - bev)
  std::vector<double> round_frame_ms;  // each round's frame, profiled
  double image_ms = 0, bev_ms = 0;
  double stage_sum_ms = 0;  // the stages' op time; the rest of the frame lies between ops
  double forward_ms = 0;    // the last warm-up forward(): host geometry, input copies and both stages
  int host_waits_per_frame = 0;  // how often that forward() waited for the backend (1: where its results left)
  double peak_gflops = 0;   // measured matmul rate of this machine at this precision
  double peak_gbps = 0;     // measured copy bandwidth (bytes read + written per second)
  double gflop_per_frame = 0, gbyte_per_frame = 0;
  // Floors of a frame at the measured peaks: every op at its bound (ProfileOp::bound_ms, summed),
  // and the arithmetic alone (gflop_per_frame at peak_gflops). Ops whose counted bytes really
  // cross memory cannot beat the first, and only fusion, which moves fewer bytes, gets below it;
  // gathers that re-read cached rows (msda's corners) can run under their bound.
  double bound_ms = 0, flop_floor_ms = 0;
  std::vector<ProfileStage> stages;     // in run order
  std::vector<ProfileOp> ops;           // every op of a frame, in run order
  std::vector<ProfileOpKind> op_kinds;  // by time
  ProfileMemory memory;
  ProfileOverhead overhead;
  bool eager = false;
  double eager_frame_ms = 0;       // the eager forward() (with history), host work included
  bool labels_from_eager = false;  // the eager and replayed op sequences matched; labels copied
  std::string labels_note;
  std::vector<std::string> files;  // written, in order
  // The run: loading the model (checkpoint read, weights prepared on the backend), the input of
  // the warm-up frames (the frame JSON's path, or "synthetic"), the last warm-up frame's
  // detections, every signpost in order (docs/PROFILING.md), the host memory guard in bytes.
  double load_seconds = 0;
  std::string input;
  size_t detections = 0;
  std::vector<std::string> signposts;
  size_t max_rss_bytes = 0;
};

// Throws bev::Error for a bad config, weights or options (kInvalidInput / kNotFound) and when
// the output directory cannot be written (kIo). Progress goes to the log.
ProfileReport run_profile(const ProfileOptions& options);

// A few lines for the terminal: the frame, the heaviest stages, the files written.
std::string format_profile_headline(const ProfileReport& report);
// The report as summary.json's text (docs/PROFILING.md, the files a profile writes).
std::string profile_summary_json(const ProfileReport& report);

}  // namespace bev
