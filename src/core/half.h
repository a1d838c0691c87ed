// IEEE binary16 and bfloat16 <-> float32, round to nearest even; NaN stays NaN (quiet, sign kept),
// infinities stay infinite, float32 subnormals and f16 subnormals are handled exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace bev {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// An element of a kernel templated on its value type (f32, or bf16 as uint16_t) as f32, exactly.
inline float widen(float v) { return v; }
inline float widen(uint16_t bf16) { return bf16_to_float(bf16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and the top payload bits, force quiet so truncation can't make it Inf.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

// float_to_bf16 on 16 lanes, for kernels that round in registers (callers check AVX-512BW and VL
// at run time; the build has no -march). The maskz spellings: GCC 12's plain shifts and narrowing
// trip -Wmaybe-uninitialized.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m256i float_to_bf16_x16(__m512 x) {
  const __m512i sixteen = _mm512_set1_epi32(16);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srlv_epi32(0xFFFF, u, sixteen), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  return _mm512_maskz_cvtepi32_epi16(0xFFFF, _mm512_maskz_srlv_epi32(0xFFFF, r, sixteen));
}

// bf16_to_float on 16 lanes (exact: a bf16's bits are the top half of its f32's). AVX-512F only,
// so any AVX-512 kernel may inline it. The maskz spellings: GCC 12's plain forms trip
// -Wmaybe-uninitialized.
__attribute__((target("avx512f"))) inline __m512 bf16_to_float_x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

void half_to_float_n(const uint16_t* src, float* dst, size_t n);
void float_to_half_n(const float* src, uint16_t* dst, size_t n);
void bf16_to_float_n(const uint16_t* src, float* dst, size_t n);
void float_to_bf16_n(const float* src, uint16_t* dst, size_t n);

}  // namespace bev
