#include "io/byte_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "bevformer/error.h"

namespace bev {

std::shared_ptr<const ByteSource> ByteSource::map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
    throw Error(ErrorKind::kInvalidInput, "not a regular file").where(path);
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

}  // namespace bev
