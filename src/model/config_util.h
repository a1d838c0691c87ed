// Error helpers shared by the config files: every config error names the file and key path
// (the path and error helpers are io/json_checks.h's, shared with the frame JSON reader).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "io/json_checks.h"

namespace bev::config_detail {

using json = nlohmann::json;

using json_checks::fail;       // fail(kind, where, path, problem, expected, hint)
using json_checks::join_path;
using json_checks::place;
using json_checks::text;       // shortest round-trip text of a value ("103.53", "[1, 2]")

// What a wrong value is, in the config's (Python's) words.
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
