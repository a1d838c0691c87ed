// cpu::attention against softmax(scale q k^T) v computed in double, head by head.
//
// Error measure: |y - ref| / S per output, S = sum_j p_j |v_j| (the magnitude of the weighted sum).
// A score's error E (absolute) moves each p_j by at most about 2E relatively, so y moves by at
// most 2E S; the sum over K keys adds (K + 4) 2^-24 S and exp's 2 ulp are inside the +4.
//   f32:  E = scale sum_d |q_d k_d| (hd + 2) 2^-24
//   bf16: q and k rounded (2^-8 each, so 2^-7 + 2^-16 on the products), then p and v rounded
//         (2^-8 each on the second product).
// The bf16 bound is loose (a few % of S at the decoder's scores), so bf16 is also held to a
// reference that rounds q, k, v and the softmax numerators to bf16 as the kernel does: relative
// L2 within 1e-4 (measured: 1e-7 to 1e-5; dropping one of 45 keys moves the output by about 2%).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/attention_amx.h"
#include "backend/cpu/onednn.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "error_test_util.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

namespace bev::cpu {
namespace {

using kernel_test::random_tensor;

struct Case {
  int64_t batch, q_len, k_len, c;
  int heads;
  float scale;
};

// Max over outputs of |y - ref| / (bound * S); <= 1 passes.
double worst_ratio(const Case& t, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y, Precision p) {
  const int64_t hd = t.c / t.heads;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* yp = y.data<float>();
  const double u = std::ldexp(1.0, -24);
  double worst = 0;
  std::vector<double> s(static_cast<size_t>(t.k_len)), mag(static_cast<size_t>(t.k_len));
  for (int64_t b = 0; b < t.batch; ++b)
    for (int h = 0; h < t.heads; ++h)
      for (int64_t i = 0; i < t.q_len; ++i) {
        const float* qi = qp + (b * t.q_len + i) * t.c + h * hd;
        double mx = -1e300, e_s = 0;
        for (int64_t j = 0; j < t.k_len; ++j) {
          const float* kj = kp + (b * t.k_len + j) * t.c + h * hd;
          double acc = 0, m = 0;
          for (int64_t d = 0; d < hd; ++d) {
            acc += static_cast<double>(qi[d]) * kj[d];
            m += std::fabs(static_cast<double>(qi[d]) * kj[d]);
          }
          s[j] = acc * t.scale;
          mag[j] = m * std::fabs(t.scale);
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < t.k_len; ++j) {
          e_s = std::max(e_s, mag[j] * (p == Precision::kF32 ? (hd + 2) * u : std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + (hd + 2) * u));
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
        const double bound = 2 * e_s + (t.k_len + 4) * u + (p == Precision::kF32 ? 0 : std::ldexp(1.0, -7));
        for (int64_t d = 0; d < hd; ++d) {
          double ref = 0, mag_y = 0;
          for (int64_t j = 0; j < t.k_len; ++j) {
            const double vj = vp[(b * t.k_len + j) * t.c + h * hd + d];
            ref += s[j] / sum * vj;
            mag_y += s[j] / sum * std::fabs(vj);
          }
          const double got = yp[(b * t.q_len + i) * t.c + h * hd + d];
          const double r = std::fabs(got - ref) / std::max(bound * mag_y, 1e-30);
          if (!(r <= worst)) worst = r;  // NaN wins, and fails the bound
        }
      }
  return worst;
}

// Relative L2 of y against softmax(scale q k^T) v with q, k, v rounded to bf16 and each
// numerator exp(s - max) rounded to bf16 before it weighs v, the sum of the numerators unrounded:
// what the bf16 kernel computes, up to f32 accumulation.
double rounded_reference_l2(const Case& t, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y) {
  const int64_t hd = t.c / t.heads;
  auto r = [](float x) { return static_cast<double>(bf16_to_float(float_to_bf16(x))); };
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* yp = y.data<float>();
  double num = 0, den = 0;
  std::vector<double> s(static_cast<size_t>(t.k_len));
  for (int64_t b = 0; b < t.batch; ++b)
    for (int h = 0; h < t.heads; ++h)
      for (int64_t i = 0; i < t.q_len; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j < t.k_len; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < hd; ++d) {
            acc += r(qp[(b * t.q_len + i) * t.c + h * hd + d]) * r(kp[(b * t.k_len + j) * t.c + h * hd + d]);
          }
          s[j] = acc * t.scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < t.k_len; ++j) {
          const double e = std::exp(s[j] - mx);
          sum += e;
          s[j] = r(static_cast<float>(e));
        }
        for (int64_t d = 0; d < hd; ++d) {
          double ref = 0;
          for (int64_t j = 0; j < t.k_len; ++j) ref += s[j] * r(vp[(b * t.k_len + j) * t.c + h * hd + d]);
          ref /= sum;
          const double got = yp[(b * t.q_len + i) * t.c + h * hd + d];
          num += (got - ref) * (got - ref);
          den += ref * ref;
        }
      }
  return std::sqrt(num / std::max(den, 1e-300));
}

void check(const Case& t, Precision p, int threads) {
  const uint32_t seed = static_cast<uint32_t>(t.batch * 131 + t.q_len * 7 + t.k_len * 3 + t.c + t.heads);
  // Scores of a few units, so the softmax is neither flat nor one-hot.
  const Tensor q = random_tensor({t.batch, t.q_len, t.c}, seed, -2.0f, 2.0f);
  const Tensor k = random_tensor({t.batch, t.k_len, t.c}, seed + 1, -2.0f, 2.0f);
  const Tensor v = random_tensor({t.batch, t.k_len, t.c}, seed + 2);
  Tensor y = Tensor::empty({t.batch, t.q_len, t.c}, DType::kF32);
  ThreadPool pool(threads);
  attention(q, k, v, t.heads, t.scale, y, p, &pool);
  const double r = worst_ratio(t, q, k, v, y, p);
  EXPECT_LE(r, 1.0) << (p == Precision::kF32 ? "f32" : "bf16") << " B=" << t.batch << " Q=" << t.q_len
                    << " K=" << t.k_len << " C=" << t.c << " heads=" << t.heads << ": error " << r << " of the bound";
  // A second call replays the same plan on the same inputs: the same bits.
  if (p == Precision::kBF16) {
    const double l2 = rounded_reference_l2(t, q, k, v, y);
    EXPECT_LE(l2, 1e-4) << "bf16 against the bf16-rounded reference, B=" << t.batch << " Q=" << t.q_len << " K=" << t.k_len;
  }
  Tensor y2 = Tensor::empty({t.batch, t.q_len, t.c}, DType::kF32);
  attention(q, k, v, t.heads, t.scale, y2, p, &pool);
  EXPECT_EQ(0, std::memcmp(y.data<float>(), y2.data<float>(), static_cast<size_t>(y.nbytes())));
}

const Case kCases[] = {
    {1, 1, 1, 1, 1, 1.0f},          // one query, one key
    {2, 37, 29, 15, 3, 0.4f},       // heads of 5, two samples
    {1, 1000, 7, 64, 8, 0.35f},     // many queries, few keys
    {3, 45, 45, 256, 8, 0.1767767f},  // the decoder's channels, three vehicles
};

TEST(CpuAttention, MatchesDoubleReferenceF32) {
  for (const Case& t : kCases) check(t, Precision::kF32, 2);
}

TEST(CpuAttention, MatchesDoubleReferenceBF16) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  for (const Case& t : kCases) check(t, Precision::kBF16, 2);
}

TEST(CpuAttention, SeveralBlocksWithAShortLast) {
  // Keys enough that a block holds fewer rows than there are queries, and the rows do not divide.
  const Case t{2, 203, 3001, 14, 2, 0.3f};
  const int64_t block = attention_block_rows(t.q_len, t.k_len, t.heads);
  ASSERT_LT(block, t.q_len);
  ASSERT_NE(t.q_len % block, 0);
  check(t, Precision::kF32, 2);
  if (bev::precision_test::runs_here(Precision::kBF16)) check(t, Precision::kBF16, 1);
}

// Heads of 32 channels at a positive scale: on an AMX machine, bf16 runs the fused tile kernel
// (attention_amx.h). Keys on both sides of its chunks of 64 (1, 63, 64, 65, 129) and queries on
// both sides of its tiles of 16, one thread and two. Elsewhere these run the oneDNN path.
TEST(CpuAttention, TileKernelShapes) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  if (isa_has_amx()) {
    EXPECT_TRUE(attention_amx_applies(256, 8, 0.1767767f));
  }
  EXPECT_FALSE(attention_amx_applies(256, 8, -0.5f));  // the oneDNN path keeps other scales
  EXPECT_FALSE(attention_amx_applies(64, 4, 0.5f));    // and heads of 16
  const Case cases[] = {
      {1, 1, 1, 32, 1, 0.5f},   {2, 17, 63, 64, 2, 0.3f}, {1, 16, 64, 32, 1, 0.25f},
      {1, 33, 65, 96, 3, 0.2f}, {2, 5, 129, 64, 2, 0.4f}, {1, 20, 30, 64, 2, -0.3f},  // the last: oneDNN's
  };
  for (const Case& t : cases) {
    check(t, Precision::kBF16, 1);
    check(t, Precision::kBF16, 2);
  }
}

// The decoder's self-attention as the model runs it: 900 queries and keys, 8 heads of 32.
TEST(CpuAttention, DecoderShapeBF16) {
  BEV_SKIP_UNLESS_RUNS(Precision::kBF16);
  check({1, 900, 900, 256, 8, 0.1767767f}, Precision::kBF16, 2); }

TEST(CpuAttention, NanPoisonsOnlyItsRowAndHead) {
  const Case t{1, 9, 11, 8, 2, 0.5f};
  Tensor q = random_tensor({1, 9, 8}, 7);
  const Tensor k = random_tensor({1, 11, 8}, 8), v = random_tensor({1, 11, 8}, 9);
  q.data<float>()[5 * 8 + 1] = std::numeric_limits<float>::quiet_NaN();  // query 5, head 0
  Tensor y = Tensor::empty({1, 9, 8}, DType::kF32);
  for (Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    attention(q, k, v, t.heads, t.scale, y, p);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t c = 0; c < 8; ++c) {
        const bool poisoned = i == 5 && c < 4;
        EXPECT_EQ(poisoned, std::isnan(y.data<float>()[i * 8 + c])) << "query " << i << " channel " << c;
      }
  }
}

// The same with heads of 32 channels (the tile kernel's, on AMX) and a NaN in the last key chunk's
// lanes, in a query past the first tile and in a value.
TEST(CpuAttention, NanStaysInItsRowHeadOrColumnWithWideHeads) {
  const int64_t ql = 21, kl = 70, c = 64;
  for (int which = 0; which < 3; ++which) {
    Tensor q = random_tensor({1, ql, c}, 27), k = random_tensor({1, kl, c}, 28), v = random_tensor({1, kl, c}, 29);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (which == 0) q.data<float>()[18 * c + 40] = nan;  // query 18, head 1
    if (which == 1) k.data<float>()[67 * c + 3] = nan;   // key 67 (past the first chunk), head 0
    if (which == 2) v.data<float>()[66 * c + 35] = nan;  // value 66, head 1, channel 35
    for (Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
      Tensor y = Tensor::empty({1, ql, c}, DType::kF32);
      attention(q, k, v, 2, 0.25f, y, p);
      for (int64_t i = 0; i < ql; ++i)
        for (int64_t ch = 0; ch < c; ++ch) {
          const bool expect = which == 0 ? (i == 18 && ch >= 32) : which == 1 ? ch < 32 : ch == 35;
          EXPECT_EQ(expect, std::isnan(y.data<float>()[i * c + ch])) << "case " << which << " query " << i << " channel " << ch;
        }
    }
  }
}

// A NaN in a key poisons every query of its head; a NaN in a value, its column of every query.
TEST(CpuAttention, NanInAKeyOrValueStaysInItsHead) {
  const Tensor q = random_tensor({1, 9, 8}, 17);
  for (Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    Tensor k = random_tensor({1, 11, 8}, 18), v = random_tensor({1, 11, 8}, 19);
    k.data<float>()[2 * 8 + 1] = std::numeric_limits<float>::quiet_NaN();  // key 2, head 0
    Tensor y = Tensor::empty({1, 9, 8}, DType::kF32);
    attention(q, k, v, 2, 0.5f, y, p);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(c < 4, std::isnan(y.data<float>()[i * 8 + c])) << "key: query " << i << " channel " << c;
    k = random_tensor({1, 11, 8}, 18);
    v.data<float>()[3 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();  // value 3, head 1, channel 5
    attention(q, k, v, 2, 0.5f, y, p);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(c == 5, std::isnan(y.data<float>()[i * 8 + c])) << "value: query " << i << " channel " << c;
  }
}

TEST(CpuAttention, RefusesBadShapes) {
  const Tensor q = random_tensor({2, 5, 12}, 1), k = random_tensor({2, 7, 12}, 2), v = random_tensor({2, 7, 12}, 3);
  Tensor y = Tensor::empty({2, 5, 12}, DType::kF32);
  test::expect_invalid_input([&] { attention(q, k, v, 5, 1.0f, y, Precision::kF32); }, "multiple of heads");
  test::expect_invalid_input([&] { attention(q, random_tensor({1, 7, 12}, 4), v, 4, 1.0f, y, Precision::kF32); },
                             "f32[2, K, 12]");
  test::expect_invalid_input([&] { attention(q, k, random_tensor({2, 6, 12}, 5), 4, 1.0f, y, Precision::kF32); },
                             "v shaped as k");
  Tensor y_bad = Tensor::empty({2, 5, 11}, DType::kF32);
  test::expect_invalid_input([&] { attention(q, k, v, 4, 1.0f, y_bad, Precision::kF32); }, "f32[2, 5, 12]");
  Tensor alias = q;
  test::expect_invalid_input([&] { attention(q, k, v, 4, 1.0f, alias, Precision::kF32); }, "disjoint");
  test::expect_invalid_input([&] { attention(random_tensor({5, 12}, 6), k, v, 4, 1.0f, y, Precision::kF32); },
                             "f32[B, Q, C]");
}

}  // namespace
}  // namespace bev::cpu
