// Multi-scale deformable attention on the CPU (spec §2.12; mmcv `multi_scale_deformable_attn`,
// batch-first). For each (b, q, h, l, p):
//   px = x * W_l - 0.5,  py = y * H_l - 0.5          (grid_sample, align_corners=False)
//   sample = bilinear(value[b, level l, h], px, py)   (zero padding; 0 unless -1<px<W_l, -1<py<H_l)
//   out[b, q, h*hd : (h+1)*hd] += w[b, q, h, l, p] * sample
//
// Shapes: value [bs, Lv, heads, hd] f32 or bf16, spatial_shapes (H_l, W_l) per level, level_start
// the first value row of each level (0, H_0*W_0, ...; Lv = the sum of H_l*W_l), sampling_locations
// [bs, Lq, heads, L, P, 2] f32 as normalized (x, y), attention_weights [bs, Lq, heads, L, P] f32,
// out [bs, Lq, heads*hd] f32. locations, weights and out must be contiguous. value only needs a
// unit stride on hd: a value stored head-major [bs, heads, Lv, hd] is passed as its
// permute({0, 2, 1, 3}) view, without a copy. A bf16 value halves the bytes every corner gathers
// (one 64-byte line per BEVFormer row of 32); each element is widened exactly to f32, so every
// path gives the bits it gives on the f32 tensor of the same values. `out` is overwritten; when
// it is undefined it is allocated. Every shape is checked; a mismatch throws Error(kInvalidInput)
// naming the tensor.
//
// msda_reference is the plain loop that defines the op (the spec other kernels are tested
// against). msda is the fast kernel: per query it first turns every (h, l, p) sample into four
// corner rows and four corner weights (attention weight folded in), vectorized over samples, then
// accumulates value rows across hd with AVX-512 (AVX2 or scalar where the CPU lacks it, chosen at
// run time), over (b, q) chunks of the pool; on value maps of msda_prefetch_bytes() or more per
// batch (8 MiB, 32 MiB on AMD) it also prefetches the next query's rows (MsdaPrefetch). Its sums
// are ordered differently from the reference (per corner, with FMAs), so it agrees to rounding:
// |fast - ref| <= ~1e-6 * sum |w| * max |value|.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;  // (H, W) per level

void msda_reference(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
                    const Tensor& sampling_locations, const Tensor& attention_weights, Tensor& out);

void msda(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
          const Tensor& sampling_locations, const Tensor& attention_weights, Tensor& out, ThreadPool& pool);

// The instruction sets msda can run with; msda picks the best the CPU has. Tests and the
// benchmark pin one with msda_with_isa to check and time each path on one machine.
enum class MsdaIsa : uint8_t { kScalar, kAvx2, kAvx512 };
const char* msda_isa_name(MsdaIsa isa);
bool msda_isa_supported(MsdaIsa isa);
MsdaIsa msda_best_isa();
// Whether the AVX-512 path prefetches the next query's value rows while it accumulates this one.
// kAuto (what msda uses) turns it on for value maps of msda_prefetch_bytes() or more per batch:
// maps that stream from DRAM, where prefetching cuts base TSA's time by a third; on maps that fit
// the caches its instructions cost more than the stalls they hide. Tests and the benchmark force
// kOn/kOff; the result is bit-identical either way.
enum class MsdaPrefetch : uint8_t { kAuto, kOff, kOn };
// 32 MiB on AMD, whose L3 (a CCD's 32 MiB, ~50 cycles away) holds base SCA's per-camera maps:
// prefetching them cost 20% on Zen 4 and gained nothing on Zen 5 (docs/PERF.md). 8 MiB elsewhere:
// on Intel's mesh L3, two to three times as far, SCA without prefetching is unmeasured.
inline constexpr double kMsdaPrefetchBytesAmd = 32.0 * (1 << 20);
inline constexpr double kMsdaPrefetchBytesOther = 8.0 * (1 << 20);
double msda_prefetch_bytes();
// Throws Error(kUnsupported) when the CPU lacks `isa`.
void msda_with_isa(MsdaIsa isa, const Tensor& value, const SpatialShapes& spatial_shapes,
                   const std::vector<int64_t>& level_start, const Tensor& sampling_locations,
                   const Tensor& attention_weights, Tensor& out, ThreadPool& pool,
                   MsdaPrefetch prefetch = MsdaPrefetch::kAuto);

namespace msda_detail {

// Everything a kernel needs, checked once. Per-sample tables (index s = (h*L + l)*P + p, the
// layout of one query's weights) repeat for every query, so they are built once per call, into
// the calling thread's scratch (see Workspace in msda.cpp).
struct KernelArgs {
  int64_t bs = 0, lv = 0, lq = 0, heads = 0, hd = 0, levels = 0, points = 0;
  int64_t samples = 0;         // heads * levels * points: samples per query
  int64_t samples_padded = 0;  // rounded up to 16 so vector loops read tables without a tail
  // One of the two, by value's dtype; strides count elements of that type.
  const float* value = nullptr;
  const uint16_t* value_bf16 = nullptr;
  int64_t value_stride_b = 0, value_stride_row = 0, value_stride_h = 0;  // elements
  const float* loc = nullptr;
  const float* attn = nullptr;
  float* out = nullptr;
  const float* width = nullptr;  // float(W_l) per sample (samples_padded entries)
  const float* height = nullptr;  // float(H_l)
  const int32_t* width_i = nullptr;  // W_l
  const int32_t* height_i = nullptr;  // H_l
  const int32_t* start = nullptr;  // level_start[l]
  const int32_t* head = nullptr;   // the sample's head
  bool prefetch = false;  // see MsdaPrefetch (the AVX-512 path)
  bool rows_line_aligned = false;  // every (b, row, h) slice of value starts on a 64-byte line
};

// One query's samples turned into corner rows and weights, corner-major structure of arrays
// (row[c * n + s], n = samples_padded). Bit c of mask[s] says corner c (0: (y0, x0), 1: (y0, x0+1),
// 2: (y0+1, x0), 3: (y0+1, x0+1)) lies inside the map; the other corners hold row 0 and weight 0
// and are never read, so a non-finite value outside the footprint cannot leak in (as in mmcv).
// The arrays are scratch of the pool participant that runs the chunk.
struct Corners {
  int64_t n = 0;
  int32_t* row = nullptr;     // 4 * n
  float* weight = nullptr;    // 4 * n
  int32_t* mask = nullptr;    // n
};

void prepare_corners_scalar(const KernelArgs& args, const float* loc_q, const float* attn_q, Corners& c);

// Kernels over the flattened (b, q) range [begin, end), with `c` as their scratch.
void run_scalar(const KernelArgs& args, Corners& c, int64_t begin, int64_t end);
void run_avx2(const KernelArgs& args, Corners& c, int64_t begin, int64_t end);
// The AVX-512 kernel takes a second Corners: it prepares query q+1 into one while it
// accumulates query q from the other.
void run_avx512(const KernelArgs& args, Corners& c, Corners& next, int64_t begin, int64_t end);

}  // namespace msda_detail
// msda's kernel for an op that makes the locations and weights of each chunk of queries itself
// (cpu::DeformableAttention): made once per call on the calling thread (value and out checked,
// the tables built into its workspace, the ISA and prefetching chosen as msda chooses them), then
// run() by each pool participant on queries [begin, end) of the flattened (b, q) range, whose
// locations [end - begin, heads, L, P, 2] and weights [end - begin, heads, L, P] lie at loc and
// attn. out [bs, Lq, heads * hd] gets those queries' rows, the bits msda gives them. Lives no
// longer than the call: the workspace is the calling thread's (no other msda on it meanwhile).
//
// Without `out` (and Lq), each call names its value batch and output rows instead: run_batch() for
// an op whose queries of one batch are not one contiguous range of an output
// (cpu::spatial_cross_attention: a chunk of BEV cells, each sampled from the cameras that see it).
class MsdaChunks {
 public:
  MsdaChunks(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
             int64_t lq, int64_t points, Tensor& out, int participants);
  MsdaChunks(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
             int64_t points, int participants);
  int64_t samples() const { return args_.samples; }  // heads * L * P per query
  void run(int64_t begin, int64_t end, const float* loc, const float* attn, int participant) const;
  // n queries on value batch b, their locations [n, heads, L, P, 2] at loc and weights [n, heads,
  // L, P] at attn -> out [n, heads * hd] f32: the bits run() gives the same queries.
  void run_batch(int64_t b, int64_t n, const float* loc, const float* attn, float* out, int participant) const;

 private:
  msda_detail::KernelArgs args_;
  MsdaIsa isa_;
  const msda_detail::Corners* corners_ = nullptr;  // two per participant (the calling thread's)
  int participants_ = 0;
};

}  // namespace bev::cpu
