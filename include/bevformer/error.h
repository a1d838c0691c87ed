// The one error type of bevformer.cpp: what was wrong, where, what was expected, and a hint
// when a fix is known. The library throws it and never calls exit(); the CLI and the server map
// its kind to an exit code or an HTTP status with the same text.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace bev {

enum class ErrorKind : uint8_t {
  kInvalidInput,  // malformed or inconsistent input (file, frame, request): the caller's fault
  kNotFound,      // a file, key or stream that does not exist
  kUnsupported,   // well-formed but outside what the engine does (legacy format, dtype, option)
  kIo,            // the operating system failed us (open, read, mmap)
  kInternal,      // a bug in the engine: an invariant broke
  kBusy,          // a resource is exhausted for now (every stream slot leased): the same call may succeed later
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string problem);

  // Builders, chained on a temporary: throw Error(...).where("file.pth: entry x").at_offset(12);
  Error& where(std::string place);
  Error& at_offset(uint64_t byte_offset);
  Error& expected(std::string what_was_expected);
  Error& hint(std::string fix);

  ErrorKind kind() const { return kind_; }
  const std::string& problem() const { return problem_; }
  const std::string& place() const { return where_; }
  std::optional<uint64_t> offset() const { return offset_; }
  const std::string& expectation() const { return expected_; }
  const std::string& fix_hint() const { return hint_; }

  // "<where> (byte N): <problem>; expected <expected>. Hint: <hint>"
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  void rebuild();

  ErrorKind kind_;
  std::string problem_;
  std::string where_;
  std::optional<uint64_t> offset_;
  std::string expected_;
  std::string hint_;
  std::string message_;
};

}  // namespace bev
