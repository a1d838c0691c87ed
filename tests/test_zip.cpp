// The ZIP layer on hand-made archives: ZIP64, comments, and the constructions it must refuse.
#include <gtest/gtest.h>

#include "io/pth_writer.h"
#include "io/zip_reader.h"
#include "io_test_util.h"

namespace bev {
namespace {

using testing::source_of;

std::vector<uint8_t> small_archive() {
  return encode_pth({{"a", testing::random_tensor({10}, DType::kF32, 1)},
                     {"b", testing::random_tensor({3}, DType::kI64, 2)}});
}

void put_le16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}
void put_le32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}
void append_le(std::vector<uint8_t>& b, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

size_t eocd_of(const std::vector<uint8_t>& b) { return b.size() - 22; }
size_t central_of(const std::vector<uint8_t>& b) { return read_le32(b.data() + eocd_of(b) + 16); }

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Zip, ReadsWhatTorchWrites) {
  ZipReader zip(source_of(small_archive()));
  ASSERT_NE(zip.find("archive/data.pkl"), nullptr);
  ASSERT_NE(zip.find("archive/data/1"), nullptr);
  EXPECT_EQ(zip.find("archive/data/1")->size, 24u);
  for (const auto& e : zip.entries()) EXPECT_NO_THROW(zip.verify_crc(e));
}

TEST(Zip, ArchiveCommentIsSkipped) {
  auto b = small_archive();
  put_le16(b, eocd_of(b) + 20, 5);
  b.insert(b.end(), {'h', 'e', 'l', 'l', 'o'});
  EXPECT_NO_THROW(ZipReader(source_of(b)));
}

TEST(Zip, Zip64DirectoryIsFollowed) {
  auto b = small_archive();
  const size_t eocd = eocd_of(b);
  const uint64_t count = read_le16(b.data() + eocd + 10);
  const uint64_t cd_size = read_le32(b.data() + eocd + 12);
  const uint64_t cd_off = read_le32(b.data() + eocd + 16);
  b.resize(eocd);
  const uint64_t z64 = b.size();
  append_le(b, 0x06064b50, 4);
  append_le(b, 44, 8);
  append_le(b, 45, 2);
  append_le(b, 45, 2);
  append_le(b, 0, 4);
  append_le(b, 0, 4);
  append_le(b, count, 8);
  append_le(b, count, 8);
  append_le(b, cd_size, 8);
  append_le(b, cd_off, 8);
  append_le(b, 0x07064b50, 4);
  append_le(b, 0, 4);
  append_le(b, z64, 8);
  append_le(b, 1, 4);
  append_le(b, 0x06054b50, 4);
  append_le(b, 0, 4);
  append_le(b, 0xffff, 2);
  append_le(b, 0xffff, 2);
  append_le(b, 0xffffffff, 4);
  append_le(b, 0xffffffff, 4);
  append_le(b, 0, 2);
  ZipReader zip(source_of(b));
  EXPECT_EQ(zip.entries().size(), count);
}

TEST(Zip, RefusesCompressedEntries) {
  auto b = small_archive();
  put_le16(b, central_of(b) + 10, 8);  // deflate
  const std::string msg = error_of([&] { ZipReader z(source_of(b)); });
  EXPECT_NE(msg.find("compressed"), std::string::npos) << msg;
}

TEST(Zip, RefusesOverlappingEntries) {
  // Point the second entry's central record at the first entry's local header: the bytes of one
  // entry would then be counted twice (a zip-bomb construction).
  auto b = small_archive();
  ZipReader ok(source_of(b));
  size_t p = central_of(b);
  const uint32_t first_header = read_le32(b.data() + p + 42);
  p += 46 + read_le16(b.data() + p + 28) + read_le16(b.data() + p + 30) + read_le16(b.data() + p + 32);
  put_le32(b, p + 42, first_header);
  const std::string msg = error_of([&] { ZipReader z(source_of(b)); });
  EXPECT_FALSE(msg.empty());
}

TEST(Zip, RefusesDirectoryThatClaimsTooManyEntries) {
  auto b = small_archive();
  put_le16(b, eocd_of(b) + 10, 0xfffe);
  const std::string msg = error_of([&] { ZipReader z(source_of(b)); });
  EXPECT_NE(msg.find("cannot fit"), std::string::npos) << msg;
}

TEST(Zip, RefusesEntryLargerThanTheFile) {
  auto b = small_archive();
  const size_t p = central_of(b);
  put_le32(b, p + 20, 0x7fffffff);
  put_le32(b, p + 24, 0x7fffffff);
  const std::string msg = error_of([&] { ZipReader z(source_of(b)); });
  EXPECT_NE(msg.find("claims"), std::string::npos) << msg;
}

TEST(Zip, CrcCatchesFlippedDataBit) {
  auto b = small_archive();
  ZipReader clean(source_of(b));
  const ZipEntry* e = clean.find("archive/data/0");
  b[e->data_offset + 5] ^= 0x10;
  ZipReader zip(source_of(b));
  const std::string msg = error_of([&] { zip.verify_crc(*zip.find("archive/data/0")); });
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
}

}  // namespace
}  // namespace bev
