// f16 / bf16 conversions against the CPU's own F16C conversions and an exact double-based rounding.
// (F16C, not the compiler's _Float16: clang 14, which builds the sanitizer and fuzz trees, has no
// _Float16 on x86 without AVX512-FP16; every x86-64 CPU this engine runs on has F16C.)
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"

namespace bev {
namespace {

// (The vector forms: clang's scalar _cvtss_sh is a C99 compound literal, an error under -Wpedantic.)
__attribute__((target("f16c"))) float f16c_to_float(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
__attribute__((target("f16c"))) uint16_t f16c_from_float(float f) {
  return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)) & 0xFFFF);
}

TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    const float ref = f16c_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(ref)) << h;
      ASSERT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << h;
      continue;
    }
    ASSERT_EQ(float_bits(f), float_bits(ref)) << "half bits " << h;
    ASSERT_EQ(float_to_half(f), h) << "half bits " << h;
  }
}

TEST(Half, RandomFloatsRoundLikeTheCpu) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    // Mix raw bit patterns (all exponents) with values near the half range edges.
    const uint32_t u = bits(rng);
    const float f = (i % 2) ? bits_float(u) : std::ldexp(bits_float((u & 0x807fffffu) | 0x3f800000u), (i / 2) % 50 - 30);
    const uint16_t rb = f16c_from_float(f);
    const uint16_t got = float_to_half(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7c00u, 0x7c00u);
      ASSERT_NE(got & 0x03ffu, 0u);
      continue;
    }
    ASSERT_EQ(got, rb) << "float bits 0x" << std::hex << float_bits(f);
  }
}

TEST(Half, Specials) {
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // tie rounds to even: infinity
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
}

// Exact bf16 round-to-nearest-even computed with doubles: the two neighbours and their midpoint.
uint16_t bf16_reference(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  const double a = bf16_to_float(lo);
  const double b = bf16_to_float(static_cast<uint16_t>(lo + 1));
  const double mid = (a + b) / 2;
  const double x = f;
  if (std::isinf(b)) {  // lo is the largest finite magnitude; its upper neighbour is infinity
    const double step = std::fabs(a - static_cast<double>(bf16_to_float(static_cast<uint16_t>(lo - 1))));
    const double m = std::fabs(a) + step / 2;
    if (std::fabs(x) < m) return lo;
    if (std::fabs(x) > m) return static_cast<uint16_t>(lo + 1);
    return (lo & 1) ? static_cast<uint16_t>(lo + 1) : lo;
  }
  if ((x > mid) == (b > a) && x != mid) return static_cast<uint16_t>(lo + 1);
  if (x == mid) return (lo & 1) ? static_cast<uint16_t>(lo + 1) : lo;
  return lo;
}

TEST(BFloat16, RandomFloatsRoundToNearestEven) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = bits(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = bits_float(u);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), bf16_reference(f)) << "float bits 0x" << std::hex << u;
  }
}

TEST(BFloat16, SpecialsAndRoundTrip) {
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(3.3895314e38f), 0x7f7f);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  // A NaN whose payload sits only in the dropped bits must stay NaN, not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(0x7f800001u)))));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), h);
    }
  }
}

// The array conversion (16 lanes at a time where AVX-512BW is present) gives float_to_bf16's bits,
// at every length's tail, on ties, specials and NaN with payload only in the dropped bits.
TEST(BFloat16, ArrayConversionMatchesScalar) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) {
    uint32_t u = bits(rng);
    if (i % 5 == 0) u = (u & 0xffff0000u) | 0x8000u;
    src[i] = bits_float(u);
  }
  src[3] = bits_float(0x7f800001u);
  src[4] = std::numeric_limits<float>::infinity();
  src[5] = std::numeric_limits<float>::max();
  src[6] = -0.0f;
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}}) {
    std::vector<uint16_t> got(n + 1, 0xabcd);
    float_to_bf16_n(src.data(), got.data(), n);
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(src[i])) {
        ASSERT_TRUE(std::isnan(bf16_to_float(got[i]))) << i;
      } else {
        ASSERT_EQ(got[i], float_to_bf16(src[i])) << "n " << n << " element " << i;
      }
    }
    ASSERT_EQ(got[n], 0xabcd) << "wrote past " << n;
  }
}

}  // namespace
}  // namespace bev
