#include <gtest/gtest.h>

#include "bevformer/error.h"

namespace bev {
namespace {

TEST(Error, MessageSaysWhatWhereAndExpected) {
  Error e(ErrorKind::kInvalidInput, "storage '3' claims 10 elements");
  e.where("model.pth: archive/data/3").at_offset(4096).expected("2 elements at most").hint("re-download it");
  EXPECT_STREQ(e.what(),
               "model.pth: archive/data/3 (byte 4096): storage '3' claims 10 elements; expected 2 elements at "
               "most. Hint: re-download it");
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
  EXPECT_EQ(*e.offset(), 4096u);
  Error bare(ErrorKind::kNotFound, "no such preset 'huge'");
  EXPECT_STREQ(bare.what(), "no such preset 'huge'");
  EXPECT_STREQ(error_kind_name(ErrorKind::kUnsupported), "unsupported");
}

TEST(Error, ThrownBuilderKeepsFields) {
  try {
    throw Error(ErrorKind::kUnsupported, "compressed entry").where("f.pth").expected("stored entries");
  } catch (const Error& e) {
    EXPECT_EQ(e.place(), "f.pth");
    EXPECT_EQ(e.expectation(), "stored entries");
    return;
  }
  FAIL();
}

}  // namespace
}  // namespace bev
