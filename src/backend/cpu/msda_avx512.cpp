// The AVX-512 MSDA kernel. Compiled without -march flags: every function carries a target
// attribute and is only called after msda_isa_supported(kAvx512) said yes.
//
// Per query: (1) 16 samples at a time, turn (x, y, w) into four corner rows, four corner weights
// (bilinear x attention) and a 4-bit in-map mask; (2) per head, stream the corner rows of its L*P
// samples and accumulate weight * row into zmm registers across head_dim; (3) on large maps,
// prefetch the corner rows of the next query. Step (1) is a few dozen vector instructions per 16
// samples; step (2) is the gather-FMA that bounds the op once (3) keeps its rows in cache.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "backend/cpu/msda.h"
#include "backend/cpu/vec_avx512.h"
#include "core/half.h"

namespace bev::cpu::msda_detail {
namespace {

#define BEV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

using avx512::first_lanes;

// Step (1). Same float operations as msda_reference (mul, then sub; floor; products of the
// bilinear weights) so the footprint and weights match it; only the attention weight is folded in.
// Inlined into run_avx512 (GCC stopped doing so once the Corners came in as a parameter): the
// constants and table pointers are then set up once per chunk, not once per query.
BEV_AVX512 __attribute__((always_inline)) inline void prepare_corners_avx512(const KernelArgs& p, const float* loc_q,
                                                                           const float* attn_q, Corners& c) {
  const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), minus_one = _mm512_set1_ps(-1.0f);
  const __m512i ione = _mm512_set1_epi32(1), izero = _mm512_setzero_si512();
  const int64_t n = c.n;
  for (int64_t s0 = 0; s0 < p.samples_padded; s0 += 16) {
    const int64_t left = p.samples - s0;
    const __mmask16 live = first_lanes(left);
    // (x, y) pairs are interleaved (masked: never past this query's row).
    __m512 x, y;
    avx512::load_pairs16(loc_q + 2 * s0, left, x, y);
    const __m512 wf = _mm512_loadu_ps(p.width + s0);
    const __m512 hf = _mm512_loadu_ps(p.height + s0);
    // Explicit-rounding forms: GCC contracts a plain mul + sub into one FMA (fp-contract=fast is
    // its C++ default), which rounds px differently from the reference and moves the footprint.
    constexpr int kRn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    // (maskz_ forms: GCC 12 warns on the _mm512_undefined source of the unmasked ones.)
    __m512 px = _mm512_maskz_sub_round_ps(live, _mm512_maskz_mul_round_ps(live, x, wf, kRn), half, kRn);
    __m512 py = _mm512_maskz_sub_round_ps(live, _mm512_maskz_mul_round_ps(live, y, hf, kRn), half, kRn);
    // Ordered compares: false for NaN. Out-of-map lanes are zeroed before the int conversion.
    const __mmask16 valid = live & _mm512_cmp_ps_mask(px, minus_one, _CMP_GT_OQ) & _mm512_cmp_ps_mask(px, wf, _CMP_LT_OQ) &
                            _mm512_cmp_ps_mask(py, minus_one, _CMP_GT_OQ) & _mm512_cmp_ps_mask(py, hf, _CMP_LT_OQ);
    px = _mm512_maskz_mov_ps(valid, px);
    py = _mm512_maskz_mov_ps(valid, py);
    // floor_ps and maskz_cvttps instead of roundscale/cvttps: GCC 12 warns (maybe-uninitialized)
    // on the _mm512_undefined source operand of the latter two.
    const __m512 x0f = _mm512_floor_ps(px), y0f = _mm512_floor_ps(py);
    const __m512 lx = _mm512_sub_ps(px, x0f), ly = _mm512_sub_ps(py, y0f);
    const __m512 hx = _mm512_sub_ps(one, lx), hy = _mm512_sub_ps(one, ly);
    const __m512i x0 = _mm512_maskz_cvttps_epi32(valid, x0f), y0 = _mm512_maskz_cvttps_epi32(valid, y0f);
    const __m512i wi = _mm512_loadu_si512(p.width_i + s0);
    const __m512i hi = _mm512_loadu_si512(p.height_i + s0);
    const __mmask16 in_x0 = _mm512_cmpge_epi32_mask(x0, izero);
    const __mmask16 in_x1 = _mm512_cmplt_epi32_mask(_mm512_add_epi32(x0, ione), wi);
    const __mmask16 in_y0 = valid & _mm512_cmpge_epi32_mask(y0, izero);
    const __mmask16 in_y1 = valid & _mm512_cmplt_epi32_mask(_mm512_add_epi32(y0, ione), hi);
    const __mmask16 m[4] = {__mmask16(in_y0 & in_x0), __mmask16(in_y0 & in_x1), __mmask16(in_y1 & in_x0),
                            __mmask16(in_y1 & in_x1)};
    const __m512 w = _mm512_maskz_loadu_ps(live, attn_q + s0);
    const __m512 cw[4] = {_mm512_mul_ps(_mm512_mul_ps(hy, hx), w), _mm512_mul_ps(_mm512_mul_ps(hy, lx), w),
                          _mm512_mul_ps(_mm512_mul_ps(ly, hx), w), _mm512_mul_ps(_mm512_mul_ps(ly, lx), w)};
    const __m512i start = _mm512_loadu_si512(p.start + s0);
    const __m512i r00 = _mm512_add_epi32(start, _mm512_add_epi32(_mm512_mullo_epi32(y0, wi), x0));
    const __m512i r10 = _mm512_add_epi32(r00, wi);
    const __m512i row[4] = {r00, _mm512_add_epi32(r00, ione), r10, _mm512_add_epi32(r10, ione)};
    __m512i bits = izero;
    for (int k = 0; k < 4; ++k) {
      _mm512_storeu_si512(c.row + k * n + s0, _mm512_maskz_mov_epi32(m[k], row[k]));
      _mm512_storeu_ps(c.weight + k * n + s0, _mm512_maskz_mov_ps(m[k], cw[k]));
      bits = _mm512_mask_or_epi32(bits, m[k], bits, _mm512_set1_epi32(1 << k));
    }
    _mm512_storeu_si512(c.mask + s0, bits);
  }
}

// 16 or 32 values of a row as f32 (lanes outside the masks read 0 and touch no memory). bf16 is
// widened exactly: its bits are the top half of the f32's. A bf16 row of 32 is one 64-byte line.
BEV_AVX512 inline void load_row(const float* v, __mmask16 tail0, __mmask16 tail1, __m512& lo, __m512& hi) {
  lo = _mm512_maskz_loadu_ps(tail0, v);
  hi = _mm512_maskz_loadu_ps(tail1, v + 16);
}
BEV_AVX512 inline void load_row(const uint16_t* v, __mmask16 tail0, __mmask16 tail1, __m512& lo, __m512& hi) {
  lo = bf16_to_float_x16(_mm256_maskz_loadu_epi16(tail0, v));
  hi = bf16_to_float_x16(_mm256_maskz_loadu_epi16(tail1, v + 16));
}

// A bf16 row of 17-32 values in one 64-byte load, as f32 in pair order: `even` holds columns
// 0, 2, ..., 30 and `odd` 1, 3, ..., 31. Each 32-bit lane holds two bf16 (the even column in its
// low half), so a shift and a mask widen both: no cross-lane shuffles (the two vpmovzxwd of
// load_row compete with the FMAs for port 5). Sums kept in this order are put back in column order
// once per group (interleave).
BEV_AVX512 inline void load_row_pairs(const uint16_t* v, __mmask32 mask, __m512& even, __m512& odd) {
  const __m512i x = _mm512_maskz_loadu_epi16(mask, v);
  even = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}
// Columns 0-15 and 16-31 from sums in pair order.
BEV_AVX512 inline void interleave(__m512 even, __m512 odd, __m512& lo, __m512& hi) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  lo = _mm512_permutex2var_ps(even, first, odd);
  hi = _mm512_permutex2var_ps(even, second, odd);
}

// Step (2) for 16 (kTwo false) or 32 (kTwo true) columns; the loads are masked by tail0/tail1 so
// they never read past head_dim (the tensor's last row stays in bounds). One accumulator per
// corner and vector: four independent FMA chains, so the 4-cycle FMA latency does not serialize
// a sample's corners. Named accumulators, not an array, and constant corner indices: a run-time
// index into an accumulator array makes GCC keep it on the stack (measured 3x slower). bf16 rows
// of 32 accumulate in pair order (load_row_pairs): each column sees the same FMAs in the same
// order, so the sums are the same bits.
template <bool kTwo, typename T>
BEV_AVX512 void accumulate_group(const Corners& c, const T* vbase, int64_t row_stride, int64_t s_begin, int64_t s_end,
                                 __mmask16 tail0, __mmask16 tail1, float* o) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const int64_t n = c.n;
  const int32_t* row = c.row;
  const float* weight = c.weight;
  constexpr bool kPairs = kTwo && std::is_same_v<T, uint16_t>;
  const __mmask32 mask32 = static_cast<__mmask32>(tail0) | (static_cast<__mmask32>(tail1) << 16);
  const auto corner = [&](int64_t i, __m512& a, __m512& b) __attribute__((always_inline)) BEV_AVX512 {
    const __m512 w = _mm512_set1_ps(weight[i]);
    const T* v = vbase + static_cast<int64_t>(row[i]) * row_stride;
    __m512 lo, hi;
    if constexpr (kPairs)
      load_row_pairs(v, mask32, lo, hi);
    else
      load_row(v, tail0, kTwo ? tail1 : __mmask16(0), lo, hi);
    a = _mm512_fmadd_ps(w, lo, a);
    if constexpr (kTwo) b = _mm512_fmadd_ps(w, hi, b);
  };
  for (int64_t s = s_begin; s < s_end; ++s) {
    const int32_t m = c.mask[static_cast<size_t>(s)];
    if (m == 15) {  // the common case: all four corners inside the map
      corner(s, a0, b0);
      corner(n + s, a1, b1);
      corner(2 * n + s, a2, b2);
      corner(3 * n + s, a3, b3);
    } else if (m != 0) {
      if (m & 1) corner(s, a0, b0);
      if (m & 2) corner(n + s, a1, b1);
      if (m & 4) corner(2 * n + s, a2, b2);
      if (m & 8) corner(3 * n + s, a3, b3);
    }
  }
  __m512 sum_a = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
  __m512 sum_b = _mm512_add_ps(_mm512_add_ps(b0, b1), _mm512_add_ps(b2, b3));
  if constexpr (kPairs) {
    const __m512 even = sum_a, odd = sum_b;
    interleave(even, odd, sum_a, sum_b);
  }
  _mm512_mask_storeu_ps(o, tail0, sum_a);
  if constexpr (kTwo) _mm512_mask_storeu_ps(o + 16, tail1, sum_b);
}

// head_dim in groups of up to 32 columns (BEVFormer's head_dim is exactly one group).
template <typename T>
BEV_AVX512 void accumulate_head(const KernelArgs& p, const Corners& c, const T* vbase, int64_t s_begin, int64_t s_end, float* o) {
  for (int64_t g = 0; g < p.hd; g += 32) {
    const int64_t cols = std::min<int64_t>(32, p.hd - g);
    if (cols > 16)
      accumulate_group<true>(c, vbase + g, p.value_stride_row, s_begin, s_end, 0xFFFF, first_lanes(cols - 16), o + g);
    else
      accumulate_group<false>(c, vbase + g, p.value_stride_row, s_begin, s_end, first_lanes(cols), 0, o + g);
  }
}

// Step (3), for value maps of msda_prefetch_bytes() or more: touch every line of query bq+1's corner
// rows (prepared into `c`) while query bq accumulates. The hardware prefetchers do not follow these
// rows (four corners, up to eight heads, two map rows: dozens of short streams that each cross
// a 4 KiB page every few queries), so without it nearly every corner of base's TSA waits on
// DRAM. Corners outside the map hold row 0: a harmless prefetch.
template <typename T>
BEV_AVX512 void prefetch_rows(const KernelArgs& p, const Corners& c, const T* vbatch) {
  const __m512i row_bytes = _mm512_set1_epi64(p.value_stride_row * static_cast<int64_t>(sizeof(T)));
  const __m512i head_bytes = _mm512_set1_epi64(p.value_stride_h * static_cast<int64_t>(sizeof(T)));
  const __m512i base = _mm512_set1_epi64(static_cast<int64_t>(reinterpret_cast<uintptr_t>(vbatch)));
  // A row of hd values starting on a cache line spans hd*sizeof(T)/64 lines rounded up; otherwise
  // one more may be needed (prefetching past the row is harmless: prefetches never fault).
  const auto hd_bytes = p.hd * static_cast<int64_t>(sizeof(T));
  const int64_t span = p.rows_line_aligned ? hd_bytes : hd_bytes + 63;
  alignas(64) int64_t addr[8];
  for (int64_t s0 = 0; s0 < p.samples; s0 += 8) {
    // (maskz_ conversions: GCC 12 warns on the _mm512_undefined source of the unmasked one.)
    const __m512i head = _mm512_maskz_cvtepi32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.head + s0)));
    const __m512i head_base = _mm512_add_epi64(base, _mm512_mullo_epi64(head, head_bytes));
    const int64_t count = std::min<int64_t>(8, p.samples - s0);
    for (int k = 0; k < 4; ++k) {
      const __m512i row = _mm512_maskz_cvtepi32_epi64(0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.row + k * c.n + s0)));
      _mm512_store_si512(addr, _mm512_add_epi64(head_base, _mm512_mullo_epi64(row, row_bytes)));
      for (int64_t i = 0; i < count; ++i) {
        const char* a = reinterpret_cast<const char*>(addr[i]);
        for (int64_t off = 0; off < span; off += 64) _mm_prefetch(a + off, _MM_HINT_T0);
      }
    }
  }
}

// With step (3), the locations and weights of query bq, two queries ahead: one sequential stream,
// yet in base's TSA their loads stalled about a quarter of the time (perf, one thread) while the
// row prefetches kept the memory system busy; this took base TSA from 24.5-29.5 to 20.2-23.5 ms.
BEV_AVX512 inline void prefetch_samples(const KernelArgs& p, int64_t bq) {
  const char* loc = reinterpret_cast<const char*>(p.loc + bq * p.samples * 2);
  const char* attn = reinterpret_cast<const char*>(p.attn + bq * p.samples);
  for (int64_t off = 0; off < p.samples * 8; off += 64) _mm_prefetch(loc + off, _MM_HINT_T0);
  for (int64_t off = 0; off < p.samples * 4; off += 64) _mm_prefetch(attn + off, _MM_HINT_T0);
}

// With KernelArgs::prefetch the loop runs one query ahead: query bq+1 is prepared into the other
// Corners and its rows prefetched before query bq accumulates. Prefetching at every shape was
// tried: at tiny's shapes, whose maps sit in L2/L3, its instructions cost more than the stalls
// they hide (bench_msda, 2 threads: tiny SCA 0.53 -> 0.93 ms, tiny TSA 0.70 -> 1.08; an earlier
// try measured only tiny TSA and dropped prefetching altogether).
template <typename T>
BEV_AVX512 void run_typed(const KernelArgs& p, const T* value, Corners& scratch, Corners& next_scratch, int64_t begin,
                          int64_t end) {
  // Local copies of the pointers: the vector stores below may alias anything the compiler can
  // reach through a reference, which would reload them after every store.
  Corners c = scratch, next = next_scratch;
  const int64_t per_head = p.levels * p.points;
  const auto prepare = [&](int64_t bq, Corners& into) __attribute__((always_inline)) BEV_AVX512 {
    prepare_corners_avx512(p, p.loc + bq * p.samples * 2, p.attn + bq * p.samples, into);
  };
  if (p.prefetch && begin < end) prepare(begin, c);
  for (int64_t bq = begin; bq < end; ++bq) {
    const int64_t b = bq / p.lq;
    if (!p.prefetch) {
      prepare(bq, c);
    } else if (bq + 1 < end) {
      if (bq + 2 < end) prefetch_samples(p, bq + 2);
      prepare(bq + 1, next);
      prefetch_rows(p, next, value + (bq + 1) / p.lq * p.value_stride_b);
    }
    for (int64_t h = 0; h < p.heads; ++h) {
      const T* vbase = value + b * p.value_stride_b + h * p.value_stride_h;
      accumulate_head(p, c, vbase, h * per_head, (h + 1) * per_head, p.out + (bq * p.heads + h) * p.hd);
    }
    if (p.prefetch) std::swap(c, next);
  }
}

}  // namespace

BEV_AVX512 void run_avx512(const KernelArgs& p, Corners& scratch, Corners& next_scratch, int64_t begin, int64_t end) {
  if (p.value_bf16)
    run_typed(p, p.value_bf16, scratch, next_scratch, begin, end);
  else
    run_typed(p, p.value, scratch, next_scratch, begin, end);
}

}  // namespace bev::cpu::msda_detail
