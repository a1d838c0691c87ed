// The glue ops around attention and the head (sampling_locations, reference_refine,
// bbox_denormalize), broadcasting add / mul, zeros and -1 padding in gather / scatter, against
// plain references written here, on random inputs of awkward sizes, through the kernels and
// through Ops (including Ops' shape errors). Where the reference is the same float formula the
// results must agree bit for bit; the double-precision references get a tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention_glue.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/select.h"
#include "backend/ops.h"
#include "backend/recorded_stage.h"
#include "kernel_test_util.h"

namespace bev {
namespace {

using kernel_test::random_tensor;
using Levels = std::vector<std::pair<int64_t, int64_t>>;  // (H, W) per level

const float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

Tensor filled(const Shape& s, float v) {
  Tensor t = Tensor::empty(s, DType::kF32);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), v);
  return t;
}

// ---- add / mul with broadcasting ----

// y[i] = a[i] op b[i with b's unit dims at 0], by explicit multi-indices.
template <typename Op>
Tensor broadcast_ref(const Tensor& a, const Tensor& b, Op op) {
  Tensor y = Tensor::empty(a.shape(), DType::kF32);
  const Shape bst = contiguous_strides(b.shape());
  for (int64_t i = 0; i < a.numel(); ++i) {
    int64_t rem = i, bi = 0;
    for (int64_t d = a.dim() - 1; d >= 0; --d) {
      const int64_t idx = rem % a.size(d);
      rem /= a.size(d);
      if (b.size(d) != 1) bi += idx * bst[static_cast<size_t>(d)];
    }
    y.data<float>()[i] = op(a.data<float>()[i], b.data<float>()[bi]);
  }
  return y;
}

TEST(AddMulBroadcast, EveryPatternMatchesTheIndexReferenceBitForBit) {
  std::mt19937 rng(101);
  ThreadPool pool(2);
  // a's own unit dims at the front, middle and end; the last three span several 16K-element
  // chunks of the pool, which start mid-row and mid-run.
  const std::vector<Shape> shapes = {{7},          {1},           {5, 3},        {1, 9},           {4, 1},
                                     {3, 1, 5},    {1, 4, 6},     {2, 3, 1},     {2, 5, 3, 7},     {3, 1, 1, 5},
                                     {1, 2, 1, 3}, {6, 301, 29},  {1003, 67},    {2, 33, 17, 37}};
  const auto add_op = [](float u, float v) { return u + v; };
  const auto mul_op = [](float u, float v) { return u * v; };
  int cases = 0;
  for (const Shape& as : shapes) {
    const Tensor a = random_tensor(as, rng, -4.0f, 4.0f);
    const auto rank = static_cast<int>(as.size());
    for (int mask = 0; mask < (1 << rank); ++mask) {
      Shape bs = as;
      for (int d = 0; d < rank; ++d) {
        if (mask & (1 << d)) bs[static_cast<size_t>(d)] = 1;
      }
      const Tensor b = random_tensor(bs, rng, -4.0f, 4.0f);
      SCOPED_TRACE("a " + shape_str(as) + " b " + shape_str(bs));
      const Tensor want_add = broadcast_ref(a, b, add_op), want_mul = broadcast_ref(a, b, mul_op);
      Tensor y = filled(as, kNaN);
      cpu::add(a, b, y, &pool);
      EXPECT_TRUE(same_bits(y, want_add));
      cpu::mul(a, b, y, &pool);
      EXPECT_TRUE(same_bits(y, want_mul));
      cpu::add(a, b, y);  // on the caller
      EXPECT_TRUE(same_bits(y, want_add));
      Tensor in_place = a.clone();  // y may be a
      cpu::mul(in_place, b, in_place, &pool);
      EXPECT_TRUE(same_bits(in_place, want_mul));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 2 * 2 + 4 * 4 + 4 * 8 + 4 * 16);  // every mask of every shape ran
}

TEST(AddMulBroadcast, EqualShapesMayAliasEitherInput) {
  std::mt19937 rng(102);
  const Tensor a = random_tensor({17, 29}, rng), b = random_tensor({17, 29}, rng);
  const Tensor want = broadcast_ref(a, b, [](float u, float v) { return u * v; });
  Tensor ya = a.clone(), yb = b.clone();
  cpu::mul(ya, b, ya);
  cpu::mul(a, yb, yb);
  EXPECT_TRUE(same_bits(ya, want));
  EXPECT_TRUE(same_bits(yb, want));
}

TEST(AddMulBroadcast, KernelRefusesBadShapesAndOverlapWithBroadcastB) {
  std::mt19937 rng(103);
  const Tensor a = random_tensor({4, 6}, rng);
  Tensor y = Tensor::empty({4, 6}, DType::kF32);
  EXPECT_THROW(cpu::add(a, random_tensor({6}, rng), y), Error);        // rank differs
  EXPECT_THROW(cpu::mul(a, random_tensor({4, 3}, rng), y), Error);     // 3 is neither 6 nor 1
  EXPECT_THROW(cpu::add(random_tensor({4, 1}, rng), random_tensor({4, 6}, rng), y), Error);  // b larger
  Tensor wrong = Tensor::empty({4, 7}, DType::kF32);
  EXPECT_THROW(cpu::add(a, random_tensor({1, 6}, rng), wrong), Error);
  Tensor b16 = Tensor::empty({1, 6}, DType::kF16);
  EXPECT_THROW(cpu::mul(a, b16, y), Error);
  // y over a broadcast b: b [1, 6] is the first row of y.
  Tensor buf = random_tensor({4, 6}, rng);
  const Tensor b_view = buf.slice(0, 0, 1);
  EXPECT_THROW(cpu::mul(a, b_view, buf), Error);
}

TEST(AddMulBroadcast, ThroughOpsAtTheModelsShapesAndShapeErrors) {
  std::mt19937 rng(104);
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend);
  const auto add_op = [](float u, float v) { return u + v; };
  const auto mul_op = [](float u, float v) { return u * v; };
  // feat [6, hw, C] + cams_embeds [6, 1, C]; weights [HW, 64] * half [1, 1]; slots [HW, C] * inv_count [HW, 1].
  const Tensor feat = random_tensor({6, 187, 19}, rng), cams = random_tensor({6, 1, 19}, rng);
  EXPECT_TRUE(same_bits(ops.add(feat, cams, "feat"), broadcast_ref(feat, cams, add_op)));
  const Tensor weights = random_tensor({313, 64}, rng), half = Tensor::from_floats({1, 1}, std::vector<float>{0.5f});
  EXPECT_TRUE(same_bits(ops.mul(weights, half), broadcast_ref(weights, half, mul_op)));
  const Tensor slots = random_tensor({313, 21}, rng), inv_count = random_tensor({313, 1}, rng, 0.1f, 1.0f);
  EXPECT_TRUE(same_bits(ops.mul(slots, inv_count), broadcast_ref(slots, inv_count, mul_op)));
  EXPECT_TRUE(same_bits(ops.add(slots, slots), broadcast_ref(slots, slots, add_op)));

  EXPECT_THROW(ops.add(random_tensor({2, 3}, rng), random_tensor({3}, rng)), Error);
  EXPECT_THROW(ops.mul(random_tensor({2, 3}, rng), random_tensor({2, 2}, rng)), Error);
  EXPECT_THROW(ops.mul(random_tensor({2, 1}, rng), random_tensor({2, 3}, rng)), Error);  // a decides the shape
  EXPECT_THROW(ops.add(random_tensor({2, 3}, rng), Tensor::empty({1, 3}, DType::kF16)), Error);
  try {
    ops.mul(random_tensor({5, 4}, rng), random_tensor({5, 2}, rng), "sca.slots");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mul 'sca.slots'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("do not broadcast"), std::string::npos) << e.what();
  }
}

// ---- zeros ----

TEST(Zeros, KernelAndOpsZeroAgainOnEveryReplay) {
  Tensor y = filled({5, 7}, kNaN);
  cpu::zeros(y);
  EXPECT_TRUE(same_bits(y, Tensor::zeros({5, 7}, DType::kF32)));
  Tensor empty = Tensor::empty({0, 3}, DType::kF32);
  cpu::zeros(empty);

  auto backend = make_cpu_backend(1, Precision::kF32);
  Ops ops(*backend, Ops::Mode::kPlan);
  const Tensor z = ops.zeros({3, 1, 9}, "acc");
  EXPECT_EQ(z.shape(), (Shape{3, 1, 9}));
  EXPECT_EQ(z.dtype(), DType::kF32);
  const RecordedStage stage("zeros", ops.take_nodes(), {z}, *backend);
  backend->execute(stage);
  EXPECT_TRUE(same_bits(z, Tensor::zeros({3, 1, 9}, DType::kF32)));
  std::fill(z.data<float>(), z.data<float>() + z.numel(), 42.0f);  // last frame's sums
  backend->execute(stage);
  EXPECT_TRUE(same_bits(z, Tensor::zeros({3, 1, 9}, DType::kF32)));
}

// ---- gather / scatter with -1 padding ----

TEST(GatherScatterPadding, MinusOneGivesZeroRowsAndSkipsRows) {
  std::mt19937 rng(201);
  const int64_t n = 11, c = 7;
  const Tensor src = random_tensor({n, c}, rng);
  const std::vector<int64_t> iv = {-1, 3, 10, -1, 0, 3, -1};
  const auto m = static_cast<int64_t>(iv.size());
  Tensor dst = filled({m, c}, kNaN);
  cpu::gather_rows(src, i64_tensor(iv), dst);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = iv[static_cast<size_t>(i)];
    for (int64_t j = 0; j < c; ++j) {
      const float want = r < 0 ? 0.0f : src.data<float>()[r * c + j];
      const float got = dst.data<float>()[i * c + j];
      ASSERT_EQ(0, std::memcmp(&got, &want, 4)) << i << ", " << j;  // +0.0f, not -0.0f or NaN
    }
  }
  // Any dtype: i64 rows pad with 0.
  Tensor src64 = Tensor::empty({n, 2}, DType::kI64), dst64 = Tensor::empty({m, 2}, DType::kI64);
  for (int64_t i = 0; i < n * 2; ++i) src64.data<int64_t>()[i] = 1000 + i;
  std::fill(dst64.data<int64_t>(), dst64.data<int64_t>() + m * 2, int64_t{-7});
  cpu::gather_rows(src64, i64_tensor(iv), dst64);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = iv[static_cast<size_t>(i)];
    EXPECT_EQ(dst64.data<int64_t>()[i * 2 + 1], r < 0 ? 0 : 1000 + r * 2 + 1);
  }

  // Scatter: -1 rows are skipped; duplicates (3) accumulate in increasing i.
  const Tensor upd = random_tensor({m, c}, rng);
  Tensor acc = random_tensor({n, c}, rng);
  std::vector<float> want(acc.data<float>(), acc.data<float>() + n * c);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = iv[static_cast<size_t>(i)];
    if (r < 0) continue;
    for (int64_t j = 0; j < c; ++j) want[static_cast<size_t>(r * c + j)] += upd.data<float>()[i * c + j];
  }
  cpu::scatter_add_rows(upd, i64_tensor(iv), acc);
  EXPECT_EQ(0, std::memcmp(acc.data<float>(), want.data(), want.size() * 4));

  // All padding: gather gives zeros, scatter changes nothing.
  const std::vector<int64_t> none(static_cast<size_t>(m), -1);
  cpu::gather_rows(src, i64_tensor(none), dst);
  EXPECT_TRUE(same_bits(dst, Tensor::zeros({m, c}, DType::kF32)));
  const Tensor before = acc.clone();
  cpu::scatter_add_rows(upd, i64_tensor(none), acc);
  EXPECT_TRUE(same_bits(acc, before));
  // No rows at all.
  Tensor dst0 = Tensor::empty({0, c}, DType::kF32);
  cpu::gather_rows(src, i64_tensor({}), dst0);
  cpu::scatter_add_rows(Tensor::empty({0, c}, DType::kF32), i64_tensor({}), acc);
  EXPECT_TRUE(same_bits(acc, before));
}

TEST(GatherScatterPadding, BelowMinusOneOrPastTheEndThrowsBeforeAnyWrite) {
  std::mt19937 rng(202);
  const int64_t n = 9, c = 5;
  const Tensor src = random_tensor({n, c}, rng);
  for (int64_t bad : {int64_t{-2}, n, int64_t{-100}, n + 5}) {
    SCOPED_TRACE(bad);
    // The bad index last, so a kernel that writes as it checks would have written rows already.
    const std::vector<int64_t> iv = {0, -1, 4, bad};
    Tensor dst = random_tensor({4, c}, rng);
    const Tensor dst_before = dst.clone();
    try {
      cpu::gather_rows(src, i64_tensor(iv), dst);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("-1 (padding)"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(same_bits(dst, dst_before));
    Tensor acc = random_tensor({n, c}, rng);
    const Tensor acc_before = acc.clone();
    EXPECT_THROW(cpu::scatter_add_rows(random_tensor({4, c}, rng), i64_tensor(iv), acc), Error);
    EXPECT_TRUE(same_bits(acc, acc_before));
  }
}

TEST(GatherScatterPadding, ThroughOps) {
  std::mt19937 rng(203);
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend);
  const Tensor src = random_tensor({6, 3}, rng);
  const Tensor g = ops.gather_rows(src, i64_tensor({5, -1, 0}), "pad");
  EXPECT_EQ(0, std::memcmp(g.data<float>(), src.data<float>() + 15, 12));
  EXPECT_TRUE(same_bits(g.slice(0, 1, 2).contiguous(), Tensor::zeros({1, 3}, DType::kF32)));
  EXPECT_EQ(0, std::memcmp(g.data<float>() + 6, src.data<float>(), 12));
  const Tensor dst = ops.zeros({6, 3});
  ops.scatter_add_rows(g, i64_tensor({-1, 2, -1}), dst);
  for (int64_t i = 0; i < 18; ++i) EXPECT_EQ(dst.data<float>()[i], i >= 6 && i < 9 ? g.data<float>()[i - 3] : 0.0f);
  EXPECT_THROW(ops.gather_rows(src, i64_tensor({-2})), Error);
  EXPECT_THROW(ops.scatter_add_rows(g, i64_tensor({0, 6, 1}), dst), Error);
}

// ---- sampling_locations ----

// loc = ref[m, Lr == 1 ? 0 : l, p % R, 0:2] + off / (W_l, H_l), in f32 as upstream.
Tensor sampling_locations_ref(const Tensor& off, const Tensor& ref, const Levels& levels) {
  Tensor out = Tensor::empty(off.shape(), DType::kF32);
  const int64_t m_len = off.size(0), heads = off.size(1), l_len = off.size(2), p_len = off.size(3);
  const int64_t lr = ref.size(1), r_len = ref.size(2), d_len = ref.size(3);
  const float* o = off.data<float>();
  const float* r = ref.data<float>();
  float* y = out.data<float>();
  for (int64_t m = 0; m < m_len; ++m) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t l = 0; l < l_len; ++l) {
        const auto [hl, wl] = levels[static_cast<size_t>(l)];
        for (int64_t p = 0; p < p_len; ++p) {
          const int64_t i = (((m * heads + h) * l_len + l) * p_len + p) * 2;
          const int64_t ri = ((m * lr + (lr == 1 ? 0 : l)) * r_len + p % r_len) * d_len;
          const float ox = o[i] / static_cast<float>(wl);
          const float oy = o[i + 1] / static_cast<float>(hl);
          y[i] = r[ri] + ox;
          y[i + 1] = r[ri + 1] + oy;
        }
      }
    }
  }
  return out;
}

struct LocCase {
  int64_t m, heads;
  Levels levels;
  int64_t points, anchors;  // P, R
  bool per_level;           // Lr = L (else 1)
  int64_t d;
  float offset_range;
};

TEST(SamplingLocations, MatchesUpstreamFormulaBitForBit) {
  std::mt19937 rng(301);
  ThreadPool pool(2);
  const std::vector<LocCase> cases = {
      {37, 3, {{13, 17}, {7, 9}, {1, 1}}, 8, 4, false, 2, 1.0f},           // SCA: Z = 4 anchors per query
      {37, 3, {{13, 17}, {7, 9}, {1, 1}}, 8, 1, true, 3, 1.0f},            // decoder: per-level 3-d reference
      {1, 1, {{1, 1}}, 1, 1, false, 2, 1.0f},                              // the smallest
      {1001, 2, {{100, 200}, {50, 3}}, 6, 2, true, 2, 1.0f},               // threaded over M
      {5, 8, {{200, 200}, {100, 100}, {50, 50}, {25, 25}}, 4, 1, false, 2, 1e6f},  // huge offsets
      {19, 5, {{31, 7}, {3, 29}}, 12, 4, true, 3, 3e4f},
      {7, 2, {{13, 17}, {7, 9}, {3, 3}}, 50, 5, true, 2, 1.0f},  // 300 values a head: past the kernel's block
  };
  for (const LocCase& c : cases) {
    const auto l_len = static_cast<int64_t>(c.levels.size());
    SCOPED_TRACE("M " + std::to_string(c.m) + " L " + std::to_string(l_len) + " P " + std::to_string(c.points) +
                 " R " + std::to_string(c.anchors) + " D " + std::to_string(c.d));
    const Tensor off = random_tensor({c.m, c.heads, l_len, c.points, 2}, rng, -c.offset_range, c.offset_range);
    const Tensor ref = random_tensor({c.m, c.per_level ? l_len : 1, c.anchors, c.d}, rng, 0.0f, 1.0f);
    const Tensor want = sampling_locations_ref(off, ref, c.levels);
    Tensor out = filled(off.shape(), kNaN);
    cpu::sampling_locations(off, ref, c.levels, out, &pool);
    EXPECT_TRUE(same_bits(out, want));
    cpu::sampling_locations(off, ref, c.levels, out);
    EXPECT_TRUE(same_bits(out, want));
    Tensor in_place = off.clone();
    cpu::sampling_locations(in_place, ref, c.levels, in_place, &pool);
    EXPECT_TRUE(same_bits(in_place, want));
  }
}

TEST(SamplingLocations, TrueDivisionIsNotAReciprocalMultiply) {
  // The reference above would pass a kernel that multiplies by 1 / W only if the two agreed;
  // at W = 17, H = 7 they do not, so the bit-exact test above does pin true division.
  std::mt19937 rng(302);
  const Levels levels = {{7, 17}};
  const Tensor off = random_tensor({200, 1, 1, 4, 2}, rng, -3.0f, 3.0f);
  const Tensor ref = random_tensor({200, 1, 1, 2}, rng, 0.0f, 1.0f);
  Tensor out = Tensor::empty(off.shape(), DType::kF32);
  cpu::sampling_locations(off, ref, levels, out);
  int differ = 0;
  for (int64_t i = 0; i < off.numel(); ++i) {
    const float inv = i % 2 == 0 ? 1.0f / 17.0f : 1.0f / 7.0f;
    const float by_reciprocal = ref.data<float>()[(i / 8) * 2 + i % 2] + off.data<float>()[i] * inv;
    differ += by_reciprocal != out.data<float>()[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(SamplingLocations, KernelRefusesBadShapesAndOverlap) {
  std::mt19937 rng(303);
  const Levels two = {{4, 5}, {2, 3}};
  const Tensor off = random_tensor({3, 2, 2, 4, 2}, rng);
  Tensor out = Tensor::empty(off.shape(), DType::kF32);
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 1, 3, 2}, rng), two, out), Error);  // R = 3 vs P = 4
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 1, 2, 1}, rng), two, out), Error);  // D = 1
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({2, 1, 2, 2}, rng), two, out), Error);  // M
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 3, 2, 2}, rng), two, out), Error);  // Lr = 3
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 2, 2, 2}, rng), Levels{{4, 5}}, out), Error);
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 1, 2, 2}, rng), Levels{{4, 5}, {0, 3}}, out), Error);
  Tensor wrong = Tensor::empty({3, 2, 2, 4, 3}, DType::kF32);
  EXPECT_THROW(cpu::sampling_locations(off, random_tensor({3, 1, 2, 2}, rng), two, wrong), Error);
  // out over reference.
  Tensor buf = random_tensor({off.numel()}, rng);
  const Tensor ref_view = buf.slice(0, 0, 3 * 1 * 2 * 2).reshape({3, 1, 2, 2});
  Tensor out_view = buf.reshape(off.shape());
  EXPECT_THROW(cpu::sampling_locations(off, ref_view, two, out_view), Error);
}

TEST(SamplingLocations, ThroughOpsAndShapeErrors) {
  std::mt19937 rng(304);
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend);
  const SamplingLocationsAttrs attrs{{{13, 17}, {7, 9}, {1, 1}}};
  const Tensor off = random_tensor({45, 3, 3, 8, 2}, rng, -10.0f, 10.0f);
  const Tensor ref = random_tensor({45, 1, 4, 2}, rng, 0.0f, 1.0f);
  EXPECT_TRUE(same_bits(ops.sampling_locations(off, ref, attrs, "sca.loc"),
                        sampling_locations_ref(off, ref, attrs.spatial_shapes)));
  const Tensor ref3 = random_tensor({45, 3, 1, 3}, rng, 0.0f, 1.0f);
  EXPECT_TRUE(same_bits(ops.sampling_locations(off, ref3, attrs), sampling_locations_ref(off, ref3, attrs.spatial_shapes)));

  EXPECT_THROW(ops.sampling_locations(random_tensor({45, 3, 3, 8}, rng), ref, attrs), Error);        // rank
  EXPECT_THROW(ops.sampling_locations(random_tensor({45, 3, 2, 8, 2}, rng), ref, attrs), Error);     // L
  EXPECT_THROW(ops.sampling_locations(random_tensor({45, 3, 3, 8, 3}, rng), ref, attrs), Error);     // last 3
  EXPECT_THROW(ops.sampling_locations(off, random_tensor({45, 2, 4, 2}, rng), attrs), Error);        // Lr = 2
  EXPECT_THROW(ops.sampling_locations(off, random_tensor({45, 1, 3, 2}, rng), attrs), Error);        // 3 !| 8
  EXPECT_THROW(ops.sampling_locations(off, random_tensor({45, 1, 4, 1}, rng), attrs), Error);        // D = 1
  EXPECT_THROW(ops.sampling_locations(off, random_tensor({44, 1, 4, 2}, rng), attrs), Error);        // M
  try {
    ops.sampling_locations(off, random_tensor({45, 1, 5, 2}, rng), attrs, "enc0.sca");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sampling_locations 'enc0.sca'"), std::string::npos) << e.what();
  }
}

// ---- reference_refine ----

// The unfused ops, exactly as upstream runs them: inverse_sigmoid, add, sigmoid.
Tensor reference_refine_unfused(const Tensor& reg, const Tensor& ref) {
  const int64_t m_len = reg.size(0), code = reg.size(1);
  Tensor inv = Tensor::empty({m_len, 3}, DType::kF32);
  cpu::inverse_sigmoid(ref, 1e-5f, inv);
  Tensor logit = Tensor::empty({m_len, 3}, DType::kF32);
  const int64_t ch[3] = {0, 1, 4};
  for (int64_t m = 0; m < m_len; ++m) {
    for (int k = 0; k < 3; ++k) {
      logit.data<float>()[m * 3 + k] = reg.data<float>()[m * code + ch[k]] + inv.data<float>()[m * 3 + k];
    }
  }
  Tensor out = Tensor::empty({m_len, 3}, DType::kF32);
  cpu::sigmoid(logit, out);
  return out;
}

double refine_f64(double reg, double ref) {
  const double c = std::min(std::max(ref, 0.0), 1.0);
  const double inv = std::log(std::max(c, 1e-5) / std::max(1.0 - c, 1e-5));
  return 1.0 / (1.0 + std::exp(-(reg + inv)));
}

// reg [m, code] random with saturating entries; reference [m, 3] in [0, 1) with the edge values.
std::pair<Tensor, Tensor> refine_inputs(int64_t m_len, int64_t code, std::mt19937& rng) {
  Tensor reg = random_tensor({m_len, code}, rng, -4.0f, 4.0f);
  Tensor ref = random_tensor({m_len, 3}, rng, 0.0f, 1.0f);
  const std::vector<float> edges = {0.0f, 1.0f, 1e-5f, 5e-6f, 2e-5f, 1.0f - 1e-5f, 0.99999f, 0.999999f, 1e-6f,
                                    0.5f, -0.25f, 1.5f, 1e-5f * 1.0000001f, 9.99999e-6f};
  for (size_t i = 0; i < edges.size() && static_cast<int64_t>(i) < m_len; ++i) {
    for (int k = 0; k < 3; ++k) ref.data<float>()[static_cast<int64_t>(i) * 3 + k] = edges[(i + static_cast<size_t>(k)) % edges.size()];
  }
  const std::vector<float> big = {100.0f, -100.0f, 0.0f, 1e4f, -1e4f, 11.5f, -11.5f};
  for (size_t i = 0; i < big.size() && static_cast<int64_t>(i + 20) < m_len; ++i) {
    for (int64_t ch : {0, 1, 4}) reg.data<float>()[static_cast<int64_t>(i + 20) * code + ch] = big[i];
  }
  return {reg, ref};
}

TEST(ReferenceRefine, EqualsTheUnfusedOpsBitForBitAndF64ToRounding) {
  std::mt19937 rng(401);
  ThreadPool pool(2);
  for (const auto& [m_len, code] : std::vector<std::pair<int64_t, int64_t>>{{211, 10}, {12001, 5}, {1, 8}, {0, 10}}) {
    SCOPED_TRACE("M " + std::to_string(m_len) + " code " + std::to_string(code));
    auto [reg, ref] = refine_inputs(m_len, code, rng);
    const Tensor want = reference_refine_unfused(reg, ref);
    Tensor out = filled({m_len, 3}, kNaN);
    cpu::reference_refine(reg, ref, out, &pool);
    EXPECT_TRUE(same_bits(out, want));
    double err = 0;
    const int64_t ch[3] = {0, 1, 4};
    for (int64_t m = 0; m < m_len; ++m) {
      for (int k = 0; k < 3; ++k) {
        const double w = refine_f64(reg.data<float>()[m * code + ch[k]], ref.data<float>()[m * 3 + k]);
        err = std::max(err, std::fabs(w - out.data<float>()[m * 3 + k]));
      }
    }
    EXPECT_LE(err, 2e-6);
    Tensor in_place = ref.clone();  // out may be reference
    cpu::reference_refine(reg, in_place, in_place);
    EXPECT_TRUE(same_bits(in_place, want));
  }
}

TEST(ReferenceRefine, SaturatesLikeUpstream) {
  // reference 0 (and below) clamps to eps: sigmoid(log(1e-5)) = 1e-5 / (1 + 1e-5); 1 (and
  // above) to 1 - that; NaN passes through.
  const Tensor reg = Tensor::zeros({5, 5}, DType::kF32);
  const Tensor ref = Tensor::from_floats({5, 3}, std::vector<float>{0.0f, 1.0f, 0.5f, -3.0f, 7.0f, 1e-5f, kNaN, 0.25f,
                                                                  1e-5f * 0.5f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f});
  Tensor out = Tensor::empty({5, 3}, DType::kF32);
  cpu::reference_refine(reg, ref, out);
  const float* y = out.data<float>();
  EXPECT_NEAR(y[0], 1e-5 / (1 + 1e-5), 1e-10);
  EXPECT_NEAR(y[1], 1.0 / (1 + 1e-5), 1e-6);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_EQ(y[3], y[0]);  // -3 clamps to 0
  EXPECT_EQ(y[4], y[1]);  // 7 clamps to 1
  EXPECT_NEAR(y[5], 1e-5, 1e-10);  // exactly eps: log(eps / (1 - eps)) round-trips
  EXPECT_TRUE(std::isnan(y[6]));
  // Below eps only the numerator clamps: log(eps / (1 - x)), not log(eps / 1).
  EXPECT_NE(y[8], y[0]);
  EXPECT_NEAR(y[8], refine_f64(0.0, 1e-5 * 0.5), 1e-10);
  // reg saturates the sigmoid to exactly 0 and 1.
  const Tensor big = Tensor::from_floats({1, 5}, std::vector<float>{200.0f, -200.0f, 0.0f, 0.0f, 1e30f});
  Tensor o1 = Tensor::empty({1, 3}, DType::kF32);
  cpu::reference_refine(big, Tensor::from_floats({1, 3}, std::vector<float>{0.5f, 0.5f, 0.5f}), o1);
  EXPECT_EQ(o1.data<float>()[0], 1.0f);
  EXPECT_EQ(o1.data<float>()[1], 0.0f);
  EXPECT_EQ(o1.data<float>()[2], 1.0f);
}

TEST(ReferenceRefine, ThroughOpsAndShapeErrors) {
  std::mt19937 rng(402);
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend);
  auto [reg, ref] = refine_inputs(901, 10, rng);
  EXPECT_TRUE(same_bits(ops.reference_refine(reg, ref, "dec.0.ref"), reference_refine_unfused(reg, ref)));
  EXPECT_THROW(ops.reference_refine(random_tensor({9, 4}, rng), random_tensor({9, 3}, rng)), Error);  // code 4
  EXPECT_THROW(ops.reference_refine(random_tensor({9, 10}, rng), random_tensor({9, 2}, rng)), Error);
  EXPECT_THROW(ops.reference_refine(random_tensor({9, 10}, rng), random_tensor({8, 3}, rng)), Error);
  EXPECT_THROW(ops.reference_refine(random_tensor({9, 10, 1}, rng), random_tensor({9, 3}, rng)), Error);
  Tensor out = Tensor::empty({9, 3}, DType::kF32);
  EXPECT_THROW(cpu::reference_refine(random_tensor({9, 4}, rng), random_tensor({9, 3}, rng), out), Error);
  // out over reg.
  Tensor buf = random_tensor({9, 10}, rng);
  Tensor out_view = buf.reshape({90}).slice(0, 0, 27).reshape({9, 3});
  EXPECT_THROW(cpu::reference_refine(buf, random_tensor({9, 3}, rng), out_view), Error);
}

// ---- bbox_denormalize ----

Tensor bbox_denormalize_ref(const Tensor& reg, const Tensor& refined, const BboxDenormalizeAttrs& a) {
  Tensor out = reg.clone();
  const int64_t code = reg.size(1);
  const int64_t ch[3] = {0, 1, 4};
  for (int64_t m = 0; m < reg.size(0); ++m) {
    for (int k = 0; k < 3; ++k) {
      const float scaled = refined.data<float>()[m * 3 + k] * a.scale[k];  // rounded
      out.data<float>()[m * code + ch[k]] = scaled + a.offset[k];          // rounded again
    }
  }
  return out;
}

TEST(BboxDenormalize, MultiplyThenAddAndTheOtherChannelsCopied) {
  std::mt19937 rng(501);
  ThreadPool pool(2);
  const BboxDenormalizeAttrs pc{.scale = {102.4f, 102.4f, 8.0f}, .offset = {-51.2f, -51.2f, -5.0f}};
  for (const auto& [m_len, code] : std::vector<std::pair<int64_t, int64_t>>{{901, 10}, {5001, 10}, {7, 5}, {0, 10}}) {
    SCOPED_TRACE("M " + std::to_string(m_len) + " code " + std::to_string(code));
    const Tensor reg = random_tensor({m_len, code}, rng, -5.0f, 5.0f);
    Tensor refined = random_tensor({m_len, 3}, rng, 0.0f, 1.0f);
    if (m_len > 2) {
      for (int k = 0; k < 3; ++k) {
        refined.data<float>()[k] = 0.0f;
        refined.data<float>()[3 + k] = 1.0f;
      }
    }
    const Tensor want = bbox_denormalize_ref(reg, refined, pc);
    Tensor out = filled({m_len, code}, kNaN);
    cpu::bbox_denormalize(reg, refined, pc, out, &pool);
    EXPECT_TRUE(same_bits(out, want));
    Tensor in_place = reg.clone();  // out may be reg
    cpu::bbox_denormalize(in_place, refined, pc, in_place, &pool);
    EXPECT_TRUE(same_bits(in_place, want));
    if (m_len > 2) {
      EXPECT_EQ(out.data<float>()[0], -51.2f);
      EXPECT_NEAR(out.data<float>()[code + 0], 51.2f, 1e-5f);
      EXPECT_EQ(out.data<float>()[code + 4], 3.0f);
    }
  }
}

TEST(BboxDenormalize, ThroughOpsAndShapeErrors) {
  std::mt19937 rng(502);
  auto backend = make_cpu_backend(2, Precision::kF32);
  Ops ops(*backend);
  const BboxDenormalizeAttrs pc{.scale = {102.4f, 102.4f, 8.0f}, .offset = {-51.2f, -51.2f, -5.0f}};
  const Tensor reg = random_tensor({301, 10}, rng), refined = random_tensor({301, 3}, rng, 0.0f, 1.0f);
  EXPECT_TRUE(same_bits(ops.bbox_denormalize(reg, refined, pc, "head.boxes"), bbox_denormalize_ref(reg, refined, pc)));
  EXPECT_THROW(ops.bbox_denormalize(random_tensor({9, 4}, rng), random_tensor({9, 3}, rng), pc), Error);
  EXPECT_THROW(ops.bbox_denormalize(random_tensor({9, 10}, rng), random_tensor({9, 2}, rng), pc), Error);
  EXPECT_THROW(ops.bbox_denormalize(random_tensor({9, 10}, rng), random_tensor({10, 3}, rng), pc), Error);
  Tensor out = Tensor::empty({9, 11}, DType::kF32);
  EXPECT_THROW(cpu::bbox_denormalize(random_tensor({9, 10}, rng), random_tensor({9, 3}, rng), pc, out), Error);
  // out over refined.
  Tensor buf = random_tensor({9, 10}, rng);
  const Tensor refined_view = buf.reshape({90}).slice(0, 0, 27).reshape({9, 3});
  EXPECT_THROW(cpu::bbox_denormalize(random_tensor({9, 10}, rng), refined_view, pc, buf), Error);
}

}  // namespace
}  // namespace bev
