// Error helpers shared by the config files: every config error names the file and key path.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"

namespace bev::config_detail {

using json = nlohmann::json;

inline std::string join_path(const std::string& a, std::string_view b) {
  return a.empty() ? std::string(b) : a + "." + std::string(b);
}

inline std::string place(const std::string& where, const std::string& path) {
  if (where.empty()) return path;
  return path.empty() ? where : where + ": " + path;
}

[[noreturn]] inline void fail(ErrorKind kind, const std::string& where, const std::string& path,
                       const std::string& problem, const std::string& expected = {},
                       const std::string& hint = {}) {
  Error e(kind, problem);
  e.where(place(where, path));
  if (!expected.empty()) e.expected(expected);
  if (!hint.empty()) e.hint(hint);
  throw e;
}

// Shortest round-trip text of any JSON-representable value ("103.53", "[1, 2]").
template <typename T>
std::string text(const T& v) {
  return json(v).dump();
}

inline std::string describe(const json& v) {
  std::string d = v.dump();
  if (d.size() > 40) d = d.substr(0, 37) + "...";
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean (" + d + ")";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer (" + d + ")";
    case json::value_t::number_float: return "a number (" + d + ")";
    case json::value_t::string: return "a string (" + d + ")";
    case json::value_t::array: return "a list (" + d + ")";
    case json::value_t::object: return "a dict";
    default: return "a value of an unexpected kind";
  }
}


}  // namespace bev::config_detail
