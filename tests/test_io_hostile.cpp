// Hostile inputs to the readers of src/io (issue 25): special files and unbounded sizes behind a
// path, checkpoints a torch user can really write that the reader got wrong, a 4 KiB pickle that
// renders to gigabytes, and images whose structure is whole but whose compressed data is not.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>

#include <gtest/gtest.h>

#include "bevformer/error.h"
#include "io/byte_source.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/pickle.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"
#include "io_test_util.h"
#include "pickle_builder.h"

namespace bev {
namespace {

using pickle::Pk;

ErrorKind kind_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error";
  return ErrorKind::kInternal;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("bev_io_hostile_" + std::to_string(getpid()) + "_" + name)).string();
}

// #13: a FIFO, a directory or a device behind a path is refused at once; sizes are bounded.
TEST(IoHostile, OnlyRegularFilesOfBoundedSizeAreRead) {
  const std::string fifo = temp_path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Run apart: a reader that waits for a writer would hang the suite instead of failing it.
  auto opened = std::async(std::launch::async, [&] { return kind_of([&] { ByteSource::map_file(fifo); }); });
  ASSERT_EQ(opened.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "open() waited on a FIFO";
  EXPECT_EQ(opened.get(), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { load_checkpoint(fifo); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { read_image(fifo); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([&] { read_regular_file(fifo, 1 << 20, "config"); }), ErrorKind::kInvalidInput);
  std::remove(fifo.c_str());
  EXPECT_EQ(kind_of([] { read_regular_file("/dev/zero", 1 << 20, "frame file"); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([] { read_regular_file(std::filesystem::temp_directory_path().string(), 1 << 20, "frame file"); }),
            ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([] { read_regular_file("/no/such/file.json", 1 << 20, "frame file"); }), ErrorKind::kNotFound);
  const std::string big = temp_path("big");
  {
    std::FILE* f = std::fopen(big.c_str(), "wb");
    ASSERT_TRUE(f);
    std::fputs("0123456789", f);
    std::fclose(f);
  }
  EXPECT_EQ(read_regular_file(big, 10, "file"), "0123456789");
  try {
    read_regular_file(big, 9, "file");
    ADD_FAILURE() << "a 10-byte file passed a 9-byte bound";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 9 bytes"), std::string::npos) << e.what();
  }
  std::remove(big.c_str());
}

// #7: a safetensors header of 128 + 256k bytes starts with 0x80, the pickle protocol's byte.
TEST(IoHostile, SafetensorsWhoseFirstByteIs0x80Loads) {
  std::vector<std::pair<std::string, Tensor>> tensors = {{"w", testing::random_tensor({4}, DType::kF32, 7)}};
  std::vector<uint8_t> bytes = encode_safetensors(tensors);
  size_t header = read_le64(bytes.data());
  // Pad the JSON header with spaces (allowed) until its length is 0x80 mod 0x100.
  const size_t pad = (0x180 - header % 0x100) % 0x100;
  bytes.insert(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header), pad, ' ');
  header += pad;
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(header >> (8 * i));
  ASSERT_EQ(bytes[0], 0x80);
  const Checkpoint ck = load_checkpoint(testing::source_of(bytes, "padded.safetensors"));
  EXPECT_EQ(ck.format, CheckpointFormat::kSafetensors);
  ASSERT_NE(ck.find("w"), nullptr);
  EXPECT_TRUE(testing::same_bytes(*ck.find("w"), tensors[0].second));
}

// The data.pkl of torch.save({'meta': <meta>, 'state_dict': {'w': tensor(16 floats), 'x': 5}}).
std::vector<uint8_t> pth_with_meta(const std::function<void(Pk&)>& meta) {
  Pk p;
  p.proto().op('}').mark().str("meta");
  meta(p);
  p.str("state_dict").op('}').mark().str("w").tensor("0", {16}, {1}).str("x").int1(5).op('u').op('u').stop();
  return encode_stored_zip({{"archive/data.pkl", p.bytes}, {"archive/data/0", std::vector<uint8_t>(256, 0)}});
}

// #12: a `meta` that is not a dict, beside a state_dict entry that is not a tensor, loads.
TEST(IoHostile, CheckpointWithAStringMetaLoads) {
  const Checkpoint ck = load_checkpoint(testing::source_of(pth_with_meta([](Pk& p) { p.str("hello"); }), "meta.pth"));
  EXPECT_EQ(ck.meta.raw, "hello");
  EXPECT_EQ(ck.meta.skipped_entries, std::vector<std::string>{"x"});
  ASSERT_NE(ck.find("w"), nullptr);
}

// #18: a 4 KiB "billion laughs" meta (each level a list of ten references to the one below,
// under a 1 KiB string) renders to a bounded JSON.
TEST(IoHostile, BillionLaughsMetaRendersBounded) {
  auto laughs = [](Pk& p) {
    p.str(std::string(1024, 'a')).put(0).op('0');  // memoized, then popped
    for (uint8_t level = 1; level <= 9; ++level) {
      p.op(']').mark();
      for (int i = 0; i < 10; ++i) p.get(static_cast<uint8_t>(level - 1));
      p.op('e').put(level);
      if (level < 9) p.op('0');
    }
  };
  const std::vector<uint8_t> bytes = pth_with_meta(laughs);
  ASSERT_LT(bytes.size(), 4096u);
  const Checkpoint ck = load_checkpoint(testing::source_of(bytes, "laughs.pth"));
  const std::string text = ck.meta.raw.dump();
  EXPECT_LT(text.size(), 8u << 20) << "10^9 KiB of strings rendered as " << text.size() << " bytes";
  EXPECT_NE(text.find("<truncated>"), std::string::npos);
}

// #18: messages say what they mean: no wrapped sizes, no "a object".
TEST(IoHostile, MessagesDoNotWrapOrMisspeak) {
  const std::string header = R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})";
  std::vector<uint8_t> st(8 + header.size() + 8, 0);
  for (size_t i = 0; i < 8; ++i) st[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  std::memcpy(st.data() + 8, header.data(), header.size());
  try {
    read_safetensors(testing::source_of(st));
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs more than 2^64 bytes"), std::string::npos) << e.what();
  }
  Pk p;
  p.proto().global("foo", "Bar").op(')').reduce().stop();
  const std::vector<uint8_t> pth = encode_stored_zip({{"archive/data.pkl", p.bytes}});
  try {
    load_checkpoint(testing::source_of(pth, "obj.pth"));
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the pickled object is an object"), std::string::npos) << e.what();
  }
}

std::vector<uint8_t> textured_jpeg(int w, int h) {
  Tensor t = Tensor::empty({h, w, 3}, DType::kU8);
  auto* px = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) px[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  return encode_image(t, ".jpg");
}

std::vector<uint8_t> be32(uint32_t v) {
  return {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)};
}

void add_chunk(std::vector<uint8_t>& png, const char* type, const std::vector<uint8_t>& data) {
  const auto len = be32(static_cast<uint32_t>(data.size()));
  png.insert(png.end(), len.begin(), len.end());
  std::vector<uint8_t> body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  png.insert(png.end(), body.begin(), body.end());
  const auto crc = be32(static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))));
  png.insert(png.end(), crc.begin(), crc.end());
}

// An Adam7-interlaced RGB PNG of w x h whose filtered data is `rows` (built here: OpenCV writes
// no interlaced PNGs), with `extra` bytes of filtered data appended or `cut` removed.
std::vector<uint8_t> interlaced_png(uint32_t w, uint32_t h, int extra, size_t cut) {
  static constexpr int kPass[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
  std::vector<uint8_t> raw;
  for (const auto& p : kPass) {
    const uint32_t pw = w > uint32_t(p[0]) ? (w - p[0] + p[2] - 1) / p[2] : 0;
    const uint32_t ph = h > uint32_t(p[1]) ? (h - p[1] + p[3] - 1) / p[3] : 0;
    if (pw == 0) continue;
    for (uint32_t r = 0; r < ph; ++r) {
      raw.push_back(0);  // filter: none
      for (uint32_t b = 0; b < 3 * pw; ++b) raw.push_back(static_cast<uint8_t>(r * 31 + b));
    }
  }
  raw.insert(raw.end(), static_cast<size_t>(extra), 0);
  raw.resize(raw.size() - cut);
  std::vector<uint8_t> z(compressBound(static_cast<uLong>(raw.size())));
  uLongf zn = static_cast<uLongf>(z.size());
  compress2(z.data(), &zn, raw.data(), static_cast<uLong>(raw.size()), 6);
  z.resize(zn);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr = be32(w);
  const auto hh = be32(h);
  ihdr.insert(ihdr.end(), hh.begin(), hh.end());
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 1});
  add_chunk(png, "IHDR", ihdr);
  add_chunk(png, "IDAT", z);
  add_chunk(png, "IEND", {});
  return png;
}

// #11: a JPEG cut mid-scan and closed with EOI is an error, not an image half grey.
TEST(IoHostile, TruncatedOrCorruptImageDataIsRefused) {
  const std::vector<uint8_t> jpg = textured_jpeg(160, 120);
  EXPECT_NO_THROW(decode_image(jpg, "whole.jpg"));
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<std::ptrdiff_t>(jpg.size() / 2));
  cut.insert(cut.end(), {0xFF, 0xD9});
  const ImageHeader h = inspect_image(cut, "cut.jpg");  // the structure alone looks whole
  EXPECT_EQ(h.width, 160);
  try {
    decode_image(cut, "cut.jpg");
    ADD_FAILURE() << "a JPEG without half its scan decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("cut.jpg"), std::string::npos) << e.what();
  }
  // PNG: interlaced data of exactly the right size decodes; one byte short or long does not.
  const std::vector<uint8_t> good = interlaced_png(13, 11, 0, 0);
  const Tensor img = decode_image(good, "adam7.png");
  EXPECT_EQ(img.size(0), 11);
  EXPECT_EQ(img.size(1), 13);
  EXPECT_EQ(kind_of([] { decode_image(interlaced_png(13, 11, 0, 1), "short.png"); }), ErrorKind::kInvalidInput);
  EXPECT_EQ(kind_of([] { decode_image(interlaced_png(13, 11, 1, 0), "long.png"); }), ErrorKind::kInvalidInput);
  std::vector<uint8_t> bad_crc = good;
  bad_crc[40] ^= 1;  // inside IDAT, CRC not updated
  EXPECT_EQ(kind_of([&] { decode_image(bad_crc, "crc.png"); }), ErrorKind::kInvalidInput);
}

}  // namespace
}  // namespace bev
