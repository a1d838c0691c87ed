// cpu::Amx1x1 (the fused bottleneck's 1x1 convs in bf16 on AMX tiles) against a plain reference in
// double on the bf16-rounded input and weights: pixel counts around its blocks of 32 (1, 5, 31, 32,
// 33, 100, 257), input and output channels of one and several tiles, with and without bias, ReLU, a
// bf16 or f32 residual (also the output itself), bf16 and f32 outputs; strips of a map give the
// whole map's bits, and `spread` changes nothing but timing.
//
// Error measure, as in test_op_conv2d: |y - ref| / S per output, S the sum of the magnitudes of
// its terms. The inputs are already bf16 (the reference uses the same rounded weights), so the
// f32 sums err by at most (K + 2) 2^-24 S, and a bf16 output adds its rounding, 2^-8 |y| <= 2^-8 S.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/amx1x1.h"
#include "backend/cpu/conv2d.h"
#include "backend/cpu/onednn.h"
#include "bevformer/error.h"
#include "core/half.h"
#include "kernel_test_util.h"

namespace bev::cpu {
namespace {

using kernel_test::random_tensor;

bool available() { return Amx1x1::supports(Conv2dAttrs{}, 32, 32, 1, 1, Precision::kBF16); }

// The weights as the kernel holds them: rounded to bf16.
std::vector<double> rounded(const Tensor& w) {
  std::vector<double> r(static_cast<size_t>(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i) r[static_cast<size_t>(i)] = bf16_to_float(float_to_bf16(w.data<float>()[i]));
  return r;
}

double widened(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? bf16_to_float(static_cast<const uint16_t*>(t.raw_data())[i])
                                   : t.data<float>()[i];
}

struct Case {
  int64_t pixels, k, o;
  bool bias, relu;
  DType residual;  // kF64: none
  bool in_place;   // the residual is y itself
  DType out;
};

std::string describe(const Case& c) {
  return "P " + std::to_string(c.pixels) + " K " + std::to_string(c.k) + " O " + std::to_string(c.o) +
         (c.bias ? " bias" : "") + (c.relu ? " relu" : "") +
         (c.residual == DType::kF64 ? "" : std::string(" residual ") + dtype_name(c.residual)) +
         (c.in_place ? " in place" : "") + " -> " + dtype_name(c.out);
}

TEST(Amx1x1, MatchesThePlainReference) {
  if (!available()) GTEST_SKIP() << "no AMX on this CPU (or oneDNN capped below it)";
  const Case cases[] = {
      {1, 32, 32, true, true, DType::kF64, false, DType::kBF16},
      {5, 64, 256, true, true, DType::kBF16, false, DType::kBF16},   // layer1's conv3, a few pixels
      {31, 256, 64, true, true, DType::kF64, false, DType::kBF16},   // layer1's conv1
      {32, 64, 256, false, false, DType::kF64, false, DType::kF32},  // the downsample, one block
      {33, 96, 64, true, true, DType::kBF16, true, DType::kBF16},    // a block and one pixel, in place
      {100, 64, 256, true, true, DType::kBF16, true, DType::kBF16},
      {100, 64, 96, true, false, DType::kF32, false, DType::kF32},
      {257, 128, 512, true, true, DType::kF32, true, DType::kF32},   // layer2's conv3, f32 in place
      {257, 512, 128, true, true, DType::kF64, false, DType::kBF16},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    const Tensor x = random_tensor({c.pixels, c.k}, rng).to(DType::kBF16);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.k));
    const Tensor w = random_tensor({c.o, c.k, 1, 1}, rng, -scale, scale);
    const Tensor b = random_tensor({c.o}, rng);
    const bool has_res = c.residual != DType::kF64;
    const Tensor res = has_res ? random_tensor({c.pixels, c.o}, rng, -2.0f, 2.0f).to(c.residual) : Tensor();
    const Amx1x1 conv(w, c.bias ? &b : nullptr, c.relu);
    const std::vector<double> wr = rounded(w);

    std::vector<double> ref(static_cast<size_t>(c.pixels * c.o)), mag(ref.size());
    for (int64_t p = 0; p < c.pixels; ++p) {
      for (int64_t oc = 0; oc < c.o; ++oc) {
        double acc = c.bias ? b.data<float>()[oc] : 0.0, m = std::fabs(acc);
        for (int64_t ic = 0; ic < c.k; ++ic) {
          const double t = widened(x, p * c.k + ic) * wr[static_cast<size_t>(oc * c.k + ic)];
          acc += t;
          m += std::fabs(t);
        }
        if (has_res) {
          acc += widened(res, p * c.o + oc);
          m += std::fabs(widened(res, p * c.o + oc));
        }
        ref[static_cast<size_t>(p * c.o + oc)] = c.relu ? std::max(acc, 0.0) : acc;
        mag[static_cast<size_t>(p * c.o + oc)] = m;
      }
    }
    const double bound = (static_cast<double>(c.k) + 2) * std::ldexp(1.0, -24) +
                         (c.out == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0);

    Tensor first = c.in_place ? res.clone() : Tensor::empty({c.pixels, c.o}, c.out);
    const void* r = c.in_place ? first.raw_data() : has_res ? res.raw_data() : nullptr;
    conv.run(static_cast<const uint16_t*>(x.raw_data()), r, has_res ? c.residual : DType::kF32, first.raw_data(), c.out,
             c.pixels);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max(worst, std::fabs(widened(first, static_cast<int64_t>(i)) - ref[i]) / std::max(mag[i], 1e-30));
    }
    EXPECT_LE(worst, bound);
    std::printf("  amx1x1 %s: max err/S %.3g (bound %.3g)\n", describe(c).c_str(), worst, bound);
    // In strips (the fused bottleneck's calls) of 7 pixels (padded blocks) and of 40 (a block,
    // then one reaching back), each with the next strip as `spread`: the whole map's bits.
    for (const int64_t step : {int64_t{7}, int64_t{40}}) {
      Tensor strips = c.in_place ? res.clone() : Tensor::empty({c.pixels, c.o}, c.out);
      const size_t xs = dtype_size(DType::kBF16), ys = dtype_size(c.out), rs = has_res ? dtype_size(c.residual) : 0;
      for (int64_t p0 = 0; p0 < c.pixels; p0 += step) {
        const int64_t n = std::min<int64_t>(step, c.pixels - p0);
        const auto* xp = static_cast<const uint16_t*>(x.raw_data()) + p0 * c.k;
        char* yp = static_cast<char*>(strips.raw_data()) + static_cast<size_t>(p0 * c.o) * ys;
        const char* rp = !has_res ? nullptr
                         : c.in_place ? yp
                                      : static_cast<const char*>(res.raw_data()) + static_cast<size_t>(p0 * c.o) * rs;
        const int64_t next = std::min<int64_t>(step, c.pixels - p0 - n);
        conv.run(xp, rp, has_res ? c.residual : DType::kF32, yp, c.out, n, next > 0 ? xp + n * c.k : nullptr,
                 static_cast<size_t>(next * c.k) * xs);
      }
      EXPECT_EQ(std::memcmp(first.raw_data(), strips.raw_data(), strips.nbytes()), 0) << "strips of " << step;
    }
  }
}

// The tile unit adds a NaN residual channel through an identity whose other products are zeros:
// NaN stays in its pixel (the 32 channels of its column block, see amx1x1.h), never reaches
// another pixel or the pixel's other column blocks.
TEST(Amx1x1, NanResidualStaysInItsPixel) {
  if (!available()) GTEST_SKIP() << "no AMX on this CPU (or oneDNN capped below it)";
  std::mt19937 rng(8);
  const Tensor x = random_tensor({64, 64}, rng).to(DType::kBF16);
  const Tensor w = random_tensor({64, 64, 1, 1}, rng, -0.125f, 0.125f);
  Tensor res = random_tensor({64, 64}, rng).to(DType::kBF16);
  static_cast<uint16_t*>(res.raw_data())[40 * 64 + 3] = 0x7FC0;  // NaN at pixel 40, channel 3
  Tensor y = Tensor::empty({64, 64}, DType::kBF16);
  Amx1x1(w, nullptr, true).run(static_cast<const uint16_t*>(x.raw_data()), res.raw_data(), DType::kBF16, y.raw_data(),
                                DType::kBF16, 64);
  const auto* yp = static_cast<const uint16_t*>(y.raw_data());
  EXPECT_TRUE(std::isnan(bf16_to_float(yp[40 * 64 + 3])));
  for (int64_t p = 0; p < 64; ++p) {
    for (int64_t ch = 0; ch < 64; ++ch) {
      if (p == 40 && ch < 32) continue;
      EXPECT_FALSE(std::isnan(bf16_to_float(yp[p * 64 + ch]))) << "pixel " << p << " channel " << ch;
    }
  }
}

// Conv2d packs its Amx1x1 on the first amx1x1() call, from its bf16 oneDNN weights: the kernel
// computes the bits of one packed straight from the f32 weights; f32 convs and 3x3s have none.
TEST(Amx1x1, ConvPacksItOnFirstUseWithTheSameBits) {
  if (!available()) GTEST_SKIP() << "no AMX on this CPU (or oneDNN capped below it)";
  const Tensor w = random_tensor({96, 64, 1, 1}, 21, -0.2f, 0.2f);
  const Tensor b = random_tensor({96}, 22);
  Conv2dAttrs relu;
  relu.relu = true;
  const Conv2d conv(w, &b, relu, Precision::kBF16);
  const Amx1x1* lazy = conv.amx1x1();
  ASSERT_NE(lazy, nullptr);
  EXPECT_EQ(conv.amx1x1(), lazy);  // packed once
  const Amx1x1 direct(w, &b, true);
  const int64_t pixels = 77;
  const Tensor x = random_tensor({pixels, 64}, 23).to(DType::kBF16);
  Tensor y1 = Tensor::empty({pixels, 96}, DType::kBF16), y2 = Tensor::empty({pixels, 96}, DType::kBF16);
  const auto* xp = static_cast<const uint16_t*>(x.raw_data());
  lazy->run(xp, nullptr, DType::kF32, y1.raw_data(), DType::kBF16, pixels);
  direct.run(xp, nullptr, DType::kF32, y2.raw_data(), DType::kBF16, pixels);
  EXPECT_EQ(0, std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes()));
  EXPECT_EQ(Conv2d(w, &b, relu, Precision::kF32).amx1x1(), nullptr);
  EXPECT_EQ(Conv2d(random_tensor({96, 64, 3, 3}, 24), &b, relu, Precision::kBF16).amx1x1(), nullptr);
}

TEST(Amx1x1, OnlyWhereItApplies) {
  const Conv2dAttrs one;
  Conv2dAttrs strided;
  strided.stride_h = strided.stride_w = 2;
  Conv2dAttrs residual;
  residual.residual = true;
  EXPECT_FALSE(Amx1x1::supports(one, 64, 256, 1, 1, Precision::kF32));
  EXPECT_FALSE(Amx1x1::supports(strided, 64, 256, 1, 1, Precision::kBF16));
  EXPECT_FALSE(Amx1x1::supports(one, 64, 256, 3, 3, Precision::kBF16));
  EXPECT_FALSE(Amx1x1::supports(one, 48, 256, 1, 1, Precision::kBF16));   // K not a multiple of 32
  EXPECT_FALSE(Amx1x1::supports(one, 64, 48, 1, 1, Precision::kBF16));    // O not a multiple of 32
  EXPECT_FALSE(Amx1x1::supports(one, 2048, 512, 1, 1, Precision::kBF16));  // weights beyond L2
  EXPECT_EQ(Amx1x1::supports(residual, 64, 256, 1, 1, Precision::kBF16), available());
  EXPECT_THROW(Amx1x1(random_tensor({48, 64, 1, 1}, 9), nullptr, false), Error);
  EXPECT_THROW(Amx1x1(random_tensor({64, 64, 3, 3}, 9), nullptr, false), Error);
}

}  // namespace
}  // namespace bev::cpu
