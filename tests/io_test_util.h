// Helpers for reader tests: random tensors of every dtype, in-memory sources, temp directories.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

#include "core/tensor.h"
#include "io/byte_source.h"

namespace bev::testing {

inline Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  if (dtype == DType::kF32) {
    std::normal_distribution<float> d;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  } else if (dtype == DType::kBool) {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() & 1);
  } else {
    for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  }
  return t;
}

// A few tensors of awkward shapes covering every dtype, including a 0-dim and an empty one.
inline std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> v;
  uint32_t seed = 1;
  v.emplace_back("img_backbone.conv1.weight", random_tensor({3, 5, 7, 1}, DType::kF32, seed++));
  v.emplace_back("img_backbone.bn1.num_batches_tracked", random_tensor({}, DType::kI64, seed++));
  v.emplace_back("half", random_tensor({13}, DType::kF16, seed++));
  v.emplace_back("brain", random_tensor({2, 3}, DType::kBF16, seed++));
  v.emplace_back("double", random_tensor({1, 1, 3}, DType::kF64, seed++));
  v.emplace_back("i32", random_tensor({5}, DType::kI32, seed++));
  v.emplace_back("i16", random_tensor({3}, DType::kI16, seed++));
  v.emplace_back("i8", random_tensor({9}, DType::kI8, seed++));
  v.emplace_back("u8", random_tensor({4, 4}, DType::kU8, seed++));
  v.emplace_back("flags", random_tensor({6}, DType::kBool, seed++));
  v.emplace_back("empty", random_tensor({0, 4}, DType::kF32, seed++));
  return v;
}

inline std::shared_ptr<const ByteSource> source_of(std::vector<uint8_t> bytes, std::string name = "mem") {
  return ByteSource::from_bytes(std::move(bytes), std::move(name));
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// A fresh directory under the system's temp directory, named after the running test (and the
// process and a counter, so parallel tests never share one), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("bev_test_" + std::string(info ? info->name() : "x") + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace bev::testing
