// Helpers shared by the strict JSON readers (the frame JSON, the model config): field paths as a
// user reads them ("cameras[2].K[1][0]"), errors that name the source and that path, and the
// shortest round-trip text of a value for messages. Each reader keeps its own wording of what a
// wrong value is (the config speaks Python: "a dict"; the frame JSON: "an object").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"

namespace bev::json_checks {

// "a.b" (just "b" at the top level).
inline std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

// "a.b[2]".
inline std::string item_path(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// "where: path", or whichever of the two is not empty.
inline std::string place(const std::string& where, const std::string& path) {
  if (where.empty()) return path;
  return path.empty() ? where : where + ": " + path;
}

// Throws Error(kind, problem) at place(where, path), with the expectation and hint when given.
[[noreturn]] inline void fail(ErrorKind kind, const std::string& where, const std::string& path,
                              const std::string& problem, const std::string& expected = {},
                              const std::string& hint = {}) {
  Error e(kind, problem);
  e.where(place(where, path));
  if (!expected.empty()) e.expected(expected);
  if (!hint.empty()) e.hint(hint);
  throw e;
}

// Shortest round-trip text of any JSON-representable value ("103.53", "[1, 2]"; NaN and inf: "null").
template <typename T>
std::string text(const T& v) {
  return nlohmann::json(v).dump();
}

}  // namespace bev::json_checks
