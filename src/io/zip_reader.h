// The ZIP container of PyTorch checkpoints (torch >= 1.6). Entries are stored uncompressed, so
// each entry is a byte range of the file: the reader returns spans into the source, zero-copy.
// It accepts only what such a writer produces and refuses the rest with a clear error: compressed
// or encrypted entries, entries outside the file, overlapping entries (the trick of zip bombs,
// which would make one stored byte range count many times), duplicate names, inconsistent local
// and central headers. ZIP64 (archives over 4 GiB) is supported.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/byte_source.h"

namespace bev {

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0;   // of the entry's bytes in the file
  uint64_t size = 0;          // bytes (stored: compressed == uncompressed)
  uint32_t crc32 = 0;         // as recorded in the central directory
  uint64_t header_offset = 0; // of the local file header
};

class ZipReader {
 public:
  // Parses the central directory of `source`. Throws bev::Error (kInvalidInput / kUnsupported).
  explicit ZipReader(std::shared_ptr<const ByteSource> source);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;  // nullptr when absent
  std::span<const uint8_t> data(const ZipEntry& e) const {
    return {source_->data() + e.data_offset, static_cast<size_t>(e.size)};
  }
  // Recomputes the entry's CRC-32 and throws when it differs from the central directory's.
  void verify_crc(const ZipEntry& e) const;
  const std::shared_ptr<const ByteSource>& source() const { return source_; }

 private:
  std::shared_ptr<const ByteSource> source_;
  std::vector<ZipEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

// True when the bytes start like a ZIP archive (local header or empty-archive EOCD).
bool looks_like_zip(std::span<const uint8_t> bytes);

}  // namespace bev
