#include "core/half.h"

#include "core/cpu_features.h"

namespace bev {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // Inf or NaN: keep the payload
    return bits_float(sign | 0x7f800000u | (mant << 13));
  }
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal half: normalize into a float32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_float(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13));
  }
  return bits_float(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520 -> Inf (also Inf itself)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Value in units of 2^-24, rounded to nearest even. abs < 2^-25 rounds to 0 (ties to even 0).
    const uint32_t exp = abs >> 23;
    if (exp < 102) return sign;  // < 2^-25: too small even to round up
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (127 - 15) ... aligns to 2^-24 units
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t v = abs - (static_cast<uint32_t>(127 - 15) << 23);
  v += 0x0fffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

void half_to_float_n(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void float_to_half_n(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

void bf16_to_float_n(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

namespace {

__attribute__((target("avx512f,avx512bw,avx512vl"))) void float_to_bf16_avx512(const float* src, uint16_t* dst,
                                                                              size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm256_mask_storeu_epi16(dst + i, m, float_to_bf16_x16(_mm512_maskz_loadu_ps(m, src + i)));
  }
}

}  // namespace

void float_to_bf16_n(const float* src, uint16_t* dst, size_t n) {
  if (cpu_features::has(cpu_features::Isa::kAvx512)) return float_to_bf16_avx512(src, dst, n);
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace bev
