// cpu::Bottleneck (a stride-1 ResNet bottleneck run depth-first in strips of rows) against
//  - a plain reference written here: the block's four convs as direct loops in double, on the
//    f32 weights, each intermediate rounded to f32 as the conv-by-conv path stores it;
//  - the same cpu::Conv2d members run one by one on the whole map (what the model runs when it
//    does not fuse).
// Shapes are awkward on purpose (odd channels, 1-row and 1-pixel maps, widths of 1 and 7), and
// the strip budget is made tiny so that a map runs as many 1-row strips, bands split images and
// every halo path (top and bottom image edges, band edges) is taken; thread counts 1-3 change the
// band split.
//
// Error measure, as in test_op_conv2d: |y - ref| / S per output, S the sum of the magnitudes of
// every term that reached it through the chain (computed alongside the reference). The f32 bound
// is the three stacked sums' (K1 + K2 + K3 + 9) * 2^-24 with K the convs' product counts (each
// conv's K + 2 terms and its rounding to f32; errors of a chain add in this measure); a
// dropped tap or a halo row from the wrong place errs by order 1/K.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/amx1x1.h"
#include "backend/cpu/bottleneck.h"
#include "backend/cpu/conv2d.h"
#include "backend/cpu/conv2d_int8.h"
#include "backend/cpu/onednn.h"
#include "bevformer/error.h"
#include "core/half.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

namespace bev::cpu {
namespace {

using kernel_test::random_tensor;
using kernel_test::ThreadsGuard;

struct Member {
  Tensor w, b;
  Conv2dAttrs a;
  std::shared_ptr<const Conv2d> conv;
};

Member member(int64_t o, int64_t i, int k, bool relu, bool residual, uint32_t seed, Precision p) {
  Member m;
  m.w = random_tensor({o, i, k, k}, seed, -0.5f, 0.5f);
  m.b = random_tensor({o}, seed + 100, -0.2f, 0.2f);
  m.a.pad_h = m.a.pad_w = k / 2;
  m.a.relu = relu;
  m.a.residual = residual;
  m.conv = std::make_shared<const Conv2d>(m.w, &m.b, m.a, p);
  return m;
}

struct Block {
  Member c1, c2, c3, ds;
  bool has_ds = false;
};

Block block(int64_t c, int64_t planes, int64_t e, bool ds, uint32_t seed, Precision p = Precision::kF32) {
  Block b;
  b.c1 = member(planes, c, 1, true, false, seed, p);
  b.c2 = member(planes, planes, 3, true, false, seed + 1, p);
  b.c3 = member(e, planes, 1, true, true, seed + 2, p);
  b.has_ds = ds;
  if (ds) b.ds = member(e, c, 1, false, false, seed + 3, p);
  return b;
}

// One conv in double over NHWC values: out = act(conv(x) + b + res), and the magnitude of its
// terms (|x| carried from the input's own magnitudes: mag_out = sum |w| * mag_x + |b| + mag_res).
struct Map {
  int64_t n, h, w, c;
  std::vector<double> v, mag;
};

Map conv_ref(const Map& x, const Member& m, const Map* res) {
  const int64_t o = m.w.size(0), k = m.w.size(2), pad = k / 2;
  Map y{x.n, x.h, x.w, o, {}, {}};
  y.v.assign(static_cast<size_t>(x.n * x.h * x.w * o), 0.0);
  y.mag = y.v;
  const float* wp = m.w.data<float>();
  const float* bp = m.b.data<float>();
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t i = 0; i < x.h; ++i)
      for (int64_t j = 0; j < x.w; ++j)
        for (int64_t oc = 0; oc < o; ++oc) {
          double acc = bp[oc], mag = std::fabs(bp[oc]);
          for (int64_t di = 0; di < k; ++di)
            for (int64_t dj = 0; dj < k; ++dj) {
              const int64_t ii = i + di - pad, jj = j + dj - pad;
              if (ii < 0 || ii >= x.h || jj < 0 || jj >= x.w) continue;
              for (int64_t ic = 0; ic < x.c; ++ic) {
                const size_t xi = static_cast<size_t>(((n * x.h + ii) * x.w + jj) * x.c + ic);
                const double wv = wp[((oc * x.c + ic) * k + di) * k + dj];
                acc += wv * x.v[xi];
                mag += std::fabs(wv) * x.mag[xi];
              }
            }
          const size_t yi = static_cast<size_t>(((n * x.h + i) * x.w + j) * o + oc);
          if (res) {
            acc += res->v[yi];
            mag += res->mag[yi];
          }
          if (m.a.relu) acc = std::max(acc, 0.0);
          // Stored as the conv-by-conv path stores it: rounded to f32.
          y.v[yi] = static_cast<double>(static_cast<float>(acc));
          y.mag[yi] = mag;
        }
  return y;
}

Map to_map(const Tensor& t) {
  const Tensor f = t.to(DType::kF32);
  Map m{t.size(0), t.size(1), t.size(2), t.size(3), {}, {}};
  const float* p = f.data<float>();
  m.v.assign(p, p + f.numel());
  m.mag.resize(m.v.size());
  for (size_t i = 0; i < m.v.size(); ++i) m.mag[i] = std::fabs(m.v[i]);
  return m;
}

Map block_ref(const Block& b, const Tensor& x) {
  const Map xm = to_map(x);
  const Map t1 = conv_ref(xm, b.c1, nullptr);
  const Map t2 = conv_ref(t1, b.c2, nullptr);
  if (b.has_ds) {
    const Map id = conv_ref(xm, b.ds, nullptr);
    return conv_ref(t2, b.c3, &id);
  }
  return conv_ref(t2, b.c3, &xm);
}

// The worst |y - ref| / S over all outputs.
double worst(const Tensor& y, const Map& ref) {
  const Tensor f = y.to(DType::kF32);
  const float* p = f.data<float>();
  double w = 0;
  for (size_t i = 0; i < ref.v.size(); ++i) {
    w = std::max(w, std::fabs(static_cast<double>(p[i]) - ref.v[i]) / std::max(ref.mag[i], 1e-30));
  }
  return w;
}

Tensor conv_by_conv(const Block& b, const Tensor& x) {
  Tensor t1 = Tensor::empty(b.c1.conv->output_shape(x.shape()), DType::kF32);
  b.c1.conv->run(x, nullptr, t1);
  Tensor t2 = Tensor::empty(t1.shape(), DType::kF32);
  b.c2.conv->run(t1, nullptr, t2);
  Tensor y = Tensor::empty(b.c3.conv->output_shape(t2.shape()), DType::kF32);
  if (b.has_ds) {
    b.ds.conv->run(x, nullptr, y);
    b.c3.conv->run(t2, &y, y);
  } else {
    b.c3.conv->run(t2, &x, y);
  }
  return y;
}

double bound_f32(const Block& b) {
  const double k1 = static_cast<double>(b.c1.w.size(1)), k2 = static_cast<double>(b.c2.w.size(1) * 9);
  const double k3 = static_cast<double>(b.c3.w.size(1));
  return (k1 + k2 + k3 + 9) * std::ldexp(1.0, -24);
}

struct Case {
  int64_t n, h, w, c, planes, e;
  bool ds;
};

TEST(Bottleneck, MatchesThePlainReferenceInStripsAndBands) {
  const Case cases[] = {
      {3, 7, 5, 5, 3, 5, false},    // odd everything, identity residual
      {2, 9, 7, 4, 3, 12, true},    // block 0: a downsample, 4 -> 12 channels
      {1, 1, 1, 6, 2, 6, false},    // one pixel
      {2, 1, 9, 3, 5, 3, false},    // one row
      {4, 6, 1, 7, 4, 20, true},    // width 1
      {1, 11, 3, 17, 16, 17, false}, // planes a multiple of 16, more rows than threads
      {2, 5, 3, 64, 64, 256, true}   // layer1 block 0's channels: conv1 and the downsample run on
                                     // cpu::Direct1x1 (f32, AVX-512), single-threaded in each lane
  };
  double observed = 0;
  for (const Case& cs : cases) {
    const Block b = block(cs.c, cs.planes, cs.e, cs.ds, static_cast<uint32_t>(cs.c * 7 + cs.h));
    const Tensor x = random_tensor({cs.n, cs.h, cs.w, cs.c}, static_cast<uint32_t>(cs.n + cs.w), -1.0f, 1.0f);
    const Map ref = block_ref(b, x);
    for (size_t budget : {size_t{1}, size_t{2000}, Bottleneck::kStripBytes}) {
      const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, b.has_ds ? b.ds.conv : nullptr, budget);
      for (int threads : {1, 2, 3}) {
        ThreadsGuard g(threads);
        Tensor y = Tensor::empty({cs.n, cs.h, cs.w, cs.e}, DType::kF32);
        fused.run(x, y, DType::kF32);
        const double err = worst(y, ref);
        observed = std::max(observed, err);
        EXPECT_LE(err, bound_f32(b)) << cs.n << "x" << cs.h << "x" << cs.w << "x" << cs.c << " planes " << cs.planes
                                     << " budget " << budget << " threads " << threads;
      }
    }
  }
  std::printf("f32 worst err/S %.3g\n", observed);
}

TEST(Bottleneck, EqualsTheConvsRunOneByOne) {
  // The same oneDNN kernels per pixel: the strips change which pixels a call covers, not the
  // arithmetic of a pixel, so the outputs are usually the same bits (0 differ here with oneDNN
  // 2.6 on avx512_core_bf16). Bit equality is up to oneDNN's choice of kernel per shape, so it is
  // printed; the f32 bound is asserted.
  const Block b = block(13, 6, 13, false, 21);
  const Tensor x = random_tensor({3, 10, 9, 13}, 22, -1.0f, 1.0f);
  const Tensor expect = conv_by_conv(b, x);
  const Map ref = to_map(expect);
  for (int threads : {1, 2}) {
    ThreadsGuard g(threads);
    const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, nullptr, 1);
    Tensor y = Tensor::empty(expect.shape(), DType::kF32);
    fused.run(x, y, DType::kF32);
    int64_t differ = 0;
    double worst_abs = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double d = std::fabs(static_cast<double>(y.data<float>()[i]) - ref.v[static_cast<size_t>(i)]);
      differ += d != 0;
      worst_abs = std::max(worst_abs, d);
    }
    std::printf("threads %d: %lld of %lld outputs differ from conv by conv, by at most %.3g\n", threads,
                static_cast<long long>(differ), static_cast<long long>(y.numel()), worst_abs);
    EXPECT_LE(worst(y, block_ref(b, x)), bound_f32(b));
  }
}

TEST(Bottleneck, InPlaceEqualsSeparateOutput) {
  // y over x: the band halos are computed before any thread overwrites x, so every band split
  // gives the separate-output result bit for bit.
  const Block b = block(9, 5, 9, false, 31);
  const Tensor x = random_tensor({3, 13, 6, 9}, 32, -1.0f, 1.0f);
  const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, nullptr, 1);
  for (int threads : {1, 2, 3}) {
    ThreadsGuard g(threads);
    Tensor separate = Tensor::empty(x.shape(), DType::kF32);
    fused.run(x, separate, DType::kF32);
    Tensor y = x.clone();
    fused.run(y, y, DType::kF32);
    EXPECT_EQ(std::memcmp(y.raw_data(), separate.raw_data(), y.nbytes()), 0) << "threads " << threads;
  }
}

TEST(Bottleneck, Bf16ActivationsMatchTheReference) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  // bf16 precision: weights and every conv's source rounded to bf16, products summed in f32, t1,
  // t2 and y stored in bf16. Each conv errs by at most (2^-7 + 2^-16) of its terms' magnitude
  // (test_op_conv2d's bound) plus the rounding of its stored output, 2^-8; errors of a chain add
  // in this measure, so three convs: 3 * (2^-7 + 2^-8 + 2^-16) + the f32 sums.
  const Block b = block(10, 7, 10, true, 41, Precision::kBF16);
  const Tensor x = random_tensor({2, 8, 5, 10}, 42, -1.0f, 1.0f).to(DType::kBF16);
  const Map ref = block_ref(b, x);
  const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, b.ds.conv, 1);
  for (int threads : {1, 2}) {
    ThreadsGuard g(threads);
    Tensor y = Tensor::empty({2, 8, 5, 10}, DType::kBF16);
    fused.run(x, y, DType::kBF16);
    const double err = worst(y, ref);
    std::printf("bf16 threads %d worst err/S %.3g\n", threads, err);
    EXPECT_LE(err, 3 * (std::ldexp(1.0, -7) + std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) + bound_f32(b));
  }
}

TEST(Bottleneck, Bf16OnAmxRunsItsOneByOnesOnTiles) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  // Channels of whole tiles (multiples of 32): on AMX the 1x1 members run on cpu::Amx1x1, the next
  // strip's rows spread into conv3's calls, the residual added by the tile unit. The same bound as
  // above, against the plain reference and against the convs run one by one (on oneDNN), with and
  // without a downsample, in place, in many strips and bands, on 1 and 2 threads. That bound
  // scales with every term of the chain, loose enough to hide a residual channel added to its
  // neighbour's output; so each output is also held to 2^-4 of its own size plus the map's RMS:
  // the bf16 chain's roundings reach 0.017-0.018 of it here, such a misplaced channel 1.7.
  for (const bool ds : {true, false}) {
    SCOPED_TRACE(ds ? "with a downsample" : "in place");
    const Block b = block(ds ? 32 : 64, 32, 64, ds, ds ? 43 : 44, Precision::kBF16);
    ASSERT_EQ(b.c1.conv->amx1x1() != nullptr, Amx1x1::supports(Conv2dAttrs{}, 32, 32, 1, 1, Precision::kBF16));
    const Tensor x = random_tensor({3, 13, 11, ds ? 32 : 64}, ds ? 45 : 46, -1.0f, 1.0f).to(DType::kBF16);
    const Map ref = block_ref(b, x);
    const Map one_by_one = to_map(conv_by_conv(b, x));
    const double bound = 3 * (std::ldexp(1.0, -7) + std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) + bound_f32(b);
    for (const size_t strip_bytes : {size_t{1}, Bottleneck::kStripBytes}) {
      const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, b.ds.conv, strip_bytes);
      for (int threads : {1, 2}) {
        ThreadsGuard g(threads);
        Tensor y = ds ? Tensor::empty({3, 13, 11, 64}, DType::kBF16) : x.clone();
        fused.run(ds ? x : y, y, DType::kBF16);
        const double err = worst(y, ref);
        std::printf("bf16 amx %s strip %zu threads %d worst err/S %.3g\n", ds ? "ds" : "in place", strip_bytes, threads,
                    err);
        EXPECT_LE(err, bound) << "strip " << strip_bytes << " threads " << threads;
        double apart = 0;  // from the convs run one by one, in units of the reference's magnitudes
        for (size_t i = 0; i < ref.v.size(); ++i) {
          const double got = bf16_to_float(static_cast<const uint16_t*>(y.raw_data())[i]);
          apart = std::max(apart, std::fabs(got - one_by_one.v[i]) / std::max(ref.mag[i], 1e-30));
        }
        EXPECT_LE(apart, 2 * bound) << "strip " << strip_bytes << " threads " << threads;
        double rms = 0, tight = 0;
        for (double v : ref.v) rms += v * v;
        rms = std::sqrt(rms / static_cast<double>(ref.v.size()));
        for (size_t i = 0; i < ref.v.size(); ++i) {
          const double got = bf16_to_float(static_cast<const uint16_t*>(y.raw_data())[i]);
          tight = std::max(tight, std::fabs(got - ref.v[i]) / (std::fabs(ref.v[i]) + rms));
        }
        EXPECT_LE(tight, std::ldexp(1.0, -4)) << "strip " << strip_bytes << " threads " << threads;
      }
    }
  }
}

TEST(Bottleneck, RunsEveryBandOnASmallerTeamThanAsked) {
  // Called from inside another parallel region, the block's own region gets a team of one while
  // the thread count asks for two: the bands must follow the team OpenMP gave.
  const Block b = block(7, 4, 7, false, 61);
  const Tensor x = random_tensor({2, 6, 5, 7}, 62, -1.0f, 1.0f);
  const Map ref = block_ref(b, x);
  const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, nullptr, 1);
  ThreadsGuard g(2);
  const int levels = omp_get_max_active_levels();
  omp_set_max_active_levels(1);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  int team = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      fused.run(x, y, DType::kF32);
      team = fused.last_threads();
    }
  }
  omp_set_max_active_levels(levels);
  EXPECT_EQ(team, 1);
  EXPECT_LE(worst(y, ref), bound_f32(b));
}

TEST(Bottleneck, MixedDtypesAsTheImageStageHasThem) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  // bf16 precision. (1) The last block of an output stage: bf16 input, f32 output, the identity
  // added from the bf16 input (a residual of another dtype than y). (2) An f32 input with bf16
  // activations (rounded inside conv1 and the downsample).
  const Block b = block(9, 4, 9, false, 71, Precision::kBF16);
  const Tensor x16 = random_tensor({2, 7, 6, 9}, 72, -1.0f, 1.0f).to(DType::kBF16);
  const double bf16_bound = 3 * (std::ldexp(1.0, -7) + std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) + bound_f32(b);
  const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, nullptr, 1);
  Tensor y32 = Tensor::empty(x16.shape(), DType::kF32);
  fused.run(x16, y32, DType::kBF16);
  EXPECT_LE(worst(y32, block_ref(b, x16)), bf16_bound);

  const Block d = block(5, 3, 12, true, 73, Precision::kBF16);
  const Tensor x32 = random_tensor({1, 9, 4, 5}, 74, -1.0f, 1.0f);
  const Bottleneck with_ds(d.c1.conv, d.c2.conv, d.c3.conv, d.ds.conv, 1);
  Tensor y16 = Tensor::empty({1, 9, 4, 12}, DType::kBF16);
  with_ds.run(x32, y16, DType::kBF16);
  EXPECT_LE(worst(y16, block_ref(d, x32)), bf16_bound);
}

// The block in int8 precision (issue 26): the same weights with calibrated input steps (x s8,
// t1 and t2 u8 after their ReLUs). Fused, it runs the int8 convs on strips; their sums are exact
// in s32 and a pixel's quantization does not depend on the strip, so it must equal the int8 convs
// run one by one, and both must stay within 8-bit quantization's error of the f32 block.
TEST(Bottleneck, Int8EqualsTheInt8ConvsRunOneByOne) {
  BEV_SKIP_UNLESS_RUNS(Precision::kInt8);
  const Block f = block(11, 6, 11, true, 91);
  const Tensor x = random_tensor({2, 13, 9, 11}, 92, -1.0f, 1.0f);
  const Tensor y32 = conv_by_conv(f, x);
  auto max_of = [](const Tensor& t) {
    const float* p = t.data<float>();
    return static_cast<float>(*std::max_element(p, p + t.numel(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
  };
  Tensor t1 = Tensor::empty(f.c1.conv->output_shape(x.shape()), DType::kF32);
  f.c1.conv->run(x, nullptr, t1);
  Tensor t2 = Tensor::empty(t1.shape(), DType::kF32);
  f.c2.conv->run(t1, nullptr, t2);
  auto int8_of = [](const Member& m, float top, bool u8) {
    Member q = m;
    q.a.int8_step = std::fabs(top) / (u8 ? 255.0f : 127.0f);
    q.a.int8_unsigned = u8;
    q.conv = std::make_shared<const Conv2d>(m.w, &m.b, q.a, Precision::kInt8);
    return q;
  };
  Block q;
  q.c1 = int8_of(f.c1, 1.0f, false);
  q.c2 = int8_of(f.c2, max_of(t1), true);
  q.c3 = int8_of(f.c3, max_of(t2), true);
  q.ds = int8_of(f.ds, 1.0f, false);
  q.has_ds = true;
  // As the model prepares it: conv1 and conv2 write u8 codes of the next conv's input step.
  Block chain = q;
  auto with_out = [](Member m, float step) {
    m.a.int8_out_step = step;
    m.conv = std::make_shared<const Conv2d>(m.w, &m.b, m.a, Precision::kInt8);
    return m;
  };
  chain.c1 = with_out(q.c1, q.c2.a.int8_step);
  chain.c2 = with_out(q.c2, q.c3.a.int8_step);
  std::printf("int8 conv2 runs on %s\n", q.c2.conv->impl_name(t1.shape()).c_str());
  const Tensor expect = conv_by_conv(q, x);
  double diff2 = 0, ref2 = 0, worst_abs = 0;
  for (int64_t i = 0; i < y32.numel(); ++i) {
    const double d = static_cast<double>(expect.data<float>()[i]) - y32.data<float>()[i];
    diff2 += d * d;
    ref2 += static_cast<double>(y32.data<float>()[i]) * y32.data<float>()[i];
  }
  const double rel = std::sqrt(diff2 / ref2);
  std::printf("int8 block against f32: relative L2 %.3g\n", rel);
  EXPECT_GT(rel, 0) << "int8 did not run";
  EXPECT_LT(rel, 3e-2);
  // The u8 chain quantizes t1 and t2 where the f32 chain's next conv did: the same codes but
  // where a rounding lands the other side of a tie, so it stays within a code of the f32 chain.
  Tensor c1 = Tensor::empty(t1.shape(), DType::kU8), c2 = Tensor::empty(t1.shape(), DType::kU8);
  chain.c1.conv->run(x, nullptr, c1);
  chain.c2.conv->run(c1, nullptr, c2);
  Tensor chained = Tensor::empty(expect.shape(), DType::kF32);
  chain.ds.conv->run(x, nullptr, chained);
  chain.c3.conv->run(c2, &chained, chained);
  double chain2 = 0;
  for (int64_t i = 0; i < y32.numel(); ++i) {
    const double d = static_cast<double>(chained.data<float>()[i]) - expect.data<float>()[i];
    chain2 += d * d;
  }
  std::printf("u8 chain against the f32-fed int8 convs: relative L2 %.3g\n", std::sqrt(chain2 / ref2));
  EXPECT_LT(std::sqrt(chain2 / ref2), 0.25 * rel);
  for (int threads : {1, 2}) {
    ThreadsGuard g(threads);
    const Bottleneck fused_chain(chain.c1.conv, chain.c2.conv, chain.c3.conv, chain.ds.conv, 1);
    Tensor yc = Tensor::empty(expect.shape(), DType::kF32);
    fused_chain.run(x, yc, DType::kU8);
    EXPECT_EQ(std::memcmp(yc.raw_data(), chained.raw_data(), yc.nbytes()), 0) << "fused u8 chain, " << threads << " threads";
    const Bottleneck fused(q.c1.conv, q.c2.conv, q.c3.conv, q.ds.conv, 1);
    Tensor y = Tensor::empty(expect.shape(), DType::kF32);
    fused.run(x, y, DType::kF32);
    int64_t differ = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double d = std::fabs(static_cast<double>(y.data<float>()[i]) - expect.data<float>()[i]);
      differ += d != 0;
      worst_abs = std::max(worst_abs, d);
    }
    std::printf("threads %d: %lld of %lld int8 outputs differ from conv by conv, by at most %.3g\n", threads,
                static_cast<long long>(differ), static_cast<long long>(y.numel()), worst_abs);
    EXPECT_LE(worst_abs, 1e-6 * max_of(expect));
  }
}

// A conv without a calibrated step in int8 precision is a conv of int8's float arithmetic (bf16
// where bf16_outruns_f32(): AMX, AMD; f32 elsewhere), bit for bit.
TEST(Conv2d, Int8PrecisionRunsUncalibratedConvsInItsFloatArithmeticAndRefusesStepsElsewhere) {
  const Precision arithmetic = float_arithmetic(Precision::kInt8);
  EXPECT_EQ(arithmetic, bf16_outruns_f32() ? Precision::kBF16 : Precision::kF32);
  const Member m = member(7, 5, 3, true, false, 95, arithmetic);
  const Conv2d plain(m.w, &m.b, m.a, Precision::kInt8);  // no step
  EXPECT_EQ(plain.precision(), arithmetic);
  const Tensor x = random_tensor({1, 6, 5, 5}, 96, -1.0f, 1.0f);
  Tensor a = Tensor::empty(plain.output_shape(x.shape()), DType::kF32), b = a.clone();
  plain.run(x, nullptr, a);
  m.conv->run(x, nullptr, b);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  Conv2dAttrs stepped = m.a;
  stepped.int8_step = 0.01f;
  try {
    Conv2d(m.w, &m.b, stepped, Precision::kF32);
    ADD_FAILURE() << "an int8 step in f32 precision was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("int8 precision"), std::string::npos) << e.what();
  }
}

TEST(Bottleneck, RejectsWhatItCannotRun) {
  const Block b = block(6, 3, 6, false, 51);
  const Bottleneck fused(b.c1.conv, b.c2.conv, b.c3.conv, nullptr);
  const Tensor x = random_tensor({1, 4, 4, 6}, 52);
  Tensor wrong_c = random_tensor({1, 4, 4, 5}, 53);
  Tensor y = Tensor::empty({1, 4, 4, 6}, DType::kF32);
  EXPECT_THROW(fused.run(wrong_c, y, DType::kF32), Error);
  Tensor small = Tensor::empty({1, 4, 3, 6}, DType::kF32);
  EXPECT_THROW(fused.run(x, small, DType::kF32), Error);
  // An output that half-overlaps the input.
  Tensor buf = Tensor::empty({2 * 96}, DType::kF32);
  Tensor x2 = buf.slice(0, 0, 96).reshape({1, 4, 4, 6});
  Tensor y2 = buf.slice(0, 48, 144).reshape({1, 4, 4, 6});
  EXPECT_THROW(fused.run(x2, y2, DType::kF32), Error);
  // In place with a downsample (the identity is not x).
  const Block d = block(6, 3, 6, true, 54);
  const Bottleneck with_ds(d.c1.conv, d.c2.conv, d.c3.conv, d.ds.conv);
  Tensor same = x.clone();
  EXPECT_THROW(with_ds.run(same, same, DType::kF32), Error);
  // Members that are not a stride-1 bottleneck.
  Member strided = member(3, 6, 1, true, false, 55, Precision::kF32);
  Conv2dAttrs s2 = strided.a;
  s2.stride_h = s2.stride_w = 2;
  auto conv_s2 = std::make_shared<const Conv2d>(strided.w, &strided.b, s2, Precision::kF32);
  EXPECT_THROW(Bottleneck(conv_s2, b.c2.conv, b.c3.conv, nullptr), Error);
  // A downsample to other channels than conv3's.
  const Member ds12 = member(12, 6, 1, false, false, 56, Precision::kF32);
  EXPECT_THROW(Bottleneck(b.c1.conv, b.c2.conv, b.c3.conv, ds12.conv), Error);
  // conv2 reading other channels than conv1 writes.
  const Member c2_wide = member(3, 4, 3, true, false, 57, Precision::kF32);
  EXPECT_THROW(Bottleneck(b.c1.conv, c2_wide.conv, b.c3.conv, nullptr), Error);
}

TEST(Bottleneck, PaysOnlyOnWideMaps) {
  // ResNet-50 at 480x800: layer1 (120x200) and layer2 (60x100) fuse, layer3 and layer4 do not.
  EXPECT_TRUE(Bottleneck::pays({6, 120, 200, 256}, 64, 256, DType::kF32));
  EXPECT_TRUE(Bottleneck::pays({6, 60, 100, 512}, 128, 512, DType::kF32));
  EXPECT_FALSE(Bottleneck::pays({6, 30, 50, 1024}, 256, 1024, DType::kF32));
  EXPECT_FALSE(Bottleneck::pays({6, 15, 25, 2048}, 512, 2048, DType::kF32));
  EXPECT_FALSE(Bottleneck::pays({6, 15, 25, 2048}, 512, 2048, DType::kBF16));
  // bf16 on AMX: where the 1x1s run on Amx1x1 and an image's output map is 8 MiB or more (tiny's
  // layer1 and its block 0, base's layer2), not tiny's layer2; elsewhere as f32 does.
  const bool amx = Amx1x1::supports(Conv2dAttrs{}, 32, 32, 1, 1, Precision::kBF16);
  EXPECT_TRUE(Bottleneck::pays({6, 120, 200, 256}, 64, 256, DType::kBF16));
  EXPECT_TRUE(Bottleneck::pays({6, 120, 200, 64}, 64, 256, DType::kBF16));
  EXPECT_TRUE(Bottleneck::pays({6, 116, 200, 512}, 128, 512, DType::kBF16));
  EXPECT_EQ(Bottleneck::pays({6, 60, 100, 512}, 128, 512, DType::kBF16), !amx);
  EXPECT_EQ(Bottleneck::pays({6, 120, 200, 24}, 24, 96, DType::kBF16), !amx);  // channels of no whole tile
}

}  // namespace
}  // namespace bev::cpu
