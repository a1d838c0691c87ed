// MSDA: the reference against an independent grid_sample-style loop in double, and every fast
// path the CPU has against the reference, on awkward shapes and locations (spec §2.12, §5.1/5.7).
//
// Bounds. Let scale = sum_{l,p} |w| * max|value| for one output element and u = 2^-24.
//  - reference vs double: px = x*W - 0.5 is rounded twice in float, moving it by up to
//    (|x|W + |px|) u; bilinear interpolation turns that into at most 2 max|value| per unit of px;
//    the float sums add ~(L*P + 4) u * scale. Checked per element (naive_tolerance).
//  - fast vs reference: identical footprint and bilinear weights, different summation order
//    (per corner, FMAs): |fast - ref| <= (4 L*P + 16) u * scale, i.e. ~1e-6 relative for BEVFormer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/msda.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

struct Case {
  int64_t bs, lq, heads, hd, points;
  SpatialShapes shapes;
};

struct Inputs {
  Case c;
  std::vector<int64_t> level_start;
  int64_t lv = 0;
  Tensor value, loc, attn;
};

std::vector<int64_t> starts_of(const SpatialShapes& shapes, int64_t* total) {
  std::vector<int64_t> s;
  int64_t t = 0;
  for (auto [h, w] : shapes) {
    s.push_back(t);
    t += h * w;
  }
  *total = t;
  return s;
}

// Locations: mostly inside or just outside the map, plus a share of exact borders and huge values.
float random_location(std::mt19937& rng, int64_t size) {
  std::uniform_real_distribution<float> u(-0.15f, 1.15f);
  std::uniform_int_distribution<int> pick(0, 19);
  const auto n = static_cast<float>(size);
  switch (pick(rng)) {
    case 0: return 0.0f;                      // px = -0.5
    case 1: return 1.0f;                      // px = W - 0.5
    case 2: return -0.5f / n;                 // px = -1 (exactly for power-of-two sizes)
    case 3: return (n - 0.5f) / n;            // px = W - 1
    case 4: return (n + 0.5f) / n;            // px = W
    case 5: return 1e9f;
    case 6: return -1e9f;
    case 7: return 1e30f;                     // behind-camera points divided by 1e-5, and worse
    default: return u(rng);
  }
}

Inputs make_inputs(const Case& c, uint32_t seed, bool signed_weights = false) {
  Inputs in;
  in.c = c;
  in.level_start = starts_of(c.shapes, &in.lv);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uv(-1.0f, 1.0f), uw(0.05f, 1.0f);
  const auto L = static_cast<int64_t>(c.shapes.size());
  std::vector<float> v(static_cast<size_t>(c.bs * in.lv * c.heads * c.hd));
  for (auto& x : v) x = uv(rng);
  std::vector<float> loc(static_cast<size_t>(c.bs * c.lq * c.heads * L * c.points * 2));
  std::vector<float> w(loc.size() / 2);
  for (size_t i = 0; i < w.size(); ++i) {
    const auto l = static_cast<size_t>((static_cast<int64_t>(i) / c.points) % L);
    loc[2 * i] = random_location(rng, c.shapes[l].second);
    loc[2 * i + 1] = random_location(rng, c.shapes[l].first);
  }
  // Softmax-like weights (positive, summing to 1 per (b, q, h)), or signed ones.
  const int64_t lp = L * c.points;
  for (size_t g = 0; g < w.size(); g += static_cast<size_t>(lp)) {
    float sum = 0.0f;
    for (int64_t k = 0; k < lp; ++k) sum += (w[g + static_cast<size_t>(k)] = uw(rng));
    for (int64_t k = 0; k < lp; ++k) w[g + static_cast<size_t>(k)] = signed_weights ? uv(rng) : w[g + static_cast<size_t>(k)] / sum;
  }
  in.value = Tensor::from_floats({c.bs, in.lv, c.heads, c.hd}, v);
  in.loc = Tensor::from_floats({c.bs, c.lq, c.heads, L, c.points, 2}, loc);
  in.attn = Tensor::from_floats({c.bs, c.lq, c.heads, L, c.points}, w);
  return in;
}

// grid_sample(bilinear, zeros, align_corners=False) per level, written independently of the
// kernels: normalized grid g = 2x - 1, pixel ((g + 1) W - 1) / 2, every corner checked in double.
std::vector<double> naive_double(const Inputs& in) {
  const Case& c = in.c;
  const auto L = static_cast<int64_t>(c.shapes.size());
  const float* v = in.value.data<float>();
  const float* loc = in.loc.data<float>();
  const float* w = in.attn.data<float>();
  std::vector<double> out(static_cast<size_t>(c.bs * c.lq * c.heads * c.hd), 0.0);
  for (int64_t b = 0; b < c.bs; ++b)
    for (int64_t q = 0; q < c.lq; ++q)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < c.points; ++p) {
            const int64_t i = (((b * c.lq + q) * c.heads + h) * L + l) * c.points + p;
            const auto H = static_cast<double>(c.shapes[static_cast<size_t>(l)].first);
            const auto W = static_cast<double>(c.shapes[static_cast<size_t>(l)].second);
            const double ix = ((2.0 * loc[2 * i] - 1.0 + 1.0) * W - 1.0) / 2.0;
            const double iy = ((2.0 * loc[2 * i + 1] - 1.0 + 1.0) * H - 1.0) / 2.0;
            const double fx = std::floor(ix), fy = std::floor(iy);
            for (int dy = 0; dy < 2; ++dy)
              for (int dx = 0; dx < 2; ++dx) {
                const double cx = fx + dx, cy = fy + dy;
                if (!(cx >= 0 && cx <= W - 1 && cy >= 0 && cy <= H - 1)) continue;
                const double k = (dx ? ix - fx : 1.0 - (ix - fx)) * (dy ? iy - fy : 1.0 - (iy - fy));
                const int64_t row = in.level_start[static_cast<size_t>(l)] + static_cast<int64_t>(cy) * static_cast<int64_t>(W) +
                                    static_cast<int64_t>(cx);
                const float* vr = v + ((b * in.lv + row) * c.heads + h) * c.hd;
                double* o = out.data() + ((b * c.lq + q) * c.heads + h) * c.hd;
                for (int64_t d = 0; d < c.hd; ++d) o[d] += w[i] * k * vr[d];
              }
          }
  return out;
}

// Per (b, q, h): sum |w| * max|value| (the scale of the bounds), and the location-rounding term.
struct Scales {
  std::vector<double> scale, loc_term;
};
Scales scales_of(const Inputs& in) {
  const Case& c = in.c;
  const auto L = static_cast<int64_t>(c.shapes.size());
  double vmax = 0;
  for (int64_t i = 0; i < in.value.numel(); ++i) vmax = std::max(vmax, std::fabs(double(in.value.data<float>()[i])));
  Scales s;
  const int64_t groups = c.bs * c.lq * c.heads;
  s.scale.assign(static_cast<size_t>(groups), 0.0);
  s.loc_term.assign(static_cast<size_t>(groups), 0.0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t k = 0; k < L * c.points; ++k) {
      const int64_t i = g * L * c.points + k;
      const auto l = static_cast<size_t>(k / c.points);
      const double aw = std::fabs(double(in.attn.data<float>()[i])) * vmax;
      s.scale[static_cast<size_t>(g)] += aw;
      const double x = std::fabs(double(in.loc.data<float>()[2 * i])) * double(c.shapes[l].second);
      const double y = std::fabs(double(in.loc.data<float>()[2 * i + 1])) * double(c.shapes[l].first);
      if (x < 1e6 && y < 1e6) s.loc_term[static_cast<size_t>(g)] += aw * 4.0 * (x + y + 2.0) * kU;  // far points read 0
    }
  return s;
}

struct Errors {
  double max_abs = 0, max_rel = 0;  // rel: abs error / scale of that element
};

// Compares `got` against `want` under tolerance(group) and returns the observed errors.
template <typename Want, typename Tol>
Errors compare(const Inputs& in, const Tensor& got, const Want& want, const Tol& tol, const std::string& what) {
  const Scales s = scales_of(in);
  Errors e;
  const int64_t hd = in.c.hd;
  int failures = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], wv = want(i);
    const auto grp = static_cast<size_t>(i / hd);
    const double err = std::fabs(g - wv);
    e.max_abs = std::max(e.max_abs, err);
    if (s.scale[grp] > 0) e.max_rel = std::max(e.max_rel, err / s.scale[grp]);
    if (!(err <= tol(s, grp)) && failures++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << wv << " err " << err << " tol " << tol(s, grp);
  }
  return e;
}

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

Tensor run_reference(const Inputs& in) {
  Tensor out;
  msda_reference(in.value, in.c.shapes, in.level_start, in.loc, in.attn, out);
  return out;
}

Tensor run_fast(const Inputs& in, MsdaIsa isa, ThreadPool& pool) {
  // Pre-filled with NaN: the kernel must overwrite every element.
  Tensor out = Tensor::empty({in.c.bs, in.c.lq, in.c.heads * in.c.hd}, DType::kF32);
  std::fill(out.data<float>(), out.data<float>() + out.numel(), std::numeric_limits<float>::quiet_NaN());
  msda_with_isa(isa, in.value, in.c.shapes, in.level_start, in.loc, in.attn, out, pool);
  return out;
}

std::vector<MsdaIsa> isas() {
  std::vector<MsdaIsa> r;
  for (MsdaIsa i : {MsdaIsa::kScalar, MsdaIsa::kAvx2, MsdaIsa::kAvx512})
    if (msda_isa_supported(i)) r.push_back(i);
  return r;
}

// Checks reference vs double and every ISA vs reference; prints the observed errors.
void check_all(const Inputs& in, ThreadPool& pool, const std::string& name) {
  const Tensor ref = run_reference(in);
  const std::vector<double> naive = naive_double(in);
  const int64_t lp = static_cast<int64_t>(in.c.shapes.size()) * in.c.points;
  const Errors en = compare(
      in, ref, [&](int64_t i) { return naive[static_cast<size_t>(i)]; },
      [&](const Scales& s, size_t g) { return s.loc_term[g] + double(lp + 4) * kU * s.scale[g] + 1e-30; }, name + " ref vs double");
  std::string line = name + ": ref-vs-double max_abs " + sci(en.max_abs) + " rel " + sci(en.max_rel);
  for (MsdaIsa isa : isas()) {
    const Tensor got = run_fast(in, isa, pool);
    const Errors ef = compare(
        in, got, [&](int64_t i) { return double(ref.data<float>()[i]); },
        [&](const Scales& s, size_t g) { return double(4 * lp + 16) * kU * s.scale[g] + 1e-30; },
        name + " " + msda_isa_name(isa) + " vs ref");
    line += std::string("; ") + msda_isa_name(isa) + "-vs-ref max_abs " + sci(ef.max_abs) + " rel " + sci(ef.max_rel);
  }
  std::printf("  %s\n", line.c_str());
}

class MsdaHeadDim : public ::testing::TestWithParam<int64_t> {};

TEST_P(MsdaHeadDim, AwkwardShapesAgree) {
  const int64_t hd = GetParam();
  ThreadPool pool(2);
  const std::vector<Case> cases = {
      {2, 7, 3, hd, 3, {{1, 1}, {3, 5}, {7, 2}}},          // a 1-pixel level among odd shapes, bs=2
      {1, 1, 1, hd, 1, {{1, 1}}},                          // Lq=1, one sample
      {2, 33, 8, hd, 8, {{4, 4}, {2, 8}, {1, 1}, {5, 3}}},  // 256 samples per query
      {1, 19, 5, hd, 4, {{6, 9}}},                         // 20 samples: a vector tail
      {2, 5, 2, hd, 5, {{8, 1}, {1, 8}}},                  // one-column and one-row levels
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    check_all(make_inputs(cases[k], 1000u + static_cast<uint32_t>(k * 31 + hd)), pool,
              "hd " + std::to_string(hd) + " case " + std::to_string(k));
    check_all(make_inputs(cases[k], 2000u + static_cast<uint32_t>(k), /*signed_weights=*/true), pool,
              "hd " + std::to_string(hd) + " case " + std::to_string(k) + " signed w");
  }
}

INSTANTIATE_TEST_SUITE_P(Msda, MsdaHeadDim, ::testing::Values(1, 3, 16, 17, 32, 33, 64, 70));

// Every combination of border coordinates, on power-of-two sizes where x*W - 0.5 is exact.
TEST(Msda, BordersExactly) {
  ThreadPool pool(2);
  for (auto [H, W] : SpatialShapes{{1, 1}, {8, 4}, {2, 16}}) {
    const auto coords = [](int64_t n) {
      const auto f = static_cast<float>(n);
      return std::vector<float>{-0.5f / f,                         // px = -1: reads 0
                                std::nextafter(-0.5f / f, 1.0f),   // just inside -1
                                0.0f,                              // px = -0.5
                                0.5f / f,                          // px = 0
                                (f - 0.5f) / f,                    // px = W - 1
                                1.0f,                              // px = W - 0.5
                                std::nextafter((f + 0.5f) / f, 0.0f),  // just below W
                                (f + 0.5f) / f,                    // px = W: reads 0
                                -1e9f, 1e9f, 3.4e38f};
    };
    const std::vector<float> xs = coords(W), ys = coords(H);
    const int64_t n = static_cast<int64_t>(xs.size() * ys.size());
    Case c{1, n, 2, 17, 1, {{H, W}}};
    Inputs in = make_inputs(c, 7u);
    float* loc = in.loc.data<float>();
    for (int64_t q = 0; q < n; ++q)
      for (int64_t h = 0; h < 2; ++h) {
        loc[(q * 2 + h) * 2] = xs[static_cast<size_t>(q) % xs.size()];
        loc[(q * 2 + h) * 2 + 1] = ys[static_cast<size_t>(q) / xs.size()];
        in.attn.data<float>()[q * 2 + h] = 0.75f;
      }
    check_all(in, pool, "borders " + std::to_string(H) + "x" + std::to_string(W));
    // Exact expectations where the bilinear footprint is a single pixel or nothing.
    const Tensor ref = run_reference(in);
    const Tensor fast = run_fast(in, msda_best_isa(), pool);
    for (int64_t q = 0; q < n; ++q) {
      const size_t xi = static_cast<size_t>(q) % xs.size(), yi = static_cast<size_t>(q) / xs.size();
      const bool outside = xi == 0 || xi >= 7 || yi == 0 || yi >= 7;
      const bool on_pixel = (xi == 3 || xi == 4) && (yi == 3 || yi == 4);
      if (!outside && !on_pixel) continue;
      const int64_t x = xi == 3 ? 0 : W - 1, y = yi == 3 ? 0 : H - 1;
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 17; ++d) {
          const float want = outside ? 0.0f : 0.75f * in.value.data<float>()[((y * W + x) * 2 + h) * 17 + d];
          ASSERT_EQ(ref.data<float>()[(q * 2 + h) * 17 + d], want) << "q " << q;
          ASSERT_EQ(fast.data<float>()[(q * 2 + h) * 17 + d], want) << "q " << q;
        }
    }
  }
}

// Huge and far-away locations read zero (no crash, no NaN, no UB in an int conversion).
TEST(Msda, HugeLocationsReadZero) {
  ThreadPool pool(2);
  Inputs in = make_inputs({2, 16, 8, 32, 4, {{15, 25}, {1, 1}}}, 11u);
  const float huge[] = {1e9f, -1e9f, 3.4e38f, -3.4e38f, std::numeric_limits<float>::infinity()};
  for (int64_t i = 0; i < in.loc.numel(); ++i) in.loc.data<float>()[i] = huge[i % 5] * ((i / 5) % 2 ? 1.0f : -1.0f);
  // A few with one coordinate in range: still zero, because the other one is not.
  for (int64_t i = 0; i < in.loc.numel(); i += 7) in.loc.data<float>()[i] = 0.5f;
  const Tensor ref = run_reference(in);
  for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_EQ(ref.data<float>()[i], 0.0f);
  for (MsdaIsa isa : isas()) {
    const Tensor got = run_fast(in, isa, pool);
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<float>()[i], 0.0f) << msda_isa_name(isa);
  }
}

// A non-finite value outside a sample's footprint must not leak into it (as in mmcv).
TEST(Msda, NonFiniteValueOutsideFootprintStaysOut) {
  ThreadPool pool(1);
  Inputs in = make_inputs({1, 4, 1, 20, 1, {{3, 3}}}, 12u);
  float* v = in.value.data<float>();
  for (int64_t d = 0; d < 20; ++d) v[(1 * 3 + 1) * 20 + d] = std::numeric_limits<float>::infinity();  // centre pixel
  const float xy[4][2] = {{0.1f, 0.1f}, {0.0f, 0.9f}, {1.0f, 1.0f}, {0.9f, 0.0f}};  // near corners: never touch the centre
  for (int64_t q = 0; q < 4; ++q) {
    in.loc.data<float>()[2 * q] = xy[q][0];
    in.loc.data<float>()[2 * q + 1] = xy[q][1];
  }
  const Tensor ref = run_reference(in);
  for (int64_t i = 0; i < ref.numel(); ++i) ASSERT_TRUE(std::isfinite(ref.data<float>()[i]));
  for (MsdaIsa isa : isas()) {
    const Tensor got = run_fast(in, isa, pool);
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<float>()[i], ref.data<float>()[i]) << msda_isa_name(isa);
  }
}

// BEVFormer-tiny TSA (two queue branches as bs=2) and a base-shaped SCA slice (4 levels, 8 points).
TEST(Msda, BevformerShapes) {
  ThreadPool pool(2);
  check_all(make_inputs({2, 2500, 8, 32, 4, {{50, 50}}}, 21u), pool, "tiny TSA");
  check_all(make_inputs({1, 64, 8, 32, 8, {{116, 200}, {58, 100}, {29, 50}, {15, 25}}}, 22u), pool, "base SCA slice");
}

// The result does not depend on the thread count or chunking: bitwise equal.
TEST(Msda, ThreadCountInvariant) {
  Inputs in = make_inputs({2, 97, 8, 33, 4, {{9, 7}, {3, 2}}}, 31u);
  for (MsdaIsa isa : isas()) {
    ThreadPool p1(1), p2(2), p3(3);
    const Tensor a = run_fast(in, isa, p1), b = run_fast(in, isa, p2), c = run_fast(in, isa, p3);
    ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << msda_isa_name(isa);
    ASSERT_EQ(std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()), 0) << msda_isa_name(isa);
  }
}

// Prefetching the next query's rows (the AVX-512 path, automatic on large maps) changes no bit:
// forced on and off over awkward shapes, chunkings (the chunk's last query has no next one) and
// a head-major view, and on a map just past both thresholds of msda_prefetch_bytes(), where kAuto
// turns it on.
TEST(Msda, PrefetchIsBitIdentical) {
  if (!msda_isa_supported(MsdaIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const auto run = [](const Inputs& in, const Tensor& value, ThreadPool& pool, MsdaPrefetch pf) {
    Tensor out = Tensor::empty({in.c.bs, in.c.lq, in.c.heads * in.c.hd}, DType::kF32);
    std::fill(out.data<float>(), out.data<float>() + out.numel(), std::numeric_limits<float>::quiet_NaN());
    msda_with_isa(MsdaIsa::kAvx512, value, in.c.shapes, in.level_start, in.loc, in.attn, out, pool, pf);
    return out;
  };
  const std::vector<Case> cases = {
      {2, 7, 3, 17, 3, {{1, 1}, {3, 5}, {7, 2}}},
      {1, 1, 1, 70, 1, {{1, 1}}},
      {2, 33, 8, 32, 8, {{4, 4}, {2, 8}, {1, 1}, {5, 3}}},
      {2, 97, 8, 33, 4, {{9, 7}, {3, 2}}},
      // 8 x 32 floats per row, 32769 rows: just over 32 MiB per batch, so kAuto prefetches on
      // every CPU.
      {1, 300, 8, 32, 4, {{3, 10923}}},
  };
  static_assert(3.0 * 10923 * 8 * 32 * sizeof(float) >= kMsdaPrefetchBytesAmd && kMsdaPrefetchBytesAmd >= kMsdaPrefetchBytesOther);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Inputs in = make_inputs(cases[k], 3000u + static_cast<uint32_t>(k));
    const Tensor head_major_view = in.value.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3});
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (const Tensor* value : {&in.value, &head_major_view}) {
        const Tensor off = run(in, *value, pool, MsdaPrefetch::kOff);
        const Tensor on = run(in, *value, pool, MsdaPrefetch::kOn);
        const Tensor automatic = run(in, *value, pool, MsdaPrefetch::kAuto);
        const std::string what = "case " + std::to_string(k) + ", " + std::to_string(threads) + " thread(s)" +
                                 (value == &in.value ? "" : ", head-major view");
        ASSERT_EQ(std::memcmp(off.raw_data(), on.raw_data(), off.nbytes()), 0) << what;
        ASSERT_EQ(std::memcmp(off.raw_data(), automatic.raw_data(), off.nbytes()), 0) << what;
      }
    }
  }
  ThreadPool pool(2);
  check_all(make_inputs(cases.back(), 3100u), pool, "map past msda_prefetch_bytes()");  // kAuto's prefetching path vs the spec
}

// bf16 values (what the model's value projections write in bf16 precision) are widened exactly,
// so every path gives the bits it gives on the f32 tensor of the same rounded values: over every
// head_dim tail, a head-major view, both prefetch settings, and a NaN outside the footprint.
TEST(Msda, Bf16ValuesGiveTheBitsOfTheirF32Values) {
  const auto to_bf16 = [](const Tensor& f32) {
    Tensor h = Tensor::empty(f32.shape(), DType::kBF16);
    float_to_bf16_n(f32.data<float>(), static_cast<uint16_t*>(h.raw_data()), static_cast<size_t>(f32.numel()));
    return h;
  };
  const auto widened = [](const Tensor& bf16) {
    Tensor f = Tensor::empty(bf16.shape(), DType::kF32);
    bf16_to_float_n(static_cast<const uint16_t*>(bf16.raw_data()), f.data<float>(), static_cast<size_t>(bf16.numel()));
    return f;
  };
  const auto same = [](const Tensor& a, const Tensor& b) { return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0; };
  std::vector<Case> cases;
  for (int64_t hd : {1, 3, 8, 9, 16, 17, 31, 32, 33, 70}) cases.push_back({2, 13, 3, hd, 3, {{1, 1}, {3, 5}, {7, 2}}});
  cases.push_back({1, 40, 8, 32, 8, {{12, 20}, {6, 10}, {3, 5}, {2, 3}}});  // BEVFormer's heads, hd, levels, points
  ThreadPool pool(2);
  for (size_t k = 0; k < cases.size(); ++k) {
    Inputs in = make_inputs(cases[k], 5000u + static_cast<uint32_t>(k), /*signed_weights=*/k % 2 == 1);
    const Tensor bf16 = to_bf16(in.value);
    in.value = widened(bf16);
    const std::string what = "hd " + std::to_string(cases[k].hd);
    ASSERT_TRUE(same(run_reference(in), [&] {
      Tensor out;
      msda_reference(bf16, in.c.shapes, in.level_start, in.loc, in.attn, out);
      return out;
    }())) << what << ", reference";
    const Tensor bf16_view = bf16.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3});
    for (MsdaIsa isa : isas()) {
      const Tensor want = run_fast(in, isa, pool);
      for (MsdaPrefetch pf : {MsdaPrefetch::kOff, MsdaPrefetch::kOn}) {
        if (pf == MsdaPrefetch::kOn && isa != MsdaIsa::kAvx512) continue;
        for (const Tensor* value : {&bf16, &bf16_view}) {
          Tensor got = Tensor::empty(want.shape(), DType::kF32);
          std::fill(got.data<float>(), got.data<float>() + got.numel(), std::numeric_limits<float>::quiet_NaN());
          msda_with_isa(isa, *value, in.c.shapes, in.level_start, in.loc, in.attn, got, pool, pf);
          ASSERT_TRUE(same(want, got)) << what << ", " << msda_isa_name(isa) << (value == &bf16 ? "" : ", head-major view")
                                       << (pf == MsdaPrefetch::kOn ? ", prefetching" : "");
        }
      }
    }
  }
  // A NaN in a bf16 value row no sample touches stays out, as in f32.
  Inputs in = make_inputs({1, 4, 1, 20, 1, {{3, 3}}}, 12u);
  float* loc = in.loc.data<float>();
  for (int64_t i = 0; i < in.loc.numel(); ++i) loc[i] = 0.1f;  // every sample near the top-left corner
  Tensor bf16 = to_bf16(in.value);
  auto* v = static_cast<uint16_t*>(bf16.raw_data());
  for (int64_t d = 0; d < 20; ++d) v[8 * 20 + d] = 0x7FC0;  // row 8, the bottom-right pixel: NaN
  for (MsdaIsa isa : isas()) {
    Tensor out;
    msda_with_isa(isa, bf16, in.c.shapes, in.level_start, in.loc, in.attn, out, pool);
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isfinite(out.data<float>()[i])) << msda_isa_name(isa);
  }
}

// A head-major value [bs, heads, Lv, hd], passed as its permuted view, gives the same result.
TEST(Msda, HeadMajorValueView) {
  ThreadPool pool(2);
  Inputs in = make_inputs({2, 40, 8, 32, 4, {{6, 5}, {2, 3}}}, 41u);
  const Tensor head_major = in.value.permute({0, 2, 1, 3}).contiguous();  // [bs, heads, Lv, hd]
  const Tensor view = head_major.permute({0, 2, 1, 3});                    // [bs, Lv, heads, hd] view
  ASSERT_FALSE(view.is_contiguous());
  Tensor ref_view;
  msda_reference(view, in.c.shapes, in.level_start, in.loc, in.attn, ref_view);
  const Tensor ref = run_reference(in);
  ASSERT_EQ(std::memcmp(ref.raw_data(), ref_view.raw_data(), ref.nbytes()), 0);
  for (MsdaIsa isa : isas()) {
    Tensor a, b;
    msda_with_isa(isa, in.value, in.c.shapes, in.level_start, in.loc, in.attn, a, pool);
    msda_with_isa(isa, view, in.c.shapes, in.level_start, in.loc, in.attn, b, pool);
    ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << msda_isa_name(isa);
  }
}

TEST(Msda, EmptyQueryBatch) {
  ThreadPool pool(2);
  // Built with Tensor::empty: Tensor::from_floats memcpys from the null data() of an empty span.
  const Tensor value = make_inputs({2, 1, 8, 32, 4, {{3, 3}}}, 51u).value;
  const Tensor loc = Tensor::empty({2, 0, 8, 1, 4, 2}, DType::kF32), attn = Tensor::empty({2, 0, 8, 1, 4}, DType::kF32);
  Tensor out, out_ref;
  msda(value, {{3, 3}}, {0}, loc, attn, out, pool);
  msda_reference(value, {{3, 3}}, {0}, loc, attn, out_ref);
  EXPECT_EQ(out.shape(), (Shape{2, 0, 256}));
  EXPECT_EQ(out_ref.shape(), (Shape{2, 0, 256}));
}

// Every malformed input throws kInvalidInput and names the offending tensor or argument.
TEST(Msda, ShapeErrorsNameTheTensor) {
  ThreadPool pool(1);
  const Inputs in = make_inputs({2, 3, 4, 8, 2, {{3, 5}, {2, 2}}}, 61u);
  const auto expect_error = [&](const std::string& needle, const Tensor& value, const SpatialShapes& shapes,
                                const std::vector<int64_t>& starts, const Tensor& loc, const Tensor& attn, Tensor out) {
    for (int fast = 0; fast < 2; ++fast) {
      Tensor o = out;
      try {
        if (fast)
          msda(value, shapes, starts, loc, attn, o, pool);
        else
          msda_reference(value, shapes, starts, loc, attn, o);
        ADD_FAILURE() << "no error for " << needle;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  };
  const auto& sh = in.c.shapes;
  const auto& ls = in.level_start;
  expect_error("value", in.value.reshape({2, 19, 32}), sh, ls, in.loc, in.attn, {});
  expect_error("value", in.value.slice(1, 0, 18), sh, ls, in.loc, in.attn, {});  // Lv != sum H*W
  expect_error("value", in.value.to(DType::kF64), sh, ls, in.loc, in.attn, {});
  expect_error("value", in.value.permute({0, 1, 3, 2}), sh, ls, in.loc.slice(2, 0, 4), in.attn, {});  // hd stride != 1
  expect_error("spatial_shapes", in.value, {}, {}, in.loc, in.attn, {});
  expect_error("spatial_shapes", in.value, {{0, 5}, {2, 2}}, ls, in.loc, in.attn, {});
  expect_error("level_start", in.value, sh, {0}, in.loc, in.attn, {});
  expect_error("level_start", in.value, sh, {0, 14}, in.loc, in.attn, {});
  expect_error("sampling_locations", in.value, sh, ls, in.loc.slice(2, 0, 3), in.attn, {});
  expect_error("sampling_locations", in.value, sh, ls, in.loc.reshape({2, 3, 4, 2, 4, 1}), in.attn, {});
  expect_error("sampling_locations", in.value, sh, ls, in.loc.permute({1, 0, 2, 3, 4, 5}).contiguous().permute({1, 0, 2, 3, 4, 5}),
               in.attn, {});  // not contiguous
  expect_error("attention_weights", in.value, sh, ls, in.loc, in.attn.slice(4, 0, 1), {});
  expect_error("attention_weights", in.value, sh, ls, in.loc, in.attn.reshape({2, 3, 4, 4}), {});
  expect_error("out", in.value, sh, ls, in.loc, in.attn, Tensor::empty({2, 3, 31}, DType::kF32));
  expect_error("out", in.value, sh, ls, in.loc, in.attn, Tensor::empty({2, 3, 32}, DType::kF16));
}

}  // namespace
}  // namespace bev::cpu
