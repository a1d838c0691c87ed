// AVX-512 helpers shared by the row kernels (elementwise.cpp), the fused attention
// (attention_amx.cpp), MSDA and DCNv2: what the CPU runs, masks, interleaved pairs split,
// horizontal reductions, a row's max, and exp.
// Callers check the CPU at run time (the build has no -march; has_f() and the rest below); each
// helper carries its own target.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "core/cpu_features.h"

namespace bev::cpu::avx512 {

// What this CPU runs now (core/cpu_features.h: the CPU's flags under ONEDNN_MAX_CPU_ISA and a
// test's cap), asked at each call: the row kernels, DCNv2's sampling, the direct 1x1 and the max
// pool dispatch on these (MSDA has its own ISA choice, msda_isa_supported). AVX-512 means F, BW,
// VL and DQ together (oneDNN's avx512_core): every AVX-512 CPU since Skylake-SP has all four.
inline bool has_f() { return cpu_features::has(cpu_features::Isa::kAvx512); }
// BW with VL: 16-bit lanes (bf16, u8 codes) and the masked 256/128-bit forms.
inline bool has_bw() { return has_f(); }
// AVX512-BF16: the CPU rounds f32 to bf16 itself (vcvtne2ps2bf16).
inline bool has_bf16() { return cpu_features::has(cpu_features::Isa::kAvx512Bf16); }

inline __mmask16 tail_mask(int64_t left) { return static_cast<__mmask16>((1u << left) - 1u); }
// The first `count` of 16 lanes, any count: none at or below 0, all at 16 or more.
inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : static_cast<__mmask16>((1u << count) - 1u);
}

// Up to 16 interleaved pairs (a0, b0, a1, b1, ...) at p split into their first and second
// members; only the first `count` pairs are read (the other lanes are 0), so a tail never reads
// past them. MSDA's sampling locations (x, y) and DCNv2's offsets (dy, dx) come this way.
__attribute__((target("avx512f"))) inline void load_pairs16(const float* p, int64_t count, __m512& first, __m512& second) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 a = _mm512_maskz_loadu_ps(first_lanes(2 * count), p);
  const __m512 b = _mm512_maskz_loadu_ps(first_lanes(2 * count - 16), p + 16);
  first = _mm512_permutex2var_ps(a, even, b);
  second = _mm512_permutex2var_ps(a, odd, b);
}

// GCC 12's _mm512_reduce_*_ps and _mm512_max_ps expand to _mm512_undefined_ps(), which trips
// -Wmaybe-uninitialized (fixed in GCC 13); these spell the same operations without it.
__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float s = 0.0f;
  for (float e : t) s += e;
  return s;
}
__attribute__((target("avx512f"))) inline float hmax16(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  float m = t[0];
  for (float e : t) m = e > m ? e : m;
  return m;
}
__attribute__((target("avx512f"))) inline __m512 max16(__m512 a, __m512 b) {
  return _mm512_mask_max_ps(b, static_cast<__mmask16>(0xFFFF), a, b);
}

// exp on 16 lanes of v in [-104, 89] (Cephes expf: n = round(v / ln 2), r = v - n ln 2 in two
// parts, degree-6 polynomial, times 2^n by scalef), within ~2 ulp of libm's expf. NaN lanes stay
// NaN. Scalar expf dominated softmax (~4 ns per element); this is ~10x cheaper.
__attribute__((target("avx512f"))) inline __m512 exp16_clamped(__m512 v) {
  const __mmask16 all = 0xFFFF;
  const __m512 n = _mm512_mask_roundscale_ps(v, all, _mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

// exp of any x: clamped so that -inf gives 0 and +inf gives inf; NaN lanes stay NaN.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __mmask16 all = 0xFFFF;
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 v = _mm512_mask_min_ps(x, all, x, _mm512_set1_ps(89.0f));
  v = _mm512_mask_max_ps(v, all, v, _mm512_set1_ps(-104.0f));
  return _mm512_mask_blend_ps(nan, exp16_clamped(v), x);
}

// exp(x) for x <= 0 or NaN, softmax's x - max: exp16 without its overflow clamp and NaN blend.
// _mm512_max_ps returns its second operand when either is NaN, so x goes second and a NaN lane
// stays NaN through the polynomial; -inf (a -inf score under a finite max, or any score under a
// +inf max) is clamped to -104, whose exp is 0 in f32, as exp16's.
__attribute__((target("avx512f"))) inline __m512 exp16_nonpositive(__m512 x) {
  return exp16_clamped(_mm512_mask_max_ps(x, static_cast<__mmask16>(0xFFFF), _mm512_set1_ps(-104.0f), x));
}

// exp for numerators that are rounded to bf16 next (the AMX attention): within ~4 ulp of expf
// (2.4e-7 relative, measured over the reduced range; a bf16 keeps 2^-9), for x <= 88, -inf and
// NaN as exp16_nonpositive. Shorter than exp16 in both uops and latency, which bound the
// numerators' loop: n by the round-to-nearest of adding 1.5 * 2^23 (instead of a 2-uop
// roundscale), and a degree-5 minimax polynomial evaluated by Estrin's scheme (instead of
// Cephes's degree 7 by Horner).
__attribute__((target("avx512f"))) inline __m512 exp16_bf16_grade(__m512 x) {
  const __mmask16 all = 0xFFFF;
  const __m512 magic = _mm512_set1_ps(12582912.0f);  // 1.5 * 2^23
  const __m512 v = _mm512_mask_max_ps(x, all, _mm512_set1_ps(-104.0f), x);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 a = _mm512_fmadd_ps(_mm512_set1_ps(0.16667114198207855f), r, _mm512_set1_ps(0.499992311000824f));
  const __m512 b = _mm512_fmadd_ps(_mm512_set1_ps(0.008312524296343327f), r, _mm512_set1_ps(0.041890114545822144f));
  const __m512 r4 = _mm512_mul_ps(r2, r2);
  const __m512 p = _mm512_fmadd_ps(r4, b, _mm512_fmadd_ps(r2, a, _mm512_add_ps(r, _mm512_set1_ps(1.0f))));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

// A row's max over `full` whole vectors and a `tm` tail; NaN when the row holds one (as PyTorch:
// NaN anywhere poisons the softmax row). _mm512_max_ps drops a NaN in its first operand, so the
// NaN is detected apart.
__attribute__((target("avx512f"))) inline float row_max_avx512(const float* xr, int64_t full, __mmask16 tm) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = ninf;
  __mmask16 nan = 0;
  for (int64_t c = 0; c < full; c += 16) {
    const __m512 v = _mm512_loadu_ps(xr + c);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = max16(v, m);
  }
  if (tm) {
    const __m512 v = _mm512_mask_loadu_ps(ninf, tm, xr + full);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = max16(v, m);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : hmax16(m);
}

}  // namespace bev::cpu::avx512
