// The small CPU ops (elementwise, pool/resize, select) against plain references written here,
// on random inputs of awkward sizes (odd channels, 1-pixel maps, ties, NaN, saturation).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/pool_resize.h"
#include "backend/cpu/select.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"

namespace bev::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

using kernel_test::random_tensor;

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// ---- elementwise ----

// NaN, both infinities, the largest finite float, subnormals and -0 among random values, at the
// ends and inside; f32 and bf16; sizes around the pool's chunk; 1 to 3 threads.
TEST(CountNonfinite, CountsExactlyTheNanAndInfiniteValues) {
  std::mt19937 rng(71);
  const float specials[] = {kNaN, kInf, -kInf, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(), -0.0f, 1e-40f};
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{16383}, int64_t{16385}, int64_t{100003}}) {
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      Tensor x = random_tensor({n}, rng);
      std::uniform_int_distribution<int64_t> pos(0, std::max<int64_t>(n - 1, 0));
      for (int k = 0; n > 0 && k < 40; ++k) x.data<float>()[pos(rng)] = specials[k % 8];
      if (n > 1) x.data<float>()[n - 1] = kNaN;
      if (dtype == DType::kBF16) x = x.to(DType::kBF16);
      const Tensor f = x.to(DType::kF32);
      // One count over everything, and a count per group (per sample of a batch) where n splits.
      std::vector<int64_t> group_counts = {1};
      for (const int64_t g : {int64_t{3}, int64_t{5}, int64_t{7}}) {
        if (n > 0 && n % g == 0) group_counts.push_back(g);
      }
      for (const int64_t groups : group_counts) {
        const int64_t per = n / groups;
        std::vector<int64_t> want(groups, 0);
        for (int64_t i = 0; i < n; ++i) want[i / per] += std::isfinite(f.data<float>()[i]) ? 0 : 1;
        for (const int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          Tensor out = Tensor::zeros({groups}, DType::kI64);
          count_nonfinite(x, out, &pool);
          for (int64_t g = 0; g < groups; ++g) {
            EXPECT_EQ(out.data<int64_t>()[g], want[g])
                << "n " << n << " groups " << groups << " group " << g << " " << dtype_name(dtype) << " threads " << threads;
          }
        }
      }
    }
  }
  Tensor out = Tensor::zeros({1}, DType::kI64);
  EXPECT_THROW(count_nonfinite(i64_tensor({1, 2}), out, nullptr), Error);
  Tensor three = Tensor::zeros({3}, DType::kI64);  // 3 groups cannot split 7 values
  EXPECT_THROW(count_nonfinite(Tensor::zeros({7}, DType::kF32), three, nullptr), Error);
}

TEST(LayerNorm, MatchesF64TwoPassAndRunsInPlace) {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  for (int64_t c : {1, 3, 17, 256, 257}) {
    for (float mean_shift : {0.0f, 1000.0f}) {
      const int64_t m = 37;
      Tensor x = random_tensor({m, c}, rng, mean_shift - 2.0f, mean_shift + 2.0f);
      const Tensor g = random_tensor({c}, rng, 0.5f, 1.5f), b = random_tensor({c}, rng);
      Tensor y = Tensor::empty({m, c}, DType::kF32);
      layer_norm(x, g, b, 1e-5f, y, &pool);
      double err = 0;
      for (int64_t r = 0; r < m; ++r) {
        const float* xr = x.data<float>() + r * c;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < c; ++k) mean += xr[k];
        mean /= static_cast<double>(c);
        for (int64_t k = 0; k < c; ++k) var += (xr[k] - mean) * (xr[k] - mean);
        var /= static_cast<double>(c);
        for (int64_t k = 0; k < c; ++k) {
          const double want = (xr[k] - mean) / std::sqrt(var + 1e-5) * g.data<float>()[k] + b.data<float>()[k];
          err = std::max(err, std::fabs(want - y.data<float>()[r * c + k]));
        }
      }
      // A mean of 1000 costs ~1000 * 2^-24 per element in f32 already; two passes keep it there.
      EXPECT_LE(err, mean_shift > 0 ? 2e-3 : 2e-6) << "C " << c << " mean " << mean_shift;
      std::printf("    layer_norm C=%lld mean %g: max |err| %.3g\n", static_cast<long long>(c), mean_shift, err);
      layer_norm(x, g, b, 1e-5f, x, nullptr);  // in place, no pool: same bits
      EXPECT_TRUE(same_bits(x, y));
    }
  }
}

TEST(LayerNorm, WithResidualGivesTheBitsOfAddThenLayerNorm) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (int64_t c : {1, 3, 17, 256, 257}) {
    for (int64_t m : {1, 37, 1000}) {
      const Tensor x = random_tensor({m, c}, rng, -3.0f, 3.0f), r = random_tensor({m, c}, rng, 100.0f, 104.0f);
      const Tensor g = random_tensor({c}, rng, 0.5f, 1.5f), b = random_tensor({c}, rng);
      Tensor sum = Tensor::empty({m, c}, DType::kF32), want = Tensor::empty({m, c}, DType::kF32);
      add(x, r, sum, &pool);
      layer_norm(sum, g, b, 1e-5f, want, &pool);
      Tensor got = Tensor::empty({m, c}, DType::kF32);
      layer_norm(x, g, b, 1e-5f, got, &pool, &r);
      EXPECT_TRUE(same_bits(got, want)) << "C " << c << " M " << m;
      // In place over either input, one thread: the same bits.
      Tensor x2 = x.clone(), r2 = r.clone();
      layer_norm(x2, g, b, 1e-5f, x2, nullptr, &r);
      layer_norm(x, g, b, 1e-5f, r2, nullptr, &r2);
      EXPECT_TRUE(same_bits(x2, want)) << "in place over x, C " << c;
      EXPECT_TRUE(same_bits(r2, want)) << "in place over the residual, C " << c;
    }
  }
  const Tensor x = random_tensor({4, 8}, rng), g = random_tensor({8}, rng), b = random_tensor({8}, rng);
  const Tensor wrong = random_tensor({4, 7}, rng);
  Tensor y = Tensor::empty({4, 8}, DType::kF32);
  EXPECT_THROW(layer_norm(x, g, b, 1e-5f, y, nullptr, &wrong), Error);
}

TEST(Softmax, MatchesF64AndHandlesInfAndNaN) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  for (int64_t c : {1, 4, 8, 17, 32, 900}) {
    const int64_t m = 23;
    Tensor x = random_tensor({m, c}, rng, -30.0f, 30.0f);
    x.data<float>()[c - 1] = 1e4f;  // a huge logit: exp without the max shift would overflow
    if (c > 2) x.data<float>()[c + 1] = -kInf;
    Tensor y = Tensor::empty({m, c}, DType::kF32);
    softmax(x, y, &pool);
    double err = 0;
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x.data<float>() + r * c;
      const double mx = *std::max_element(xr, xr + c);
      double sum = 0;
      for (int64_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(xr[k]) - mx);
      for (int64_t k = 0; k < c; ++k) {
        err = std::max(err, std::fabs(std::exp(static_cast<double>(xr[k]) - mx) / sum - y.data<float>()[r * c + k]));
      }
    }
    EXPECT_LE(err, 1e-6) << "C " << c;
    softmax(x, x);
    EXPECT_TRUE(same_bits(x, y));
  }
  // Relative accuracy of tiny probabilities: one row spanning e^0 .. e^-87 (normal floats).
  std::vector<float> wide(40);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = -static_cast<float>(i) * 2.23f;
  const Tensor w = Tensor::from_floats({1, 40}, wide);
  Tensor wy = Tensor::empty({1, 40}, DType::kF32);
  softmax(w, wy);
  double sum = 0, rel = 0;
  for (float v : wide) sum += std::exp(static_cast<double>(v));
  for (size_t i = 0; i < wide.size(); ++i) {
    const double want = std::exp(static_cast<double>(wide[i])) / sum;
    rel = std::max(rel, std::fabs(wy.data<float>()[i] - want) / want);
  }
  std::printf("    softmax max relative error down to 1e-38: %.3g\n", rel);
  EXPECT_LE(rel, 1e-6);
  Tensor x = Tensor::from_floats({3, 3}, std::vector<float>{-kInf, -kInf, -kInf, 1.0f, kNaN, 2.0f, 0.0f, kInf, 1.0f});
  Tensor y = Tensor::empty({3, 3}, DType::kF32);
  softmax(x, y);
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(std::isnan(y.data<float>()[k])) << k;  // all -inf, and NaN rows
  EXPECT_TRUE(std::isnan(y.data<float>()[7]));  // +inf - +inf, as PyTorch
}

// Rows of 2, 4 and 8 run several to a vector: each row's bits are those of the row alone (which the
// one-row kernel computes), a NaN poisons its own row and not the rows sharing its vector, and a
// row of -inf and +inf logits gives what the one-row kernel gives.
TEST(Softmax, ShortRowsPackedInVectorsKeepTheBitsOfOneRow) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (int64_t c : {2, 4, 8}) {
    const int64_t m = 37;  // full vectors and a tail of rows
    Tensor x = random_tensor({m, c}, rng, -20.0f, 20.0f);
    x.data<float>()[5 * c + 1] = kNaN;
    x.data<float>()[7 * c + c - 1] = -kNaN;  // a NaN with its sign bit set, not in the row's first column
    x.data<float>()[9 * c] = -kInf;
    x.data<float>()[12 * c + c - 1] = kInf;
    x.data<float>()[20 * c] = 3e38f;
    Tensor y = Tensor::empty({m, c}, DType::kF32);
    softmax(x, y, &pool);
    for (int64_t r = 0; r < m; ++r) {
      const Tensor xr = x.slice(0, r, r + 1).contiguous();
      Tensor yr = Tensor::empty({1, c}, DType::kF32);
      softmax(xr, yr);
      EXPECT_EQ(std::memcmp(yr.raw_data(), y.data<float>() + r * c, static_cast<size_t>(c) * sizeof(float)), 0)
          << "C " << c << " row " << r;
    }
    for (int64_t k = 0; k < c; ++k) {
      EXPECT_TRUE(std::isnan(y.data<float>()[5 * c + k])) << "C " << c;
      EXPECT_FALSE(std::isnan(y.data<float>()[4 * c + k])) << "C " << c;  // its neighbours
      EXPECT_FALSE(std::isnan(y.data<float>()[6 * c + k])) << "C " << c;
      EXPECT_TRUE(std::isnan(y.data<float>()[7 * c + k])) << "C " << c;
    }
  }
}

// add_rows into bf16 (the image features in bf16 precision): each element the f32 sum rounded to
// nearest even, NaN staying NaN; rows wider than the kernel's 256-column block, odd widths, and an
// output overlapping the input refused.
TEST(Elementwise, AddRowsToBf16) {
  std::mt19937 rng(4);
  ThreadPool pool(2);
  for (const auto& [m, c] : {std::pair<int64_t, int64_t>{301, 67}, {70, 256}, {9, 600}}) {
    Tensor a = random_tensor({m, c}, rng, -8.0f, 8.0f);
    const Tensor row = random_tensor({c}, rng);
    a.data<float>()[5] = kNaN;
    a.data<float>()[6] = 3.3999e38f;  // finite in f32, past bf16's largest finite value: inf
    Tensor y = Tensor::empty({m, c}, DType::kBF16);
    add_rows(a, row, y, &pool);
    const auto* yp = static_cast<const uint16_t*>(y.raw_data());
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float sum = a.data<float>()[i] + row.data<float>()[i % c];
      if (std::isnan(sum)) {
        ASSERT_TRUE(std::isnan(bf16_to_float(yp[i]))) << i;
      } else {
        ASSERT_EQ(yp[i], float_to_bf16(sum)) << i << " of " << m << "x" << c;
      }
    }
    EXPECT_EQ(yp[6], 0x7F80u);  // +inf
  }
  Tensor a = random_tensor({4, 8}, rng);
  const Tensor row = random_tensor({8}, rng);
  Tensor over = Tensor::view_of(a.storage(), DType::kBF16, {4, 8}, contiguous_strides({4, 8}), 0);
  EXPECT_THROW(add_rows(a, row, over), Error);
}

// feat_flatten against the ops it replaces, one by one: add(level, cams_embeds broadcast per
// image), add_rows(level_embeds row) into the output dtype, each level's rows copied after the
// levels before it. The same bits: f32 and bf16 output, with and without cams_embeds, a batch of
// samples (image i takes camera i % cams), odd widths and a width past a vector, NaN, a value
// that rounds to bf16 infinity, 1 and 3 threads; then the shape and overlap errors.
TEST(Elementwise, FeatFlattenHasTheBitsOfTheOpsItReplaces) {
  std::mt19937 rng(11);
  ThreadPool three(3);
  struct Case {
    int64_t images, cams, c;
    std::vector<int64_t> hws;
  };
  const Case cases[] = {{6, 6, 256, {23, 7, 2, 1}}, {4, 2, 37, {5, 3}}, {3, 0, 300, {9}}, {1, 1, 1, {1, 1}}};
  for (const Case& k : cases) {
    std::vector<Tensor> maps, rows;
    for (int64_t hw : k.hws) {
      maps.push_back(random_tensor({k.images, hw, k.c}, rng, -8.0f, 8.0f));
      rows.push_back(random_tensor({k.c}, rng));
    }
    maps[0].data<float>()[0] = kNaN;
    if (maps[0].numel() > 1) maps[0].data<float>()[1] = 3.3999e38f;
    const Tensor cams = k.cams > 0 ? random_tensor({k.cams, k.c}, rng) : Tensor();
    int64_t total = 0;
    for (int64_t hw : k.hws) total += hw;
    for (const DType out : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::to_string(k.images) + " images, " + std::to_string(k.cams) + " cams, C " + std::to_string(k.c) +
                   (out == DType::kBF16 ? ", bf16" : ", f32"));
      Tensor want = Tensor::empty({k.images, total, k.c}, out);
      const size_t es = dtype_size(out);
      int64_t start = 0;
      for (size_t l = 0; l < maps.size(); ++l) {
        const int64_t hw = k.hws[l];
        Tensor f = maps[l];
        if (cams.defined()) {
          Tensor sum = Tensor::empty({k.images / k.cams, k.cams, hw, k.c}, DType::kF32);
          add(f.reshape({k.images / k.cams, k.cams, hw, k.c}), cams.reshape({1, k.cams, 1, k.c}), sum);
          f = sum.reshape({k.images, hw, k.c});
        }
        Tensor level = Tensor::empty({k.images, hw, k.c}, out);
        add_rows(f, rows[l], level);
        for (int64_t i = 0; i < k.images; ++i) {
          std::memcpy(static_cast<char*>(want.raw_data()) + static_cast<size_t>((i * total + start) * k.c) * es,
                      static_cast<const char*>(level.raw_data()) + static_cast<size_t>(i * hw * k.c) * es,
                      static_cast<size_t>(hw * k.c) * es);
        }
        start += hw;
      }
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &three}) {
        Tensor got = Tensor::empty({k.images, total, k.c}, out);
        feat_flatten(maps, rows, cams.defined() ? &cams : nullptr, got, pool);
        EXPECT_TRUE(same_bits(got, want)) << (pool ? "3 threads" : "1 thread");
      }
    }
  }
  const std::vector<Tensor> maps = {random_tensor({2, 3, 8}, rng), random_tensor({2, 1, 8}, rng)};
  const std::vector<Tensor> rows = {random_tensor({8}, rng), random_tensor({8}, rng)};
  const Tensor cams = random_tensor({2, 8}, rng);
  Tensor y = Tensor::empty({2, 4, 8}, DType::kF32);
  EXPECT_NO_THROW(feat_flatten(maps, rows, &cams, y));
  Tensor short_y = Tensor::empty({2, 3, 8}, DType::kF32);
  EXPECT_THROW(feat_flatten(maps, rows, &cams, short_y), Error);  // rows of one level missing
  const std::vector<Tensor> one_row = {rows[0]};
  EXPECT_THROW(feat_flatten(maps, one_row, &cams, y), Error);  // a level without its row
  const Tensor three_cams = random_tensor({3, 8}, rng);
  EXPECT_THROW(feat_flatten(maps, rows, &three_cams, y), Error);  // 3 cameras do not divide 2 images
  const std::vector<Tensor> narrow = {maps[0], random_tensor({2, 1, 7}, rng)};
  EXPECT_THROW(feat_flatten(narrow, rows, &cams, y), Error);  // a level of another width
  const std::vector<Tensor> big = {random_tensor({2, 3, 8}, rng), random_tensor({2, 1, 8}, rng)};
  Tensor in_big = Tensor::view_of(big[0].storage(), DType::kBF16, {2, 4, 8}, contiguous_strides({2, 4, 8}), 0);
  EXPECT_THROW(feat_flatten(big, rows, &cams, in_big), Error);  // the output over an input
}

// add into bf16 (TSA's query in bf16 precision): each element the f32 sum rounded to nearest even,
// equal shapes and broadcasts (a run of 300 columns, past the 256-element block on the stack), NaN
// staying NaN; the output over an input refused across dtypes.
TEST(Elementwise, AddToBf16) {
  std::mt19937 rng(5);
  ThreadPool pool(3);
  for (const auto& [a_shape, b_shape] : {std::pair<Shape, Shape>{{301, 67}, {301, 67}}, {{9, 300}, {1, 300}},
                                        {{4, 5, 300}, {4, 1, 300}}, {{70, 33}, {70, 1}}}) {
    Tensor a = random_tensor(a_shape, rng, -8.0f, 8.0f);
    const Tensor b = random_tensor(b_shape, rng, -8.0f, 8.0f);
    a.data<float>()[3] = kNaN;
    a.data<float>()[4] = 3.3999e38f;  // finite in f32, past bf16's largest finite value
    Tensor want32 = Tensor::empty(a_shape, DType::kF32);
    add(a, b, want32, &pool);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Tensor y = Tensor::empty(a_shape, DType::kBF16);
      add(a, b, y, p);
      const auto* yp = static_cast<const uint16_t*>(y.raw_data());
      for (int64_t i = 0; i < a.numel(); ++i) {
        const float sum = want32.data<float>()[i];
        if (std::isnan(sum)) {
          ASSERT_TRUE(std::isnan(bf16_to_float(yp[i]))) << i;
        } else {
          ASSERT_EQ(yp[i], float_to_bf16(sum)) << i << " of " << shape_str(a_shape) << " + " << shape_str(b_shape);
        }
      }
    }
  }
  Tensor a = random_tensor({4, 8}, rng);
  const Tensor b = random_tensor({4, 8}, rng);
  Tensor over = Tensor::view_of(a.storage(), DType::kBF16, {4, 8}, contiguous_strides({4, 8}), 0);
  EXPECT_THROW(add(a, b, over), Error);
  Tensor over_b = Tensor::view_of(b.storage(), DType::kBF16, {4, 8}, contiguous_strides({4, 8}), 0);
  EXPECT_THROW(add(a, b, over_b), Error);
  Tensor y16 = Tensor::empty({4, 8}, DType::kBF16);
  EXPECT_THROW(mul(a, b, y16), Error);  // mul stays f32
}

TEST(Elementwise, ReluSigmoidAddAddRows) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t m = 301, c = 67;  // > one 16K chunk, odd width
  Tensor a = random_tensor({m, c}, rng, -8.0f, 8.0f), b = random_tensor({m, c}, rng, -8.0f, 8.0f);
  const Tensor row = random_tensor({c}, rng);
  a.data<float>()[5] = kNaN;
  a.data<float>()[6] = 100.0f;
  a.data<float>()[7] = -100.0f;
  Tensor y = Tensor::empty({m, c}, DType::kF32);
  relu(a, y, &pool);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float v = a.data<float>()[i];
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(y.data<float>()[i]));
    } else {
      ASSERT_EQ(y.data<float>()[i], v > 0 ? v : 0.0f);
    }
  }
  sigmoid(a, y, &pool);
  double err = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (i == 5) continue;
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(a.data<float>()[i])));
    err = std::max(err, std::fabs(want - y.data<float>()[i]));
  }
  EXPECT_LE(err, 1e-7);
  EXPECT_TRUE(std::isnan(y.data<float>()[5]));
  EXPECT_EQ(y.data<float>()[6], 1.0f);
  EXPECT_EQ(y.data<float>()[7], 0.0f);
  add(a, b, y, &pool);
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (i != 5) {
      ASSERT_EQ(y.data<float>()[i], a.data<float>()[i] + b.data<float>()[i]);
    }
  }
  add_rows(b, row, y, &pool);
  for (int64_t i = 0; i < b.numel(); ++i) ASSERT_EQ(y.data<float>()[i], b.data<float>()[i] + row.data<float>()[i % c]);
  add_rows(b, row, b);  // in place
  EXPECT_TRUE(same_bits(b, y));
  Tensor wrong = Tensor::empty({m, c + 1}, DType::kF32);
  EXPECT_THROW(add(a, b, wrong), Error);
  EXPECT_THROW(add_rows(a, row, wrong), Error);
  const Tensor overlap = a.reshape({m * c}).slice(0, 1, m * c);  // shifted by one element
  Tensor shifted_y = a.reshape({m * c}).slice(0, 0, m * c - 1);
  EXPECT_THROW(relu(overlap, shifted_y), Error);
}

TEST(InverseSigmoid, UpstreamClampsAtTheEdges) {
  const float eps = 1e-5f;
  const std::vector<float> xs = {0.0f, 1.0f, eps, eps / 2, 1.0f - eps, 0.5f, -0.3f, -kInf, 1.7f, kInf, 0.25f,
                                 0.999f, kNaN};
  const Tensor x = Tensor::from_floats({static_cast<int64_t>(xs.size())}, xs);
  Tensor y = Tensor::empty(x.shape(), DType::kF32);
  inverse_sigmoid(x, eps, y);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float v = xs[i];
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(y.data<float>()[i]));
      continue;
    }
    // Upstream in f32: clamp to [0, 1], then each side to >= eps, then log of the ratio.
    const float c = std::min(std::max(v, 0.0f), 1.0f);
    const double want = std::log(static_cast<double>(std::max(c, eps)) / static_cast<double>(std::max(1.0f - c, eps)));
    EXPECT_NEAR(y.data<float>()[i], want, 2e-6 * std::max(1.0, std::fabs(want))) << "x = " << v;
  }
  EXPECT_NEAR(y.data<float>()[0], -11.512925, 1e-5);  // log(1e-5)
  EXPECT_NEAR(y.data<float>()[1], 11.512925, 1e-5);
  EXPECT_EQ(y.data<float>()[0], y.data<float>()[6]);   // negatives clamp to 0
  EXPECT_EQ(y.data<float>()[1], y.data<float>()[8]);   // > 1 clamps to 1
  EXPECT_EQ(y.data<float>()[5], 0.0f);
  // Round trip through sigmoid inside the clamp range.
  std::mt19937 rng(4);
  const Tensor p = random_tensor({1000}, rng, 0.01f, 0.99f);
  Tensor l = Tensor::empty({1000}, DType::kF32), back = Tensor::empty({1000}, DType::kF32);
  inverse_sigmoid(p, 1e-5f, l);
  sigmoid(l, back);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_NEAR(back.data<float>()[i], p.data<float>()[i], 1e-6);
}

// ---- pool / resize ----

TEST(MaxPool, MatchesPaddedLoops) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (int64_t h : {1, 2, 3, 7, 8}) {
    for (int64_t w : {1, 4, 5}) {
      for (int64_t c : {1, 3, 17}) {
        // All negative, so a 0 padding would show.
        const Tensor x = random_tensor({2, h, w, c}, rng, -5.0f, -1.0f);
        const Shape ys = max_pool2d_3x3_s2_p1_shape(x.shape());
        ASSERT_EQ(ys, (Shape{2, (h - 1) / 2 + 1, (w - 1) / 2 + 1, c}));
        Tensor y = Tensor::empty(ys, DType::kF32);
        max_pool2d_3x3_s2_p1(x, y, &pool);
        for (int64_t n = 0; n < 2; ++n) {
          for (int64_t oy = 0; oy < ys[1]; ++oy) {
            for (int64_t ox = 0; ox < ys[2]; ++ox) {
              for (int64_t ch = 0; ch < c; ++ch) {
                float m = -kInf;
                for (int64_t i = 0; i < 3; ++i) {
                  for (int64_t j = 0; j < 3; ++j) {
                    const int64_t sy = oy * 2 - 1 + i, sx = ox * 2 - 1 + j;
                    if (sy < 0 || sy >= h || sx < 0 || sx >= w) continue;
                    m = std::max(m, x.data<float>()[((n * h + sy) * w + sx) * c + ch]);
                  }
                }
                ASSERT_EQ(m, y.data<float>()[((n * ys[1] + oy) * ys[2] + ox) * c + ch]) << h << "x" << w << "x" << c;
              }
            }
          }
        }
      }
    }
  }
  Tensor x = Tensor::from_floats({1, 3, 3, 1}, std::vector<float>{1, 2, 3, 4, kNaN, 6, 7, 8, 9});
  Tensor y = Tensor::empty({1, 2, 2, 1}, DType::kF32);
  max_pool2d_3x3_s2_p1(x, y);
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(std::isnan(y.data<float>()[k]));  // every window holds the NaN
  // The same through the vector path (32 channels): a NaN in channel 21 of the centre pixel,
  // read first by window (1, 1) and last by window (0, 0), wins there; other channels do not see it.
  Tensor xv = random_tensor({1, 3, 3, 32}, rng, -5.0f, 5.0f);
  xv.data<float>()[(1 * 3 + 1) * 32 + 21] = kNaN;
  Tensor yv = Tensor::empty({1, 2, 2, 32}, DType::kF32);
  max_pool2d_3x3_s2_p1(xv, yv, &pool);
  for (int k = 0; k < 4; ++k) {
    for (int ch = 0; ch < 32; ++ch) EXPECT_EQ(std::isnan(yv.data<float>()[k * 32 + ch]), ch == 21) << k << " " << ch;
  }
  Tensor wrong = Tensor::empty({1, 3, 3, 1}, DType::kF32);
  EXPECT_THROW(max_pool2d_3x3_s2_p1(x, wrong), Error);
}

// The pool splits rows into chunks that may span images (one chunk of 15 rows on one thread;
// chunks of 2 rows on three threads, of which [4, 6) spans images 0 and 1): the results agree bit
// for bit, in f32 and bf16.
TEST(MaxPool, ChunksAcrossImagesAgree) {
  std::mt19937 rng(7);
  ThreadPool three(3);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor x = random_tensor({3, 9, 7, 33}, rng, -5.0f, 5.0f).to(dt);
    const Shape ys = max_pool2d_3x3_s2_p1_shape(x.shape());  // [3, 5, 4, 33]
    Tensor whole = Tensor::empty(ys, dt), split = Tensor::empty(ys, dt);
    max_pool2d_3x3_s2_p1(x, whole);
    max_pool2d_3x3_s2_p1(x, split, &three);
    ASSERT_EQ(0, std::memcmp(whole.raw_data(), split.raw_data(), whole.nbytes()));
    // And the whole map equals the same values pooled one image at a time.
    for (int64_t n = 0; n < 3; ++n) {
      const Tensor one = x.slice(0, n, n + 1).contiguous();
      Tensor y = Tensor::empty(max_pool2d_3x3_s2_p1_shape(one.shape()), dt);
      max_pool2d_3x3_s2_p1(one, y);
      ASSERT_EQ(0, std::memcmp(y.raw_data(), whole.slice(0, n, n + 1).raw_data(), y.nbytes())) << n;
    }
  }
}

// bf16 maps: exactly the f32 pool of the same values, rounded (here: already on the bf16 grid).
// u8 codes (int8 precision's stem): exactly the f32 pool of the same values, through the vector
// path (64 channels a vector, a masked tail) and the scalar one; codes up to 255 and down to 0.
TEST(MaxPool, U8EqualsF32PoolOfTheSameValues) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> code(0, 255);
  ThreadPool pool(2);
  for (int64_t h : {1, 3, 8, 9}) {
    for (int64_t w : {1, 5, 6}) {
      for (int64_t c : {1, 17, 64, 131}) {  // a tail only, one vector, two vectors and a tail
        Tensor x8 = Tensor::empty({2, h, w, c}, DType::kU8);
        for (int64_t i = 0; i < x8.numel(); ++i) x8.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
        Tensor x = Tensor::empty(x8.shape(), DType::kF32);
        for (int64_t i = 0; i < x8.numel(); ++i) x.data<float>()[i] = x8.data<uint8_t>()[i];
        const Shape ys = max_pool2d_3x3_s2_p1_shape(x.shape());
        Tensor y = Tensor::empty(ys, DType::kF32), y8 = Tensor::empty(ys, DType::kU8);
        max_pool2d_3x3_s2_p1(x, y, &pool);
        max_pool2d_3x3_s2_p1(x8, y8, &pool);
        for (int64_t i = 0; i < y.numel(); ++i) {
          ASSERT_EQ(y.data<float>()[i], y8.data<uint8_t>()[i]) << h << "x" << w << "x" << c << " at " << i;
        }
      }
    }
  }
  Tensor x8 = Tensor::zeros({1, 3, 3, 4}, DType::kU8);
  Tensor f32_out = Tensor::empty({1, 2, 2, 4}, DType::kF32);
  EXPECT_THROW(max_pool2d_3x3_s2_p1(x8, f32_out), Error);  // the output takes the input's dtype
  Tensor s8 = Tensor::zeros({1, 3, 3, 4}, DType::kI8), s8_out = Tensor::empty({1, 2, 2, 4}, DType::kI8);
  EXPECT_THROW(max_pool2d_3x3_s2_p1(s8, s8_out), Error);  // s8 codes never reach a pool
}

TEST(MaxPool, Bf16EqualsF32PoolOfTheSameValues) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  for (int64_t h : {1, 3, 8, 9}) {
    for (int64_t w : {1, 5, 6}) {
      for (int64_t c : {1, 17, 35}) {  // scalar only, one vector and a tail, two vectors and a tail
        const Tensor x16 = random_tensor({2, h, w, c}, rng, -5.0f, 3.0f).to(DType::kBF16);
        const Tensor x = x16.to(DType::kF32);
        const Shape ys = max_pool2d_3x3_s2_p1_shape(x.shape());
        Tensor y = Tensor::empty(ys, DType::kF32);
        max_pool2d_3x3_s2_p1(x, y, &pool);
        Tensor y16 = Tensor::empty(ys, DType::kBF16);
        max_pool2d_3x3_s2_p1(x16, y16, &pool);
        ASSERT_EQ(0, std::memcmp(y.to(DType::kBF16).raw_data(), y16.raw_data(), y16.nbytes())) << h << "x" << w << "x" << c;
      }
    }
  }
  // A NaN wins in bf16 too, in the vector lanes and the scalar tail.
  Tensor x = random_tensor({1, 3, 3, 19}, rng, -5.0f, 5.0f);
  x.data<float>()[(1 * 3 + 1) * 19 + 4] = kNaN;
  x.data<float>()[(1 * 3 + 1) * 19 + 18] = kNaN;
  Tensor y16 = Tensor::empty({1, 2, 2, 19}, DType::kBF16);
  max_pool2d_3x3_s2_p1(x.to(DType::kBF16), y16, &pool);
  const Tensor y = y16.to(DType::kF32);
  for (int k = 0; k < 4; ++k) {
    for (int ch = 0; ch < 19; ++ch) EXPECT_EQ(std::isnan(y.data<float>()[k * 19 + ch]), ch == 4 || ch == 18) << k << " " << ch;
  }
  // The output takes the input's dtype.
  Tensor f32_out = Tensor::empty({1, 2, 2, 19}, DType::kF32);
  EXPECT_THROW(max_pool2d_3x3_s2_p1(x.to(DType::kBF16), f32_out), Error);
  EXPECT_THROW(max_pool2d_3x3_s2_p1(x, y16), Error);
}

TEST(UpsampleNearest2xAdd, PyTorchNearestAtOddAndDoubleSizes) {
  std::mt19937 rng(6);
  ThreadPool pool(2);
  struct Sizes { int64_t h, w, H, W; };
  for (const Sizes s : {Sizes{1, 1, 1, 1}, Sizes{1, 1, 3, 5}, Sizes{2, 3, 4, 6}, Sizes{15, 25, 29, 50},
                        Sizes{29, 50, 58, 100}, Sizes{3, 5, 7, 9}, Sizes{7, 3, 5, 2}}) {
    const int64_t c = 19;
    const Tensor coarse = random_tensor({2, s.h, s.w, c}, rng);
    Tensor fine = random_tensor({2, s.H, s.W, c}, rng);
    const Tensor before = fine.clone();
    upsample_nearest2x_add(coarse, fine, &pool);
    // PyTorch 1.9 nearest_idx: 1x and 2x shortcuts, else min(floor(dst * (float)in / out), in - 1) in f32.
    const auto src = [](int64_t d, int64_t in, int64_t out) -> int64_t {
      if (in == out) return d;
      if (out == 2 * in) return d / 2;
      const float scale = static_cast<float>(in) / static_cast<float>(out);
      return std::min<int64_t>(static_cast<int64_t>(std::floor(static_cast<float>(d) * scale)), in - 1);
    };
    for (int64_t n = 0; n < 2; ++n) {
      for (int64_t y = 0; y < s.H; ++y) {
        for (int64_t x = 0; x < s.W; ++x) {
          for (int64_t ch = 0; ch < c; ++ch) {
            const int64_t fi = ((n * s.H + y) * s.W + x) * c + ch;
            const int64_t ci = ((n * s.h + src(y, s.h, s.H)) * s.w + src(x, s.w, s.W)) * c + ch;
            ASSERT_EQ(fine.data<float>()[fi], before.data<float>()[fi] + coarse.data<float>()[ci]);
          }
        }
      }
    }
  }
  // For BEVFormer's exact 2x levels the index is dst / 2.
  for (int64_t d = 0; d < 200; ++d) ASSERT_EQ(nearest_source_index(d, 100, 200), d / 2);
  const Tensor coarse = random_tensor({1, 2, 2, 3}, rng);
  Tensor fine = random_tensor({1, 4, 4, 4}, rng);
  EXPECT_THROW(upsample_nearest2x_add(coarse, fine), Error);
}

// ---- select ----

TEST(Topk, DescendingStableOnTiesNaNLast) {
  std::mt19937 rng(7);
  const int64_t n = 9000;  // the decoder's 900 x 10 scores, with heavy ties
  Tensor s = Tensor::empty({n}, DType::kF32);
  std::uniform_int_distribution<int> pick(0, 5);
  const float levels[] = {0.1f, 0.2f, 0.3f, 0.7f, -0.0f, 0.0f};
  for (int64_t i = 0; i < n; ++i) s.data<float>()[i] = levels[pick(rng)];
  s.data<float>()[17] = kNaN;
  s.data<float>()[18] = -kInf;
  s.data<float>()[8000] = kInf;
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{300}, int64_t{8999}, n}) {
    Tensor v = Tensor::empty({k}, DType::kF32), idx = Tensor::empty({k}, DType::kI64);
    topk(s, k, v, idx);
    std::vector<int64_t> want(static_cast<size_t>(n));
    std::iota(want.begin(), want.end(), int64_t{0});
    const float* sp = s.data<float>();
    std::stable_sort(want.begin(), want.end(), [&](int64_t a, int64_t b) {
      if (std::isnan(sp[a]) || std::isnan(sp[b])) return !std::isnan(sp[a]) && std::isnan(sp[b]);
      return sp[a] > sp[b];
    });
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(idx.data<int64_t>()[i], want[static_cast<size_t>(i)]) << "k " << k << " rank " << i;
      const int64_t wi = want[static_cast<size_t>(i)];
      ASSERT_TRUE(same_bits(v.slice(0, i, i + 1), s.slice(0, wi, wi + 1)));
    }
    if (k == n) {
      EXPECT_EQ(idx.data<int64_t>()[n - 1], 17);  // NaN is last
    }
  }
  Tensor v = Tensor::empty({n + 1}, DType::kF32), idx = Tensor::empty({n + 1}, DType::kI64);
  EXPECT_THROW(topk(s, n + 1, v, idx), Error);
}

TEST(GatherScatter, ScatterMeanGivesTheBitsOfZerosScatterAndMul) {
  std::mt19937 rng(9);
  ThreadPool pool(3);
  // Rows that many slots hit, rows none hits, padding; blocks of y (64 KiB) crossed by repeats.
  for (const auto& [m, n, c] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {50, 7, 3}, {3066, 2500, 256},
                                {4000, 3000, 5}, {600, 9000, 33}}) {
    Tensor src = random_tensor({m, c}, rng, -50.0f, 50.0f);
    src.data<float>()[0] = -0.0f;  // +0 + -0 is +0: the sum starts from the zeros' +0
    Tensor idx = Tensor::empty({m}, DType::kI64);
    std::uniform_int_distribution<int64_t> row(0, n - 1);
    for (int64_t i = 0; i < m; ++i) idx.data<int64_t>()[i] = i % 7 == 6 ? -1 : (i % 5 == 0 ? 0 : row(rng));
    const Tensor scale = random_tensor({n, 1}, rng, 0.1f, 1.0f);
    Tensor want = Tensor::zeros({n, c}, DType::kF32);
    scatter_add_rows(src, idx, want);
    mul(want, scale, want, &pool);
    Tensor got = Tensor::empty({n, c}, DType::kF32);
    for (float* p = got.data<float>(); p != got.data<float>() + got.numel(); ++p) *p = kNaN;  // all overwritten
    scatter_mean_rows(src, idx, scale, got, &pool);
    EXPECT_TRUE(same_bits(got, want)) << "M " << m << " N " << n << " C " << c;
    Tensor one = Tensor::empty({n, c}, DType::kF32);
    scatter_mean_rows(src, idx, scale, one, nullptr);
    EXPECT_TRUE(same_bits(one, want)) << "one thread, M " << m;
    // bf16 y (SCA's mean in bf16 precision): the same sums, each rounded once.
    Tensor want16 = Tensor::empty({n, c}, DType::kBF16);
    float_to_bf16_n(want.data<float>(), static_cast<uint16_t*>(want16.raw_data()), static_cast<size_t>(want.numel()));
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      Tensor got16 = Tensor::empty({n, c}, DType::kBF16);
      scatter_mean_rows(src, idx, scale, got16, p);
      EXPECT_TRUE(same_bits(got16, want16)) << "bf16, M " << m << (p ? ", 3 threads" : ", 1 thread");
    }
  }
  const Tensor src = random_tensor({3, 4}, rng), scale = random_tensor({5, 1}, rng);
  Tensor y = Tensor::empty({5, 4}, DType::kF32);
  EXPECT_THROW(scatter_mean_rows(src, i64_tensor({0, 5, 1}), scale, y, nullptr), Error);  // row 5 of 5
  EXPECT_THROW(scatter_mean_rows(src, i64_tensor({0, 1}), scale, y, nullptr), Error);     // 2 indices, 3 rows
  Tensor wrong = Tensor::empty({5, 3}, DType::kF32);
  EXPECT_THROW(scatter_mean_rows(src, i64_tensor({0, 1, 2}), scale, wrong, nullptr), Error);
  Tensor half = Tensor::empty({5, 4}, DType::kF16);
  EXPECT_THROW(scatter_mean_rows(src, i64_tensor({0, 1, 2}), scale, half, nullptr), Error);
}

TEST(GatherScatter, RowsWithDuplicatesAndBoundsChecks) {
  std::mt19937 rng(8);
  const int64_t N = 13, C = 37, M = 29;
  const Tensor src = random_tensor({N, C}, rng);
  std::vector<int64_t> iv(static_cast<size_t>(M));
  std::uniform_int_distribution<int64_t> pick(0, N - 1);
  for (auto& e : iv) e = pick(rng);
  iv[3] = iv[4] = N - 1;  // duplicates
  const Tensor idx = i64_tensor(iv);
  Tensor dst = Tensor::empty({M, C}, DType::kF32);
  gather_rows(src, idx, dst);
  for (int64_t m = 0; m < M; ++m) {
    ASSERT_EQ(0, std::memcmp(dst.data<float>() + m * C, src.data<float>() + iv[static_cast<size_t>(m)] * C, C * 4));
  }
  // Any dtype: i64 rows.
  Tensor src64 = Tensor::empty({N, 3}, DType::kI64), dst64 = Tensor::empty({M, 3}, DType::kI64);
  for (int64_t i = 0; i < N * 3; ++i) src64.data<int64_t>()[i] = i * 1000003;
  gather_rows(src64, idx, dst64);
  for (int64_t m = 0; m < M; ++m) {
    ASSERT_EQ(dst64.data<int64_t>()[m * 3 + 2], (iv[static_cast<size_t>(m)] * 3 + 2) * 1000003);
  }

  Tensor acc = random_tensor({N, C}, rng);
  const Tensor upd = random_tensor({M, C}, rng);
  std::vector<float> wantf(acc.data<float>(), acc.data<float>() + N * C);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t row = iv[static_cast<size_t>(m)];
    for (int64_t c = 0; c < C; ++c) wantf[static_cast<size_t>(row * C + c)] += upd.data<float>()[m * C + c];
  }
  scatter_add_rows(upd, idx, acc);
  ASSERT_EQ(0, std::memcmp(acc.data<float>(), wantf.data(), wantf.size() * 4));  // same order, same bits

  std::vector<int64_t> bad_iv = iv;
  bad_iv[M - 1] = N;
  const Tensor before = dst.clone();
  EXPECT_THROW(gather_rows(src, i64_tensor(bad_iv), dst), Error);
  EXPECT_TRUE(same_bits(dst, before));  // nothing written
  bad_iv[M - 1] = -2;  // -1 is padding (test_op_glue.cpp); anything below is an error
  const Tensor acc_before = acc.clone();
  EXPECT_THROW(scatter_add_rows(upd, i64_tensor(bad_iv), acc), Error);
  EXPECT_TRUE(same_bits(acc, acc_before));
  Tensor wrong = Tensor::empty({M, C + 1}, DType::kF32);
  EXPECT_THROW(gather_rows(src, idx, wrong), Error);
}

TEST(Concat, AnyAxisAndDtype) {
  std::mt19937 rng(9);
  const Tensor a = random_tensor({2, 3, 5}, rng), b = random_tensor({2, 1, 5}, rng), c = random_tensor({2, 4, 5}, rng);
  const std::vector<Tensor> parts = {a, b, c};
  Tensor y = Tensor::empty({2, 8, 5}, DType::kF32);
  concat(parts, 1, y);
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t j = 0; j < 8; ++j) {
      const Tensor& src = j < 3 ? a : j < 4 ? b : c;
      const int64_t jj = j < 3 ? j : j < 4 ? j - 3 : j - 4;
      for (int64_t k = 0; k < 5; ++k) {
        ASSERT_EQ(y.data<float>()[(n * 8 + j) * 5 + k], src.data<float>()[(n * src.size(1) + jj) * 5 + k]);
      }
    }
  }
  const Tensor p = random_tensor({3, 2}, rng), q = random_tensor({3, 7}, rng);
  const std::vector<Tensor> last = {p, q};
  Tensor z = Tensor::empty({3, 9}, DType::kF32);
  concat(last, -1, z);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t k = 0; k < 9; ++k) {
      ASSERT_EQ(z.data<float>()[r * 9 + k], k < 2 ? p.data<float>()[r * 2 + k] : q.data<float>()[r * 7 + k - 2]);
    }
  }
  const std::vector<Tensor> rows = {i64_tensor({1, 2}), i64_tensor({3}), i64_tensor({4, 5, 6})};
  Tensor r = Tensor::empty({6}, DType::kI64);
  concat(rows, 0, r);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.data<int64_t>()[i], i + 1);
  const std::vector<Tensor> mismatched = {a, random_tensor({2, 1, 4}, rng)};
  Tensor m = Tensor::empty({2, 4, 5}, DType::kF32);
  EXPECT_THROW(concat(mismatched, 1, m), Error);
  EXPECT_THROW(concat(parts, 3, y), Error);
}

// Threaded (a pool) and into bf16: concat along axis 0 (one block per part, split into pieces) and
// along the last axis (many short rows), and gather_rows with padding, each against the plain copy
// rounded to nearest even; same-dtype threaded copies give the serial bytes; bf16 dst overlapping
// an input is refused.
TEST(Concat, ThreadedAndIntoBf16) {
  std::mt19937 rng(10);
  ThreadPool pool(3);
  const auto rounded = [](const Tensor& f32) { return f32.to(DType::kBF16); };
  // Axis 0, parts past one 64K-element piece; the last axis, 40000 short rows (TSA's query_cat).
  for (const auto& [shapes, axis] : {std::pair<std::vector<Shape>, int64_t>{{{700, 256}, {300, 256}}, 0},
                                     {{{40000, 7}, {40000, 9}}, 1}}) {
    std::vector<Tensor> parts;
    Shape out = shapes[0];
    out[static_cast<size_t>(axis)] = 0;
    for (const Shape& sh : shapes) {
      parts.push_back(random_tensor(sh, rng));
      out[static_cast<size_t>(axis)] += sh[static_cast<size_t>(axis)];
    }
    parts[0].data<float>()[3] = kNaN;
    Tensor serial = Tensor::empty(out, DType::kF32), threaded = Tensor::empty(out, DType::kF32);
    concat(parts, axis, serial);
    concat(parts, axis, threaded, &pool);
    EXPECT_TRUE(same_bits(serial, threaded));
    Tensor y16 = Tensor::empty(out, DType::kBF16);
    concat(parts, axis, y16, &pool);
    EXPECT_TRUE(same_bits(y16, rounded(serial))) << "axis " << axis;
  }
  const Tensor src = random_tensor({50, 33}, rng);
  std::vector<int64_t> iv(3001);
  std::uniform_int_distribution<int64_t> pick(-1, 49);
  for (auto& e : iv) e = pick(rng);
  Tensor serial = Tensor::empty({3001, 33}, DType::kF32), y16 = Tensor::empty({3001, 33}, DType::kBF16);
  Tensor threaded = Tensor::empty({3001, 33}, DType::kF32);
  gather_rows(src, i64_tensor(iv), serial);
  gather_rows(src, i64_tensor(iv), threaded, &pool);
  EXPECT_TRUE(same_bits(serial, threaded));
  gather_rows(src, i64_tensor(iv), y16, &pool);
  EXPECT_TRUE(same_bits(y16, rounded(serial)));
  Tensor over = Tensor::view_of(src.storage(), DType::kBF16, {10, 33}, contiguous_strides({10, 33}), 0);
  EXPECT_THROW(gather_rows(src, i64_tensor(std::vector<int64_t>(10, 1)), over, &pool), Error);
  const std::vector<Tensor> parts = {src, src};
  Tensor over_concat = Tensor::view_of(src.storage(), DType::kBF16, {100, 33}, contiguous_strides({100, 33}), 0);
  EXPECT_THROW(concat(parts, 0, over_concat, &pool), Error);
}

// zeros split over threads clears every byte, odd sizes included.
TEST(Elementwise, ThreadedZerosClearEveryByte) {
  ThreadPool pool(3);
  for (const int64_t bytes : {int64_t{1}, int64_t{(1 << 20) + 13}, int64_t{5 << 20}}) {
    Tensor y = Tensor::empty({bytes}, DType::kU8);
    std::memset(y.raw_data(), 0xAB, static_cast<size_t>(bytes));
    zeros(y, &pool);
    const auto* p = static_cast<const uint8_t*>(y.raw_data());
    EXPECT_EQ(std::count(p, p + bytes, uint8_t{0}), bytes) << bytes << " bytes";
  }
}

// Element i of `view` through its strides, for any rank.
template <typename T>
T at_index(const Tensor& view, int64_t flat) {
  int64_t off = 0;
  for (int64_t d = view.dim(); d-- > 0;) {
    off += (flat % view.size(d)) * view.strides()[static_cast<size_t>(d)];
    flat /= view.size(d);
  }
  return static_cast<const T*>(view.storage()->data())[view.offset() + off];
}

TEST(PermuteCopy, NhwcNchwAndRandomPermutations) {
  std::mt19937 rng(10);
  ThreadPool pool(2);
  const auto check = [&pool](const Tensor& view) {
    Tensor out = Tensor::empty(view.shape(), view.dtype());
    permute_copy(view, out);
    Tensor split = Tensor::empty(view.shape(), view.dtype());  // large ones split over the pool
    permute_copy(view, split, &pool);
    ASSERT_EQ(0, std::memcmp(out.raw_data(), split.raw_data(), out.nbytes())) << view.describe();
    for (int64_t i = 0; i < view.numel(); ++i) {
      if (view.dtype() == DType::kF32) {
        ASSERT_EQ(out.data<float>()[i], at_index<float>(view, i)) << view.describe() << " @" << i;
      } else {
        ASSERT_EQ(out.data<uint8_t>()[i], at_index<uint8_t>(view, i)) << view.describe() << " @" << i;
      }
    }
  };
  const Tensor nhwc = random_tensor({2, 37, 41, 19}, rng);
  check(nhwc.permute({0, 3, 1, 2}));                 // NHWC -> NCHW (blocked path)
  check(nhwc.permute({0, 3, 1, 2}).contiguous().permute({0, 2, 3, 1}));  // and back
  check(nhwc.slice(2, 3, 40).slice(3, 1, 18));       // a sub-box: row memcpy path
  check(nhwc.slice(3, 5, 6).permute({3, 0, 2, 1}));  // no unit-stride dim left
  check(nhwc.select(0, 1));
  // Camera images to NHWC: a 3-channel NCHW view with 33,800 pixels per image (the split path,
  // with a partial last block).
  const Tensor nchw = random_tensor({2, 3, 130, 260}, rng);
  check(nchw.permute({0, 2, 3, 1}));
  const Tensor five = random_tensor({3, 1, 4, 5, 6}, rng);
  std::vector<int64_t> order = {0, 1, 2, 3, 4};
  for (int t = 0; t < 12; ++t) {
    std::shuffle(order.begin(), order.end(), rng);
    check(five.permute(order));
  }
  Tensor bytes = Tensor::empty({5, 7, 3}, DType::kU8);
  for (int64_t i = 0; i < bytes.numel(); ++i) bytes.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  check(bytes.permute({2, 0, 1}));
  Tensor wrong = Tensor::empty({2, 19, 37, 40}, DType::kF32);
  EXPECT_THROW(permute_copy(nhwc.permute({0, 3, 1, 2}), wrong), Error);
  Tensor self = nhwc.clone();
  Tensor self_view = self.permute({0, 1, 2, 3});
  EXPECT_THROW(permute_copy(self_view, self), Error);  // overlapping src and dst
}

}  // namespace
}  // namespace bev::cpu
