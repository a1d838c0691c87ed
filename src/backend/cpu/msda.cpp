// MSDA: shape checks, the reference loop (the spec of the op), ISA dispatch, and the scalar and
// AVX2 fast paths. The AVX-512 path lives in msda_avx512.cpp. See msda.h for the semantics.
#include "backend/cpu/msda.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "backend/cpu/onednn.h"
#include "bevformer/error.h"
#include "core/cpu_features.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

using msda_detail::Corners;
using msda_detail::KernelArgs;

[[noreturn]] void bad_shape(const char* who, const std::string& what, const Tensor& t, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, std::string(what) + " is " + t.describe()).where(who).expected(expected);
}

void check_f32_cpu(const char* who, const char* what, const Tensor& t) {
  if (!t.defined()) throw Error(ErrorKind::kInvalidInput, std::string(what) + " is undefined").where(who);
  if (t.device() != Device::kCpu)
    throw Error(ErrorKind::kInvalidInput, std::string(what) + " is on " + device_name(t.device())).where(who).expected("a host tensor");
  if (t.dtype() != DType::kF32) bad_shape(who, what, t, "dtype f32");
}

// An empty tensor holds no elements to be out of place. (Tensor::is_contiguous says false for
// empty tensors made by Tensor::empty, since their strides skip the zero extent.)
bool dense(const Tensor& t) { return t.numel() == 0 || t.is_contiguous(); }

// Checks value against the levels and fills the plan's value fields.
KernelArgs check_value(const char* who, const Tensor& value, const SpatialShapes& shapes,
                       const std::vector<int64_t>& level_start) {
  if (value.defined() && value.dtype() == DType::kBF16) {
    if (value.device() != Device::kCpu)
      throw Error(ErrorKind::kInvalidInput, std::string("value is on ") + device_name(value.device())).where(who).expected("a host tensor");
  } else {
    check_f32_cpu(who, "value", value);
  }
  if (value.dim() != 4) bad_shape(who, "value", value, "[bs, Lv, heads, head_dim]");
  KernelArgs p;
  p.bs = value.size(0);
  p.lv = value.size(1);
  p.heads = value.size(2);
  p.hd = value.size(3);
  if (p.heads < 1 || p.hd < 1) bad_shape(who, "value", value, "heads >= 1 and head_dim >= 1");
  if ((p.hd > 1 && value.strides()[3] != 1) || value.strides()[0] < 0 || value.strides()[1] < 0 || value.strides()[2] < 0)
    bad_shape(who, "value", value, "a view with unit stride on head_dim and non-negative strides");
  if (shapes.empty()) throw Error(ErrorKind::kInvalidInput, "spatial_shapes is empty").where(who).expected("one (H, W) per level");
  p.levels = static_cast<int64_t>(shapes.size());
  if (static_cast<int64_t>(level_start.size()) != p.levels)
    throw Error(ErrorKind::kInvalidInput, "level_start has " + std::to_string(level_start.size()) + " entries")
        .where(who)
        .expected(std::to_string(p.levels) + ", one per spatial_shapes level");
  int64_t total = 0;
  for (int64_t l = 0; l < p.levels; ++l) {
    const auto [h, w] = shapes[static_cast<size_t>(l)];
    const auto lvl = [l] { return "level " + std::to_string(l); };  // for errors only
    if (h < 1 || w < 1 || h > (int64_t{1} << 30) || w > (int64_t{1} << 30))
      throw Error(ErrorKind::kInvalidInput, "spatial_shapes " + lvl() + " is (" + std::to_string(h) + ", " + std::to_string(w) + ")")
          .where(who)
          .expected("H >= 1 and W >= 1");
    if (level_start[static_cast<size_t>(l)] != total)
      throw Error(ErrorKind::kInvalidInput, "level_start " + lvl() + " is " + std::to_string(level_start[static_cast<size_t>(l)]))
          .where(who)
          .expected(std::to_string(total) + ", the sum of H*W over the levels before it");
    total += h * w;
    if (total > (int64_t{1} << 30))
      throw Error(ErrorKind::kUnsupported, "value has more than 2^30 rows over the levels").where(who).hint("rows are indexed with int32");
  }
  if (p.lv != total) bad_shape(who, "value", value, "Lv = " + std::to_string(total) + ", the sum of H*W over spatial_shapes");
  if (value.dtype() == DType::kBF16)
    p.value_bf16 = static_cast<const uint16_t*>(value.raw_data());
  else
    p.value = value.data<float>();
  p.value_stride_b = value.strides()[0];
  p.value_stride_row = value.strides()[1];
  p.value_stride_h = value.strides()[2];
  const auto elem = static_cast<int64_t>(dtype_size(value.dtype()));
  const auto on_line = [elem](int64_t elements) { return elements * elem % 64 == 0; };
  p.rows_line_aligned = reinterpret_cast<uintptr_t>(value.raw_data()) % 64 == 0 && on_line(p.value_stride_b) &&
                        on_line(p.value_stride_row) && on_line(p.value_stride_h);
  return p;
}

// out [bs, Lq, heads * hd] f32, contiguous: allocated when undefined, checked otherwise.
void check_out(const char* who, const KernelArgs& p, Tensor& out) {
  const Shape out_shape{p.bs, p.lq, p.heads * p.hd};
  if (!out.defined()) out = Tensor::empty(out_shape, DType::kF32);
  check_f32_cpu(who, "out", out);
  if (out.shape() != out_shape || !dense(out)) bad_shape(who, "out", out, "contiguous " + shape_str(out_shape));
}

// Whether the AVX-512 path prefetches (msda_prefetch_bytes; measured, docs/PERF.md). Base TSA's
// maps (41 MB in bf16, 82 MB in f32) stream from DRAM and gain everywhere; tiny's (2.5 MB at most)
// lose everywhere; base SCA's per camera (15.8 MB bf16, 31.6 MB f32) and base's decoder map in
// bf16 (20.5 MB) sit in an AMD L3, where prefetching them lost 20% (Zen 4) or broke even (Zen 5).
bool wants_prefetch(const KernelArgs& p, MsdaPrefetch prefetch) {
  const double batch_bytes = static_cast<double>(p.lv) * static_cast<double>(p.heads * p.hd) *
                             static_cast<double>(p.value_bf16 ? sizeof(uint16_t) : sizeof(float));
  return prefetch == MsdaPrefetch::kOn || (prefetch == MsdaPrefetch::kAuto && batch_bytes >= msda_prefetch_bytes());
}

// Checks every input against the others and returns the plan (tables not yet built). `out` is
// allocated when undefined and checked otherwise.
KernelArgs check(const char* who, const Tensor& value, const SpatialShapes& shapes, const std::vector<int64_t>& level_start,
           const Tensor& loc, const Tensor& attn, Tensor& out) {
  KernelArgs p = check_value(who, value, shapes, level_start);
  check_f32_cpu(who, "sampling_locations", loc);
  check_f32_cpu(who, "attention_weights", attn);
  if (loc.dim() != 6 || loc.size(0) != p.bs || loc.size(2) != p.heads || loc.size(3) != p.levels || loc.size(4) < 1 ||
      loc.size(5) != 2)
    bad_shape(who, "sampling_locations", loc,
              "[bs=" + std::to_string(p.bs) + ", Lq, heads=" + std::to_string(p.heads) + ", levels=" + std::to_string(p.levels) +
                  ", points >= 1, 2]");
  p.lq = loc.size(1);
  p.points = loc.size(4);
  const Shape attn_shape{p.bs, p.lq, p.heads, p.levels, p.points};
  if (attn.shape() != attn_shape) bad_shape(who, "attention_weights", attn, shape_str(attn_shape));
  if (!dense(loc)) bad_shape(who, "sampling_locations", loc, "a contiguous tensor");
  if (!dense(attn)) bad_shape(who, "attention_weights", attn, "a contiguous tensor");
  check_out(who, p, out);
  p.samples = p.heads * p.levels * p.points;
  p.samples_padded = (p.samples + 15) / 16 * 16;
  p.loc = loc.data<float>();
  p.attn = attn.data<float>();
  p.out = out.data<float>();
  return p;
}

// The scratch of one msda call, in a buffer of the calling thread that only grows: the tables
// and one Corners per pool participant (the workers index it by participant). After the first
// call at a shape on a thread (a plan's recording run) calls at that shape allocate nothing,
// where a Corners per chunk allocated three vectors every time. The calling thread's, like
// cpu::stream(): the thread that runs a backend's ops is its one caller at a time.
//
// Layout, in 4-byte words (float and int32_t): the six tables, then each participant's two sets
// of rows, weights and masks, every block starting on its own 128-byte line pair with a free pair
// between blocks. Packed back to back, two threads wrote the line where one's masks end and the
// next one's rows begin on every query: measured 30% slower at tiny TSA on two threads.
class Workspace {
 public:
  Workspace(int64_t samples_padded, int participants) : n_(static_cast<size_t>(samples_padded)) {
    thread_local std::vector<uint32_t> buffer;
    const size_t words = kPair + block(kTableWords) + block(kCornerWords) * 2 * static_cast<size_t>(participants);
    if (buffer.size() < words) buffer.resize(words);
    const size_t misalign = reinterpret_cast<uintptr_t>(buffer.data()) / sizeof(uint32_t) % kPair;
    base_ = buffer.data() + (kPair - misalign) % kPair;
  }
  // Table t (0: width, 1: height, 2: width_i, 3: height_i, 4: start, 5: head).
  float* float_table(size_t t) const { return reinterpret_cast<float*>(base_ + t * n_); }
  int32_t* int_table(size_t t) const { return reinterpret_cast<int32_t*>(base_ + t * n_); }
  // Set 0 or 1 of a participant.
  Corners corners(int participant, int set) const {
    uint32_t* c = base_ + block(kTableWords) + block(kCornerWords) * static_cast<size_t>(2 * participant + set);
    return {static_cast<int64_t>(n_), reinterpret_cast<int32_t*>(c), reinterpret_cast<float*>(c + 4 * n_),
            reinterpret_cast<int32_t*>(c + 8 * n_)};
  }

 private:
  static constexpr size_t kPair = 128 / sizeof(uint32_t);  // words in a 128-byte line pair
  static constexpr size_t kTableWords = 6;   // per sample: width, height, width_i, height_i, start, head
  static constexpr size_t kCornerWords = 9;  // per sample: row (4), weight (4), mask (1)
  // Words of a block of `per_sample` words per sample, rounded up to line pairs, plus a free one.
  size_t block(size_t per_sample) const { return (per_sample * n_ + kPair - 1) / kPair * kPair + kPair; }

  size_t n_;
  uint32_t* base_ = nullptr;
};

void build_tables(KernelArgs& p, const Workspace& ws, const SpatialShapes& shapes, const std::vector<int64_t>& level_start) {
  const auto n = static_cast<size_t>(p.samples_padded);
  float* width = ws.float_table(0);
  float* height = ws.float_table(1);
  int32_t* width_i = ws.int_table(2);
  int32_t* height_i = ws.int_table(3);
  int32_t* start = ws.int_table(4);
  int32_t* head = ws.int_table(5);
  // Padding lanes get a 1x1 level so that vector code may compute on them harmlessly.
  std::fill(width, width + n, 1.0f);
  std::fill(height, height + n, 1.0f);
  std::fill(width_i, width_i + n, 1);
  std::fill(height_i, height_i + n, 1);
  std::fill(start, start + n, 0);
  std::fill(head, head + n, 0);
  for (int64_t s = 0; s < p.samples; ++s) {
    const auto l = static_cast<size_t>((s / p.points) % p.levels);
    const auto i = static_cast<size_t>(s);
    height_i[i] = static_cast<int32_t>(shapes[l].first);
    width_i[i] = static_cast<int32_t>(shapes[l].second);
    height[i] = static_cast<float>(shapes[l].first);
    width[i] = static_cast<float>(shapes[l].second);
    start[i] = static_cast<int32_t>(level_start[l]);
    head[i] = static_cast<int32_t>(s / (p.levels * p.points));
  }
  p.width = width;
  p.height = height;
  p.width_i = width_i;
  p.height_i = height_i;
  p.start = start;
  p.head = head;
}

// ---- fast paths without AVX-512 ----

// Scalar accumulation: one pass per corner over hd; the compiler vectorizes the inner loop with
// the baseline ISA (SSE2).
template <typename T>
void accumulate_scalar(const KernelArgs& p, const Corners& c, const T* vbase, int64_t s_begin, int64_t s_end, float* o) {
  std::fill(o, o + p.hd, 0.0f);
  for (int64_t s = s_begin; s < s_end; ++s) {
    const int32_t m = c.mask[static_cast<size_t>(s)];
    for (int k = 0; k < 4; ++k) {
      if (!(m & (1 << k))) continue;
      const float w = c.weight[static_cast<size_t>(k * c.n + s)];
      const T* v = vbase + static_cast<int64_t>(c.row[static_cast<size_t>(k * c.n + s)]) * p.value_stride_row;
      for (int64_t d = 0; d < p.hd; ++d) o[d] += w * widen(v[d]);
    }
  }
}

__attribute__((target("avx2,fma"))) inline __m256i avx2_tail_mask(int64_t cols) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)), lane);
}

// Eight values of a row from `cols` (1-8) columns at v as f32; lanes past cols read 0 and never
// touch memory past the row.
__attribute__((target("avx2,fma"))) inline __m256 load8_avx2(const float* v, int64_t cols, __m256i mask) {
  return cols >= 8 ? _mm256_loadu_ps(v) : _mm256_maskload_ps(v, mask);
}
__attribute__((target("avx2,fma"))) inline __m256 load8_avx2(const uint16_t* v, int64_t cols, __m256i) {
  __m128i h;
  if (cols >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, v, static_cast<size_t>(std::max<int64_t>(cols, 0)) * sizeof(uint16_t));
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // bf16 -> f32 exactly
}

// AVX2: 16 columns at a time in two ymm per corner. One accumulator set per corner keeps four
// independent FMA chains per vector, so FMA latency does not serialize a sample's corners.
template <typename T>
__attribute__((target("avx2,fma"))) void accumulate_avx2(const KernelArgs& p, const Corners& c, const T* vbase,
                                                         int64_t s_begin, int64_t s_end, float* o) {
  for (int64_t g = 0; g < p.hd; g += 16) {
    const int64_t cols = std::min<int64_t>(16, p.hd - g);
    const __m256i m0 = avx2_tail_mask(cols), m1 = avx2_tail_mask(cols - 8);
    __m256 acc[4][2];
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
    const auto corner = [&](int k, int64_t s) __attribute__((target("avx2,fma"))) {
      const __m256 w = _mm256_set1_ps(c.weight[static_cast<size_t>(k * c.n + s)]);
      const T* v = vbase + static_cast<int64_t>(c.row[static_cast<size_t>(k * c.n + s)]) * p.value_stride_row + g;
      // Masked loads never touch lanes past hd, so a short last row cannot read past the tensor.
      const __m256 v0 = load8_avx2(v, cols, m0);
      const __m256 v1 = cols > 8 ? load8_avx2(v + 8, cols - 8, m1) : _mm256_setzero_ps();
      acc[k][0] = _mm256_fmadd_ps(w, v0, acc[k][0]);
      acc[k][1] = _mm256_fmadd_ps(w, v1, acc[k][1]);
    };
    for (int64_t s = s_begin; s < s_end; ++s) {
      // Constant corner indices: a run-time index into acc would keep it on the stack.
      const int32_t m = c.mask[static_cast<size_t>(s)];
      if (m & 1) corner(0, s);
      if (m & 2) corner(1, s);
      if (m & 4) corner(2, s);
      if (m & 8) corner(3, s);
    }
    for (int j = 0; j < 2; ++j) {
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0][j], acc[1][j]), _mm256_add_ps(acc[2][j], acc[3][j]));
      if (cols >= 8 * (j + 1))
        _mm256_storeu_ps(o + g + 8 * j, sum);
      else
        _mm256_maskstore_ps(o + g + 8 * j, j == 0 ? m0 : m1, sum);
    }
  }
}

template <typename T, typename Accumulate>
void run_with(const KernelArgs& p, const T* value, Corners& c, int64_t begin, int64_t end, Accumulate accumulate) {
  const int64_t per_head = p.levels * p.points;
  for (int64_t bq = begin; bq < end; ++bq) {
    const int64_t b = bq / p.lq;
    msda_detail::prepare_corners_scalar(p, p.loc + bq * p.samples * 2, p.attn + bq * p.samples, c);
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* vbase = value + b * p.value_stride_b + h * p.value_stride_h;
      accumulate(p, c, vbase, h * per_head, (h + 1) * per_head, p.out + (bq * p.heads + h) * p.hd);
    }
  }
}

void dispatch(MsdaIsa isa, const KernelArgs& p, const Workspace& ws, ThreadPool& pool) {
  // Chunks of at least ~2k samples amortize the pool's hand-off; the pool caps the chunk count.
  const int64_t grain = std::max<int64_t>(1, 2048 / p.samples);
  pool.parallel_for_indexed(p.bs * p.lq, grain, [&](int64_t begin, int64_t end, int participant) {
    Corners c = ws.corners(participant, 0);
    Corners next = ws.corners(participant, 1);
    switch (isa) {
      case MsdaIsa::kScalar: msda_detail::run_scalar(p, c, begin, end); return;
      case MsdaIsa::kAvx2: msda_detail::run_avx2(p, c, begin, end); return;
      case MsdaIsa::kAvx512: msda_detail::run_avx512(p, c, next, begin, end); return;
    }
  });
}

}  // namespace

namespace msda_detail {

// Same float arithmetic as msda_reference for px, py and the corner weights; the attention weight
// is folded into each corner's weight.
void prepare_corners_scalar(const KernelArgs& p, const float* loc_q, const float* attn_q, Corners& c) {
  const int64_t n = c.n;
  for (int64_t s = 0; s < p.samples; ++s) {
    const auto i = static_cast<size_t>(s);
    for (int k = 0; k < 4; ++k) {
      c.row[static_cast<size_t>(k * n + s)] = 0;
      c.weight[static_cast<size_t>(k * n + s)] = 0.0f;
    }
    c.mask[i] = 0;
    const float wf = p.width[i], hf = p.height[i];
    const float px = loc_q[2 * s] * wf - 0.5f;
    const float py = loc_q[2 * s + 1] * hf - 0.5f;
    // Bounds in float first: locations may be ~1e9, which no int conversion survives.
    if (!(px > -1.0f && px < wf && py > -1.0f && py < hf)) continue;
    const float x0f = std::floor(px), y0f = std::floor(py);
    const auto x0 = static_cast<int32_t>(x0f), y0 = static_cast<int32_t>(y0f);
    const float lx = px - x0f, ly = py - y0f, hx = 1.0f - lx, hy = 1.0f - ly;
    const float w = attn_q[s];
    const int32_t wi = p.width_i[i];
    const bool in_x[2] = {x0 >= 0, x0 + 1 < wi};
    const bool in_y[2] = {y0 >= 0, y0 + 1 < p.height_i[i]};
    const float cw[4] = {(hy * hx) * w, (hy * lx) * w, (ly * hx) * w, (ly * lx) * w};
    int32_t m = 0;
    for (int k = 0; k < 4; ++k) {
      const int dy = k >> 1, dx = k & 1;
      if (!(in_y[dy] && in_x[dx])) continue;
      m |= 1 << k;
      c.row[static_cast<size_t>(k * n + s)] = p.start[i] + (y0 + dy) * wi + (x0 + dx);
      c.weight[static_cast<size_t>(k * n + s)] = cw[k];
    }
    c.mask[i] = m;
  }
}

void run_scalar(const KernelArgs& p, Corners& c, int64_t begin, int64_t end) {
  if (p.value_bf16)
    run_with(p, p.value_bf16, c, begin, end, accumulate_scalar<uint16_t>);
  else
    run_with(p, p.value, c, begin, end, accumulate_scalar<float>);
}
void run_avx2(const KernelArgs& p, Corners& c, int64_t begin, int64_t end) {
  if (p.value_bf16)
    run_with(p, p.value_bf16, c, begin, end, accumulate_avx2<uint16_t>);
  else
    run_with(p, p.value, c, begin, end, accumulate_avx2<float>);
}

}  // namespace msda_detail

void msda_reference(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
                    const Tensor& sampling_locations, const Tensor& attention_weights, Tensor& out) {
  const KernelArgs p = check("msda_reference", value, spatial_shapes, level_start, sampling_locations, attention_weights, out);
  for (int64_t b = 0; b < p.bs; ++b) {
    for (int64_t q = 0; q < p.lq; ++q) {
      for (int64_t h = 0; h < p.heads; ++h) {
        float* o = p.out + ((b * p.lq + q) * p.heads + h) * p.hd;
        std::fill(o, o + p.hd, 0.0f);
        const int64_t vh = b * p.value_stride_b + h * p.value_stride_h;  // element offset of the head
        for (int64_t l = 0; l < p.levels; ++l) {
          const int64_t H = spatial_shapes[static_cast<size_t>(l)].first;
          const int64_t W = spatial_shapes[static_cast<size_t>(l)].second;
          const int64_t vl = vh + level_start[static_cast<size_t>(l)] * p.value_stride_row;
          for (int64_t pt = 0; pt < p.points; ++pt) {
            const int64_t i = (((b * p.lq + q) * p.heads + h) * p.levels + l) * p.points + pt;
            const float px = p.loc[2 * i] * static_cast<float>(W) - 0.5f;
            const float py = p.loc[2 * i + 1] * static_cast<float>(H) - 0.5f;
            const float w = p.attn[i];
            // In float, before any int conversion: behind-camera locations reach ~1e9.
            if (!(px > -1.0f && px < static_cast<float>(W) && py > -1.0f && py < static_cast<float>(H))) continue;
            const float x0f = std::floor(px), y0f = std::floor(py);
            const auto x0 = static_cast<int64_t>(x0f), y0 = static_cast<int64_t>(y0f);
            const float lx = px - x0f, ly = py - y0f, hx = 1.0f - lx, hy = 1.0f - ly;
            const float w00 = hy * hx, w01 = hy * lx, w10 = ly * hx, w11 = ly * lx;
            const bool x0_in = x0 >= 0, x1_in = x0 + 1 < W, y0_in = y0 >= 0, y1_in = y0 + 1 < H;
            for (int64_t d = 0; d < p.hd; ++d) {
              // mmcv's order: the bilinear value over in-range corners, then times the weight.
              float v = 0.0f;
              const auto at = [&](int64_t y, int64_t x) {
                const int64_t e = vl + (y * W + x) * p.value_stride_row + d;
                return p.value_bf16 ? bf16_to_float(p.value_bf16[e]) : p.value[e];
              };
              if (y0_in && x0_in) v += w00 * at(y0, x0);
              if (y0_in && x1_in) v += w01 * at(y0, x0 + 1);
              if (y1_in && x0_in) v += w10 * at(y0 + 1, x0);
              if (y1_in && x1_in) v += w11 * at(y0 + 1, x0 + 1);
              o[d] += w * v;
            }
          }
        }
      }
    }
  }
}

const char* msda_isa_name(MsdaIsa isa) {
  switch (isa) {
    case MsdaIsa::kScalar: return "scalar";
    case MsdaIsa::kAvx2: return "avx2";
    case MsdaIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool msda_isa_supported(MsdaIsa isa) {
  switch (isa) {
    case MsdaIsa::kScalar: return true;
    case MsdaIsa::kAvx2: return cpu_features::has(cpu_features::Isa::kAvx2);
    case MsdaIsa::kAvx512: return cpu_features::has(cpu_features::Isa::kAvx512);
  }
  return false;
}

double msda_prefetch_bytes() {
  static const double bytes = cpu_is_amd() ? kMsdaPrefetchBytesAmd : kMsdaPrefetchBytesOther;
  return bytes;
}

MsdaIsa msda_best_isa() {
  return msda_isa_supported(MsdaIsa::kAvx512) ? MsdaIsa::kAvx512
         : msda_isa_supported(MsdaIsa::kAvx2) ? MsdaIsa::kAvx2
                                              : MsdaIsa::kScalar;
}

void msda_with_isa(MsdaIsa isa, const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
                   const Tensor& sampling_locations, const Tensor& attention_weights, Tensor& out, ThreadPool& pool,
                   MsdaPrefetch prefetch) {
  if (!msda_isa_supported(isa))
    throw Error(ErrorKind::kUnsupported, std::string("this CPU lacks ") + msda_isa_name(isa)).where("msda");
  KernelArgs p = check("msda", value, spatial_shapes, level_start, sampling_locations, attention_weights, out);
  const Workspace ws(p.samples_padded, pool.size());
  build_tables(p, ws, spatial_shapes, level_start);
  p.prefetch = wants_prefetch(p, prefetch);
  dispatch(isa, p, ws, pool);
}

// ---- MsdaChunks ----

MsdaChunks::MsdaChunks(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
                       int64_t lq, int64_t points, Tensor& out, int participants)
    : MsdaChunks(value, spatial_shapes, level_start, points, participants) {
  if (lq < 0) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(lq) + " queries").where("deformable_attention").expected("Lq >= 0");
  }
  args_.lq = lq;
  check_out("deformable_attention", args_, out);
  args_.out = out.data<float>();
}

MsdaChunks::MsdaChunks(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
                       int64_t points, int participants)
    : isa_(msda_best_isa()) {
  const char* who = "deformable_attention";
  args_ = check_value(who, value, spatial_shapes, level_start);
  if (points < 1) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(points) + " points").where(who).expected("points >= 1");
  }
  args_.points = points;
  args_.samples = args_.heads * args_.levels * args_.points;
  args_.samples_padded = (args_.samples + 15) / 16 * 16;
  const Workspace ws(args_.samples_padded, participants);
  build_tables(args_, ws, spatial_shapes, level_start);
  args_.prefetch = wants_prefetch(args_, MsdaPrefetch::kAuto);
  // The calling thread's list, which only grows: a replayed call allocates nothing.
  thread_local std::vector<Corners> corners;
  if (corners.size() < static_cast<size_t>(2 * participants)) corners.resize(static_cast<size_t>(2 * participants));
  for (int i = 0; i < participants; ++i) {
    corners[static_cast<size_t>(2 * i)] = ws.corners(i, 0);
    corners[static_cast<size_t>(2 * i + 1)] = ws.corners(i, 1);
  }
  corners_ = corners.data();
  participants_ = participants;
}

void MsdaChunks::run(int64_t begin, int64_t end, const float* loc, const float* attn, int participant) const {
  // The kernels index value by bq / Lq: each batch's part of the range runs as a batch of its own.
  for (int64_t s0 = begin; s0 < end;) {
    const int64_t b = s0 / args_.lq, s1 = std::min(end, (b + 1) * args_.lq);
    run_batch(b, s1 - s0, loc + (s0 - begin) * args_.samples * 2, attn + (s0 - begin) * args_.samples,
              args_.out + s0 * args_.heads * args_.hd, participant);
    s0 = s1;
  }
}

void MsdaChunks::run_batch(int64_t b, int64_t n, const float* loc, const float* attn, float* out, int participant) const {
  if (participant < 0 || participant >= participants_ || b < 0 || b >= args_.bs || n < 0)
    throw Error(ErrorKind::kInternal, "participant " + std::to_string(participant) + " of " + std::to_string(participants_) +
                                          ", batch " + std::to_string(b) + " of " + std::to_string(args_.bs))
        .where("deformable_attention");
  Corners c = corners_[2 * participant], next = corners_[2 * participant + 1];
  KernelArgs p = args_;
  p.bs = 1;
  p.lq = n;
  if (p.value_bf16) p.value_bf16 += b * p.value_stride_b;
  if (p.value) p.value += b * p.value_stride_b;
  p.loc = loc;
  p.attn = attn;
  p.out = out;
  switch (isa_) {
    case MsdaIsa::kScalar: msda_detail::run_scalar(p, c, 0, p.lq); break;
    case MsdaIsa::kAvx2: msda_detail::run_avx2(p, c, 0, p.lq); break;
    case MsdaIsa::kAvx512: msda_detail::run_avx512(p, c, next, 0, p.lq); break;
  }
}

void msda(const Tensor& value, const SpatialShapes& spatial_shapes, const std::vector<int64_t>& level_start,
          const Tensor& sampling_locations, const Tensor& attention_weights, Tensor& out, ThreadPool& pool) {
  msda_with_isa(msda_best_isa(), value, spatial_shapes, level_start, sampling_locations, attention_weights, out, pool);
}

}  // namespace bev::cpu
