// Malformed checkpoints: truncated, bit-flipped, lying lengths, oversized headers, wrong dtypes,
// zip-bomb constructions. Every case must end in a bev::Error with a message, never a crash, a
// hang, an out-of-bounds read (this suite also runs under ASan+UBSan) or silently wrong tensors.
#include <gtest/gtest.h>

#include "io/checkpoint.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"
#include "io/zip_reader.h"
#include "io_test_util.h"

#include <algorithm>

namespace bev {
namespace {

using testing::sample_tensors;
using testing::same_bytes;
using testing::source_of;

// Loads `bytes`; returns the error text, or "" when it loaded.
std::string try_load(const std::vector<uint8_t>& bytes, Checkpoint* out = nullptr) {
  try {
    Checkpoint ck = load_checkpoint(source_of(bytes, "hostile"));
    if (out) *out = std::move(ck);
    return "";
  } catch (const Error& e) {
    EXPECT_GT(std::string(e.what()).size(), 10u);
    return e.what();
  }
}

bool same_checkpoint(const Checkpoint& a, const std::vector<std::pair<std::string, Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < b.size(); ++i) {
    if (a.tensors()[i].first != b[i].first || !same_bytes(a.tensors()[i].second, b[i].second)) return false;
  }
  return true;
}

TEST(Hostile, TruncatedPthAtEveryLengthFails) {
  const auto bytes = encode_pth(sample_tensors());
  for (size_t n = 0; n < bytes.size(); n += (n < 200 || n + 200 > bytes.size()) ? 1 : 7) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_FALSE(try_load(cut).empty()) << "a " << n << "-byte prefix loaded";
  }
}

TEST(Hostile, TruncatedSafetensorsAtEveryLengthFails) {
  const auto bytes = encode_safetensors(sample_tensors());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    ASSERT_FALSE(try_load(cut).empty()) << "a " << n << "-byte prefix loaded";
  }
}

TEST(Hostile, EveryBitFlipInPthFailsOrChangesNothing) {
  // CRC-32 covers the pickle and the storages; flips elsewhere (padding, unused header fields)
  // must either fail cleanly or leave the tensors exactly as written.
  const auto tensors = std::vector<std::pair<std::string, Tensor>>{
      {"w", testing::random_tensor({7}, DType::kF32, 3)}, {"n", testing::random_tensor({}, DType::kI64, 4)}};
  const auto bytes = encode_pth(tensors);
  int loaded = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 5}) {
      auto flipped = bytes;
      flipped[i] ^= static_cast<uint8_t>(1u << bit);
      Checkpoint ck;
      if (try_load(flipped, &ck).empty()) {
        ++loaded;
        ASSERT_TRUE(same_checkpoint(ck, tensors)) << "flip of bit " << bit << " at byte " << i << " changed tensors";
      }
    }
  }
  EXPECT_LT(loaded, static_cast<int>(bytes.size()));  // most flips are detected
}

TEST(Hostile, BitFlipsInSafetensorsHeaderNeverCrash) {
  const auto bytes = encode_safetensors(sample_tensors());
  const size_t header_end = 8 + read_le64(bytes.data());
  int failed = 0;
  for (size_t i = 0; i < header_end; ++i) {
    auto flipped = bytes;
    flipped[i] ^= 0x04;
    Checkpoint ck;
    if (!try_load(flipped, &ck).empty()) {
      ++failed;
    } else {
      EXPECT_EQ(ck.tensor_bytes(), bytes.size() - header_end);  // the data still tiles exactly
    }
  }
  EXPECT_GT(failed, 0);
}

std::vector<uint8_t> safetensors_with_header(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0x42);
  for (size_t i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  return b;
}

TEST(Hostile, SafetensorsLiesAreNamed) {
  struct Case {
    const char* header;
    size_t data;
    const char* expect;
  } cases[] = {
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "outside"},          // lying length
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16, "needs 12 bytes"},  // shape vs bytes
      {R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4, "not supported"},  // wrong dtype
      {R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16, "non-negative"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16, "gap"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 16, "belong to none"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,16]}})", 16, "overflows"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"extra":1}})", 16, "exactly"},
      {R"({"__metadata__":{"k":5}})", 0, "not a string"},
      {R"([1,2,3])", 0, "not a JSON object"},
      {R"({"a":)", 0, "not valid JSON"},
      {R"({"a":887e888888885555555555})", 0, "cannot be read"},  // found by fuzz_safetensors
      {R"({"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})", 0, "nests deeper"},
  };
  for (const auto& c : cases) {
    const std::string msg = try_load(safetensors_with_header(c.header, c.data));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
  }
}

TEST(Hostile, OversizedSafetensorsHeaderLengthFailsFast) {
  struct Case {
    uint64_t len;
    const char* expect;
  } cases[] = {{uint64_t{1} << 40, "over the 100 MiB limit"},
               {(uint64_t{100} << 20) + 1, "over the 100 MiB limit"},
               {1000, "runs past the end"}};
  for (const auto& c : cases) {
    std::vector<uint8_t> b(64, ' ');
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(c.len >> (8 * i));
    std::string msg;
    try {
      read_safetensors(source_of(b));
    } catch (const Error& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    // Through format detection the same bytes are called what they are: not a checkpoint.
    EXPECT_NE(try_load(b).find("not a checkpoint"), std::string::npos);
  }
}

// Rewrites the pickle of a one-tensor checkpoint and re-encodes the archive around it.
std::vector<uint8_t> pth_with_numel(int64_t claimed_numel, const char* storage_type = "FloatStorage") {
  // Encode with the writer, then patch the pickle text: the writer emits the numel as BININT1
  // (K) after the location string 'cpu'. Re-encoding keeps the CRCs valid, so the reader's
  // structural checks (not the checksum) must catch the lie.
  Tensor t = testing::random_tensor({4}, DType::kF32, 1);
  auto bytes = encode_pth({{"w", t}});
  ZipReader zip(source_of(bytes));
  const ZipEntry* pkl = zip.find("archive/data.pkl");
  std::vector<uint8_t> p(zip.data(*pkl).begin(), zip.data(*pkl).end());
  const std::string cpu = "cpu";
  auto it = std::search(p.begin(), p.end(), cpu.begin(), cpu.end());
  size_t at = static_cast<size_t>(it - p.begin()) + 3;
  EXPECT_EQ(p[at], 'K');
  std::vector<uint8_t> numel = {'J'};
  for (int i = 0; i < 4; ++i) numel.push_back(static_cast<uint8_t>(static_cast<uint64_t>(claimed_numel) >> (8 * i)));
  p.erase(p.begin() + static_cast<std::ptrdiff_t>(at), p.begin() + static_cast<std::ptrdiff_t>(at + 2));
  p.insert(p.begin() + static_cast<std::ptrdiff_t>(at), numel.begin(), numel.end());
  const std::string type = "FloatStorage";
  auto ty = std::search(p.begin(), p.end(), type.begin(), type.end());
  const std::string repl = storage_type;
  p.erase(ty, ty + static_cast<std::ptrdiff_t>(type.size()));
  p.insert(p.begin() + (ty - p.begin()), repl.begin(), repl.end());
  std::vector<uint8_t> storage(zip.data(*zip.find("archive/data/0")).begin(), zip.data(*zip.find("archive/data/0")).end());
  return encode_stored_zip({{"archive/data.pkl", p}, {"archive/data/0", storage}});
}

TEST(Hostile, PthLyingStorageLengthIsRefused) {
  const std::string msg = try_load(pth_with_numel(1000));
  EXPECT_NE(msg.find("claims 1000"), std::string::npos) << msg;
  EXPECT_TRUE(try_load(pth_with_numel(4)).empty());  // the honest file loads
  EXPECT_FALSE(try_load(pth_with_numel(-1)).empty());
}

TEST(Hostile, PthUnknownStorageDtypeIsRefused) {
  const std::string msg = try_load(pth_with_numel(4, "ComplexFloatStorage"));
  EXPECT_NE(msg.find("ComplexFloatStorage"), std::string::npos) << msg;
}

TEST(Hostile, NotACheckpointAtAll) {
  EXPECT_FALSE(try_load({}).empty());
  EXPECT_FALSE(try_load({'h', 'e', 'l', 'l', 'o'}).empty());
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0};
  EXPECT_FALSE(try_load(png).empty());
}

}  // namespace
}  // namespace bev
