// The bev stage's fused ops against the same ops run one by one on the same backend, bytes
// identical. Ops::ffn_norm (a layer's FFN, residual and norm in chunks that keep the hidden rows
// in cache) at awkward and BEVFormer shapes; Ops::deformable_attention (the query's projections,
// softmax, sampling locations and msda as one op, in chunks that stay in cache) on awkward shapes (rows that leave a short last chunk, batches whose
// boundaries fall inside a chunk, 1-3 levels, odd heads and head_dim, softmax per level or over
// a head's levels and points), at BEVFormer's shapes, with 1-3 threads, in f32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "bevformer/error.h"
#include "core/half.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

Tensor to_bf16(const Tensor& t) {
  Tensor b = Tensor::empty(t.shape(), DType::kBF16);
  float_to_bf16_n(t.data<float>(), static_cast<uint16_t*>(b.raw_data()), static_cast<size_t>(t.numel()));
  return b;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

struct Case {
  std::string name;
  int64_t bs, lq, c, heads, hd, points;
  SpatialShapes shapes;
  int64_t lr, r, d;  // reference [M, lr, r, d]
  bool per_level;
};

struct Result {
  Tensor fused, unfused;
};

// Both paths on one backend: `bf16_query` and `bf16_value` as the model feeds them in bf16.
Result run_both(const Case& k, int threads, Precision precision, bool bf16_query, bool bf16_value, uint32_t seed) {
  auto backend = make_cpu_backend(threads, precision);
  Ops ops(*backend);
  const auto levels = static_cast<int64_t>(k.shapes.size());
  const int64_t samples = k.heads * levels * k.points, rows = k.bs * k.lq;
  int64_t lv = 0;
  MsdaAttrs ma;
  for (const auto& [h, w] : k.shapes) {
    ma.spatial_shapes.emplace_back(h, w);
    ma.level_start.push_back(lv);
    lv += h * w;
  }
  // Offsets of a few cells (some samples leave the map), logits of a softmax's usual range.
  const Tensor wo = random_tensor({2 * samples, k.c}, seed, -0.4f, 0.4f), bo = random_tensor({2 * samples}, seed + 1, -3, 3);
  const Tensor wa = random_tensor({samples, k.c}, seed + 2, -0.3f, 0.3f), ba = random_tensor({samples}, seed + 3, -1, 1);
  const PreparedWeights offsets = ops.prepare_linear(wo, &bo, {});
  const PreparedWeights weights = ops.prepare_linear(wa, &ba, {});
  Tensor query = random_tensor({rows, k.c}, seed + 4, -1, 1);
  if (bf16_query) query = to_bf16(query);
  Tensor value = random_tensor({k.bs, lv, k.heads, k.hd}, seed + 5, -2, 2);
  if (bf16_value) value = to_bf16(value);
  const Tensor reference = random_tensor({rows, k.lr, k.r, k.d}, seed + 6, 0, 1);
  const Tensor q = backend->upload(query), ref = backend->upload(reference), v = backend->upload(value);

  Result out;
  out.fused = backend->read(ops.deformable_attention(q, ref, v, offsets, weights, ma, k.per_level, "fused"));
  const Tensor off = ops.linear(q, offsets).reshape({rows, k.heads, levels, k.points, 2});
  const int64_t cols = k.per_level ? k.points : levels * k.points;
  const Tensor w = ops.softmax(ops.linear(q, weights).reshape({rows * samples / cols, cols}))
                       .reshape({k.bs, k.lq, k.heads, levels, k.points});
  const Tensor loc = ops.sampling_locations(off, ref, {ma.spatial_shapes}).reshape({k.bs, k.lq, k.heads, levels, k.points, 2});
  out.unfused = backend->read(ops.msda(v, loc, w, ma).reshape({rows, k.heads * k.hd}));
  return out;
}

void expect_same_bytes(const Result& r, const std::string& what) {
  ASSERT_EQ(r.fused.shape(), r.unfused.shape()) << what;
  ASSERT_EQ(r.fused.dtype(), DType::kF32) << what;
  const float* a = r.fused.data<float>();
  const float* b = r.unfused.data<float>();
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < r.fused.numel(); ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << r.fused.numel() << " values differ, first at " << first
                       << " (" << (first >= 0 ? a[first] : 0.0f) << " vs " << (first >= 0 ? b[first] : 0.0f) << ")";
  // Not a test of zeros: the outputs carry values.
  double sum = 0;
  for (int64_t i = 0; i < r.fused.numel(); ++i) sum += std::abs(a[i]);
  EXPECT_GT(sum, 0.0) << what;
}

const std::vector<Case>& awkward_cases() {
  static const std::vector<Case> cases = {
      {"1 query, 1 head, hd 1, 1 point", 1, 1, 5, 1, 1, 1, {{3, 2}}, 1, 1, 2, false},
      {"TSA-like, 2 levels per level, short last chunk", 1, 1037, 24, 3, 17, 4, {{13, 11}, {13, 11}}, 2, 1, 2, true},
      {"SCA-like, 3 cameras, batch edges inside chunks", 3, 301, 32, 8, 32, 8, {{9, 14}, {5, 7}, {3, 4}}, 1, 4, 2, false},
      {"decoder-like, D 3, 2 samples", 2, 77, 16, 2, 33, 4, {{21, 19}}, 1, 1, 3, false},
      {"3 levels per level, R 3", 1, 555, 40, 5, 8, 3, {{6, 9}, {3, 5}, {1, 2}}, 3, 3, 2, true},
  };
  return cases;
}

class DeformableAttentionThreads : public ::testing::TestWithParam<int> {};

TEST_P(DeformableAttentionThreads, AwkwardShapesGiveTheBitsOfTheOpsOneByOne) {
  const int threads = GetParam();
  uint32_t seed = 100;
  for (const Case& k : awkward_cases()) {
    expect_same_bytes(run_both(k, threads, Precision::kF32, false, false, seed), k.name + ", f32");
    if (bev::precision_test::runs_here(Precision::kBF16)) {
      expect_same_bytes(run_both(k, threads, Precision::kBF16, true, true, seed + 7), k.name + ", bf16 query and value");
      expect_same_bytes(run_both(k, threads, Precision::kBF16, false, true, seed + 11), k.name + ", bf16, f32 query");
    }
    seed += 1000;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, DeformableAttentionThreads, ::testing::Values(1, 2, 3));

// BEVFormer's shapes (tiny's BEV 50x50, SCA over four FPN levels of 6 cameras; base's TSA rows),
// as the model runs them in bf16 and f32.
TEST(DeformableAttention, BevformerShapesGiveTheBitsOfTheOpsOneByOne) {
  const std::vector<Case> cases = {
      {"tiny TSA", 1, 2500, 512, 8, 32, 4, {{50, 50}, {50, 50}}, 2, 1, 2, true},
      {"tiny SCA", 6, 611, 256, 8, 32, 8, {{15, 25}}, 1, 4, 2, false},
      {"tiny decoder", 1, 900, 256, 8, 32, 4, {{50, 50}}, 1, 1, 3, false},
      {"base SCA, 4 levels", 6, 1234, 256, 8, 32, 8, {{116, 200}, {58, 100}, {29, 50}, {15, 25}}, 1, 4, 2, false},
  };
  uint32_t seed = 7;
  for (const Case& k : cases) {
    if (bev::precision_test::runs_here(Precision::kBF16))
      expect_same_bytes(run_both(k, 2, Precision::kBF16, k.name != "tiny decoder", true, seed), k.name + ", bf16");
    expect_same_bytes(run_both(k, 2, Precision::kF32, false, false, seed + 1), k.name + ", f32");
    seed += 10;
  }
}

// ffn_norm against linear, linear, add_layer_norm: x [rows, c], hidden h.
void expect_ffn_norm_bits(int64_t rows, int64_t c, int64_t h, int threads, Precision precision, uint32_t seed) {
  auto backend = make_cpu_backend(threads, precision);
  Ops ops(*backend);
  const Tensor w1 = random_tensor({h, c}, seed, -0.3f, 0.3f), b1 = random_tensor({h}, seed + 1, -0.5f, 0.5f);
  const Tensor w2 = random_tensor({c, h}, seed + 2, -0.3f, 0.3f), b2 = random_tensor({c}, seed + 3, -0.5f, 0.5f);
  const PreparedWeights fc1 = ops.prepare_linear(w1, &b1, {.relu = true});
  const PreparedWeights fc2 = ops.prepare_linear(w2, &b2, {});
  const Tensor x = backend->upload(random_tensor({rows, c}, seed + 4, -2, 2));
  const Tensor g = backend->upload(random_tensor({c}, seed + 5, 0.5f, 1.5f));
  const Tensor b = backend->upload(random_tensor({c}, seed + 6, -1, 1));
  const DType hidden = precision == Precision::kBF16 ? DType::kBF16 : DType::kF32;
  Result r;
  r.fused = backend->read(ops.ffn_norm(x, fc1, fc2, g, b, 1e-5f, hidden, "ffn"));
  r.unfused = backend->read(ops.add_layer_norm(x, ops.linear(ops.linear(x, fc1, "fc1", hidden), fc2), g, b, 1e-5f));
  expect_same_bytes(r, "ffn_norm " + std::to_string(rows) + "x" + std::to_string(c) + " -> " + std::to_string(h) +
                           ", " + std::to_string(threads) + " threads, " + precision_name(precision));
}

TEST(FfnNorm, GivesTheBitsOfTheOpsOneByOne) {
  uint32_t seed = 300;
  for (const int threads : {1, 2, 3}) {
    for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
      expect_ffn_norm_bits(1, 3, 5, threads, p, seed++);
      expect_ffn_norm_bits(517, 24, 40, threads, p, seed++);  // a short last chunk
      expect_ffn_norm_bits(1000, 33, 64, threads, p, seed++);
    }
  }
  // BEVFormer's: tiny's BEV and decoder queries (512 hidden), and base's BEV rows (chunked in
  // bf16 by the unfused fc1 too: M >= 8192).
  for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
    expect_ffn_norm_bits(2500, 256, 512, 2, p, seed++);
    expect_ffn_norm_bits(900, 256, 512, 2, p, seed++);
  }
  if (bev::precision_test::runs_here(Precision::kBF16)) expect_ffn_norm_bits(40000, 256, 512, 2, Precision::kBF16, seed++);
}

TEST(FfnNorm, ShapeErrorsAreInvalidInput) {
  auto backend = make_cpu_backend(1, Precision::kF32);
  Ops ops(*backend);
  const PreparedWeights fc1 = ops.prepare_linear(random_tensor({6, 4}, 1, -1, 1), nullptr, {.relu = true});
  const PreparedWeights fc2 = ops.prepare_linear(random_tensor({4, 6}, 2, -1, 1), nullptr, {});
  const PreparedWeights fc1_no_relu = ops.prepare_linear(random_tensor({6, 4}, 3, -1, 1), nullptr, {});
  const Tensor x = backend->upload(random_tensor({5, 4}, 4, -1, 1));
  const Tensor g = backend->upload(random_tensor({4}, 5, -1, 1)), b = backend->upload(random_tensor({4}, 6, -1, 1));
  EXPECT_NO_THROW(ops.ffn_norm(x, fc1, fc2, g, b, 1e-5f, DType::kF32));
  const auto invalid = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind() == ErrorKind::kInvalidInput;
    }
    return false;
  };
  EXPECT_TRUE(invalid([&] { ops.ffn_norm(x, fc2, fc1, g, b, 1e-5f, DType::kF32); }));          // swapped
  EXPECT_TRUE(invalid([&] { ops.ffn_norm(x, fc1_no_relu, fc2, g, b, 1e-5f, DType::kF32); }));  // no ReLU
  EXPECT_TRUE(invalid([&] { ops.ffn_norm(x.slice(1, 0, 3).contiguous(), fc1, fc2, g, b, 1e-5f, DType::kF32); }));
  EXPECT_TRUE(invalid([&] { ops.ffn_norm(x, fc1, fc2, g.slice(0, 0, 3), b, 1e-5f, DType::kF32); }));
  // bf16 hidden rows need bf16 arithmetic.
  EXPECT_TRUE(invalid([&] { ops.ffn_norm(x, fc1, fc2, g, b, 1e-5f, DType::kBF16); }));
}

TEST(DeformableAttention, ShapeErrorsAreInvalidInput) {
  auto backend = make_cpu_backend(1, Precision::kF32);
  Ops ops(*backend);
  MsdaAttrs ma{{{4, 5}}, {0}};
  const PreparedWeights offsets = ops.prepare_linear(random_tensor({2 * 2 * 3, 8}, 1, -1, 1), nullptr, {});
  const PreparedWeights weights = ops.prepare_linear(random_tensor({2 * 3, 8}, 2, -1, 1), nullptr, {});
  const PreparedWeights relu = ops.prepare_linear(random_tensor({2 * 3, 8}, 3, -1, 1), nullptr, {.relu = true});
  const Tensor q = backend->upload(random_tensor({6, 8}, 4, -1, 1));
  const Tensor ref = backend->upload(random_tensor({6, 1, 1, 2}, 5, 0, 1));
  const Tensor v = backend->upload(random_tensor({2, 20, 2, 4}, 6, -1, 1));
  const auto kind_of = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;  // no error: fails the expectations below
  };
  EXPECT_NO_THROW(ops.deformable_attention(q, ref, v, offsets, weights, ma, false));
  // Query rows not a multiple of value's batch.
  EXPECT_EQ(kind_of([&] { ops.deformable_attention(q.slice(0, 0, 5), ref.slice(0, 0, 5), v, offsets, weights, ma, false); }),
            ErrorKind::kInvalidInput);
  // Query width unlike the projections'.
  EXPECT_EQ(kind_of([&] {
              ops.deformable_attention(backend->upload(random_tensor({6, 7}, 7, -1, 1)), ref, v, offsets, weights, ma, false);
            }),
            ErrorKind::kInvalidInput);
  // Offsets and weights swapped, a ReLU projection, a reference of other rows, two levels declared.
  EXPECT_EQ(kind_of([&] { ops.deformable_attention(q, ref, v, weights, offsets, ma, false); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { ops.deformable_attention(q, ref, v, offsets, relu, ma, false); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { ops.deformable_attention(q, ref.slice(0, 0, 4), v, offsets, weights, ma, false); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] {
              ops.deformable_attention(q, ref, v, offsets, weights, MsdaAttrs{{{4, 5}, {2, 2}}, {0, 20}}, false);
            }),
            ErrorKind::kInvalidInput);
  // Value rows unlike the levels' cells.
  EXPECT_EQ(kind_of([&] {
              ops.deformable_attention(q, ref, backend->upload(random_tensor({2, 21, 2, 4}, 8, -1, 1)), offsets, weights,
                                       ma, false);
            }),
            ErrorKind::kInvalidInput);
}

}  // namespace
}  // namespace bev
