// DCNv2 on the CPU as "bilinear im2col + matmul": the column tile has one row per output pixel
// and K*Cin columns in (tap, cin) order, so with NHWC input every bilinear corner is one
// contiguous Cin vector (vectorized over Cin), and the weight is reordered once to [K*Cin, Cout]
// so the tile times the weight writes straight into the NHWC output rows. Tiles are bounded by
// a byte budget so the column buffer stays small even at base's layer3 (6 x 58 x 100 rows x 2304).
#include "backend/cpu/deform_conv2d.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernel_check.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/row_gemm.h"
#include "backend/cpu/vec_avx512.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

float sigmoid_f(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// Up to four bilinear corners of one sample (deform_conv2d_detail::TapCorners made pointers):
// weights and the corner's Cin vector (x's f32, or its bf16 in bf16 precision: In).
template <typename In>
struct Corners {
  int n = 0;
  float w[4];
  const In* p[4];
};

// d[c] = (sum_q w_q * p_q[c]) * mask, stored as f32 or, for the bf16 column tile, rounded to
// bf16 (core/half.h's float_to_bf16). With no corner the result is 0 * mask, as in mmcv (so a
// NaN mask still poisons the output the way upstream's does).
template <typename In, typename Out>
void combine_scalar(const Corners<In>& k, float mask, Out* d, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    float v = 0.0f;
    for (int q = 0; q < k.n; ++q) v += k.w[q] * widen(k.p[q][c]);
    if constexpr (std::is_same_v<Out, float>) {
      d[c] = v * mask;
    } else {
      d[c] = float_to_bf16(v * mask);
    }
  }
}

#define BEV_AVX512_BW __attribute__((target("avx512f,avx512bw,avx512vl")))

// 16 channels at d (the first `m` of them): f32, or bf16 rounded as float_to_bf16 (core/half.h).
template <typename Out>
BEV_AVX512_BW inline void store16(Out* d, __mmask16 m, __m512 v) {
  if constexpr (std::is_same_v<Out, float>) {
    _mm512_mask_storeu_ps(d, m, v);
  } else {
    _mm256_mask_storeu_epi16(d, m, float_to_bf16_x16(v));
  }
}

// 16 channels at p (the first `m` of them; the others read 0 and touch no memory) as f32; bf16
// widened exactly.
BEV_AVX512_BW inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
BEV_AVX512_BW inline __m512 load16(const uint16_t* p, __mmask16 m) {
  return bf16_to_float_x16(_mm256_maskz_loadu_epi16(m, p));
}

// The AVX-512 combine (the bf16 output needs AVX512BW/VL as well: avx512::has_bw).
template <typename In, typename Out>
BEV_AVX512_BW void combine_avx512(const Corners<In>& k, float mask, Out* d, int64_t C) {
  const __m512 vm = _mm512_set1_ps(mask);
  __m512 vw[4];
  for (int q = 0; q < k.n; ++q) vw[q] = _mm512_set1_ps(k.w[q]);
  int64_t c = 0;
  if (k.n == 4) {  // the common case, unrolled
    for (; c + 16 <= C; c += 16) {
      __m512 a = _mm512_mul_ps(vw[0], load16(k.p[0] + c, 0xFFFF));
      a = _mm512_fmadd_ps(vw[1], load16(k.p[1] + c, 0xFFFF), a);
      a = _mm512_fmadd_ps(vw[2], load16(k.p[2] + c, 0xFFFF), a);
      a = _mm512_fmadd_ps(vw[3], load16(k.p[3] + c, 0xFFFF), a);
      store16(d + c, 0xFFFF, _mm512_mul_ps(a, vm));
    }
  } else {
    for (; c + 16 <= C; c += 16) {
      __m512 a = _mm512_setzero_ps();
      for (int q = 0; q < k.n; ++q) a = _mm512_fmadd_ps(vw[q], load16(k.p[q] + c, 0xFFFF), a);
      store16(d + c, 0xFFFF, _mm512_mul_ps(a, vm));
    }
  }
  if (c < C) {
    const __mmask16 m = static_cast<__mmask16>((1u << (C - c)) - 1u);
    __m512 a = _mm512_setzero_ps();
    for (int q = 0; q < k.n; ++q) a = _mm512_fmadd_ps(vw[q], load16(k.p[q] + c, m), a);
    store16(d + c, m, _mm512_mul_ps(a, vm));
  }
}

// bf16 in, bf16 out, 32 channels a step, where the CPU converts to bf16 itself (AVX512-BF16: the
// Xeons with AMX, Zen 4 and 5). The corners' rows are widened by interleaving zeros below their
// words (unpacklo/hi), which puts channels in the order [0-3, 8-11, 16-19, 24-27 | 4-7, ...];
// the sums run in that order, and one permute after the conversion puts them back. Per 32
// channels that is a load and two unpacks per corner and three instructions to store, where
// combine_avx512 spends three per 16 channels per corner and eight to round and store 16 (base's
// layer3, bench_dcn: see docs/PERF.md). Every channel's arithmetic is combine_avx512's (w0 v0,
// then FMAs in corner order, then * mask); vcvtne2ps2bf16 rounds to nearest even as
// float_to_bf16 does, but reads a subnormal sum as zero, which the bf16 matmul that reads the
// column does anyway.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void combine_bf16_native(const Corners<uint16_t>& k,
                                                                                         float mask, uint16_t* d,
                                                                                         int64_t C) {
  // Channel c's word in the converted pair of sums (see above).
  alignas(64) static constexpr uint16_t kOrder[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                                      8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i order = _mm512_load_si512(kOrder);
  const __m512i zero = _mm512_setzero_si512();
  const __m512 vm = _mm512_set1_ps(mask);
  __m512 vw[4];
  for (int q = 0; q < k.n; ++q) vw[q] = _mm512_set1_ps(k.w[q]);
  int64_t c = 0;
  for (; c + 32 <= C; c += 32) {
    __m512 lo, hi;
    if (k.n == 4) {  // the common case, unrolled
      __m512i v = _mm512_loadu_si512(k.p[0] + c);
      lo = _mm512_mul_ps(vw[0], _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)));
      hi = _mm512_mul_ps(vw[0], _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)));
      for (int q = 1; q < 4; ++q) {
        v = _mm512_loadu_si512(k.p[q] + c);
        lo = _mm512_fmadd_ps(vw[q], _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)), lo);
        hi = _mm512_fmadd_ps(vw[q], _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)), hi);
      }
    } else {
      lo = hi = _mm512_setzero_ps();
      for (int q = 0; q < k.n; ++q) {
        const __m512i v = _mm512_loadu_si512(k.p[q] + c);
        lo = _mm512_fmadd_ps(vw[q], _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v)), lo);
        hi = _mm512_fmadd_ps(vw[q], _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v)), hi);
      }
    }
    const __m512i words = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, vm), _mm512_mul_ps(lo, vm)));
    _mm512_storeu_si512(d + c, _mm512_permutexvar_epi16(order, words));
  }
  if (c < C) {  // fewer than 32 channels left: 16 at a time, in order
    for (; c < C; c += 16) {
      const __mmask16 m = static_cast<__mmask16>(C - c >= 16 ? 0xFFFF : (1u << (C - c)) - 1u);
      __m512 a = _mm512_setzero_ps();
      for (int q = 0; q < k.n; ++q) a = _mm512_fmadd_ps(vw[q], load16(k.p[q] + c, m), a);
      _mm256_mask_storeu_epi16(d + c, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_mul_ps(a, vm))));
    }
  }
}

struct Geometry {
  int64_t n, h, w, cin, ho, wo, kh, kw;
  const deform_conv2d_detail::TapGeometry* taps;
};

// Fills column rows for output pixels [b, e) (flattened n, ho, wo); row p goes to col + (p - p0) * K*Cin.
// Col is float, or uint16_t (bf16) in bf16 precision; so is In, x's element.
template <typename In, typename Col>
void sample_rows(const Geometry& g, const In* x, const float* om, Col* col, int64_t p0, int64_t b, int64_t e) {
  const int64_t taps = g.kh * g.kw, row_len = taps * g.cin, hw_out = g.ho * g.wo;
  const bool native_bf16 = avx512::has_bf16(), bw = avx512::has_bw();  // once, not per tap
  deform_conv2d_detail::PixelTaps pt;
  Corners<In> k;
  for (int64_t p = b; p < e; ++p) {
    const int64_t n = p / hw_out, r = p % hw_out, ho = r / g.wo, wo = r % g.wo;
    const In* xn = x + n * g.h * g.w * g.cin;
    const float* o = om + p * 3 * taps;
    Col* dst = col + (p - p0) * row_len;
    for (int64_t t0 = 0; t0 < taps; t0 += 16) {
      const int64_t count = std::min<int64_t>(16, taps - t0);
      if (g.taps->avx512)
        deform_conv2d_detail::pixel_taps_avx512(*g.taps, ho, wo, o, t0, count, pt);
      else
        deform_conv2d_detail::pixel_taps_scalar(*g.taps, ho, wo, o, t0, count, pt);
      for (int64_t i = 0; i < count; ++i) {
        const deform_conv2d_detail::TapCorners& tc = pt.tap[i];
        k.n = tc.n;
        for (int q = 0; q < tc.n; ++q) {
          k.w[q] = tc.w[q];
          k.p[q] = xn + tc.off[q];
        }
        const float mask = pt.mask[i];
        Col* d = dst + (t0 + i) * g.cin;
        if constexpr (std::is_same_v<In, uint16_t> && std::is_same_v<Col, uint16_t>) {
          if (native_bf16) {
            combine_bf16_native(k, mask, d, g.cin);
            continue;
          }
        }
        if (bw) {
          combine_avx512(k, mask, d, g.cin);
        } else {
          combine_scalar(k, mask, d, g.cin);
        }
      }
    }
  }
}

}  // namespace

namespace deform_conv2d_detail {

TapGeometry tap_geometry(int64_t h, int64_t w, int64_t cin, int64_t kh, int64_t kw, int stride, int pad, int dilation) {
  TapGeometry g{h, w, cin, kh, kw, stride, pad, dilation, kh * kw, false, {}, {}};
  // Offsets (y * W + x) * Cin and the positions' integer parts (at most stride * (H + 2 pad) +
  // (kh - 1) * dilation) in int32 lanes, with room to spare.
  constexpr int64_t kLimit = int64_t{1} << 30;
  const auto fits = [&](int64_t size, int64_t k) {
    return size < kLimit && stride * (size + 2 * int64_t{pad}) < kLimit && k * dilation < kLimit;
  };
  const bool cpu = avx512::has_bw();  // with DQ (cpu_features::Isa::kAvx512)
  g.avx512 = cpu && h * w * cin < kLimit && fits(h, kh) && fits(w, kw);
  // The vector form's tables, padded to whole groups of 16 so it loads them without a tail.
  if (g.avx512) {
    const auto padded = static_cast<size_t>((g.taps + 15) / 16 * 16);
    g.tap_y.assign(padded, 0);
    g.tap_x.assign(padded, 0);
    for (int64_t t = 0; t < g.taps; ++t) {
      g.tap_y[static_cast<size_t>(t)] = static_cast<int32_t>(t / kw * dilation);
      g.tap_x[static_cast<size_t>(t)] = static_cast<int32_t>(t % kw * dilation);
    }
  }
  return g;
}

// mmcv's dmcn_im2col_bilinear with the caller's range test folded in: corner weights in f32 in
// mmcv's order, and only the corners inside the map are listed.
void pixel_taps_scalar(const TapGeometry& g, int64_t ho, int64_t wo, const float* o, int64_t t0, int64_t count,
                       PixelTaps& out) {
  const int64_t H = g.h, W = g.w, C = g.cin;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = t0 + i;
    TapCorners& c = out.tap[i];
    out.mask[i] = sigmoid_f(o[2 * g.taps + t]);
    c.n = 0;
    // mmcv: int base position plus the f32 offset, in f32.
    const float h = static_cast<float>(ho * g.stride - g.pad + t / g.kw * g.dil) + o[2 * t];
    const float w = static_cast<float>(wo * g.stride - g.pad + t % g.kw * g.dil) + o[2 * t + 1];
    // Written so that NaN positions fail the test (mmcv reads 0 there).
    if (!(h > -1.0f && w > -1.0f && h < static_cast<float>(H) && w < static_cast<float>(W))) continue;
    const int64_t h_low = static_cast<int64_t>(std::floor(h));
    const int64_t w_low = static_cast<int64_t>(std::floor(w));
    const int64_t h_high = h_low + 1, w_high = w_low + 1;
    const float lh = h - static_cast<float>(h_low), lw = w - static_cast<float>(w_low);
    const float hh = 1.0f - lh, hw = 1.0f - lw;
    auto add = [&](int64_t y, int64_t x, float wt) {
      c.w[c.n] = wt;
      c.off[c.n] = (y * W + x) * C;
      ++c.n;
    };
    if (h_low >= 0 && w_low >= 0) add(h_low, w_low, hh * hw);
    if (h_low >= 0 && w_high <= W - 1) add(h_low, w_high, hh * lw);
    if (h_high <= H - 1 && w_low >= 0) add(h_high, w_low, lh * hw);
    if (h_high <= H - 1 && w_high <= W - 1) add(h_high, w_high, lh * lw);
  }
}

// Every lane does pixel_taps_scalar's float operations in its order (the int position converted,
// then the f32 add; ordered compares; floor; the four products), so each tap gets its bits; only
// the listing of a tap's corners and the masks' expf stay scalar.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void pixel_taps_avx512(const TapGeometry& g, int64_t ho,
                                                                                     int64_t wo, const float* o,
                                                                                     int64_t t0, int64_t count,
                                                                                     PixelTaps& out) {
  const __mmask16 live = avx512::first_lanes(count);
  __m512 dy, dx;  // (Δy, Δx) pairs are interleaved; nothing past the taps is read
  avx512::load_pairs16(o + 2 * t0, count, dy, dx);
  const __m512i ty = _mm512_loadu_si512(g.tap_y.data() + t0), tx = _mm512_loadu_si512(g.tap_x.data() + t0);
  // (maskz_ conversions: GCC 12 warns on the _mm512_undefined source of the unmasked one.)
  const __m512 by = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(ho * g.stride - g.pad)), ty));
  const __m512 bx = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(wo * g.stride - g.pad)), tx));
  const __m512 hy = _mm512_add_ps(by, dy), wx = _mm512_add_ps(bx, dx);
  const __m512 minus_one = _mm512_set1_ps(-1.0f), one = _mm512_set1_ps(1.0f);
  const __m512 hf = _mm512_set1_ps(static_cast<float>(g.h)), wf = _mm512_set1_ps(static_cast<float>(g.w));
  const __mmask16 valid = live & _mm512_cmp_ps_mask(hy, minus_one, _CMP_GT_OQ) & _mm512_cmp_ps_mask(wx, minus_one, _CMP_GT_OQ) &
                          _mm512_cmp_ps_mask(hy, hf, _CMP_LT_OQ) & _mm512_cmp_ps_mask(wx, wf, _CMP_LT_OQ);
  const __m512 h = _mm512_maskz_mov_ps(valid, hy), w = _mm512_maskz_mov_ps(valid, wx);
  const __m512 h_floor = _mm512_floor_ps(h), w_floor = _mm512_floor_ps(w);
  const __m512 lh = _mm512_sub_ps(h, h_floor), lw = _mm512_sub_ps(w, w_floor);
  const __m512 hh = _mm512_sub_ps(one, lh), hw = _mm512_sub_ps(one, lw);
  const __m512i h_low = _mm512_maskz_cvttps_epi32(valid, h_floor), w_low = _mm512_maskz_cvttps_epi32(valid, w_floor);
  const __m512i zero = _mm512_setzero_si512();
  const __mmask16 h0 = valid & _mm512_cmpge_epi32_mask(h_low, zero);
  const __mmask16 h1 = valid & _mm512_cmplt_epi32_mask(h_low, _mm512_set1_epi32(static_cast<int32_t>(g.h - 1)));
  const __mmask16 w0 = _mm512_cmpge_epi32_mask(w_low, zero);
  const __mmask16 w1 = _mm512_cmplt_epi32_mask(w_low, _mm512_set1_epi32(static_cast<int32_t>(g.w - 1)));
  const __mmask16 m[4] = {__mmask16(h0 & w0), __mmask16(h0 & w1), __mmask16(h1 & w0), __mmask16(h1 & w1)};
  const __m512i c = _mm512_set1_epi32(static_cast<int32_t>(g.cin));
  const __m512i off00 = _mm512_mullo_epi32(_mm512_add_epi32(_mm512_mullo_epi32(h_low, _mm512_set1_epi32(static_cast<int32_t>(g.w))), w_low), c);
  const __m512i row = _mm512_set1_epi32(static_cast<int32_t>(g.w * g.cin));
  alignas(64) float wt[4][16];
  alignas(64) int32_t off[4][16];
  _mm512_store_ps(wt[0], _mm512_mul_ps(hh, hw));
  _mm512_store_ps(wt[1], _mm512_mul_ps(hh, lw));
  _mm512_store_ps(wt[2], _mm512_mul_ps(lh, hw));
  _mm512_store_ps(wt[3], _mm512_mul_ps(lh, lw));
  _mm512_store_si512(off[0], off00);
  _mm512_store_si512(off[1], _mm512_add_epi32(off00, c));
  _mm512_store_si512(off[2], _mm512_add_epi32(off00, row));
  _mm512_store_si512(off[3], _mm512_add_epi32(_mm512_add_epi32(off00, row), c));
  const unsigned all = m[0] & m[1] & m[2] & m[3];
  for (int64_t i = 0; i < count; ++i) {
    TapCorners& tc = out.tap[i];
    out.mask[i] = sigmoid_f(o[2 * g.taps + t0 + i]);
    if (all >> i & 1u) {  // the common case: every corner inside
      tc.n = 4;
      for (int q = 0; q < 4; ++q) {
        tc.w[q] = wt[q][i];
        tc.off[q] = off[q][i];
      }
      continue;
    }
    int n = 0;
    for (int q = 0; q < 4; ++q) {
      if (!(m[q] >> i & 1u)) continue;
      tc.w[n] = wt[q][i];
      tc.off[n] = off[q][i];
      ++n;
    }
    tc.n = n;
  }
}

}  // namespace deform_conv2d_detail

struct DeformConv2d::Impl {
  int64_t cout = 0, cin = 0, kh = 0, kw = 0;
  int stride = 1, pad = 0, dil = 1;
  size_t col_budget = 0;
  bool bf16 = false;  // columns and weight in bf16, f32 accumulation, f32 or bf16 output
  bool relu = false;
  Tensor weight_kc;  // [kh*kw*Cin, Cout], f32 or bf16
  Tensor bias_1c;    // [1, Cout] or undefined
  // f32 where oneDNN's matmul would make a pixel's sums depend on the tile height and threads
  // (below AVX-512: row_gemm_needed), which follow the batch: the columns' product runs here.
  std::optional<RowGemm> row_gemm;

  // Mutable state of run(), guarded by mu: the column tile and one matmul per tile height
  // (a run has at most two: full tiles and the last one), each with its argument memories,
  // pointed at this run's buffers by bind() (creating them per run would allocate).
  struct Matmul {
    dnnl::matmul prim;
    dnnl::memory src, weights, bias, dst, scratchpad;
  };
  mutable std::mutex mu;
  mutable Tensor scratch;
  mutable Tensor tail_out;  // the padded last tile's output rows (see run), in y's dtype
  mutable deform_conv2d_detail::TapGeometry taps;  // for the last run's map shape
  mutable std::map<std::pair<int64_t, bool>, Matmul> matmuls;  // by rows and whether y is bf16
  // weight_kc reordered into the layouts the matmuls asked for (tag::any): packed weights are
  // what oneDNN's brgemm matmul runs fastest on; plain [K, Cout] made it repack them per call.
  mutable PackedWeights packed;  // its source: weight_kc as a plain [K, Cout] matrix

  const Matmul& matmul_for(int64_t m, bool bf16_out) const {
    auto it = matmuls.find({m, bf16_out});
    if (it != matmuls.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const int64_t k = kh * kw * cin;
    const dt operand = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc src({m, k}, operand, tag::ab);
    const dnnl::memory::desc wei({k, cout}, operand, tag::any);
    const dnnl::memory::desc dst({m, cout}, bf16_out ? dt::bf16 : dt::f32, tag::ab);
    const dnnl::memory::desc bias({1, cout}, dt::f32, tag::ab);
    const dnnl::matmul::desc d =
        bias_1c.defined() ? dnnl::matmul::desc(src, wei, bias, dst) : dnnl::matmul::desc(src, wei, dst);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // owned here: nothing allocated per run
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(d, attr, engine());
    Matmul mm{dnnl::matmul(pd),
              unbound(src),
              packed.in(pd.weights_desc()),
              bias_1c.defined() ? dnnl::memory(bias, engine(), bias_1c.raw_data()) : dnnl::memory(),
              unbound(dst),
              dnnl::memory(pd.scratchpad_desc(), engine())};
    return matmuls.emplace(std::make_pair(m, bf16_out), std::move(mm)).first->second;
  }
};

DeformConv2d::DeformConv2d(const Tensor& weight_oihw, const Tensor* bias, int stride, int pad, int dilation,
                           size_t col_budget_bytes, Precision precision, bool relu)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.bf16 = precision == Precision::kBF16;
  s.relu = relu;
  if (!weight_oihw.defined() || weight_oihw.dtype() != DType::kF32 || weight_oihw.dim() != 4 ||
      weight_oihw.numel() == 0) {
    bad_tensor("deform_conv2d", weight_oihw, "weight", "f32 [Cout, Cin, kh, kw], non-empty");
  }
  if (stride < 1 || pad < 0 || dilation < 1) {
    throw Error(ErrorKind::kInvalidInput, "stride " + std::to_string(stride) + ", pad " + std::to_string(pad) +
                                              ", dilation " + std::to_string(dilation))
        .where("deform_conv2d")
        .expected("stride >= 1, pad >= 0, dilation >= 1");
  }
  const Tensor w = weight_oihw.contiguous();
  s.cout = w.size(0);
  s.cin = w.size(1);
  s.kh = w.size(2);
  s.kw = w.size(3);
  s.stride = stride;
  s.pad = pad;
  s.dil = dilation;
  s.col_budget = col_budget_bytes;
  const int64_t taps = s.kh * s.kw;
  s.weight_kc = Tensor::empty({taps * s.cin, s.cout}, DType::kF32);
  const float* src = w.data<float>();
  float* dst = s.weight_kc.data<float>();
  for (int64_t co = 0; co < s.cout; ++co) {
    for (int64_t ci = 0; ci < s.cin; ++ci) {
      for (int64_t t = 0; t < taps; ++t) dst[(t * s.cin + ci) * s.cout + co] = src[(co * s.cin + ci) * taps + t];
    }
  }
  if (s.bf16) {
    Tensor w16 = Tensor::empty(s.weight_kc.shape(), DType::kBF16);
    float_to_bf16_n(s.weight_kc.data<float>(), static_cast<uint16_t*>(w16.raw_data()), static_cast<size_t>(w16.numel()));
    s.weight_kc = w16;
  }
  s.packed = PackedWeights(dnnl::memory({{taps * s.cin, s.cout}, s.bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
                                          dnnl::memory::format_tag::ab},
                                         engine(), s.weight_kc.raw_data()));
  if (bias != nullptr) {
    if (!bias->defined() || bias->dtype() != DType::kF32 || bias->shape() != Shape{s.cout}) {
      bad_tensor("deform_conv2d", *bias, "bias", "f32" + shape_str({s.cout}));
    }
    s.bias_1c = bias->contiguous().clone().reshape({1, s.cout});
  }
  if (!s.bf16 && row_gemm_needed()) {
    // RowGemm reads PyTorch's [out, in]: the column order (tap, Cin) per output channel.
    const int64_t k = taps * s.cin;
    Tensor w_ok = Tensor::empty({s.cout, k}, DType::kF32);
    const float* kc = s.weight_kc.data<float>();
    float* ok = w_ok.data<float>();
    for (int64_t r = 0; r < k; ++r)
      for (int64_t co = 0; co < s.cout; ++co) ok[co * k + r] = kc[r * s.cout + co];
    s.row_gemm.emplace(ok, s.cout, k, s.bias_1c.defined() ? s.bias_1c.data<float>() : nullptr, s.relu);
  }
}

DeformConv2d::~DeformConv2d() = default;
DeformConv2d::DeformConv2d(DeformConv2d&&) noexcept = default;
DeformConv2d& DeformConv2d::operator=(DeformConv2d&&) noexcept = default;

int64_t DeformConv2d::in_channels() const { return impl_->cin; }
int64_t DeformConv2d::out_channels() const { return impl_->cout; }

Shape DeformConv2d::output_shape(const Shape& x) const {
  const Impl& s = *impl_;
  if (x.size() != 4 || x[3] != s.cin) {
    throw Error(ErrorKind::kInvalidInput, "input x has shape " + shape_str(x))
        .where("deform_conv2d")
        .expected("[N, H, W, " + std::to_string(s.cin) + "]");
  }
  const int64_t ho = (x[1] + 2 * s.pad - (s.dil * (s.kh - 1) + 1)) / s.stride + 1;
  const int64_t wo = (x[2] + 2 * s.pad - (s.dil * (s.kw - 1) + 1)) / s.stride + 1;
  if (x[1] < 1 || x[2] < 1 || ho < 1 || wo < 1) {
    throw Error(ErrorKind::kInvalidInput, "input x of shape " + shape_str(x) + " leaves no output pixel")
        .where("deform_conv2d")
        .expected("H, W >= 1 and large enough for the dilated kernel");
  }
  return {x[0], ho, wo, s.cout};
}

void DeformConv2d::run(const Tensor& x, const Tensor& offset_mask, Tensor& y, ThreadPool& pool) const {
  const Impl& s = *impl_;
  if (!x.defined()) bad_tensor("deform_conv2d", x, "input x", "f32 [N, H, W, Cin]");
  const Shape y_shape = output_shape(x.shape());
  // x is f32, or bf16 in bf16 precision (sampled from its bf16 values, widened exactly).
  const bool bf16_in = s.bf16 && x.dtype() == DType::kBF16;
  expect_host_shape("deform_conv2d", x, "input x", bf16_in ? DType::kBF16 : DType::kF32, x.shape());
  const int64_t taps = s.kh * s.kw;
  expect_f32_shape("deform_conv2d", offset_mask, "offset_mask", {y_shape[0], y_shape[1], y_shape[2], 3 * taps});
  const bool bf16_out = s.bf16 && y.defined() && y.dtype() == DType::kBF16;
  const DType y_dtype = bf16_out ? DType::kBF16 : DType::kF32;
  expect_host_shape("deform_conv2d", y, "output y", y_dtype, y_shape);
  const size_t y_es = dtype_size(y_dtype);
  const int64_t rows = y_shape[0] * y_shape[1] * y_shape[2];
  if (rows == 0) return;
  const int64_t row_len = taps * s.cin;
  const DType col_dtype = s.bf16 ? DType::kBF16 : DType::kF32;
  // Equal tiles under the budget, so there are at most two tile heights. When the budget holds
  // kRowQuantum rows or more, a tile is a multiple of it and the last tile is padded up to one
  // (zero rows, into a scratch output; still within the budget): oneDNN 2.6's AMX matmul runs
  // some row counts at a third of its rate (base layer4's K 4608, N 512 on the AMX Xeon, 2
  // threads: 870 rows 7.1 ms and 636 rows 8.9 ms, against 896 rows 2.6 and 768 rows 2.3), while
  // every multiple of 128 measured ran at full rate.
  constexpr int64_t kRowQuantum = 128;
  const int64_t budget_rows = std::max<int64_t>(1, static_cast<int64_t>(s.col_budget / dtype_size(col_dtype)) / row_len);
  int64_t tiles = (rows + budget_rows - 1) / budget_rows;
  int64_t tile = (rows + tiles - 1) / tiles;
  // (RowGemm runs any row count alike: no padded tile for it.)
  const bool quantized = !s.row_gemm && rows > kRowQuantum && budget_rows >= kRowQuantum;
  if (quantized) {
    tile = std::max(kRowQuantum, tile / kRowQuantum * kRowQuantum);  // <= budget_rows
    tiles = (rows + tile - 1) / tile;
  }
  const int64_t last = rows - (tiles - 1) * tile;
  const int64_t last_padded = quantized ? std::min(tile, (last + kRowQuantum - 1) / kRowQuantum * kRowQuantum) : last;

  std::lock_guard<std::mutex> lock(s.mu);
  // The taps' tables, made again only when the map's shape changes (a replay allocates nothing).
  if (s.taps.h != x.size(1) || s.taps.w != x.size(2) || s.taps.taps != taps)
    s.taps = deform_conv2d_detail::tap_geometry(x.size(1), x.size(2), s.cin, s.kh, s.kw, s.stride, s.pad, s.dil);
  const Geometry g{x.size(0), x.size(1), x.size(2), s.cin, y_shape[1], y_shape[2], s.kh, s.kw, &s.taps};
  if (!s.scratch.defined() || s.scratch.dtype() != col_dtype || s.scratch.numel() < tile * row_len) {
    s.scratch = Tensor::empty({tile * row_len}, col_dtype);
  }
  if (last_padded != last &&
      (!s.tail_out.defined() || s.tail_out.dtype() != y_dtype || s.tail_out.numel() < last_padded * s.cout)) {
    s.tail_out = Tensor::empty({last_padded * s.cout}, y_dtype);
  }
  const void* xp = x.raw_data();
  const float* om = offset_mask.data<float>();
  void* col = s.scratch.raw_data();
  auto* yp = static_cast<char*>(y.raw_data());
  try {
    dnnl::stream& st = stream();
    for (int64_t p0 = 0; p0 < rows; p0 += tile) {
      const int64_t m = std::min(tile, rows - p0);
      const bool padded = m == last && last_padded != last;
      pool.parallel_for(m, 8, [&](int64_t b, int64_t e) {
        if (bf16_in) {
          sample_rows(g, static_cast<const uint16_t*>(xp), om, static_cast<uint16_t*>(col), p0, p0 + b, p0 + e);
        } else if (s.bf16) {
          sample_rows(g, static_cast<const float*>(xp), om, static_cast<uint16_t*>(col), p0, p0 + b, p0 + e);
        } else {
          sample_rows(g, static_cast<const float*>(xp), om, static_cast<float*>(col), p0, p0 + b, p0 + e);
        }
      });
      if (padded) {
        std::memset(static_cast<char*>(col) + m * row_len * dtype_size(col_dtype), 0,
                    static_cast<size_t>((last_padded - m) * row_len) * dtype_size(col_dtype));
      }
      if (s.row_gemm) {  // f32: each pixel's row alone, whatever the tile height
        s.row_gemm->run(static_cast<const float*>(col), m, reinterpret_cast<float*>(yp + static_cast<size_t>(p0 * s.cout) * y_es), &pool);
        continue;
      }
      const Impl::Matmul& mm = s.matmul_for(padded ? last_padded : m, bf16_out);
      bind(mm.src, col);
      bind(mm.dst, padded ? s.tail_out.raw_data() : yp + static_cast<size_t>(p0 * s.cout) * y_es);
      const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mm.src.get()},
                                      {DNNL_ARG_WEIGHTS, mm.weights.get()},
                                      {DNNL_ARG_DST, mm.dst.get()},
                                      {DNNL_ARG_SCRATCHPAD, mm.scratchpad.get()},
                                      {DNNL_ARG_BIAS, mm.bias ? mm.bias.get() : nullptr}};
      execute(mm.prim, st, std::span(args, mm.bias ? 5 : 4));
      st.wait();
      if (padded) std::memcpy(yp + static_cast<size_t>(p0 * s.cout) * y_es, s.tail_out.raw_data(), static_cast<size_t>(m * s.cout) * y_es);
    }
  } catch (const dnnl::error& e) {
    throw Error(ErrorKind::kInternal, std::string("oneDNN matmul failed: ") + e.what()).where("deform_conv2d");
  }
}

void deform_conv2d_reference(const Tensor& x, const Tensor& offset_mask, const Tensor& weight_oihw,
                             const Tensor* bias, int stride, int pad, int dilation, Tensor& y) {
  // Shape checks are the optimized path's; the kernel itself stays in plain loops below.
  const DeformConv2d shape_only(weight_oihw, bias, stride, pad, dilation);
  if (!x.defined()) bad_tensor("deform_conv2d", x, "input x", "f32 [N, H, W, Cin]");
  const Shape ys = shape_only.output_shape(x.shape());
  const int64_t cout = weight_oihw.size(0), cin = weight_oihw.size(1), kh = weight_oihw.size(2),
                kw = weight_oihw.size(3), taps = kh * kw;
  expect_f32_shape("deform_conv2d", x, "input x", x.shape());
  expect_f32_shape("deform_conv2d", offset_mask, "offset_mask", {ys[0], ys[1], ys[2], 3 * taps});
  expect_f32_shape("deform_conv2d", y, "output y", ys);
  const Tensor w = weight_oihw.contiguous();
  const float* wp = w.data<float>();
  const Tensor b = bias ? bias->contiguous() : Tensor();
  const float* bp = bias ? b.data<float>() : nullptr;
  const int64_t H = x.size(1), W = x.size(2);
  const float* xp = x.data<float>();
  const float* om = offset_mask.data<float>();
  float* yp = y.data<float>();
  std::vector<float> sample(static_cast<size_t>(taps * cin));
  for (int64_t n = 0; n < ys[0]; ++n) {
    const float* xn = xp + n * H * W * cin;
    auto at = [&](int64_t yy, int64_t xx, int64_t c) { return xn[(yy * W + xx) * cin + c]; };
    for (int64_t ho = 0; ho < ys[1]; ++ho) {
      for (int64_t wo = 0; wo < ys[2]; ++wo) {
        const float* o = om + ((n * ys[1] + ho) * ys[2] + wo) * 3 * taps;
        for (int64_t i = 0; i < kh; ++i) {
          for (int64_t j = 0; j < kw; ++j) {
            const int64_t t = i * kw + j;
            const float h_im = static_cast<float>(ho * stride - pad + i * dilation) + o[2 * t];
            const float w_im = static_cast<float>(wo * stride - pad + j * dilation) + o[2 * t + 1];
            const float mask = 1.0f / (1.0f + std::exp(-o[2 * taps + t]));
            for (int64_t c = 0; c < cin; ++c) {
              float val = 0.0f;
              if (h_im > -1 && w_im > -1 && h_im < static_cast<float>(H) && w_im < static_cast<float>(W)) {
                const int64_t h_low = static_cast<int64_t>(std::floor(h_im));
                const int64_t w_low = static_cast<int64_t>(std::floor(w_im));
                const int64_t h_high = h_low + 1, w_high = w_low + 1;
                const float lh = h_im - static_cast<float>(h_low), lw = w_im - static_cast<float>(w_low);
                const float hh = 1 - lh, hw = 1 - lw;
                const float v1 = (h_low >= 0 && w_low >= 0) ? at(h_low, w_low, c) : 0.0f;
                const float v2 = (h_low >= 0 && w_high <= W - 1) ? at(h_low, w_high, c) : 0.0f;
                const float v3 = (h_high <= H - 1 && w_low >= 0) ? at(h_high, w_low, c) : 0.0f;
                const float v4 = (h_high <= H - 1 && w_high <= W - 1) ? at(h_high, w_high, c) : 0.0f;
                val = hh * hw * v1 + hh * lw * v2 + lh * hw * v3 + lh * lw * v4;
              }
              sample[static_cast<size_t>(t * cin + c)] = val * mask;
            }
          }
        }
        float* yo = yp + ((n * ys[1] + ho) * ys[2] + wo) * cout;
        for (int64_t co = 0; co < cout; ++co) {
          double acc = bp ? bp[co] : 0.0;
          for (int64_t c = 0; c < cin; ++c) {
            for (int64_t t = 0; t < taps; ++t) {
              acc += static_cast<double>(sample[static_cast<size_t>(t * cin + c)]) * wp[(co * cin + c) * taps + t];
            }
          }
          yo[co] = static_cast<float>(acc);
        }
      }
    }
  }
}

}  // namespace bev::cpu
