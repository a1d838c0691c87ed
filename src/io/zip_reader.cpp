#include "io/zip_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "bevformer/error.h"

namespace bev {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEocdSize = 22;
constexpr size_t kCentralSize = 46;
constexpr size_t kLocalSize = 30;
constexpr uint64_t kMaxEntries = 10'000'000;

Error bad(const ByteSource& src, uint64_t offset, std::string problem) {
  Error e(ErrorKind::kInvalidInput, std::move(problem));
  e.where(src.name()).at_offset(offset);
  return e;
}

// Finds the end-of-central-directory record: the last signature whose comment reaches exactly
// the end of the file (a comment may itself contain the signature bytes).
uint64_t find_eocd(const ByteSource& src) {
  const size_t n = src.size();
  if (n < kEocdSize) {
    throw bad(src, 0, "file of " + std::to_string(n) + " bytes is too short to be a ZIP archive")
        .expected("a PyTorch checkpoint (ZIP archive)");
  }
  const uint8_t* d = src.data();
  const size_t lowest = n >= kEocdSize + 0xffff ? n - kEocdSize - 0xffff : 0;
  for (size_t pos = n - kEocdSize + 1; pos-- > lowest;) {
    if (read_le32(d + pos) == kEocdSig && pos + kEocdSize + read_le16(d + pos + 20) == n) return pos;
  }
  throw bad(src, n, "no ZIP end-of-central-directory record: the file is truncated or not a ZIP archive")
      .expected("a complete PyTorch checkpoint")
      .hint("re-download or re-save the checkpoint; partial downloads end this way");
}

// Applies a ZIP64 extended-information extra field to the fields that were 0xFFFFFFFF.
void apply_zip64_extra(const ByteSource& src, uint64_t at, const uint8_t* extra, size_t len,
                       uint64_t* usize, uint64_t* csize, uint64_t* header) {
  size_t p = 0;
  while (p + 4 <= len) {
    const uint16_t id = read_le16(extra + p);
    const uint16_t sz = read_le16(extra + p + 2);
    if (p + 4 + sz > len) throw bad(src, at, "extra field runs past its header");
    if (id == 0x0001) {
      size_t q = p + 4;
      auto take = [&](uint64_t* field) {
        if (*field != 0xffffffffu) return;
        if (q + 8 > p + 4 + sz) throw bad(src, at, "ZIP64 extra field too short");
        *field = read_le64(extra + q);
        q += 8;
      };
      take(usize);
      take(csize);
      take(header);
      return;
    }
    p += 4 + sz;
  }
}

}  // namespace

bool looks_like_zip(std::span<const uint8_t> bytes) {
  return bytes.size() >= 4 && (read_le32(bytes.data()) == kLocalSig || read_le32(bytes.data()) == kEocdSig);
}

ZipReader::ZipReader(std::shared_ptr<const ByteSource> source) : source_(std::move(source)) {
  const ByteSource& src = *source_;
  const uint8_t* d = src.data();
  const uint64_t n = src.size();
  const uint64_t eocd = find_eocd(src);

  uint64_t count = read_le16(d + eocd + 10);
  uint64_t cd_size = read_le32(d + eocd + 12);
  uint64_t cd_offset = read_le32(d + eocd + 16);
  if (read_le16(d + eocd + 4) != 0 || read_le16(d + eocd + 6) != 0) {
    throw bad(src, eocd, "multi-disk ZIP archives are not supported");
  }
  if (count == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    if (eocd < 20 || read_le32(d + eocd - 20) != kZip64LocatorSig) {
      throw bad(src, eocd, "ZIP64 fields without a ZIP64 locator");
    }
    const uint64_t z64 = read_le64(d + eocd - 20 + 8);
    if (z64 > n || n - z64 < 56 || read_le32(d + z64) != kZip64EocdSig) {
      throw bad(src, eocd - 20, "ZIP64 end-of-central-directory record missing or outside the file");
    }
    count = read_le64(d + z64 + 32);
    cd_size = read_le64(d + z64 + 40);
    cd_offset = read_le64(d + z64 + 48);
  }
  if (cd_offset > n || cd_size > n - cd_offset) {
    throw bad(src, eocd, "central directory (offset " + std::to_string(cd_offset) + ", " +
                             std::to_string(cd_size) + " bytes) lies outside the file")
        .hint("the file is truncated");
  }
  if (count > kMaxEntries || count > cd_size / kCentralSize) {
    throw bad(src, eocd, std::to_string(count) + " entries cannot fit a central directory of " +
                             std::to_string(cd_size) + " bytes");
  }

  entries_.reserve(static_cast<size_t>(count));
  uint64_t p = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_end - p < kCentralSize || read_le32(d + p) != kCentralSig) {
      throw bad(src, p, "central directory entry " + std::to_string(i) + " is damaged");
    }
    const uint16_t flags = read_le16(d + p + 8);
    const uint16_t method = read_le16(d + p + 10);
    const uint32_t crc = read_le32(d + p + 16);
    uint64_t csize = read_le32(d + p + 20);
    uint64_t usize = read_le32(d + p + 24);
    const uint16_t name_len = read_le16(d + p + 28);
    const uint16_t extra_len = read_le16(d + p + 30);
    const uint16_t comment_len = read_le16(d + p + 32);
    uint64_t header = read_le32(d + p + 42);
    const uint64_t var_len = uint64_t{name_len} + extra_len + comment_len;
    if (cd_end - p - kCentralSize < var_len) {
      throw bad(src, p, "central directory entry " + std::to_string(i) + " runs past the directory");
    }
    std::string name(reinterpret_cast<const char*>(d + p + kCentralSize), name_len);
    apply_zip64_extra(src, p, d + p + kCentralSize + name_len, extra_len, &usize, &csize, &header);
    if (flags & 0x1) throw Error(ErrorKind::kUnsupported, "encrypted entry '" + name + "'").where(src.name()).at_offset(p);
    if (method != 0) {
      throw Error(ErrorKind::kUnsupported, "entry '" + name + "' is compressed (method " +
                                               std::to_string(method) + ")")
          .where(src.name())
          .at_offset(p)
          .expected("stored (uncompressed) entries, as torch.save writes them");
    }
    if (csize != usize) {
      throw bad(src, p, "stored entry '" + name + "' claims " + std::to_string(csize) +
                            " compressed but " + std::to_string(usize) + " uncompressed bytes");
    }
    // The local header must exist, agree on the name, and the data must lie inside the file.
    if (header > n || n - header < kLocalSize || read_le32(d + header) != kLocalSig) {
      throw bad(src, header, "local header of entry '" + name + "' is missing or outside the file");
    }
    const uint16_t lname = read_le16(d + header + 26);
    const uint16_t lextra = read_le16(d + header + 28);
    if (lname != name_len || n - header - kLocalSize < uint64_t{lname} + lextra ||
        std::memcmp(d + header + kLocalSize, name.data(), name_len) != 0) {
      throw bad(src, header, "local header of entry '" + name + "' disagrees with the central directory");
    }
    const uint64_t data = header + kLocalSize + lname + lextra;
    if (usize > n - data) {
      throw bad(src, data, "entry '" + name + "' claims " + std::to_string(usize) + " bytes but the file has " +
                               std::to_string(n - data) + " left")
          .hint("the file is truncated or its directory is corrupt");
    }
    if (by_name_.count(name)) throw bad(src, p, "duplicate entry '" + name + "'");
    by_name_.emplace(name, entries_.size());
    entries_.push_back(ZipEntry{std::move(name), data, usize, crc, header});
    p += kCentralSize + var_len;
  }

  // No two entries may share bytes: a stored byte range counted twice is how a small file
  // pretends to hold far more data than it has.
  std::vector<const ZipEntry*> order;
  order.reserve(entries_.size());
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const ZipEntry* a, const ZipEntry* b) { return a->header_offset < b->header_offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const ZipEntry& prev = *order[i - 1];
    if (prev.data_offset + prev.size > order[i]->header_offset) {
      throw bad(src, order[i]->header_offset,
                "entries '" + prev.name + "' and '" + order[i]->name + "' overlap")
          .expected("disjoint entries (overlapping entries are a zip-bomb construction)");
    }
  }
}

const ZipEntry* ZipReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

void ZipReader::verify_crc(const ZipEntry& e) const {
  uLong crc = crc32(0L, Z_NULL, 0);
  const uint8_t* p = source_->data() + e.data_offset;
  uint64_t left = e.size;
  while (left > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(left, 1u << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    left -= chunk;
  }
  if (static_cast<uint32_t>(crc) != e.crc32) {
    throw Error(ErrorKind::kInvalidInput, "CRC-32 mismatch in entry '" + e.name + "'")
        .where(source_->name())
        .at_offset(e.data_offset)
        .expected("the checksum recorded in the archive")
        .hint("the file is corrupt (bit flips or a damaged copy); re-download it");
  }
}

}  // namespace bev
