// cpu::Conv2dInt8 against a plain integer reference: the products of the integer input and the
// quantized weights summed exactly (int64), then scaled, biased, residual added and ReLU'd in
// double. The kernel accumulates in s32 exactly too (inputs here keep |sum| < 2^31), so its only
// errors are f32 roundings after the sum: the accumulator to f32, the per-channel scale, the bias
// divided by it and added, the product, the residual. Each is at most u = 2^-24 of a term bounded
// by S = act_scale * w_scale[o] * sum|q_x q_w| + |b| + |r|, so |y - ref| <= 6 u S whatever K is
// (a dropped product shows up as ~1/K of S, far above). Observed maxima are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/conv2d_int8.h"
#include "backend/cpu/onednn.h"
#include "error_test_util.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

namespace bev::cpu {
namespace {

using kernel_test::random_tensor;
using kernel_test::ThreadsGuard;

// Integers over the whole range of `dtype` (u8: 0..255, i8: -128..127), as a tensor of that dtype.
Tensor random_ints(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_int_distribution<int> dist(dtype == DType::kU8 ? 0 : -128, dtype == DType::kU8 ? 255 : 127);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kU8) {
      t.data<uint8_t>()[i] = static_cast<uint8_t>(dist(rng));
    } else {
      t.data<int8_t>()[i] = static_cast<int8_t>(dist(rng));
    }
  }
  return t;
}

int64_t int_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kU8 ? t.data<uint8_t>()[i] : t.data<int8_t>()[i];
}

// The worst |y - ref| / S over all outputs (see the file comment).
double worst_error(const Tensor& qx, const Conv2dInt8& conv, const Tensor& qw, const Tensor* b, const Conv2dAttrs& a,
                   const Tensor* residual, const Tensor& y) {
  const int64_t n = qx.size(0), h = qx.size(1), wd = qx.size(2), c = qx.size(3);
  const int64_t o = qw.size(0), cg = qw.size(1), kh = qw.size(2), kw = qw.size(3);
  const int64_t og = o / a.groups;
  const int64_t ho = y.size(1), wo = y.size(2);
  const float* ws = conv.weight_scales().data<float>();
  double worst = 0;
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow)
        for (int64_t oc = 0; oc < o; ++oc) {
          const int64_t g = oc / og;
          int64_t acc = 0, mag = 0;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dilation_h;
                const int64_t iw = ow * a.stride_w - a.pad_w + j * a.dilation_w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const int64_t p = int_at(qx, ((in * h + ih) * wd + iw) * c + g * cg + ic) *
                                  static_cast<int64_t>(qw.data<int8_t>()[((oc * cg + ic) * kh + i) * kw + j]);
                acc += p;
                mag += p < 0 ? -p : p;
              }
          const double scale = static_cast<double>(conv.act_scale()) * ws[oc];
          double ref = scale * static_cast<double>(acc), s = scale * static_cast<double>(mag);
          const int64_t at = ((in * ho + oh) * wo + ow) * o + oc;
          if (b) {
            ref += b->data<float>()[oc];
            s += std::fabs(b->data<float>()[oc]);
          }
          if (residual) {
            ref += residual->data<float>()[at];
            s += std::fabs(residual->data<float>()[at]);
          }
          if (a.relu) ref = std::max(ref, 0.0);
          worst = std::max(worst, std::fabs(y.data<float>()[at] - ref) / std::max(s, 1e-30));
        }
  return worst;
}

TEST(Conv2dInt8, QuantizeWeightsPerChannel) {
  Tensor w = random_tensor({4, 3, 3, 3}, 3u, -2.0f, 2.0f);
  for (int64_t i = 0; i < 27; ++i) w.data<float>()[2 * 27 + i] = 0.0f;  // an all-zero channel
  w.data<float>()[5] = 7.5f;                                            // one large weight in channel 0
  Tensor scales;
  const Tensor q = Conv2dInt8::quantize_weights(w, &scales);
  ASSERT_EQ(q.dtype(), DType::kI8);
  for (int64_t o = 0; o < 4; ++o) {
    const float s = scales.data<float>()[o];
    int m = 0;
    for (int64_t i = 0; i < 27; ++i) {
      const int v = q.data<int8_t>()[o * 27 + i];
      m = std::max(m, std::abs(v));
      EXPECT_LE(std::fabs(v * s - w.data<float>()[o * 27 + i]), s / 2 * (1 + 1e-6)) << o << " " << i;
    }
    EXPECT_EQ(m, o == 2 ? 0 : 127) << "channel " << o;
  }
  EXPECT_EQ(scales.data<float>()[2], 1.0f);
  EXPECT_FLOAT_EQ(scales.data<float>()[0], 7.5f / 127);
  Tensor bad = w.clone();
  bad.data<float>()[3] = NAN;
  test::expect_invalid_input([&] { Conv2dInt8::quantize_weights(bad, nullptr); }, "not finite");
}

TEST(Conv2dInt8, QuantizeActivationsRoundsToEvenAndSaturates) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  const float s = 1.0f / 64;  // k/128 are ties exactly
  std::vector<float> xs;
  for (int k = -300; k <= 300; ++k) xs.push_back(static_cast<float>(k) / 128);  // ties and integers
  for (float v : {255.4f * s, 255.6f * s, 300.0f * s, -1e6f, 1e6f, -0.3f * s}) xs.push_back(v);
  const Tensor x = Tensor::from_floats({1, 1, 1, static_cast<int64_t>(xs.size())}, xs);
  for (const DType act : {DType::kU8, DType::kI8}) {
    const Conv2dInt8 conv(random_tensor({1, static_cast<int64_t>(xs.size()), 1, 1}, 5u), nullptr, {}, act, s);
    Tensor q = Tensor::empty(x.shape(), act);
    conv.quantize(x, q);
    const float lo = act == DType::kU8 ? 0 : -128, hi = act == DType::kU8 ? 255 : 127;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = std::clamp(std::nearbyint(xs[i] * (1.0f / s)), lo, hi);
      EXPECT_EQ(static_cast<float>(int_at(q, static_cast<int64_t>(i))), want) << dtype_name(act) << " x = " << xs[i];
    }
  }
}

struct Case {
  std::string name;
  int64_t n, c, h, w, o, k;
  Conv2dAttrs attrs;
  bool bias, residual_in_place, residual_apart;
};

class Conv2dInt8Cases : public ::testing::TestWithParam<DType> {};

TEST_P(Conv2dInt8Cases, MatchesTheIntegerReference) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  const DType act = GetParam();
  auto attrs = [](int s, int p, int d, int g, bool relu, bool res) {
    Conv2dAttrs a;
    a.stride_h = a.stride_w = s;
    a.pad_h = a.pad_w = p;
    a.dilation_h = a.dilation_w = d;
    a.groups = g;
    a.relu = relu;
    a.residual = res;
    return a;
  };
  Conv2dAttrs odd = attrs(1, 0, 1, 1, false, false);
  odd.stride_h = 2;
  odd.pad_w = 2;
  odd.dilation_w = 2;
  const std::vector<Case> cases = {
      {"C3 -> O5 3x3", 1, 3, 9, 11, 5, 3, attrs(1, 1, 1, 1, false, false), true, false, false},
      {"C17 -> O17 3x3 relu", 2, 17, 7, 13, 17, 3, attrs(1, 1, 1, 1, true, false), true, false, false},
      {"stem 7x7/2", 1, 3, 29, 37, 16, 7, attrs(2, 3, 1, 1, true, false), true, false, false},
      {"1x1 on 1x1 maps", 3, 64, 1, 1, 48, 1, attrs(1, 0, 1, 1, false, false), false, false, false},
      {"s2 on 15x25", 1, 24, 15, 25, 40, 3, attrs(2, 1, 1, 1, true, false), true, false, false},
      {"1x1/2 on 29x50", 1, 32, 29, 50, 64, 1, attrs(2, 0, 1, 1, false, false), true, false, false},
      {"dilation 2", 1, 16, 12, 14, 16, 3, attrs(1, 2, 2, 1, true, false), true, false, false},
      {"groups 4", 1, 32, 10, 12, 32, 3, attrs(1, 1, 1, 4, false, false), true, false, false},
      {"depthwise", 1, 16, 9, 9, 16, 3, attrs(1, 1, 1, 16, true, false), true, false, false},
      {"s(2,1) p(0,2) d(1,2)", 1, 8, 11, 15, 12, 3, odd, true, false, false},
      {"1x1 + residual in place + relu", 2, 64, 8, 10, 256, 1, attrs(1, 0, 1, 1, true, true), true, true, false},
      {"3x3 + residual apart", 1, 32, 8, 9, 32, 3, attrs(1, 1, 1, 1, false, true), false, false, true},
      {"3x3 C512 (sums past 2^24)", 1, 512, 6, 7, 24, 3, attrs(1, 1, 1, 1, false, false), true, false, false},
  };
  std::mt19937 rng(2026);
  for (const int threads : {1, 2}) {
    ThreadsGuard guard(threads);
    for (const Case& cs : cases) {
      const std::string what = cs.name + ", " + dtype_name(act) + ", " + std::to_string(threads) + " threads";
      const Tensor w = random_tensor({cs.o, cs.c / cs.attrs.groups, cs.k, cs.k}, rng, -0.5f, 0.5f);
      const Tensor b = random_tensor({cs.o}, rng, -3.0f, 3.0f);
      const float act_scale = 0.0371f;
      const Conv2dInt8 conv(w, cs.bias ? &b : nullptr, cs.attrs, act, act_scale);
      const Tensor qx = random_ints({cs.n, cs.h, cs.w, cs.c}, act, rng);
      const Shape out = conv.output_shape(qx.shape());
      Tensor y = Tensor::empty(out, DType::kF32);
      Tensor residual;
      if (cs.attrs.residual) residual = random_tensor(out, rng, -4.0f, 4.0f);
      if (cs.residual_in_place) y = residual.clone();
      Tensor scales;
      const Tensor qw = Conv2dInt8::quantize_weights(w, &scales);
      conv.run(qx, cs.attrs.residual ? (cs.residual_in_place ? &y : &residual) : nullptr, y);
      const double err = worst_error(qx, conv, qw, cs.bias ? &b : nullptr, cs.attrs, cs.attrs.residual ? &residual : nullptr, y);
      std::printf("  %-36s %-5s %d thr  %-26s err/S %.2e\n", cs.name.c_str(), dtype_name(act), threads,
                  conv.impl_name(qx.shape()).c_str(), err);
      EXPECT_LE(err, 6.0 / (1 << 24)) << what;
    }
  }
}

// The codes q of the f32 output y at `step`: saturate(nearbyint(y / step)) over u8 or s8, one
// off only within 1e-4 of a tie (the f32 roundings before the code, as the test below says).
// Returns how many values saturated.
int64_t expect_codes_of(const Tensor& y, const Tensor& q, float step, const std::string& what) {
  const bool u8 = q.dtype() == DType::kU8;
  const double lo = u8 ? 0.0 : -128.0, hi = u8 ? 255.0 : 127.0;
  int64_t exact = 0, saturated = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double v = y.data<float>()[i] / static_cast<double>(step);
    const double want = std::clamp(std::nearbyint(v), lo, hi);
    const int64_t got = int_at(q, i);
    saturated += v > hi + 0.5 || v < lo - 0.5;
    if (got == want) {
      ++exact;
    } else {
      EXPECT_LE(std::fabs(static_cast<double>(got) - want), 1) << what << " at " << i;
      EXPECT_LE(std::fabs(v - std::floor(v) - 0.5), 1e-4) << what << ": code " << got << " for y / step = " << v;
    }
  }
  EXPECT_GT(exact, y.numel() * 99 / 100) << what;
  return saturated;
}

// A u8 output (int8_out_step: the next conv's input step) holds the codes of the f32 output:
// saturate(nearbyint(y / out_step)). The f32 roundings before the code (6 u S, as above) can move
// a value across a rounding boundary, so a code may be one off where y / out_step lies within
// 6 u S / out_step of a half-integer; anywhere else it must be exact.
TEST(Conv2dInt8, U8OutputsAreTheCodesOfTheF32Output) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  std::mt19937 rng(7);
  Conv2dAttrs a;
  a.pad_h = a.pad_w = 1;
  a.stride_h = 2;
  a.relu = true;
  const Tensor w = random_tensor({37, 19, 3, 3}, rng, -0.5f, 0.5f);
  const Tensor b = random_tensor({37}, rng, -3.0f, 3.0f);
  const Tensor qx = random_ints({2, 11, 13, 19}, DType::kU8, rng);
  const Conv2dInt8 f32_out(w, &b, a, DType::kU8, 0.0371f);
  Conv2dAttrs au8 = a;
  au8.int8_out_step = 0.173f;  // codes past 255 too: saturation
  const Conv2dInt8 u8_out(w, &b, au8, DType::kU8, 0.0371f);
  EXPECT_EQ(u8_out.out(), DType::kU8);
  const Shape out = f32_out.output_shape(qx.shape());
  Tensor y = Tensor::empty(out, DType::kF32), q = Tensor::empty(out, DType::kU8);
  for (const int threads : {1, 2}) {
    ThreadsGuard guard(threads);
    f32_out.run(qx, nullptr, y);
    u8_out.run(qx, nullptr, q);
    const int64_t saturated = expect_codes_of(y, q, au8.int8_out_step, std::to_string(threads) + " threads");
    std::printf("u8 output, %d thr: %lld saturated\n", threads, static_cast<long long>(saturated));
    EXPECT_GT(saturated, 0);
  }
  Conv2dAttrs no_relu = au8;
  no_relu.relu = false;
  EXPECT_EQ(Conv2dInt8(w, &b, no_relu, DType::kU8, 0.0371f).out(), DType::kI8);  // codes without a ReLU are signed
  Tensor wrong = Tensor::empty(out, DType::kF32);
  test::expect_invalid_input([&] { u8_out.run(qx, nullptr, wrong); }, "output");
}

// Codes in and out of a ResNet block in int8 precision: an s8 output without a ReLU (the
// downsample's identity), and a conv whose residual is int8 codes of another step (a block's u8
// input, the downsample's s8 output) under a u8 output, in place or apart, or under an f32 output.
// Each equals the f32-output conv run on the residual's f32 value (step x code), then coded.
TEST(Conv2dInt8, CodesInTheResidualAndTheOutput) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  std::mt19937 rng(11);
  const Tensor w = random_tensor({40, 24, 1, 1}, rng, -0.5f, 0.5f);
  const Tensor b = random_tensor({40}, rng, -3.0f, 3.0f);
  const Tensor qx = random_ints({2, 7, 9, 24}, DType::kU8, rng);
  const float act_scale = 0.0371f;
  const Shape out = {2, 7, 9, 40};

  // s8 output, no ReLU: the codes of the f32 output, negatives included.
  Conv2dAttrs plain;
  const Conv2dInt8 f32_plain(w, &b, plain, DType::kU8, act_scale);
  Conv2dAttrs s8a = plain;
  s8a.int8_out_step = 0.061f;
  const Conv2dInt8 s8_out(w, &b, s8a, DType::kU8, act_scale);
  EXPECT_EQ(s8_out.out(), DType::kI8);
  Tensor y = Tensor::empty(out, DType::kF32), q = Tensor::empty(out, DType::kI8);
  f32_plain.run(qx, nullptr, y);
  s8_out.run(qx, nullptr, q);
  EXPECT_GT(expect_codes_of(y, q, s8a.int8_out_step, "s8 output"), 0);  // both ends saturate somewhere

  Conv2dAttrs res;
  res.relu = res.residual = true;
  const Conv2dInt8 f32_res(w, &b, res, DType::kU8, act_scale);
  for (const DType res_dt : {DType::kU8, DType::kI8}) {
    const float res_step = res_dt == DType::kU8 ? 0.047f : 0.083f;
    const Tensor codes = random_ints(out, res_dt, rng);
    Tensor res_f32 = Tensor::empty(out, DType::kF32);
    for (int64_t i = 0; i < codes.numel(); ++i) res_f32.data<float>()[i] = res_step * static_cast<float>(int_at(codes, i));
    Conv2dAttrs a = res;
    a.int8_residual_step = res_step;
    a.int8_residual_unsigned = res_dt == DType::kU8;
    // The reference: the f32 output over the dequantized residual (checked against integers above).
    Tensor want = res_f32.clone();
    f32_res.run(qx, &want, want);
    for (const int threads : {1, 2}) {
      ThreadsGuard guard(threads);
      const std::string what = std::string(dtype_name(res_dt)) + " residual, " + std::to_string(threads) + " threads";
      // Under an f32 output: dequantized into the output, then summed.
      const Conv2dInt8 to_f32(w, &b, a, DType::kU8, act_scale);
      Tensor yf = Tensor::empty(out, DType::kF32);
      to_f32.run(qx, &codes, yf);
      double worst = 0;
      for (int64_t i = 0; i < yf.numel(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(yf.data<float>()[i]) - want.data<float>()[i]) /
                                    (1.0 + std::fabs(want.data<float>()[i])));
      }
      EXPECT_LE(worst, 1e-5) << what << ", f32 output";
      // Under a u8 output: in place (the output buffer holds the residual's codes) and apart.
      Conv2dAttrs au8 = a;
      au8.int8_out_step = 0.109f;
      const Conv2dInt8 to_u8(w, &b, au8, DType::kU8, act_scale);
      Tensor in_place = Tensor::empty(out, DType::kU8);
      std::memcpy(in_place.raw_data(), codes.raw_data(), codes.nbytes());
      const Tensor residual_view = Tensor::view_of(in_place.storage(), res_dt, out, in_place.strides(), 0);
      to_u8.run(qx, &residual_view, in_place);
      expect_codes_of(want, in_place, au8.int8_out_step, what + ", u8 output in place");
      Tensor apart = Tensor::empty(out, DType::kU8);
      to_u8.run(qx, &codes, apart);
      EXPECT_EQ(std::memcmp(apart.raw_data(), in_place.raw_data(), apart.nbytes()), 0) << what << ", apart";
      // An int8 residual cannot lie in an f32 output's buffer, nor an f32 one be given for codes.
      Tensor f32_view = Tensor::empty(out, DType::kF32);
      const Tensor codes_in_f32 = Tensor::view_of(f32_view.storage(), res_dt, out, contiguous_strides(out), 0);
      test::expect_invalid_input([&] { to_f32.run(qx, &codes_in_f32, f32_view); }, "residual");
      test::expect_invalid_input([&] { to_u8.run(qx, &res_f32, apart); }, "residual");
    }
  }
  Conv2dAttrs no_residual = plain;
  no_residual.int8_residual_step = 0.5f;
  test::expect_invalid_input([&] { Conv2dInt8(w, &b, no_residual, DType::kU8, act_scale); }, "without a residual");
  // An f32 residual cannot be summed from an int8 output's buffer: refused, not miscoded.
  Conv2dAttrs f32_residual = res;
  f32_residual.int8_out_step = 0.109f;
  test::expect_invalid_input([&] { Conv2dInt8(w, &b, f32_residual, DType::kU8, act_scale); }, "over an f32 residual");
  Conv2dAttrs bad_step = res;
  bad_step.int8_residual_step = -1.0f;
  test::expect_invalid_input([&] { Conv2dInt8(w, &b, bad_step, DType::kU8, act_scale); }, "int8 residual");
}

INSTANTIATE_TEST_SUITE_P(Activations, Conv2dInt8Cases, ::testing::Values(DType::kU8, DType::kI8),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// An f32 input is quantized inside run() exactly as quantize() does it: the same bits out.
TEST(Conv2dInt8, AnF32InputEqualsItsQuantizedInput) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  Conv2dAttrs a;
  a.pad_h = a.pad_w = 1;
  a.relu = true;
  const Conv2dInt8 conv(random_tensor({24, 16, 3, 3}, 7u), nullptr, a, DType::kU8, 0.02f);
  const Tensor x = random_tensor({2, 9, 10, 16}, 8u, -1.0f, 6.0f);  // negatives and values past 255 steps
  Tensor q = Tensor::empty(x.shape(), DType::kU8);
  conv.quantize(x, q);
  Tensor ya = Tensor::empty(conv.output_shape(x.shape()), DType::kF32), yb = Tensor::empty(ya.shape(), DType::kF32);
  conv.run(x, nullptr, ya);
  conv.run(q, nullptr, yb);
  EXPECT_EQ(std::memcmp(ya.raw_data(), yb.raw_data(), ya.nbytes()), 0);
}

// Floats in bf16 (the float arithmetic on AMX): a bf16 input quantizes to the codes its f32
// value does, and a bf16 output is the f32 output rounded once. A float residual that is bf16
// already adds exactly as its f32 value; int8 codes under a bf16 output are dequantized into it,
// which rounds them to bf16 first: within a bf16 step of the sum there.
TEST(Conv2dInt8, Bf16FloatsAreTheF32ResultsRounded) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  const auto rounded = [](const Tensor& t) { return t.to(DType::kBF16).to(DType::kF32); };
  const auto bits_of_rounded = [](const Tensor& f32, const Tensor& bf16) {
    const Tensor r = f32.to(DType::kBF16);
    return std::memcmp(r.raw_data(), bf16.raw_data(), static_cast<size_t>(r.nbytes())) == 0;
  };
  Conv2dAttrs a;
  a.pad_h = a.pad_w = 1;
  a.relu = true;
  a.residual = true;
  const Tensor w = random_tensor({24, 16, 3, 3}, 9u);
  const Tensor b = random_tensor({24}, 10u);
  const Tensor x = rounded(random_tensor({2, 9, 10, 16}, 11u, -1.0f, 6.0f));
  const Conv2dInt8 conv(w, &b, a, DType::kU8, 0.02f);
  const Shape out = conv.output_shape(x.shape());
  const Tensor r = rounded(random_tensor(out, 12u, -3.0f, 3.0f));
  Tensor y32 = Tensor::empty(out, DType::kF32), y16 = Tensor::empty(out, DType::kBF16);
  conv.run(x, &r, y32);
  conv.run(x.to(DType::kBF16), &r, y16);  // f32 residual under a bf16 output
  EXPECT_TRUE(bits_of_rounded(y32, y16));
  const Tensor r16 = r.to(DType::kBF16);
  conv.run(x.to(DType::kBF16), &r16, y16);  // bf16 residual
  EXPECT_TRUE(bits_of_rounded(y32, y16));
  Tensor y16_in_place = r16.clone();  // the residual is the output itself
  conv.run(x, &y16_in_place, y16_in_place);
  EXPECT_TRUE(bits_of_rounded(y32, y16_in_place));

  // u8 codes of the residual under a float output.
  Conv2dAttrs c = a;
  c.int8_residual_step = 0.05f;
  c.int8_residual_unsigned = true;
  const Conv2dInt8 coded(w, &b, c, DType::kU8, 0.02f);
  std::mt19937 rng(13);
  const Tensor codes = random_ints(out, DType::kU8, rng);
  coded.run(x, &codes, y32);
  coded.run(x, &codes, y16);
  const Tensor got = y16.to(DType::kF32);
  // Each rounding moves its value by at most 2^-9 of it: the residual's by 2^-9 |r|, the output's
  // by 2^-9 |y|.
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double e = std::fabs(got.data<float>()[i] - y32.data<float>()[i]);
    const double scale = std::fabs(double(y32.data<float>()[i])) + 0.05 * codes.data<uint8_t>()[i];
    worst = std::max(worst, e / std::max(scale, 1e-6));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -8)) << "two bf16 roundings (the residual's, the output's) at most";

  // A bf16 input is checked as an f32 one: a strided view is refused, not read as dense.
  const Tensor strided = x.to(DType::kBF16).permute({0, 2, 1, 3}).permute({0, 2, 1, 3}).slice(2, 0, 9);
  Tensor y_small = Tensor::empty(conv.output_shape(strided.shape()), DType::kBF16);
  test::expect_invalid_input([&] { conv.run(strided, nullptr, y_small); }, "contiguous");
}

TEST(Conv2dInt8, RefusesWhatItCannotRun) {
  if (!has_int8_dot()) {
    test::expect_error(ErrorKind::kUnsupported, [] { Conv2dInt8(random_tensor({4, 4, 1, 1}, 1u), nullptr, {}, DType::kU8, 1.0f); },
                       "int8 dot product");
    return;
  }
  const Tensor w = random_tensor({8, 4, 1, 1}, 9u);
  test::expect_invalid_input([&] { Conv2dInt8(w, nullptr, {}, DType::kF32, 1.0f); }, "u8 or i8");
  test::expect_invalid_input([&] { Conv2dInt8(w, nullptr, {}, DType::kU8, 0.0f); }, "scale");
  const Conv2dInt8 conv(w, nullptr, {}, DType::kU8, 0.5f);
  Tensor y = Tensor::empty({1, 3, 3, 8}, DType::kF32);
  Tensor s8 = Tensor::zeros({1, 3, 3, 4}, DType::kI8);
  test::expect_invalid_input([&] { conv.run(s8, nullptr, y); }, "input");           // an i8 input to a u8 conv
  const Tensor x = random_tensor({1, 3, 3, 4}, 10u);
  test::expect_invalid_input([&] { conv.run(x, &y, y); }, "residual");              // no residual configured
  const Tensor wrong = random_tensor({1, 3, 3, 5}, 11u);
  test::expect_invalid_input([&] { conv.run(wrong, nullptr, y); }, "channels");
}

}  // namespace
}  // namespace bev::cpu
