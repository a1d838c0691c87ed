#include "bevformer/error.h"

#include <utility>

namespace bev {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidInput: return "invalid input";
    case ErrorKind::kNotFound: return "not found";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kIo: return "i/o error";
    case ErrorKind::kInternal: return "internal error";
    case ErrorKind::kBusy: return "busy";
  }
  return "error";
}

Error::Error(ErrorKind kind, std::string problem) : kind_(kind), problem_(std::move(problem)) {
  rebuild();
}

Error& Error::where(std::string place) {
  where_ = std::move(place);
  rebuild();
  return *this;
}

Error& Error::at_offset(uint64_t byte_offset) {
  offset_ = byte_offset;
  rebuild();
  return *this;
}

Error& Error::expected(std::string what_was_expected) {
  expected_ = std::move(what_was_expected);
  rebuild();
  return *this;
}

Error& Error::hint(std::string fix) {
  hint_ = std::move(fix);
  rebuild();
  return *this;
}

void Error::rebuild() {
  std::string m;
  if (!where_.empty()) m += where_;
  if (offset_) m += (m.empty() ? "byte " : " (byte ") + std::to_string(*offset_) + (m.empty() ? "" : ")");
  if (!m.empty()) m += ": ";
  m += problem_;
  if (!expected_.empty()) m += "; expected " + expected_;
  if (!hint_.empty()) m += ". Hint: " + hint_;
  message_ = std::move(m);
}

}  // namespace bev
