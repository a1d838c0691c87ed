#include "io/byte_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "bevformer/error.h"

namespace bev {

namespace {

const char* file_type_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

std::string size_text(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

std::shared_ptr<const ByteSource> ByteSource::map_file(const std::string& path, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat can say
  // what it is. It changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    throw Error(e == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIo,
                std::string("cannot open: ") + std::strerror(e))
        .where(path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(ErrorKind::kIo, std::string("cannot stat: ") + std::strerror(e)).where(path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kInvalidInput, std::string("is ") + file_type_name(st.st_mode)).where(path).expected("a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error(ErrorKind::kInvalidInput, "the file is " + size_text(static_cast<uint64_t>(st.st_size)))
        .where(path)
        .expected("at most " + size_text(max_bytes));
  }
  auto src = std::shared_ptr<ByteSource>(new ByteSource());
  src->name_ = path;
  src->size_ = static_cast<size_t>(st.st_size);
  if (src->size_ > 0) {
    void* p = ::mmap(nullptr, src->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw Error(ErrorKind::kIo, std::string("cannot map: ") + std::strerror(e)).where(path);
    }
    src->data_ = static_cast<const uint8_t*>(p);
    src->mapped_ = true;
  }
  ::close(fd);
  return src;
}

std::shared_ptr<const ByteSource> ByteSource::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  auto src = std::shared_ptr<ByteSource>(new ByteSource());
  src->owned_ = std::move(bytes);
  src->data_ = src->owned_.data();
  src->size_ = src->owned_.size();
  src->name_ = std::move(name);
  return src;
}

ByteSource::~ByteSource() {
  if (mapped_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  std::shared_ptr<const ByteSource> src;
  try {
    src = ByteSource::map_file(path, max_bytes);
  } catch (Error& e) {
    if (e.kind() == ErrorKind::kNotFound) throw Error(ErrorKind::kNotFound, "no such " + what).where(path);
    throw;
  }
  return std::string(reinterpret_cast<const char*>(src->data()), src->size());
}

void write_file_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(ErrorKind::kIo, std::string("cannot open for writing: ") + std::strerror(errno)).where(tmp);
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    throw Error(ErrorKind::kIo, "write failed").where(tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(ErrorKind::kIo, "cannot rename " + tmp + ": " + ec.message()).where(path);
  }
}

}  // namespace bev
