// cpu::Conv2d against a direct 7-loop convolution in double (NCHW-indexed math over NHWC storage).
//
// Error measure: for every output, |y - ref| / S where S = sum|x*w| + |bias| + |residual| is the
// sum of the magnitudes of the terms; it does not depend on cancellation, so a proven bound holds
// for any data. With K = C/groups * KH * KW products and u = 2^-24 (f32 unit roundoff):
//   f32:  summing K + 2 terms in f32 in any order errs by at most (K + 2) * u * S.
//   bf16: x and w are each rounded to bf16 (8-bit significand, unit roundoff 2^-8), so each product
//         is off by at most (2^-7 + 2^-16) |x*w|; plus the f32 sum: (2^-7 + 2^-16 + (K + 2) * u) * S.
// Those are the asserted bounds (a dropped or misplaced term shows up as err/S ~ 1/K or more).
// Observed maxima are printed: f32 ~1e-7, bf16 ~3e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/conv2d.h"
#include "backend/cpu/onednn.h"
#include "core/compare.h"
#include "error_test_util.h"
#include "kernel_test_util.h"
#include "core/cpu_features.h"
#include "precision_test_util.h"

namespace bev::cpu {
namespace {

using kernel_test::random_tensor;
using kernel_test::ThreadsGuard;

struct Ref {
  std::vector<double> y;    // NHWC
  std::vector<double> mag;  // sum of |terms| per output
};

// y[n,oh,ow,o] = act(sum_{c,i,j} x[n, oh*s-p+i*d, ow*s-p+j*d, g*Cg+c] * w[o,c,i,j] + b[o] + r[...])
Ref reference(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dAttrs& a, const Tensor* residual) {
  const int64_t n = x.size(0), h = x.size(1), wd = x.size(2), c = x.size(3);
  const int64_t o = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t og = o / a.groups;
  const int64_t ho = (h + 2 * a.pad_h - a.dilation_h * (kh - 1) - 1) / a.stride_h + 1;
  const int64_t wo = (wd + 2 * a.pad_w - a.dilation_w * (kw - 1) - 1) / a.stride_w + 1;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  Ref r;
  r.y.resize(static_cast<size_t>(n * ho * wo * o));
  r.mag.resize(r.y.size());
  for (int64_t in = 0; in < n; ++in)
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow)
        for (int64_t oc = 0; oc < o; ++oc) {
          const int64_t g = oc / og;
          double acc = 0, mag = 0;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * a.stride_h - a.pad_h + i * a.dilation_h;
                const int64_t iw = ow * a.stride_w - a.pad_w + j * a.dilation_w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const double t = static_cast<double>(xp[((in * h + ih) * wd + iw) * c + g * cg + ic]) *
                                 static_cast<double>(wp[((oc * cg + ic) * kh + i) * kw + j]);
                acc += t;
                mag += std::fabs(t);
              }
          const size_t idx = static_cast<size_t>(((in * ho + oh) * wo + ow) * o + oc);
          if (b) {
            acc += b->data<float>()[oc];
            mag += std::fabs(b->data<float>()[oc]);
          }
          if (residual) {
            acc += residual->data<float>()[idx];
            mag += std::fabs(residual->data<float>()[idx]);
          }
          if (a.relu) acc = std::max(acc, 0.0);
          r.y[idx] = acc;
          r.mag[idx] = mag;
        }
  return r;
}

struct Errors {
  double max_abs = 0, max_rel_to_mag = 0;
};

Errors compare(const Tensor& y, const Ref& ref) {
  EXPECT_EQ(static_cast<size_t>(y.numel()), ref.y.size());
  Errors e;
  const float* p = y.data<float>();
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double d = std::fabs(static_cast<double>(p[i]) - ref.y[i]);
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel_to_mag = std::max(e.max_rel_to_mag, d / std::max(ref.mag[i], 1e-30));
  }
  return e;
}

double bound(Precision p, int64_t k) {
  const double sum = static_cast<double>(k + 2) * std::ldexp(1.0, -24);
  return p == Precision::kF32 ? sum : std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + sum;
}

// Runs one case in the given precision and asserts the bound; returns the errors for reporting.
Errors check_case(const char* name, const Shape& x_shape, const Shape& w_shape, bool with_bias, const Conv2dAttrs& a,
                  Precision precision, uint32_t seed) {
  const Tensor x = random_tensor(x_shape, seed);
  const double fan_in = static_cast<double>(w_shape[1] * w_shape[2] * w_shape[3]);
  const float ws = static_cast<float>(1.0 / std::sqrt(fan_in));
  const Tensor w = random_tensor(w_shape, seed + 1, -ws, ws);
  const Tensor b = random_tensor({w_shape[0]}, seed + 2);
  const Conv2d conv(w, with_bias ? &b : nullptr, a, precision);
  const Shape out = conv.output_shape(x_shape);
  const Tensor res = random_tensor(out, seed + 3);
  Tensor y = Tensor::empty(out, DType::kF32);
  conv.run(x, a.residual ? &res : nullptr, y);
  const Ref ref = reference(x, w, with_bias ? &b : nullptr, a, a.residual ? &res : nullptr);
  const Errors e = compare(y, ref);
  const double limit = bound(precision, w_shape[1] * w_shape[2] * w_shape[3]);
  std::printf("  %-28s %-4s %s -> %s  max|err| %.3g  max err/S %.3g (bound %.3g)  [%s]\n", name,
              precision == Precision::kF32 ? "f32" : "bf16", shape_str(x_shape).c_str(), shape_str(out).c_str(),
              e.max_abs, e.max_rel_to_mag, limit, conv.impl_name(x_shape).c_str());
  EXPECT_LE(e.max_rel_to_mag, limit) << name;
  return e;
}

Conv2dAttrs attrs(int stride, int pad, int dilation = 1, int groups = 1, bool relu = false, bool residual = false) {
  Conv2dAttrs a;
  a.stride_h = a.stride_w = stride;
  a.pad_h = a.pad_w = pad;
  a.dilation_h = a.dilation_w = dilation;
  a.groups = groups;
  a.relu = relu;
  a.residual = residual;
  return a;
}

class Conv2dBothPrecisions : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override { BEV_SKIP_UNLESS_RUNS(GetParam()); }
};

TEST_P(Conv2dBothPrecisions, OddChannels3x3Pad1) {
  check_case("3x3 p1 C3->O5", {2, 9, 7, 3}, {5, 3, 3, 3}, true, attrs(1, 1), GetParam(), 10);
  check_case("3x3 p1 C17->O5 relu", {1, 6, 5, 17}, {5, 17, 3, 3}, true, attrs(1, 1, 1, 1, true), GetParam(), 11);
}

TEST_P(Conv2dBothPrecisions, Stem7x7Stride2) {
  check_case("7x7 s2 p3 C3->O17", {2, 33, 29, 3}, {17, 3, 7, 7}, false, attrs(2, 3, 1, 1, true), GetParam(), 20);
}

TEST_P(Conv2dBothPrecisions, OnePixelMaps) {
  check_case("3x3 p1 on 1x1", {3, 1, 1, 17}, {5, 17, 3, 3}, true, attrs(1, 1), GetParam(), 30);
  check_case("1x1 on 1x1", {1, 1, 1, 5}, {3, 5, 1, 1}, true, attrs(1, 0), GetParam(), 31);
  check_case("3x3 s2 p1 on 1x1", {2, 1, 1, 16}, {32, 16, 3, 3}, false, attrs(2, 1), GetParam(), 32);
}

TEST_P(Conv2dBothPrecisions, Stride2OddSizes) {
  check_case("1x1 s2 (caffe) 15x25", {2, 15, 25, 17}, {33, 17, 1, 1}, false, attrs(2, 0), GetParam(), 40);
  check_case("3x3 s2 p1 (pytorch) 15x25", {2, 15, 25, 16}, {24, 16, 3, 3}, false, attrs(2, 1), GetParam(), 41);
  check_case("3x3 s2 p1 P6 29x50", {1, 29, 50, 8}, {16, 8, 3, 3}, true, attrs(2, 1), GetParam(), 42);
}

TEST_P(Conv2dBothPrecisions, Dilation2) {
  check_case("3x3 d2 p2", {2, 11, 13, 5}, {7, 5, 3, 3}, true, attrs(1, 2, 2), GetParam(), 50);
}

TEST_P(Conv2dBothPrecisions, Groups) {
  check_case("3x3 groups 4", {2, 8, 9, 8}, {12, 2, 3, 3}, true, attrs(1, 1, 1, 4), GetParam(), 60);
  check_case("3x3 depthwise C5", {1, 7, 6, 5}, {5, 1, 3, 3}, false, attrs(1, 1, 1, 5), GetParam(), 61);
}

TEST_P(Conv2dBothPrecisions, AsymmetricStridePad) {
  Conv2dAttrs a;
  a.stride_h = 2;
  a.stride_w = 1;
  a.pad_h = 0;
  a.pad_w = 2;
  a.dilation_w = 2;
  check_case("3x5 s(2,1) p(0,2) d(1,2)", {1, 10, 9, 6}, {4, 6, 3, 5}, true, a, GetParam(), 70);
}

TEST_P(Conv2dBothPrecisions, ResidualRelu) {
  // ResNet bottleneck conv3: y = relu(conv1x1(x) + b + identity).
  check_case("1x1 +res relu", {2, 7, 9, 16}, {64, 16, 1, 1}, true, attrs(1, 0, 1, 1, true, true), GetParam(), 80);
  check_case("3x3 +res relu odd", {1, 5, 3, 17}, {5, 17, 3, 3}, false, attrs(1, 1, 1, 1, true, true), GetParam(), 81);
  // Wide outputs: the 1x1 runs in pixel chunks (512 px at 2048 channels: 851 = 512 + a 339 tail).
  check_case("1x1 +res relu chunks", {1, 23, 37, 13}, {2048, 13, 1, 1}, true, attrs(1, 0, 1, 1, true, true), GetParam(),
             82);
  check_case("1x1 +res chunks no relu", {3, 7, 5, 9}, {1500, 9, 1, 1}, false, attrs(1, 0, 1, 1, false, true), GetParam(),
             83);
}

TEST_P(Conv2dBothPrecisions, OneByOneResidualRunsInPixelChunks) {
  const Tensor w = random_tensor({2048, 13, 1, 1}, 84);
  // On AMX oneDNN's sum post-op is faster and the chunks are not used (ResidualRelu's "chunks"
  // cases then check the sum post-op; other machines check the chunks).
  const std::string chunked = Conv2d(w, nullptr, attrs(1, 0, 1, 1, true, true), GetParam()).impl_name({1, 23, 37, 13});
  if (isa_has_amx()) {
    EXPECT_EQ(chunked.find("chunks"), std::string::npos) << chunked;
  } else {
    EXPECT_NE(chunked.find("chunks of 512"), std::string::npos) << chunked;
  }
  // Without a residual, or not a pixel GEMM (stride 2), it stays one conv.
  EXPECT_EQ(Conv2d(w, nullptr, attrs(1, 0, 1, 1, true, false), GetParam()).impl_name({1, 23, 37, 13}).find("chunks"),
            std::string::npos);
  EXPECT_EQ(Conv2d(w, nullptr, attrs(2, 0, 1, 1, true, true), GetParam()).impl_name({1, 23, 37, 13}).find("chunks"),
            std::string::npos);
}

TEST_P(Conv2dBothPrecisions, ResidualInPlace) {
  // Residual given as y itself: the same result as from a separate tensor, bit for bit; a 3x3
  // (sum post-op), a 1x1 in one pixel chunk and a 1x1 in chunks with a tail (binary add).
  struct Case {
    Shape x, w;
    int pad;
  };
  for (const Case& c : {Case{{2, 6, 5, 24}, {40, 24, 3, 3}, 1}, Case{{2, 6, 5, 24}, {40, 24, 1, 1}, 0},
                        Case{{2, 11, 13, 24}, {1100, 24, 1, 1}, 0}}) {
    SCOPED_TRACE(shape_str(c.w));
    const Conv2dAttrs a = attrs(1, c.pad, 1, 1, true, true);
    const Tensor x = random_tensor(c.x, 90);
    const Tensor w = random_tensor(c.w, 91, -0.2f, 0.2f);
    const Tensor b = random_tensor({c.w[0]}, 92);
    const Conv2d conv(w, &b, a, GetParam());
    const Tensor res = random_tensor({c.x[0], c.x[1], c.x[2], c.w[0]}, 93);
    Tensor y1 = Tensor::empty(res.shape(), DType::kF32);
    conv.run(x, &res, y1);
    Tensor y2 = res.clone();
    conv.run(x, &y2, y2);
    const Ref ref = reference(x, w, &b, a, &res);
    EXPECT_LE(compare(y1, ref).max_rel_to_mag, bound(GetParam(), c.w[1] * c.w[2] * c.w[3]));
    EXPECT_EQ(0, std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes()));
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, Conv2dBothPrecisions, ::testing::Values(Precision::kF32, Precision::kBF16),
                         [](const auto& p) { return std::string(p.param == Precision::kF32 ? "f32" : "bf16"); });

const char* const kDirect = "bev:direct1x1:avx512";

// 1x1 stride-1 f32 convs with at most 256 input channels and a multiple of 64 output channels run
// on our prefetching kernel (cpu::Direct1x1) instead of oneDNN. Against the double reference: pixel
// counts that leave every tail tile (1-5 pixels) and fewer pixels than threads, input channels of
// 1, odd and 256, one and four column blocks, with and without bias and ReLU, on 1-3 threads; and
// the same bits for a map and for its rows run one by one (the fused bottleneck's strips).
TEST(Conv2d, DirectOneByOneMatchesTheReference) {
  if (!cpu_features::has(cpu_features::Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 here (" << cpu_features::lacking(cpu_features::Isa::kAvx512) << "): every conv runs on oneDNN";
  struct Case {
    Shape x;
    int64_t o;
    bool bias, relu;
  };
  const Case cases[] = {
      {{1, 1, 1, 1}, 64, true, true},      // one pixel, one input channel
      {{2, 3, 5, 17}, 64, false, true},    // 30 pixels: whole tiles
      {{1, 7, 11, 64}, 128, true, false},  // 77 pixels: a tail of 5
      {{3, 2, 7, 33}, 256, true, true},    // 42 pixels, 4 column blocks
      {{1, 1, 13, 256}, 64, true, true},   // 256 input channels (the largest), a tail of 1
      {{2, 5, 4, 3}, 192, false, false},   // 40 pixels: a tail of 4
  };
  for (const Case& c : cases) {
    const Shape ws = {c.o, c.x[3], 1, 1};
    const Tensor x = random_tensor(c.x, 91);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.x[3])));
    const Tensor w = random_tensor(ws, 92, -scale, scale);
    const Tensor b = random_tensor({c.o}, 93);
    const Conv2dAttrs a = attrs(1, 0, 1, 1, c.relu);
    const Conv2d conv(w, c.bias ? &b : nullptr, a, Precision::kF32);
    ASSERT_EQ(conv.impl_name(c.x), kDirect) << shape_str(c.x);
    const Ref ref = reference(x, w, c.bias ? &b : nullptr, a, nullptr);
    const Shape out = conv.output_shape(c.x);
    Tensor first;
    for (int threads : {1, 2, 3}) {
      Tensor y = Tensor::empty(out, DType::kF32);
      {
        ThreadsGuard g(threads);
        conv.run(x, nullptr, y);
      }
      const Errors e = compare(y, ref);
      EXPECT_LE(e.max_rel_to_mag, bound(Precision::kF32, c.x[3])) << shape_str(c.x) << " threads " << threads;
      if (!first.defined()) {
        first = y;
        std::printf("  direct 1x1 %s -> %s  max err/S %.3g (bound %.3g)\n", shape_str(c.x).c_str(), shape_str(out).c_str(),
                    e.max_rel_to_mag, bound(Precision::kF32, c.x[3]));
      } else {
        EXPECT_EQ(std::memcmp(first.raw_data(), y.raw_data(), y.nbytes()), 0) << "threads " << threads;
      }
    }
    // Row by row, as the fused bottleneck's strips call it: the same bits.
    Tensor rows = Tensor::empty(out, DType::kF32);
    for (int64_t n = 0; n < c.x[0]; ++n) {
      for (int64_t h = 0; h < c.x[1]; ++h) {
        Tensor dst = rows.slice(0, n, n + 1).slice(1, h, h + 1);
        conv.run(x.slice(0, n, n + 1).slice(1, h, h + 1), nullptr, dst);
      }
    }
    EXPECT_EQ(std::memcmp(first.raw_data(), rows.raw_data(), rows.nbytes()), 0) << shape_str(c.x);
    // And oneDNN's result for the same conv within the same bound.
    const Conv2d onednn(w, c.bias ? &b : nullptr, a, Precision::kF32, /*allow_direct=*/false);
    EXPECT_NE(onednn.impl_name(c.x), kDirect);
    Tensor y1 = Tensor::empty(out, DType::kF32);
    onednn.run(x, nullptr, y1);
    EXPECT_LE(compare(y1, ref).max_rel_to_mag, bound(Precision::kF32, c.x[3]));
  }
  // The largest weights it takes: 256 x 256.
  EXPECT_EQ(Conv2d(random_tensor({256, 256, 1, 1}, 98), nullptr, attrs(1, 0), Precision::kF32).impl_name({1, 2, 2, 256}),
            kDirect);
}

// What stays on oneDNN, on any CPU: a residual, stride 2, padding, 3x3, bf16, outputs not a
// multiple of 64, more than 256 input channels, weights beyond L2 (256 x 320).
TEST(Conv2d, DirectOneByOneOnlyWhereItApplies) {
  const Tensor w64 = random_tensor({64, 32, 1, 1}, 94);
  auto impl = [](const Tensor& w, const Conv2dAttrs& a, Precision p, const Shape& x) {
    return Conv2d(w, nullptr, a, p).impl_name(x);
  };
  EXPECT_NE(impl(w64, attrs(1, 0, 1, 1, true, true), Precision::kF32, {1, 4, 4, 32}), kDirect);
  EXPECT_NE(impl(w64, attrs(2, 0), Precision::kF32, {1, 4, 4, 32}), kDirect);
  EXPECT_NE(impl(w64, attrs(1, 1), Precision::kF32, {1, 4, 4, 32}), kDirect);
  if (bev::precision_test::runs_here(Precision::kBF16)) {
    EXPECT_NE(impl(w64, attrs(1, 0), Precision::kBF16, {1, 4, 4, 32}), kDirect);
  }
  EXPECT_NE(impl(random_tensor({64, 32, 3, 3}, 95), attrs(1, 1), Precision::kF32, {1, 4, 4, 32}), kDirect);
  EXPECT_NE(impl(random_tensor({48, 32, 1, 1}, 96), attrs(1, 0), Precision::kF32, {1, 4, 4, 32}), kDirect);
  EXPECT_NE(impl(random_tensor({64, 257, 1, 1}, 97), attrs(1, 0), Precision::kF32, {1, 4, 4, 257}), kDirect);
  EXPECT_NE(impl(random_tensor({320, 256, 1, 1}, 99), attrs(1, 0), Precision::kF32, {1, 4, 4, 256}), kDirect);
  EXPECT_EQ(impl(w64, attrs(1, 0), Precision::kF32, {1, 4, 4, 32}) == kDirect, cpu_features::has(cpu_features::Isa::kAvx512));
}

TEST(Conv2d, ReusesPrimitivesAcrossShapesAndIsDeterministic) {
  const Conv2dAttrs a = attrs(1, 1, 1, 1, true);
  const Tensor w = random_tensor({9, 7, 3, 3}, 100, -0.3f, 0.3f);
  const Tensor b = random_tensor({9}, 101);
  const Conv2d conv(w, &b, a, Precision::kF32);
  for (const Shape& s : {Shape{1, 8, 8, 7}, Shape{3, 5, 11, 7}, Shape{1, 8, 8, 7}, Shape{2, 1, 1, 7}}) {
    const Tensor x = random_tensor(s, 102 + static_cast<uint32_t>(s[1]));
    Tensor y1 = Tensor::empty(conv.output_shape(s), DType::kF32);
    Tensor y2 = Tensor::empty(conv.output_shape(s), DType::kF32);
    conv.run(x, nullptr, y1);
    conv.run(x, nullptr, y2);
    EXPECT_EQ(0, std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes())) << shape_str(s);
    EXPECT_LE(compare(y1, reference(x, w, &b, a, nullptr)).max_rel_to_mag, bound(Precision::kF32, 63)) << shape_str(s);
  }
}

// Relative L2 of bf16 against f32 at a BEVFormer-like layer (3x3, 256 -> 256, a 15x25 map) on
// random data. Each product carries two independent bf16 roundings (uniform, 2^-8 relative at
// most), so the relative L2 is a few 1e-3 (observed 2.2e-3); asserted <= 5e-3.
TEST(Conv2d, Bf16RelativeL2AgainstF32) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  const Tensor x = random_tensor({2, 15, 25, 256}, 130);
  const float ws = static_cast<float>(1.0 / std::sqrt(256.0 * 9.0));
  const Tensor w = random_tensor({256, 256, 3, 3}, 131, -ws, ws);
  const Tensor b = random_tensor({256}, 132, -0.1f, 0.1f);
  const Conv2dAttrs a = attrs(1, 1);
  Tensor y32 = Tensor::empty({2, 15, 25, 256}, DType::kF32), y16 = Tensor::empty({2, 15, 25, 256}, DType::kF32);
  Conv2d(w, &b, a, Precision::kF32).run(x, nullptr, y32);
  Conv2d(w, &b, a, Precision::kBF16).run(x, nullptr, y16);
  const TensorDiff diff = compare(y16, y32);
  const double rel_l2 = diff.relative_l2, max_abs = diff.max_abs;
  std::printf("  bf16 vs f32, 3x3 256->256 on [2, 15, 25, 256]: relative L2 %.3g, max|diff| %.3g\n", rel_l2, max_abs);
  EXPECT_LE(rel_l2, 5e-3);
}

// Stride-2 convs of few (odd) channels run in bf16 over pairs of columns where oneDNN's bf16 pads
// channel pairs (AMD's avx512_bf16 without AMX: conv2d.cpp, ColumnPairs): a stride-1 conv of 2C
// channels with its own kernel, holding the same taps. Each case against the double reference,
// at kernels, pads and channel counts whose pair kernels differ (a zero tap on the left, on the
// right, none), with the form each run took; odd widths run the plain form.
TEST(Conv2d, StrideTwoOverColumnPairs) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  {
    const Conv2d probe(random_tensor({8, 3, 7, 7}, 200), nullptr, attrs(2, 3), Precision::kBF16);
    if (probe.impl_name({1, 16, 16, 3}).find("column pairs") == std::string::npos)
      GTEST_SKIP() << "bf16 stride-2 convs run over column pairs only on AMD's avx512_bf16 without AMX; here: "
                   << probe.impl_name({1, 16, 16, 3}) << " (" << isa_name() << ")";
  }
  struct Case {
    const char* name;
    Shape x, w;
    Conv2dAttrs a;
    bool pairs;
  };
  Conv2dAttrs rect = attrs(1, 0, 1, 1, true);
  rect.stride_w = 2;
  rect.pad_w = 3;
  const std::vector<Case> cases = {
      {"stem 7x7 s2 p3 C3->O17 relu", {2, 34, 30, 3}, {17, 3, 7, 7}, attrs(2, 3, 1, 1, true), true},
      {"7x7 s2 p3, odd width", {1, 21, 29, 3}, {17, 3, 7, 7}, attrs(2, 3, 1, 1, true), false},
      {"7x7 s2 p0 C3->O8", {1, 20, 22, 3}, {8, 3, 7, 7}, attrs(2, 0), true},
      {"3x3 s2 p1 C3->O24", {1, 9, 16, 3}, {24, 3, 3, 3}, attrs(2, 1), true},
      {"5x5 s2 p2 C1->O5", {2, 11, 12, 1}, {5, 1, 5, 5}, attrs(2, 2), true},
      {"1x1 s2 C5->O7", {1, 6, 10, 5}, {7, 5, 1, 1}, attrs(2, 0), true},
      {"4x4 s2 p1 C3->O9", {1, 12, 18, 3}, {9, 3, 4, 4}, attrs(2, 1), true},
      {"3x7 s(1,2) p(0,3) C3->O16 relu", {2, 8, 40, 3}, {16, 3, 3, 7}, rect, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor w = random_tensor(c.w, 201);
    const Conv2d conv(w, nullptr, c.a, Precision::kBF16);
    EXPECT_EQ(conv.impl_name(c.x).find("column pairs") != std::string::npos, c.pairs) << conv.impl_name(c.x);
    check_case(c.name, c.x, c.w, true, c.a, Precision::kBF16, 202);
  }
  // A derived conv keeps the pairs only with the same stride, padding and dilation across the width.
  const Conv2d stem(random_tensor({17, 3, 7, 7}, 203), nullptr, attrs(2, 3, 1, 1, true), Precision::kBF16);
  {
    // A bf16 source is read as pairs in place; an f32 one through its rounded copy: same bits.
    const Tensor x16 = random_tensor({2, 18, 26, 3}, 205).to(DType::kBF16);
    Tensor y_from_f32 = Tensor::empty(stem.output_shape(x16.shape()), DType::kBF16);
    Tensor y_from_bf16 = Tensor::empty(stem.output_shape(x16.shape()), DType::kBF16);
    stem.run(x16.to(DType::kF32), nullptr, y_from_f32);
    stem.run(x16, nullptr, y_from_bf16);
    EXPECT_EQ(0, std::memcmp(y_from_f32.raw_data(), y_from_bf16.raw_data(), y_from_f32.nbytes()));
  }
  Conv2dAttrs unpadded = stem.attrs();
  unpadded.pad_h = 0;
  EXPECT_NE(stem.with_attrs(unpadded).impl_name({1, 20, 30, 3}).find("column pairs"), std::string::npos);
  unpadded.pad_w = 0;
  const Conv2d derived = stem.with_attrs(unpadded);
  EXPECT_EQ(derived.impl_name({1, 20, 30, 3}).find("column pairs"), std::string::npos);
  const Tensor x = random_tensor({1, 20, 30, 3}, 204);
  Tensor y = Tensor::empty(derived.output_shape(x.shape()), DType::kF32);
  derived.run(x, nullptr, y);
  const Tensor w = random_tensor({17, 3, 7, 7}, 203);
  EXPECT_LE(compare(y, reference(x, w, nullptr, unpadded, nullptr)).max_rel_to_mag, bound(Precision::kBF16, 147));
}

TEST(Conv2d, FoldBatchNormMatchesConvThenBatchNorm) {
  const Tensor w = random_tensor({6, 5, 3, 3}, 110, -0.3f, 0.3f);
  const Tensor gamma = random_tensor({6}, 111, 0.5f, 1.5f);
  const Tensor beta = random_tensor({6}, 112);
  const Tensor mean = random_tensor({6}, 113);
  const Tensor var = random_tensor({6}, 114, 0.01f, 2.0f);
  const float eps = 1e-5f;
  const Tensor x = random_tensor({2, 7, 6, 5}, 115);
  for (bool relu : {false, true}) {
    Tensor fw, fb;
    Conv2d::fold_batch_norm(w, nullptr, gamma, beta, mean, var, eps, &fw, &fb);
    Conv2dAttrs a = attrs(1, 1);
    a.relu = relu;
    const Conv2d conv(fw, &fb, a, Precision::kF32);
    Tensor y = Tensor::empty(conv.output_shape(x.shape()), DType::kF32);
    conv.run(x, nullptr, y);
    // Unfolded reference: conv in double, then BN in double, then ReLU.
    const Ref raw = reference(x, w, nullptr, attrs(1, 1), nullptr);
    double max_err = 0;
    for (size_t i = 0; i < raw.y.size(); ++i) {
      const size_t c = i % 6;
      const double s = gamma.data<float>()[c] / std::sqrt(static_cast<double>(var.data<float>()[c]) + eps);
      double want = (raw.y[i] - mean.data<float>()[c]) * s + beta.data<float>()[c];
      if (relu) want = std::max(want, 0.0);
      // S for the folded conv: the conv terms scaled by |s| plus the folded bias.
      const double mag = raw.mag[i] * std::fabs(s) + std::fabs(fb.data<float>()[c]);
      max_err = std::max(max_err, std::fabs(y.data<float>()[i] - want) / mag);
    }
    std::printf("  BN fold (relu=%d): max err/S %.3g\n", relu, max_err);
    // The fold itself rounds w' and b' to f32: one more u per term.
    EXPECT_LE(max_err, bound(Precision::kF32, 45) + std::ldexp(1.0, -24));
  }
  // With a conv bias too: b' = (b - mean) * s + beta.
  const Tensor b = random_tensor({6}, 116);
  Tensor fw, fb;
  Conv2d::fold_batch_norm(w, &b, gamma, beta, mean, var, eps, &fw, &fb);
  for (int c = 0; c < 6; ++c) {
    const double s = gamma.data<float>()[c] / std::sqrt(static_cast<double>(var.data<float>()[c]) + eps);
    EXPECT_NEAR(fb.data<float>()[c], (b.data<float>()[c] - mean.data<float>()[c]) * s + beta.data<float>()[c], 1e-6);
    EXPECT_FLOAT_EQ(fw.data<float>()[c * 45 + 7], static_cast<float>(w.data<float>()[c * 45 + 7] * s));
  }
}

// bf16 activations (bf16 precision): a bf16 input, residual or output. Inputs already on the bf16
// grid give bit-identical results whether they arrive as f32 (rounded inside) or bf16; a bf16
// output is the f32 one rounded once more (2^-8 relative at most, asserted against the reference).
TEST(Conv2d, Bf16ActivationsInAndOut) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  // A 3x3 (one conv, sum post-op) and a wide 1x1 (pixel chunks + binary add, with a tail).
  for (const auto& [k, oc] : {std::pair<int64_t, int64_t>{3, 33}, std::pair<int64_t, int64_t>{1, 1100}}) {
    SCOPED_TRACE("kernel " + std::to_string(k) + ", " + std::to_string(oc) + " channels");
    const int pad = static_cast<int>(k / 2);
    const Conv2dAttrs a = attrs(1, pad, 1, 1, true, true);
    const float ws = static_cast<float>(1.0 / std::sqrt(19.0 * static_cast<double>(k * k)));
    const Tensor w = random_tensor({oc, 19, k, k}, 140, -ws, ws);
    const Tensor b = random_tensor({oc}, 141);
    const Conv2d conv(w, &b, a, Precision::kBF16);
    const Tensor x16 = random_tensor({2, 17, 13, 19}, 142).to(DType::kBF16);
    const Tensor x = x16.to(DType::kF32);  // the same values, on the bf16 grid, in f32
    const Tensor res16 = random_tensor({2, 17, 13, oc}, 143).to(DType::kBF16);
    const Tensor res = res16.to(DType::kF32);
    const Ref ref = reference(x, w, &b, a, &res);

    Tensor y = Tensor::empty({2, 17, 13, oc}, DType::kF32);
    conv.run(x, &res, y);
    for (const auto& [xi, ri] : {std::pair{&x16, &res}, std::pair{&x, &res16}, std::pair{&x16, &res16}}) {
      Tensor y2 = Tensor::empty(y.shape(), DType::kF32);
      conv.run(*xi, ri, y2);
      EXPECT_EQ(0, std::memcmp(y.raw_data(), y2.raw_data(), y.nbytes()))
          << "input " << xi->describe() << ", residual " << ri->describe();
    }
    const double limit = bound(Precision::kBF16, 19 * k * k) + std::ldexp(1.0, -8);
    for (const auto& [xi, ri] : {std::pair{&x, &res}, std::pair{&x16, &res16}}) {
      Tensor y16 = Tensor::empty(y.shape(), DType::kBF16);
      conv.run(*xi, ri, y16);
      const Errors e = compare(y16.to(DType::kF32), ref);
      std::printf("  bf16 output (input %s): max err/S %.3g (bound %.3g)\n", dtype_name(xi->dtype()), e.max_rel_to_mag,
                  limit);
      EXPECT_LE(e.max_rel_to_mag, limit);
      EXPECT_GT(e.max_rel_to_mag, 0.0);  // it is rounded: a bf16 output equal to f32 would mean no bf16 at all
      // The bf16 output is the f32 output rounded once (no intermediate rounding on the way).
      EXPECT_EQ(0, std::memcmp(y16.raw_data(), y.to(DType::kBF16).raw_data(), y16.nbytes()));
    }
    // In place: the bf16 residual in the bf16 output itself.
    Tensor yi = res16.clone();
    conv.run(x16, &yi, yi);
    EXPECT_LE(compare(yi.to(DType::kF32), ref).max_rel_to_mag, limit);
    // f32 precision refuses bf16 activations.
    const Conv2d conv32(w, &b, a, Precision::kF32);
    EXPECT_THROW(conv32.run(x16, &res, y), Error);
    Tensor y16 = Tensor::empty(y.shape(), DType::kBF16);
    EXPECT_THROW(conv32.run(x, &res, y16), Error);
  }
}

TEST(Conv2d, RejectsMismatchesWithWhatWasExpected) {
  const Tensor w = random_tensor({4, 3, 3, 3}, 120);
  const Conv2d conv(w, nullptr, attrs(1, 1), Precision::kF32);
  const Tensor x = random_tensor({1, 5, 5, 3}, 121);
  Tensor y = Tensor::empty({1, 5, 5, 4}, DType::kF32);
  test::expect_invalid_input([&] { conv.output_shape({1, 5, 5, 4}); }, "3 channels");
  test::expect_invalid_input([&] { conv.output_shape({5, 5, 3}); }, "rank 4");
  Tensor y_bad = Tensor::empty({1, 5, 4, 4}, DType::kF32);
  test::expect_invalid_input([&] { conv.run(x, nullptr, y_bad); }, "[1, 5, 5, 4]");
  test::expect_invalid_input([&] { conv.run(x, &y, y); }, "attrs.residual is not set");
  Tensor y_bf16 = Tensor::empty({1, 5, 5, 4}, DType::kBF16);
  test::expect_invalid_input([&] { conv.run(x, nullptr, y_bf16); }, "f32");
  test::expect_invalid_input([&] { conv.run(x.permute({0, 2, 1, 3}), nullptr, y); }, "contiguous");
  const Conv2d conv_res(w, nullptr, attrs(1, 1, 1, 1, false, true), Precision::kF32);
  test::expect_invalid_input([&] { conv_res.run(x, nullptr, y); }, "attrs.residual is set");
  const Conv2d conv_big(random_tensor({4, 3, 7, 7}, 122), nullptr, attrs(1, 0), Precision::kF32);
  test::expect_invalid_input([&] { conv_big.output_shape({1, 5, 5, 3}); }, "empty output");
  test::expect_invalid_input([&] { Conv2d(random_tensor({4, 3, 3}, 123), nullptr, attrs(1, 1), Precision::kF32); }, "rank 4");
  test::expect_invalid_input([&] { Conv2d(w, nullptr, attrs(1, 1, 1, 3), Precision::kF32); }, "divisible by groups");
  const Tensor b5 = random_tensor({5}, 124);
  test::expect_invalid_input([&] { Conv2d(w, &b5, attrs(1, 1), Precision::kF32); }, "f32[4]");
  // Output aliasing the input.
  const Conv2d same(random_tensor({3, 3, 1, 1}, 125), nullptr, attrs(1, 0), Precision::kF32);
  Tensor xy = random_tensor({1, 5, 5, 3}, 126);
  test::expect_invalid_input([&] { same.run(xy, nullptr, xy); }, "overlaps");
}

}  // namespace
}  // namespace bev::cpu

// A batch of images (vehicles' cameras stacked) gives each image the bits it gets alone: the
// convs' reduction order does not depend on N. The stem, 1x1s of both kinds (oneDNN's and, on
// AVX-512, ours), 3x3s and a stride-2 3x3, as ResNet has them, f32.
namespace bev::cpu {
namespace {
TEST(Conv2dBatch, EachImageIsTheBitsOfItAlone) {
  struct S { int64_t h, w, ic, oc, k, stride; };
  for (S s : {S{32, 48, 3, 8, 7, 2}, S{16, 24, 8, 8, 1, 1}, S{16, 24, 8, 32, 1, 1}, S{16, 24, 32, 8, 1, 1}, S{16, 24, 8, 8, 3, 1},
              S{16, 24, 16, 32, 3, 2}, S{8, 12, 64, 32, 1, 1}, S{8, 12, 32, 32, 3, 1}, S{64, 96, 64, 64, 1, 1}, S{64, 96, 64, 256, 1, 1}, S{64, 96, 256, 64, 1, 1}}) {
    Conv2dAttrs a;
    a.stride_h = a.stride_w = static_cast<int>(s.stride);
    a.pad_h = a.pad_w = static_cast<int>(s.k / 2);
    const Tensor w = kernel_test::random_tensor({s.oc, s.ic, s.k, s.k}, 3, -0.2f, 0.2f);
    const Tensor b = kernel_test::random_tensor({s.oc}, 4);
    const Conv2d conv(w, &b, a, Precision::kF32);
    const int64_t n = 6;
    const Tensor x4 = kernel_test::random_tensor({4 * n, s.h, s.w, s.ic}, 7);
    const int64_t oh = (s.h + 2 * (s.k / 2) - s.k) / s.stride + 1, ow = (s.w + 2 * (s.k / 2) - s.k) / s.stride + 1;
    Tensor y4 = Tensor::empty({4 * n, oh, ow, s.oc}, DType::kF32);
    conv.run(x4, nullptr, y4);
    for (int part = 0; part < 4; ++part) {
      Tensor x1 = Tensor::empty({n, s.h, s.w, s.ic}, DType::kF32);
      std::memcpy(x1.raw_data(), x4.data<float>() + part * x1.numel(), x1.nbytes());
      Tensor y1 = Tensor::empty({n, oh, ow, s.oc}, DType::kF32);
      conv.run(x1, nullptr, y1);
      int64_t diff = 0;
      for (int64_t i = 0; i < y1.numel(); ++i) diff += y1.data<float>()[i] != y4.data<float>()[part * y1.numel() + i];
      EXPECT_EQ(diff, 0) << s.h << "x" << s.w << " " << s.ic << "->" << s.oc << " k" << s.k << " s" << s.stride << " part " << part;
    }
  }
}
}  // namespace
}  // namespace bev::cpu
