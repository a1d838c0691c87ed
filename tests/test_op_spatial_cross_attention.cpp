// Ops::spatial_cross_attention (SCA's per-camera sampling and mean over cameras as one op)
// against the ops the model ran before it, one by one on the same backend: gather_rows (the
// rebatch, rounded to the query's dtype), deformable_attention and scatter_mean_rows. Bytes
// identical, on awkward slot lists (padding, cells seen by several cameras, cells seen by none,
// a camera's slots out of cell order, a cell twice on one camera, more slots than a chunk's pass
// holds) and at BEVFormer's shapes, with 1-3 threads, in f32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/ops.h"
#include "bevformer/error.h"
#include "core/half.h"
#include "kernel_test_util.h"
#include "precision_test_util.h"

namespace bev {
namespace {

using SpatialShapes = std::vector<std::pair<int64_t, int64_t>>;

using kernel_test::random_tensor;

Tensor index_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// The slot lists the rig's geometry makes: camera k sees a window of cells in increasing order
// (`cover` of the cells, neighbours overlapping), padded to max_len with -1.
std::vector<int64_t> rig_slots(int64_t cells, int64_t cams, int64_t max_len, double cover) {
  std::vector<int64_t> index(static_cast<size_t>(cams * max_len), -1);
  for (int64_t k = 0; k < cams; ++k) {
    const auto count = std::min<int64_t>(max_len, static_cast<int64_t>(cover * static_cast<double>(cells)));
    const int64_t first = k * cells / cams;
    std::vector<int64_t> seen;
    for (int64_t j = 0; j < count; ++j) seen.push_back((first + j) % cells);
    std::sort(seen.begin(), seen.end());
    std::copy(seen.begin(), seen.end(), index.begin() + k * max_len);
  }
  return index;
}

struct Case {
  std::string name;
  int64_t cells, c, heads, hd, points;
  SpatialShapes shapes;
  std::vector<int64_t> index;  // cams * max_len slots
  int64_t cams, r;             // reference [slots, 1, r, 2]
};

struct Result {
  Tensor fused, unfused;
};

Result run_both(const Case& k, int threads, Precision precision, uint32_t seed) {
  auto backend = make_cpu_backend(threads, precision);
  Ops ops(*backend);
  const bool bf16 = precision == Precision::kBF16;
  const DType compact = bf16 ? DType::kBF16 : DType::kF32;
  const auto levels = static_cast<int64_t>(k.shapes.size());
  const int64_t samples = k.heads * levels * k.points, slots = static_cast<int64_t>(k.index.size());
  int64_t lv = 0;
  MsdaAttrs ma;
  for (const auto& [h, w] : k.shapes) {
    ma.spatial_shapes.emplace_back(h, w);
    ma.level_start.push_back(lv);
    lv += h * w;
  }
  const Tensor wo = random_tensor({2 * samples, k.c}, seed, -0.4f, 0.4f), bo = random_tensor({2 * samples}, seed + 1, -3, 3);
  const Tensor wa = random_tensor({samples, k.c}, seed + 2, -0.3f, 0.3f), ba = random_tensor({samples}, seed + 3, -1, 1);
  const PreparedWeights offsets = ops.prepare_linear(wo, &bo, {});
  const PreparedWeights weights = ops.prepare_linear(wa, &ba, {});
  const Tensor query = backend->upload(random_tensor({k.cells, k.c}, seed + 4, -1, 1));
  Tensor host_value = random_tensor({k.cams, lv, k.heads, k.hd}, seed + 5, -2, 2);
  if (bf16) host_value = host_value.to(DType::kBF16);
  const Tensor value = backend->upload(host_value);
  const Tensor reference = backend->upload(random_tensor({slots, 1, k.r, 2}, seed + 6, 0, 1));
  const Tensor index = backend->upload(index_tensor(k.index));
  // 1 / max(count, 1) per cell, as the geometry gives it.
  Tensor inv = Tensor::empty({k.cells, 1}, DType::kF32);
  std::vector<int64_t> count(static_cast<size_t>(k.cells), 0);
  for (int64_t q : k.index)
    if (q >= 0) ++count[static_cast<size_t>(q)];
  for (int64_t q = 0; q < k.cells; ++q)
    inv.data<float>()[q] = 1.0f / static_cast<float>(std::max<int64_t>(count[static_cast<size_t>(q)], 1));
  const Tensor inv_count = backend->upload(inv);

  Result out;
  out.fused = backend->read(ops.spatial_cross_attention(query, index, reference, inv_count, value, offsets, weights, ma,
                                                        compact, "fused", compact));
  const Tensor rebatched = ops.gather_rows(query, index, "rebatch", compact);
  const Tensor sampled = ops.deformable_attention(rebatched, reference, value, offsets, weights, ma, false);
  out.unfused = backend->read(ops.scatter_mean_rows(sampled, index, inv_count, "mean", compact));
  return out;
}

void expect_same_bytes(const Result& r, const std::string& what) {
  ASSERT_EQ(r.fused.shape(), r.unfused.shape()) << what;
  ASSERT_EQ(r.fused.dtype(), r.unfused.dtype()) << what;
  const size_t size = dtype_size(r.fused.dtype());
  const auto* a = static_cast<const char*>(r.fused.raw_data());
  const auto* b = static_cast<const char*>(r.unfused.raw_data());
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < r.fused.numel(); ++i) {
    if (std::memcmp(a + i * size, b + i * size, size) != 0) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << r.fused.numel() << " values differ, first at " << first;
  // Not a test of zeros: the outputs carry values.
  const Tensor f = r.fused.to(DType::kF32);
  double sum = 0;
  for (int64_t i = 0; i < f.numel(); ++i) sum += std::abs(f.data<float>()[i]);
  EXPECT_GT(sum, 0.0) << what;
}

std::vector<Case> awkward_cases() {
  std::vector<Case> cases;
  cases.push_back({"1 cell, 1 camera, 1 slot", 1, 3, 1, 1, 4, {{6, 5}}, {0}, 1, 1});
  // Cells 0 and 3 seen by both cameras, 5 by none; camera 1's slots out of cell order, cell 2
  // twice on camera 0; padding in both.
  cases.push_back({"2 cameras, repeats, out of order, unseen cells", 7, 24, 3, 17, 4, {{13, 11}, {5, 4}},
                   {0, 2, 3, 2, -1, 6, -1, 3, 1, 0, 4, -1, -1, -1}, 2, 2});
  // Every cell seen by all six cameras: more slots in a chunk than one pass holds.
  std::vector<int64_t> all;
  for (int64_t k = 0; k < 6; ++k)
    for (int64_t q = 0; q < 100; ++q) all.push_back(q);
  cases.push_back({"6 cameras see every cell", 100, 32, 8, 32, 8, {{9, 14}, {5, 7}, {3, 4}}, all, 6, 4});
  cases.push_back({"a rig's windows, 4 levels", 1111, 40, 5, 8, 4, {{12, 20}, {6, 10}, {3, 5}, {2, 3}},
                   rig_slots(1111, 6, 300, 0.22), 6, 4});
  // No slot holds a cell: the mean is zero everywhere (and still written).
  cases.push_back({"all padding", 17, 16, 2, 8, 2, {{4, 4}}, std::vector<int64_t>(3 * 5, -1), 3, 1});
  return cases;
}

class SpatialCrossAttentionThreads : public ::testing::TestWithParam<int> {};

TEST_P(SpatialCrossAttentionThreads, AwkwardSlotsGiveTheBitsOfTheOpsOneByOne) {
  const int threads = GetParam();
  uint32_t seed = 500;
  for (const Case& k : awkward_cases()) {
    for (const Precision p : bev::precision_test::precisions_here({Precision::kF32, Precision::kBF16})) {
      const Result r = run_both(k, threads, p, seed++);
      if (k.name == "all padding") {
        ASSERT_EQ(r.fused.shape(), r.unfused.shape());
        EXPECT_EQ(std::memcmp(r.fused.raw_data(), r.unfused.raw_data(), r.fused.nbytes()), 0) << k.name;
        continue;
      }
      expect_same_bytes(r, k.name + ", " + precision_name(p) + ", " + std::to_string(threads) + " threads");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, SpatialCrossAttentionThreads, ::testing::Values(1, 2, 3));

// Tiny's and base's shapes (six cameras, base's four FPN levels of a 900x1600 image) with the
// rig's slot lists: tiny 2500 cells in 6 x 511 slots, base 40000 cells in 6 x 9514 (the bundled
// nuScenes frame's max_len; about 1.13 slots a cell).
TEST(SpatialCrossAttention, BevformerShapesGiveTheBitsOfTheOpsOneByOne) {
  const std::vector<Case> cases = {
      {"tiny SCA", 2500, 256, 8, 32, 8, {{15, 25}}, rig_slots(2500, 6, 511, 0.19), 6, 4},
      {"base SCA", 40000, 256, 8, 32, 8, {{116, 200}, {58, 100}, {29, 50}, {15, 25}}, rig_slots(40000, 6, 9514, 0.19), 6, 4},
  };
  uint32_t seed = 900;
  for (const Case& k : cases) {
    if (bev::precision_test::runs_here(Precision::kBF16)) expect_same_bytes(run_both(k, 2, Precision::kBF16, seed++), k.name + ", bf16");
    if (k.name == "tiny SCA") expect_same_bytes(run_both(k, 2, Precision::kF32, seed++), k.name + ", f32");
  }
}

TEST(SpatialCrossAttention, ShapeErrorsAreInvalidInput) {
  auto backend = make_cpu_backend(1, Precision::kF32);
  Ops ops(*backend);
  MsdaAttrs ma{{{4, 5}}, {0}};
  const PreparedWeights offsets = ops.prepare_linear(random_tensor({2 * 2 * 4, 8}, 1, -1, 1), nullptr, {});
  const PreparedWeights weights = ops.prepare_linear(random_tensor({2 * 4, 8}, 2, -1, 1), nullptr, {});
  const Tensor q = backend->upload(random_tensor({5, 8}, 4, -1, 1));
  const Tensor index = backend->upload(index_tensor({0, 1, 4, -1, 2, 3}));  // 2 cameras x 3
  const Tensor ref = backend->upload(random_tensor({6, 1, 2, 2}, 5, 0, 1));
  const Tensor inv = backend->upload(random_tensor({5, 1}, 6, 0.5f, 1));
  const Tensor v = backend->upload(random_tensor({2, 20, 2, 4}, 7, -1, 1));
  const auto kind_of = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;  // no error: fails the expectations below
  };
  const DType f32 = DType::kF32;
  EXPECT_NO_THROW(ops.spatial_cross_attention(q, index, ref, inv, v, offsets, weights, ma, f32));
  // Slots not a multiple of the cameras; a cell past the query's rows; below -1.
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index.slice(0, 0, 5), ref.slice(0, 0, 5), inv, v, offsets, weights, ma, f32); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] {
              ops.spatial_cross_attention(q, backend->upload(index_tensor({0, 1, 5, -1, 2, 3})), ref, inv, v, offsets, weights,
                                          ma, f32);
            }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] {
              ops.spatial_cross_attention(q, backend->upload(index_tensor({0, 1, -2, -1, 2, 3})), ref, inv, v, offsets,
                                          weights, ma, f32);
            }),
            ErrorKind::kInvalidInput);
  // A reference of other rows; R not dividing the points; inv_count of other cells.
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index, ref.slice(0, 0, 4), inv, v, offsets, weights, ma, f32); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] {
              ops.spatial_cross_attention(q, index, backend->upload(random_tensor({6, 1, 3, 2}, 8, 0, 1)), inv, v, offsets,
                                          weights, ma, f32);
            }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index, ref, inv.slice(0, 0, 4), v, offsets, weights, ma, f32); }),
            ErrorKind::kInvalidInput);
  // Offsets and weights swapped; bf16 rows or mean without bf16 arithmetic.
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index, ref, inv, v, weights, offsets, ma, f32); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index, ref, inv, v, offsets, weights, ma, DType::kBF16); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { ops.spatial_cross_attention(q, index, ref, inv, v, offsets, weights, ma, f32, "x", DType::kBF16); }),
            ErrorKind::kInvalidInput);
}

}  // namespace
}  // namespace bev
