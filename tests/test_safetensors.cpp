#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace bev {
namespace {

using testing::sample_tensors;
using testing::same_bytes;
using testing::source_of;

TEST(Safetensors, RoundTripEveryDtypeAligned) {
  const auto tensors = sample_tensors();
  auto bytes = encode_safetensors(tensors, {{"format", "pt"}});
  EXPECT_EQ(read_le64(bytes.data()) % 8, 0u);  // header padded: data aligned for every dtype
  const Checkpoint ck = read_safetensors(source_of(bytes));
  ASSERT_EQ(ck.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(ck.tensors()[i].first, tensors[i].first);  // file order is kept
    EXPECT_TRUE(same_bytes(ck.tensors()[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(ck.meta.raw["format"], "pt");
  EXPECT_EQ(ck.format, CheckpointFormat::kSafetensors);
}

TEST(Safetensors, ZeroCopyPointsIntoTheSource) {
  auto bytes = encode_safetensors({{"w", testing::random_tensor({64}, DType::kF32, 3)}});
  auto src = source_of(bytes);
  const Checkpoint ck = read_safetensors(src);
  const uint8_t* p = static_cast<const uint8_t*>(ck.find("w")->raw_data());
  EXPECT_GE(p, src->data());
  EXPECT_LT(p, src->data() + src->size());
}

TEST(Safetensors, StridedTensorsAreWrittenContiguous) {
  Tensor t = testing::random_tensor({3, 4}, DType::kF32, 5);
  const Checkpoint ck = read_safetensors(source_of(encode_safetensors({{"t", t.permute({1, 0})}})));
  EXPECT_TRUE(same_bytes(*ck.find("t"), t.permute({1, 0}).contiguous()));
}

TEST(Safetensors, MisalignedDataIsCopiedNotMisread) {
  // A writer that did not pad its header: the F32 tensor starts at an odd address.
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  std::vector<uint8_t> bytes(8);
  const uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(len >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.push_back(7);
  const float vals[2] = {1.5f, -2.25f};
  const auto* vb = reinterpret_cast<const uint8_t*>(vals);
  bytes.insert(bytes.end(), vb, vb + 8);
  const Checkpoint ck = read_safetensors(source_of(bytes));
  EXPECT_EQ(ck.find("b")->data<float>()[1], -2.25f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ck.find("b")->raw_data()) % 4, 0u);
}

}  // namespace
}  // namespace bev
