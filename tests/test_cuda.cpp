// Device-memory round trips; skipped on machines without a CUDA device (CI has none).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda/device_memory.h"

namespace bev {
namespace {

TEST(CudaMemory, RoundTripIsExact) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  Tensor h = Tensor::empty({3, 17, 5}, DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = d(rng);
  const Tensor dev = cuda::to_device(h.permute({2, 0, 1}));  // strided source: copied contiguous
  EXPECT_EQ(dev.device(), Device::kCuda);
  const Tensor back = cuda::to_host(dev);
  const Tensor expect = h.permute({2, 0, 1}).contiguous();
  ASSERT_EQ(back.shape(), expect.shape());
  EXPECT_EQ(std::memcmp(back.raw_data(), expect.raw_data(), expect.nbytes()), 0);
}

TEST(CudaMemory, ConversionsMatchTheHost) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  Tensor h = Tensor::empty({100003}, DType::kF32);
  for (int64_t i = 0; i < h.numel(); ++i) {
    uint32_t u = bits(rng);
    if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu;  // finite values; NaN payloads differ by design
    std::memcpy(h.data<float>() + i, &u, 4);
  }
  const Tensor dev = cuda::to_device(h);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Tensor got = cuda::to_host(cuda::convert(dev, t));
    const Tensor want = h.to(t);
    ASSERT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << dtype_name(t);
    const Tensor back = cuda::to_host(cuda::convert(cuda::to_device(want), DType::kF32));
    const Tensor want_back = want.to(DType::kF32);
    ASSERT_EQ(std::memcmp(back.raw_data(), want_back.raw_data(), want_back.nbytes()), 0) << dtype_name(t);
  }
}

}  // namespace
}  // namespace bev
