#include <gtest/gtest.h>

#include "io/pth_reader.h"
#include "io/pth_writer.h"
#include "io/zip_reader.h"
#include "io_test_util.h"

namespace bev {
namespace {

using testing::sample_tensors;
using testing::same_bytes;
using testing::source_of;

TEST(Pth, RoundTripEveryDtypeWithMmcvMeta) {
  const auto tensors = sample_tensors();
  PthWriteOptions o;
  o.meta = {{"CLASSES", {"car", "truck"}}, {"mmcv_version", "1.4.0"}, {"config", "model = dict()"}, {"epoch", 24}};
  const Checkpoint ck = read_pth(source_of(encode_pth(tensors, o)));
  ASSERT_EQ(ck.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(ck.tensors()[i].first, tensors[i].first);
    EXPECT_TRUE(same_bytes(ck.tensors()[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(ck.meta.classes, (std::vector<std::string>{"car", "truck"}));
  EXPECT_EQ(ck.meta.mmcv_version, "1.4.0");
  EXPECT_EQ(ck.meta.config_text, "model = dict()");
  EXPECT_EQ(ck.meta.state_dict_key, "state_dict");
  EXPECT_EQ(ck.meta.raw["epoch"], 24);
}

TEST(Pth, PlainStateDictAndOtherPrefix) {
  PthWriteOptions o;
  o.mmcv_layout = false;
  o.prefix = "bevformer_tiny_epoch_24";
  o.align_data = false;  // data lands at odd offsets: the reader must copy, not misread
  const auto tensors = sample_tensors();
  const Checkpoint ck = read_pth(source_of(encode_pth(tensors, o)));
  EXPECT_EQ(ck.meta.state_dict_key, "");
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(same_bytes(ck.tensors()[i].second, tensors[i].second)) << tensors[i].first;
    if (ck.tensors()[i].second.numel() > 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(ck.tensors()[i].second.raw_data()) % dtype_size(tensors[i].second.dtype()), 0u);
    }
  }
}

TEST(Pth, AlignedEntriesAreZeroCopy) {
  auto src = source_of(encode_pth({{"w", testing::random_tensor({33}, DType::kF32, 9)}}));
  ZipReader zip(src);
  for (const auto& e : zip.entries()) {
    if (e.name.find("/data/") != std::string::npos) {
      EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    }
  }
  const Checkpoint ck = read_pth(src);
  const auto* p = static_cast<const uint8_t*>(ck.find("w")->raw_data());
  EXPECT_TRUE(p >= src->data() && p < src->data() + src->size());
}

TEST(Pth, LegacyFormatGetsAResaveHint) {
  std::vector<uint8_t> legacy = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
  try {
    read_pth(source_of(legacy, "old.pth"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("torch.save"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bev
