// The golden set's official-format checkpoint: .pth and safetensors hold identical tensors, and
// both validate against the set's config.
#include <gtest/gtest.h>

#include <cstring>

#include "bevformer/checkpoint.h"
#include "io/checkpoint.h"

namespace bev {
namespace {

const std::string kMicro = std::string(BEV_SHARED_DIR) + "/golden/micro";

TEST(GoldenCheckpoint, PthAndSafetensorsAreByteIdentical) {
  const Checkpoint pth = load_checkpoint(kMicro + "/checkpoint.pth");
  const Checkpoint st = load_checkpoint(kMicro + "/weights.safetensors");
  EXPECT_EQ(pth.format, CheckpointFormat::kPyTorch);
  EXPECT_EQ(st.format, CheckpointFormat::kSafetensors);
  ASSERT_EQ(pth.size(), 493u);
  ASSERT_EQ(st.size(), 493u);
  for (const auto& [name, t] : pth.tensors()) {
    const Tensor* other = st.find(name);
    ASSERT_NE(other, nullptr) << name;
    ASSERT_EQ(t.dtype(), other->dtype()) << name;
    ASSERT_EQ(t.shape(), other->shape()) << name;
    const Tensor a = t.contiguous(), b = other->contiguous();
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << name;
  }
  EXPECT_EQ(pth.find("img_backbone.bn1.num_batches_tracked")->dtype(), DType::kI64);
  EXPECT_EQ(pth.find("img_backbone.bn1.num_batches_tracked")->dim(), 0);
}

TEST(GoldenCheckpoint, MmcvMetaIsRead) {
  const Checkpoint pth = load_checkpoint(kMicro + "/checkpoint.pth");
  EXPECT_EQ(pth.meta.mmcv_version, "1.4.0");
  ASSERT_EQ(pth.meta.classes.size(), 10u);
  EXPECT_EQ(pth.meta.classes.front(), "car");
  EXPECT_EQ(pth.meta.classes.back(), "traffic_cone");
  EXPECT_NE(pth.meta.config_text.find("BEVFormerHead"), std::string::npos);
  EXPECT_EQ(pth.meta.state_dict_key, "state_dict");
  EXPECT_EQ(pth.meta.raw["hook_msgs"]["last_ckpt"], "work_dirs/bevformer_oracle_micro/epoch_24.pth");
}

TEST(GoldenCheckpoint, ValidatesAgainstItsConfig) {
  InspectOptions o;
  o.config = kMicro + "/config.json";
  const CheckpointReport r = inspect_checkpoint(kMicro + "/checkpoint.pth", o);
  ASSERT_TRUE(r.has_config_check);
  EXPECT_TRUE(r.config_check.ok) << r.config_check.report;
  EXPECT_EQ(r.config_check.matched, 493u);
  EXPECT_EQ(r.elements, 239451);  // the set's README: 239,451 values
  // The micro checkpoint is not a tiny model: validating against the preset reports everything.
  o.config = "tiny";
  const CheckpointReport t = inspect_checkpoint(kMicro + "/weights.safetensors", o);
  EXPECT_FALSE(t.config_check.ok);
  EXPECT_FALSE(t.config_check.missing.empty());
  EXPECT_FALSE(t.config_check.unexpected.empty());
  EXPECT_FALSE(t.config_check.mismatched.empty());
}

}  // namespace
}  // namespace bev
