// DCNv2 (bev::cpu::DeformConv2d) against an independent f64 loop written from the spec
// (docs/bevformer-spec.md §2.2) on NCHW indices, and against deform_conv2d_reference.
// Offsets deliberately land outside the map, exactly on its borders and on integer grid
// points; mask logits include saturating ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/deform_conv2d.h"
#include "core/half.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

namespace bev::cpu {
namespace {

struct Case {
  int64_t n, h, w, cin, cout, kh, kw;
  int stride, pad, dil;
  bool bias;
  size_t col_budget;  // small budgets force several tiles and a short last tile
};

using kernel_test::random_tensor;

// conv_offset's output with awkward values: half random offsets, half aimed at chosen sample
// positions (outside, on -1, on H-1, on H, on integers, far away, NaN); logits mostly moderate.
Tensor make_offset_mask(const Case& c, int64_t ho, int64_t wo, std::mt19937& rng) {
  const int64_t taps = c.kh * c.kw;
  Tensor om = Tensor::empty({c.n, ho, wo, 3 * taps}, DType::kF32);
  float* p = om.data<float>();
  std::uniform_real_distribution<float> u(-2.5f, 2.5f), logit(-4.0f, 4.0f), coin(0.0f, 1.0f);
  const auto target = [&](int64_t size) -> float {
    const float s = static_cast<float>(size);
    const float picks[] = {-1.0f, -0.999f, -0.5f, 0.0f, s - 1.0f, s - 0.5f, s - 0.001f, s, s + 0.5f,
                           1e9f, -1e9f, std::floor(coin(rng) * s)};
    return picks[static_cast<size_t>(coin(rng) * 11.999f)];
  };
  for (int64_t n = 0; n < c.n; ++n) {
    for (int64_t y = 0; y < ho; ++y) {
      for (int64_t x = 0; x < wo; ++x) {
        float* o = p + ((n * ho + y) * wo + x) * 3 * taps;
        for (int64_t t = 0; t < taps; ++t) {
          const int64_t i = t / c.kw, j = t % c.kw;
          const float by = static_cast<float>(y * c.stride - c.pad + i * c.dil);
          const float bx = static_cast<float>(x * c.stride - c.pad + j * c.dil);
          const float r = coin(rng);
          if (r < 0.5f) {
            o[2 * t] = u(rng);
            o[2 * t + 1] = u(rng);
          } else if (r < 0.98f) {
            o[2 * t] = target(c.h) - by;
            o[2 * t + 1] = coin(rng) < 0.5f ? target(c.w) - bx : u(rng);
          } else {
            o[2 * t] = std::numeric_limits<float>::quiet_NaN();
            o[2 * t + 1] = u(rng);
          }
          const float m = coin(rng);
          o[2 * taps + t] = m < 0.05f ? -100.0f : m < 0.1f ? 100.0f : m < 0.15f ? 30.0f : logit(rng);
        }
      }
    }
  }
  return om;
}

// The spec in f64 on NCHW indices: x[n][c][y][x], offsets [n][2K][ho][wo], mask [n][K][ho][wo].
// bf16: each sample (its position formed in f32) and each weight rounded to bf16 first, as the
// bf16 kernel's column tile and weight hold them.
std::vector<double> independent_dcn(const Case& c, const Tensor& x_nhwc, const Tensor& om_nhwc, const Tensor& w_oihw,
                                    const Tensor* bias, int64_t ho, int64_t wo, bool bf16 = false) {
  const auto r16 = [](double v) { return static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(v)))); };
  const int64_t K = c.kh * c.kw;
  const float* xs = x_nhwc.data<float>();
  const float* os = om_nhwc.data<float>();
  const float* ws = w_oihw.data<float>();
  auto X = [&](int64_t n, int64_t ch, int64_t y, int64_t x) -> double {
    return xs[((n * c.h + y) * c.w + x) * c.cin + ch];
  };
  auto OFF = [&](int64_t n, int64_t ch, int64_t y, int64_t x) -> double {
    return os[((n * ho + y) * wo + x) * 3 * K + ch];
  };
  auto bilinear = [&](int64_t n, int64_t ch, double py, double px) -> double {
    if (!(py > -1 && px > -1 && py < static_cast<double>(c.h) && px < static_cast<double>(c.w))) return 0.0;
    const double y0 = std::floor(py), x0 = std::floor(px);
    double v = 0.0;
    for (int dy = 0; dy < 2; ++dy) {
      for (int dx = 0; dx < 2; ++dx) {
        const int64_t yy = static_cast<int64_t>(y0) + dy, xx = static_cast<int64_t>(x0) + dx;
        if (yy < 0 || yy >= c.h || xx < 0 || xx >= c.w) continue;
        const double wy = dy ? py - y0 : 1.0 - (py - y0), wx = dx ? px - x0 : 1.0 - (px - x0);
        v += wy * wx * X(n, ch, yy, xx);
      }
    }
    return v;
  };
  std::vector<double> out(static_cast<size_t>(c.n * ho * wo * c.cout));
  for (int64_t n = 0; n < c.n; ++n) {
    for (int64_t co = 0; co < c.cout; ++co) {
      for (int64_t y = 0; y < ho; ++y) {
        for (int64_t x = 0; x < wo; ++x) {
          double acc = bias ? bias->data<float>()[co] : 0.0;
          for (int64_t ci = 0; ci < c.cin; ++ci) {
            for (int64_t i = 0; i < c.kh; ++i) {
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t k = i * c.kw + j;
                double py = static_cast<double>(y * c.stride - c.pad + i * c.dil) + OFF(n, 2 * k, y, x);
                double px = static_cast<double>(x * c.stride - c.pad + j * c.dil) + OFF(n, 2 * k + 1, y, x);
                if (bf16) {
                  // The position as mmcv (and the kernel) forms it, in f32: in f64 it moves the
                  // sample by a few f32 ulps, enough to round some samples to the other bf16.
                  py = static_cast<double>(static_cast<float>(y * c.stride - c.pad + i * c.dil) +
                                           static_cast<float>(OFF(n, 2 * k, y, x)));
                  px = static_cast<double>(static_cast<float>(x * c.stride - c.pad + j * c.dil) +
                                           static_cast<float>(OFF(n, 2 * k + 1, y, x)));
                }
                const double mask = 1.0 / (1.0 + std::exp(-OFF(n, 2 * K + k, y, x)));
                const double wt = ws[((co * c.cin + ci) * c.kh + i) * c.kw + j];
                if (bf16) {
                  acc += r16(wt) * r16(mask * bilinear(n, ci, py, px));
                } else {
                  acc += wt * mask * bilinear(n, ci, py, px);
                }
              }
            }
          }
          out[static_cast<size_t>(((n * ho + y) * wo + x) * c.cout + co)] = acc;
        }
      }
    }
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

double max_err(const Tensor& got, const std::vector<double>& want) {
  const float* g = got.data<float>();
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(static_cast<double>(g[i]) - want[i]);
    if (!(d <= e)) e = d;  // a NaN makes the error NaN, which fails every bound
  }
  return e;
}

std::vector<double> as_double(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "x [" << c.n << "," << c.h << "," << c.w << "," << c.cin << "] cout "
                                  << c.cout << " k " << c.kh << "x" << c.kw << " s" << c.stride << " p" << c.pad
                                  << " d" << c.dil << (c.bias ? " bias" : "") << " budget " << c.col_budget);
  std::mt19937 rng(seed);
  const Tensor x = random_tensor({c.n, c.h, c.w, c.cin}, rng, -1.0f, 1.0f);
  const Tensor w = random_tensor({c.cout, c.cin, c.kh, c.kw}, rng, -0.5f, 0.5f);
  const Tensor b = random_tensor({c.cout}, rng, -1.0f, 1.0f);
  const Tensor* bias = c.bias ? &b : nullptr;
  const DeformConv2d dcn(w, bias, c.stride, c.pad, c.dil, c.col_budget);
  const Shape ys = dcn.output_shape(x.shape());
  const Tensor om = make_offset_mask(c, ys[1], ys[2], rng);
  Tensor y = Tensor::empty(ys, DType::kF32);
  Tensor y_ref = Tensor::empty(ys, DType::kF32);
  ThreadPool pool(2);
  dcn.run(x, om, y, pool);
  deform_conv2d_reference(x, om, w, bias, c.stride, c.pad, c.dil, y_ref);
  const std::vector<double> want = independent_dcn(c, x, om, w, bias, ys[1], ys[2]);
  const double scale = std::max(1.0, max_abs(want));
  ASSERT_GT(max_abs(want), 0.1);  // the case must not be degenerate
  // Errors are f32 rounding of the samples and of a dot of length K*Cin, relative to the output scale.
  const double tol = 2e-6 * std::sqrt(static_cast<double>(c.kh * c.kw * c.cin)) * scale;
  EXPECT_LE(max_err(y, want), tol) << "optimized vs f64 spec";
  EXPECT_LE(max_err(y_ref, want), tol) << "reference vs f64 spec";
  EXPECT_LE(max_err(y, as_double(y_ref)), tol) << "optimized vs reference";
  std::printf("    dcn max |err| / scale: optimized %.3g, reference %.3g (scale %.3g)\n", max_err(y, want) / scale,
              max_err(y_ref, want) / scale, scale);
}

TEST(DeformConv2d, AwkwardShapesMatchF64Spec) {
  const Case cases[] = {
      {2, 7, 5, 3, 5, 3, 3, 1, 1, 1, false, DeformConv2d::kDefaultColBudgetBytes},
      {1, 9, 8, 3, 5, 3, 3, 2, 1, 1, true, DeformConv2d::kDefaultColBudgetBytes},  // stride 2
      {2, 8, 9, 17, 5, 3, 3, 1, 2, 2, false, DeformConv2d::kDefaultColBudgetBytes},  // dilation 2
      {3, 1, 1, 19, 7, 3, 3, 1, 1, 1, true, DeformConv2d::kDefaultColBudgetBytes},  // 1-pixel maps
      {1, 6, 11, 40, 33, 3, 3, 1, 1, 1, true, 4096},                               // many tiles, 16+16+8 channels
      {2, 5, 6, 16, 3, 2, 3, 1, 0, 1, false, 3 * 2 * 3 * 16 * 4},                  // 2x3 kernel, 3-row tiles
      {1, 10, 7, 33, 9, 3, 3, 2, 2, 2, true, 1000},                                // stride and dilation 2
      // 299 rows, a budget of 150: tiles of 128 rows and a last of 43 padded to 128.
      {1, 13, 23, 16, 8, 3, 3, 1, 1, 1, true, 150 * 9 * 16 * 4},
      // A budget under 128 rows keeps its tiles (no padding): 299 rows in tiles of 100, 100, 99.
      {1, 13, 23, 16, 8, 3, 3, 1, 1, 1, false, 100 * 9 * 16 * 4},
      // 257 rows, a budget of exactly 128: tiles of 128, 128 and a last row padded to 128.
      {1, 1, 257, 8, 4, 3, 3, 1, 1, 1, true, 128 * 9 * 8 * 4},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) run_case(c, seed++);
}

double rel_l2(const Tensor& got, const std::vector<double>& want) {
  const float* g = got.data<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (g[i] - want[i]) * (g[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// bf16 precision: the column tile and the weight in bf16, accumulated in f32. It sits close to
// the spec with its samples and weights rounded the same way (relative L2: a sample whose f32
// value lies on a bf16 rounding boundary may round the other way) and a bf16 rounding away from
// the exact spec (a wrong column layout or a misread tile would be O(1)). Tiles, a short last
// tile, channel tails and bias included.
TEST(DeformConv2d, Bf16ColumnsMatchTheRoundedSpec) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  const Case cases[] = {
      {2, 7, 5, 19, 5, 3, 3, 1, 1, 1, true, DeformConv2d::kDefaultColBudgetBytes},
      {1, 6, 11, 40, 33, 3, 3, 1, 1, 1, true, 4096},  // many tiles, 16+16+8 channels
      {1, 10, 7, 33, 9, 3, 3, 2, 2, 2, false, 1000},  // stride and dilation 2
      {1, 15, 25, 256, 64, 3, 3, 1, 1, 1, false, DeformConv2d::kDefaultColBudgetBytes},  // layer3's width
  };
  uint32_t seed = 11;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "cin " << c.cin << " cout " << c.cout << " budget " << c.col_budget);
    std::mt19937 rng(seed++);
    const Tensor x = random_tensor({c.n, c.h, c.w, c.cin}, rng, -1.0f, 1.0f);
    const Tensor w = random_tensor({c.cout, c.cin, c.kh, c.kw}, rng, -0.5f, 0.5f);
    const Tensor b = random_tensor({c.cout}, rng, -1.0f, 1.0f);
    const Tensor* bias = c.bias ? &b : nullptr;
    const DeformConv2d f32(w, bias, c.stride, c.pad, c.dil, c.col_budget);
    const DeformConv2d bf16(w, bias, c.stride, c.pad, c.dil, c.col_budget, Precision::kBF16);
    const Shape ys = f32.output_shape(x.shape());
    const Tensor om = make_offset_mask(c, ys[1], ys[2], rng);
    Tensor y32 = Tensor::empty(ys, DType::kF32), y16 = Tensor::empty(ys, DType::kF32);
    ThreadPool pool(2);
    f32.run(x, om, y32, pool);
    bf16.run(x, om, y16, pool);
    const std::vector<double> rounded = independent_dcn(c, x, om, w, bias, ys[1], ys[2], /*bf16=*/true);
    const std::vector<double> exact = independent_dcn(c, x, om, w, bias, ys[1], ys[2]);
    const double vs_rounded = rel_l2(y16, rounded), vs_exact = rel_l2(y16, exact), f32_vs_exact = rel_l2(y32, exact);
    std::printf("    bf16 dcn rel L2: vs rounded spec %.3g, vs exact spec %.3g (f32 kernel %.3g)\n", vs_rounded, vs_exact,
                f32_vs_exact);
    // Samples formed in f32 differ from the f64 spec's by an f32 ulp or two, which rounds a few
    // per 10^4 to the neighbouring bf16 (1.7e-5 at layer3's width): still 100x below bf16's own
    // error, which a kernel that rounded differently, or not at all, would show.
    EXPECT_LT(vs_rounded, 0.05 * vs_exact);
    EXPECT_GT(vs_exact, 1e-4) << "no bf16 rounding at all?";
    EXPECT_LT(vs_exact, 1e-2);
    // The model's bf16 input (conv1's output) samples 32 channels a step where the CPU converts to
    // bf16 itself, in a permuted lane order (deform_conv2d.cpp): the bits of the f32 input of the
    // same values, at these channel counts (32-channel steps with tails of 1, 3 and 8, none).
    const Tensor x16 = x.to(DType::kBF16), x_rounded = x16.to(DType::kF32);
    Tensor from16 = Tensor::empty(ys, DType::kF32), from_rounded = Tensor::empty(ys, DType::kF32);
    bf16.run(x16, om, from16, pool);
    bf16.run(x_rounded, om, from_rounded, pool);
    EXPECT_EQ(std::memcmp(from16.raw_data(), from_rounded.raw_data(), from16.nbytes()), 0);
  }
}

// The fused ReLU (and, in bf16 precision, the bf16 output the next conv reads) are the unfused
// forms' bits: relu(y) in f32, and relu(y) rounded to nearest even in bf16, including the padded
// last tile (a budget of 200 rows: tiles of 128, the last 119 rows padded to 128). A bf16 x gives
// the bits of an f32 x holding its values.
TEST(DeformConv2d, FusedReluAndBf16OutputAreTheUnfusedBits) {
  const Case c{1, 15, 25, 24, 40, 3, 3, 1, 1, 1, true, size_t{9 * 24 * 2 * 200}};
  std::mt19937 rng(31);
  const Tensor x = random_tensor({c.n, c.h, c.w, c.cin}, rng, -1.0f, 1.0f);
  const Tensor w = random_tensor({c.cout, c.cin, c.kh, c.kw}, rng, -0.5f, 0.5f);
  const Tensor b = random_tensor({c.cout}, rng, -1.0f, 1.0f);
  ThreadPool pool(2);
  for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    const DeformConv2d plain(w, &b, 1, 1, 1, c.col_budget, p);
    const DeformConv2d fused(w, &b, 1, 1, 1, c.col_budget, p, /*relu=*/true);
    const Shape ys = plain.output_shape(x.shape());
    const Tensor om = make_offset_mask(c, ys[1], ys[2], rng);
    Tensor y = Tensor::empty(ys, DType::kF32), yr = Tensor::empty(ys, DType::kF32);
    plain.run(x, om, y, pool);
    fused.run(x, om, yr, pool);
    Tensor want = y.clone();
    int64_t negatives = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      float& v = want.data<float>()[i];
      negatives += v < 0;
      v = std::max(v, 0.0f);
    }
    ASSERT_GT(negatives, want.numel() / 4) << "a ReLU with little to clip";
    EXPECT_EQ(std::memcmp(yr.raw_data(), want.raw_data(), want.nbytes()), 0) << precision_name(p);
    if (p == Precision::kBF16) {
      Tensor y16 = Tensor::empty(ys, DType::kBF16);
      fused.run(x, om, y16, pool);
      const Tensor want16 = want.to(DType::kBF16);
      EXPECT_EQ(std::memcmp(y16.raw_data(), want16.raw_data(), want16.nbytes()), 0);
      // A bf16 x (conv1's output in the model) samples the bits an f32 x of the same values does.
      const Tensor x16 = x.to(DType::kBF16), x_rounded = x16.to(DType::kF32);
      Tensor from16 = Tensor::empty(ys, DType::kF32), from_rounded = Tensor::empty(ys, DType::kF32);
      fused.run(x16, om, from16, pool);
      fused.run(x_rounded, om, from_rounded, pool);
      EXPECT_EQ(std::memcmp(from16.raw_data(), from_rounded.raw_data(), from16.nbytes()), 0);
      EXPECT_NE(std::memcmp(from16.raw_data(), yr.raw_data(), yr.nbytes()), 0) << "x was not rounded?";
    } else {
      EXPECT_THROW(fused.run(x.to(DType::kBF16), om, yr, pool), Error);  // bf16 x needs bf16 precision
      Tensor y16 = Tensor::empty(ys, DType::kBF16);
      EXPECT_THROW(fused.run(x, om, y16, pool), Error);  // bf16 output needs bf16 precision
    }
  }
}

TEST(DeformConv2d, BaseWidthAgainstReference) {
  // layer3's width (256 -> 256, 3x3) on a small map; the optimized path vs the plain-loop spec.
  std::mt19937 rng(7);
  const Case c{1, 15, 25, 256, 256, 3, 3, 1, 1, 1, false, DeformConv2d::kDefaultColBudgetBytes};
  const Tensor x = random_tensor({1, 15, 25, 256}, rng, -1.0f, 1.0f);
  const Tensor w = random_tensor({256, 256, 3, 3}, rng, -0.05f, 0.05f);
  const DeformConv2d dcn(w, nullptr, 1, 1, 1);
  const Tensor om = make_offset_mask(c, 15, 25, rng);
  Tensor y = Tensor::empty({1, 15, 25, 256}, DType::kF32), y_ref = Tensor::empty({1, 15, 25, 256}, DType::kF32);
  ThreadPool pool(2);
  dcn.run(x, om, y, pool);
  deform_conv2d_reference(x, om, w, nullptr, 1, 1, 1, y_ref);
  const std::vector<double> ref = as_double(y_ref);
  const double scale = max_abs(ref), err = max_err(y, ref);
  std::printf("    base-width max |err| / scale: %.3g (scale %.3g)\n", err / scale, scale);
  EXPECT_GT(scale, 0.5);
  // Measured 1.5e-6 here (AVX-512 brgemm); other ISAs sum in another order, hence the margin.
  EXPECT_LE(err, 5e-6 * scale);
}

TEST(DeformConv2d, ZeroOffsetsAndOpenMaskIsPlainConvTimesHalf) {
  // With Δ = 0 and logit 0 every sample is x at the integer tap times sigmoid(0) = 0.5: an
  // ordinary zero-padded convolution, checked against direct loops.
  std::mt19937 rng(3);
  const int64_t H = 6, W = 7, Cin = 5, Cout = 4;
  const Tensor x = random_tensor({1, H, W, Cin}, rng, -1.0f, 1.0f);
  const Tensor w = random_tensor({Cout, Cin, 3, 3}, rng, -1.0f, 1.0f);
  const DeformConv2d dcn(w, nullptr, 1, 1, 1);
  Tensor om = Tensor::zeros({1, H, W, 27}, DType::kF32);
  Tensor y = Tensor::empty({1, H, W, Cout}, DType::kF32);
  ThreadPool pool(1);
  dcn.run(x, om, y, pool);
  double err = 0;
  for (int64_t yy = 0; yy < H; ++yy) {
    for (int64_t xx = 0; xx < W; ++xx) {
      for (int64_t co = 0; co < Cout; ++co) {
        double acc = 0;
        for (int64_t i = 0; i < 3; ++i) {
          for (int64_t j = 0; j < 3; ++j) {
            const int64_t sy = yy - 1 + i, sx = xx - 1 + j;
            if (sy < 0 || sy >= H || sx < 0 || sx >= W) continue;
            for (int64_t ci = 0; ci < Cin; ++ci) {
              const double wv = w.data<float>()[((co * Cin + ci) * 3 + i) * 3 + j];
              acc += 0.5 * x.data<float>()[(sy * W + sx) * Cin + ci] * wv;
            }
          }
        }
        err = std::max(err, std::fabs(acc - y.data<float>()[(yy * W + xx) * Cout + co]));
      }
    }
  }
  EXPECT_LE(err, 1e-5);
}

TEST(DeformConv2d, DeterministicAcrossPoolSizes) {
  std::mt19937 rng(11);
  const Case c{2, 9, 13, 24, 20, 3, 3, 1, 1, 1, true, 20000};
  const Tensor x = random_tensor({2, 9, 13, 24}, rng, -1.0f, 1.0f);
  const Tensor w = random_tensor({20, 24, 3, 3}, rng, -1.0f, 1.0f);
  const Tensor b = random_tensor({20}, rng, -1.0f, 1.0f);
  const DeformConv2d dcn(w, &b, 1, 1, 1, c.col_budget);
  const Tensor om = make_offset_mask(c, 9, 13, rng);
  Tensor y1 = Tensor::empty({2, 9, 13, 20}, DType::kF32), y2 = Tensor::empty({2, 9, 13, 20}, DType::kF32);
  ThreadPool p1(1), p3(3);
  dcn.run(x, om, y1, p1);
  dcn.run(x, om, y2, p3);
  EXPECT_EQ(0, std::memcmp(y1.raw_data(), y2.raw_data(), y1.nbytes()));
}

// The taps' geometry 16 lanes at a time gives the scalar form's bits: every tap's corner count,
// order, weights and offsets, and its mask, over offsets aimed at the borders, integer grid
// points, far outside and NaN; 1x1 to layer3-sized maps; 3x3, 2x3 and 5x5 kernels (25 taps: a
// full group of 16 and a group of 9); stride, padding and dilation.
TEST(DeformConv2d, TapGeometryAvx512IsTheScalarBits) {
  using namespace deform_conv2d_detail;
  const Case cases[] = {
      {1, 1, 1, 19, 1, 3, 3, 1, 1, 1, false, 0},
      {2, 7, 5, 3, 1, 3, 3, 1, 1, 1, false, 0},
      {1, 10, 7, 33, 1, 3, 3, 2, 2, 2, false, 0},
      {1, 5, 6, 16, 1, 2, 3, 1, 0, 1, false, 0},
      {1, 9, 11, 8, 1, 5, 5, 1, 2, 1, false, 0},
      {1, 58, 100, 256, 1, 3, 3, 1, 1, 1, false, 0},
  };
  uint32_t seed = 40;
  int64_t taps_seen = 0, partial = 0, none = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "map " << c.h << "x" << c.w << " k " << c.kh << "x" << c.kw << " s" << c.stride
                                    << " p" << c.pad << " d" << c.dil);
    const TapGeometry g = tap_geometry(c.h, c.w, c.cin, c.kh, c.kw, c.stride, c.pad, c.dil);
    if (!g.avx512) GTEST_SKIP() << "no AVX-512 (F, BW, VL, DQ) on this CPU";
    const int64_t ho = (c.h + 2 * c.pad - (c.dil * (c.kh - 1) + 1)) / c.stride + 1;
    const int64_t wo = (c.w + 2 * c.pad - (c.dil * (c.kw - 1) + 1)) / c.stride + 1;
    std::mt19937 rng(seed++);
    const Tensor om = make_offset_mask(c, ho, wo, rng);
    const int64_t taps = c.kh * c.kw;
    for (int64_t p = 0; p < c.n * ho * wo; ++p) {
      const int64_t y = p % (ho * wo) / wo, x = p % wo;
      const float* o = om.data<float>() + p * 3 * taps;
      for (int64_t t0 = 0; t0 < taps; t0 += 16) {
        const int64_t count = std::min<int64_t>(16, taps - t0);
        PixelTaps a, b;
        pixel_taps_scalar(g, y, x, o, t0, count, a);
        pixel_taps_avx512(g, y, x, o, t0, count, b);
        for (int64_t i = 0; i < count; ++i) {
          const TapCorners &sa = a.tap[i], &sb = b.tap[i];
          ASSERT_EQ(sa.n, sb.n) << "pixel " << p << " tap " << t0 + i;
          ASSERT_EQ(std::memcmp(&a.mask[i], &b.mask[i], sizeof(float)), 0) << "pixel " << p << " tap " << t0 + i;
          for (int q = 0; q < sa.n; ++q) {
            ASSERT_EQ(std::memcmp(&sa.w[q], &sb.w[q], sizeof(float)), 0) << "pixel " << p << " tap " << t0 + i << " corner " << q;
            ASSERT_EQ(sa.off[q], sb.off[q]) << "pixel " << p << " tap " << t0 + i << " corner " << q;
          }
          ++taps_seen;
          partial += sa.n > 0 && sa.n < 4;
          none += sa.n == 0;
        }
      }
    }
  }
  // The offsets must have reached the cases that differ: taps with some corners out, and none in.
  EXPECT_GT(partial, taps_seen / 50);
  EXPECT_GT(none, taps_seen / 50);
}

TEST(DeformConv2d, ShapeErrorsNameTheTensor) {
  std::mt19937 rng(5);
  const Tensor w = random_tensor({4, 3, 3, 3}, rng, -1.0f, 1.0f);
  const DeformConv2d dcn(w, nullptr, 1, 1, 1);
  const Tensor x = random_tensor({1, 5, 5, 3}, rng, -1.0f, 1.0f);
  Tensor om = random_tensor({1, 5, 5, 18}, rng, -1.0f, 1.0f);  // 18: offsets without the mask
  Tensor y = Tensor::empty({1, 5, 5, 4}, DType::kF32);
  ThreadPool pool(1);
  const auto expect_error = [](const auto& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { dcn.run(x, om, y, pool); }, "offset_mask");
  const Tensor om_ok = random_tensor({1, 5, 5, 27}, rng, -1.0f, 1.0f);
  Tensor y_bad = Tensor::empty({1, 5, 5, 5}, DType::kF32);
  expect_error([&] { dcn.run(x, om_ok, y_bad, pool); }, "output y");
  const Tensor x_bad = random_tensor({1, 5, 5, 4}, rng, -1.0f, 1.0f);
  expect_error([&] { dcn.run(x_bad, om_ok, y, pool); }, "input x");
  const Tensor b_bad = random_tensor({5}, rng, -1.0f, 1.0f);
  expect_error([&] { DeformConv2d bad(w, &b_bad, 1, 1, 1); }, "bias");
  expect_error([&] { DeformConv2d bad(w, nullptr, 0, 1, 1); }, "stride");
}

}  // namespace
}  // namespace bev::cpu
