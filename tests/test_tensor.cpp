#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/compare.h"
#include "core/tensor.h"

namespace bev {
namespace {

Tensor iota(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i) * 0.5f - 3.0f;
  return t;
}

TEST(Tensor, ContiguousBasics) {
  Tensor t = iota({2, 3, 5});
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 120u);
  EXPECT_EQ(t.strides(), (Shape{15, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  EXPECT_EQ(t.describe(), "f32[2, 3, 5]");
  EXPECT_THROW(t.data<int64_t>(), Error);
}

TEST(Tensor, PermuteSliceSelectMatchIndexMath) {
  Tensor t = iota({3, 4, 7});
  Tensor p = t.permute({2, 0, 1});  // [7, 3, 4]
  EXPECT_FALSE(p.is_contiguous());
  Tensor c = p.contiguous();
  ASSERT_EQ(c.shape(), (Shape{7, 3, 4}));
  for (int a = 0; a < 7; ++a)
    for (int b = 0; b < 3; ++b)
      for (int d = 0; d < 4; ++d)
        ASSERT_EQ(c.data<float>()[(a * 3 + b) * 4 + d], t.data<float>()[(b * 4 + d) * 7 + a]);
  Tensor s = t.slice(2, 2, 5).contiguous();  // [3, 4, 3]
  for (int b = 0; b < 3; ++b)
    for (int d = 0; d < 4; ++d)
      for (int e = 0; e < 3; ++e)
        ASSERT_EQ(s.data<float>()[(b * 4 + d) * 3 + e], t.data<float>()[(b * 4 + d) * 7 + e + 2]);
  Tensor sel = t.select(1, 3);
  EXPECT_EQ(sel.shape(), (Shape{3, 7}));
  EXPECT_EQ(sel.contiguous().data<float>()[7 + 1], t.data<float>()[(1 * 4 + 3) * 7 + 1]);
  EXPECT_THROW(t.slice(0, 2, 4), Error);
  EXPECT_THROW(t.permute({0, 0, 1}), Error);
}

TEST(Tensor, ReshapeInfersAndChecks) {
  Tensor t = iota({6, 10});
  EXPECT_EQ(t.reshape({3, -1, 5}).shape(), (Shape{3, 4, 5}));
  EXPECT_THROW(t.reshape({7, -1}), Error);
  EXPECT_THROW(t.permute({1, 0}).reshape({60}), Error);
}

TEST(Tensor, ViewOfRejectsOutOfBoundsAndOverflow) {
  auto st = Storage::allocate(40);  // 10 floats
  EXPECT_NO_THROW(Tensor::view_of(st, DType::kF32, {2, 5}, {5, 1}, 0));
  EXPECT_NO_THROW(Tensor::view_of(st, DType::kF32, {5, 2}, {1, 5}, 0));  // transposed view
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {2, 5}, {5, 1}, 1), Error);
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {3, 4}, {4, 1}, 0), Error);
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {2}, {1LL << 62}, 0), Error);
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {-1}, {1}, 0), Error);
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {2}, {-1}, 1), Error);
  EXPECT_NO_THROW(Tensor::view_of(st, DType::kF32, {0, 1000}, {1000, 1}, 10));  // empty views address nothing
  EXPECT_THROW(Tensor::view_of(st, DType::kF32, {1LL << 40, 1LL << 40}, {1, 1}, 0), Error);
}

TEST(Tensor, DtypeConversions) {
  Tensor t = iota({3, 3});
  Tensor h = t.to(DType::kF16), b = t.to(DType::kBF16), d = t.to(DType::kF64), i = t.to(DType::kI32);
  for (int k = 0; k < 9; ++k) {
    EXPECT_EQ(h.to(DType::kF32).data<float>()[k], t.data<float>()[k]);  // halves are exact here
    EXPECT_EQ(b.to(DType::kF32).data<float>()[k], t.data<float>()[k]);
    EXPECT_EQ(d.data<double>()[k], t.data<float>()[k]);
    EXPECT_EQ(i.data<int32_t>()[k], static_cast<int32_t>(t.data<float>()[k]));
  }
  Tensor l = Tensor::empty({2}, DType::kI64);
  l.data<int64_t>()[0] = (1LL << 40) + 1;
  l.data<int64_t>()[1] = -7;
  EXPECT_EQ(l.to(DType::kF64).data<double>()[0], static_cast<double>((1LL << 40) + 1));
  EXPECT_EQ(l.to(DType::kI32).data<int32_t>()[1], -7);
  // A strided source converts element by element in logical order.
  Tensor tp = t.permute({1, 0}).to(DType::kF64);
  EXPECT_EQ(tp.data<double>()[1], t.data<float>()[3]);
}

TEST(Tensor, BorrowedStorageKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  Tensor t;
  {
    auto st = Storage::borrow(owner->data(), 16, owner);
    t = Tensor::view_of(st, DType::kF32, {2, 2}, {2, 1}, 0);
  }
  std::weak_ptr<std::vector<float>> w = owner;
  owner.reset();
  ASSERT_FALSE(w.expired());
  EXPECT_EQ(t.data<float>()[3], 4.0f);
  t = Tensor();
  EXPECT_TRUE(w.expired());
}

TEST(SmallVector, BehavesLikeAVectorInlineAndSpilled) {
  Shape s = {1, 2, 3};
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.back(), 3);
  s.push_back(4);
  s.insert(s.begin(), 0);
  s.insert(s.end(), {5, 6});
  EXPECT_EQ(s, (Shape{0, 1, 2, 3, 4, 5, 6}));
  s.erase(s.begin() + 1);
  EXPECT_EQ(s, (Shape{0, 2, 3, 4, 5, 6}));
  // Past the inline capacity (8) it moves to the heap and keeps working.
  for (int64_t v = 7; v < 40; ++v) s.push_back(v);
  EXPECT_EQ(s.size(), 39u);
  EXPECT_EQ(s[5], 6);
  EXPECT_EQ(s.back(), 39);
  s.push_back(s[0]);  // an element of the vector itself, across a growth
  EXPECT_EQ(s.back(), 0);
  Shape copy = s;
  EXPECT_EQ(copy, s);
  Shape moved = std::move(copy);
  EXPECT_EQ(moved, s);
  moved = Shape{9};
  EXPECT_EQ(moved, Shape{9});
  s.insert(s.begin() + 1, s.begin(), s.begin() + 2);  // a range of the vector itself
  EXPECT_EQ(s[1], 0);
  EXPECT_EQ(s[2], 2);
  EXPECT_EQ(s[3], 2);
  s.resize(2);
  EXPECT_EQ(s, (Shape{0, 0}));
  s.resize(4, 7);
  EXPECT_EQ(s, (Shape{0, 0, 7, 7}));
  EXPECT_LT((Shape{1, 2}), (Shape{1, 3}));
  EXPECT_NE((Shape{1, 2}), (Shape{1, 2, 0}));
}

TEST(SmallVector, ConvertsToAndFromStdVector) {
  const std::vector<int64_t> v = {4, 5, 6};
  const Shape s = v;
  EXPECT_EQ(s, (Shape{4, 5, 6}));
  EXPECT_TRUE(s == v);
  const std::vector<int64_t> back = s;
  EXPECT_EQ(back, v);
  EXPECT_EQ(Shape(v.begin(), v.end()), s);
  EXPECT_EQ(Shape(3, 1), (Shape{1, 1, 1}));
  EXPECT_EQ(Shape(2), (Shape{0, 0}));
}

TEST(Compare, RelativeL2AndMaxAbs) {
  Tensor want = Tensor::from_floats({2, 2}, std::vector<float>{3, 0, 0, 4});  // norm 5
  Tensor got = Tensor::from_floats({2, 2}, std::vector<float>{3, 0.3f, 0, 3.6f});
  const TensorDiff d = compare(got, want);
  EXPECT_NEAR(d.relative_l2, 0.1, 1e-7);  // sqrt(0.09 + 0.16) / 5
  EXPECT_NEAR(d.max_abs, 0.4, 1e-6);
  EXPECT_EQ(compare(want.permute({1, 0}), want.permute({1, 0}).contiguous()).max_abs, 0.0);
  EXPECT_THROW(compare(got, want.reshape({4})), Error);
}

}  // namespace
}  // namespace bev
