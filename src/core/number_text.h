// A double as the shortest text that reads back as the same value ("0.1", "1532402927.647951",
// "1e+300"), for error messages: std::to_string prints fixed-point, 301 digits for 1e300, and
// rounds small values to "0.000000".
#pragma once

#include <charconv>
#include <string>
#include <type_traits>

namespace bev {

// A float gets its own shortest text ("3e+38", not the double's "3.0000000054977558e+38").
template <typename T>
  requires std::is_floating_point_v<T>
std::string number_text(T v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace bev
