// Immutable bytes with an owner: a read-only memory mapping of a file, or an in-memory copy
// (tests and fuzzers feed readers from memory). Tensors read zero-copy from a source hold a
// shared_ptr to it, so the mapping lives as long as any tensor that points into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bev {

class ByteSource {
 public:
  // Maps `path` read-only. Only a regular file of at most `max_bytes` is read: a directory, FIFO,
  // socket or device is Error(kInvalidInput) at once (opening never blocks on a FIFO without a
  // writer), as is a larger file; a missing one is kNotFound, other failures kIo, with the path.
  static std::shared_ptr<const ByteSource> map_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);
  // Takes ownership of `bytes`; `name` is what error messages call it.
  static std::shared_ptr<const ByteSource> from_bytes(std::vector<uint8_t> bytes, std::string name);

  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;
  ~ByteSource();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> span() const { return {data_, size_}; }
  const std::string& name() const { return name_; }

 private:
  ByteSource() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
};

// The whole of a regular file of at most `max_bytes` as text, under map_file's rules; `what`
// names it in errors ("config", "frame file"). For readers of small text files (configs, frames)
// that would otherwise wait forever on a FIFO or read /dev/zero until memory runs out.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// Writes `text` to path + ".tmp" and renames it over `path`, so a reader never sees half a file;
// Error(kIo) naming the file when the folder cannot take it.
void write_file_atomically(const std::string& path, std::string_view text);

// Little-endian reads from a span, bounds-checked by the caller.
inline uint16_t read_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t read_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline uint64_t read_le64(const uint8_t* p) {
  return static_cast<uint64_t>(read_le32(p)) | (static_cast<uint64_t>(read_le32(p + 4)) << 32);
}

}  // namespace bev
