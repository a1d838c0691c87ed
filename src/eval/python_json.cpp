#include "eval/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>
#include <unordered_set>
#include <vector>

#include "bevformer/error.h"
#include "io/byte_source.h"

namespace bev::eval {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void append_escaped(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  auto u16 = [&](uint32_t c) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(c >> shift) & 0xF];
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) {
            u16(c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // ensure_ascii: a code point as \uXXXX, beyond the BMP as a UTF-16 surrogate pair. The text
    // came through nlohmann's parser, which accepts valid UTF-8 only.
    const int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = c & (len == 4 ? 0x07u : len == 3 ? 0x0Fu : 0x1Fu);
    for (int k = 1; k < len && i + static_cast<size_t>(k) < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3Fu);
    }
    if (cp >= 0x10000) {
      cp -= 0x10000;
      u16(0xD800 + (cp >> 10));
      u16(0xDC00 + (cp & 0x3FF));
    } else {
      u16(cp);
    }
    i += static_cast<size_t>(len);
  }
  out += '"';
}

void dump_value(std::string& out, const ojson& v, int indent, int level, std::string_view nan_token) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.type()) {
    case ojson::value_t::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ',';
        first = false;
        newline(level + 1);
        append_escaped(out, key);
        out += ": ";
        dump_value(out, item, indent, level + 1, nan_token);
      }
      newline(level);
      out += '}';
      return;
    }
    case ojson::value_t::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const ojson& item : v) {
        if (!first) out += ',';
        first = false;
        newline(level + 1);
        dump_value(out, item, indent, level + 1, nan_token);
      }
      newline(level);
      out += ']';
      return;
    }
    case ojson::value_t::string: append_escaped(out, v.get_ref<const std::string&>()); return;
    case ojson::value_t::number_float: {
      const double d = v.get<double>();
      out += std::isfinite(d) ? python_float_repr(d) : std::string(nan_token);
      return;
    }
    default: out += v.dump(); return;  // null, booleans, integers: the same text in both
  }
}

}  // namespace

std::string read_text_file(const std::string& path) {
  // A regular file of bounded size, as every other command reads: a FIFO waited forever,
  // /dev/zero was read until memory ran out, a directory was an i/o error (exit 3).
  return read_regular_file(path, kMaxEvalFileBytes, "file");
}

std::optional<std::string> replace_nan_tokens(std::string_view text) {
  std::string fixed;
  size_t copied = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == 'N' && text.compare(i, 3, "NaN") == 0) {
      if (copied == 0) fixed.reserve(text.size() + text.size() / 64);
      fixed.append(text.substr(copied, i - copied)).append("null");
      copied = i + 3;
      i += 2;
    }
  }
  if (copied == 0) return std::nullopt;
  fixed.append(text.substr(copied));
  return fixed;
}

ojson parse_python_json(std::string_view text, const std::string& where) {
  const std::optional<std::string> fixed = replace_nan_tokens(text);
  const std::string_view input = fixed ? std::string_view(*fixed) : text;
  // A key twice in one object is refused: Python's json.load keeps the later value without a word
  // (a ground truth with a sample twice lost the earlier one's boxes), ordered_json likewise.
  std::vector<std::unordered_set<std::string>> keys;
  const ojson::parser_callback_t duplicates = [&](int, ojson::parse_event_t event, ojson& parsed) {
    if (event == ojson::parse_event_t::object_start) keys.emplace_back();
    if (event == ojson::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == ojson::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
      throw Error(ErrorKind::kInvalidInput, "key '" + parsed.get<std::string>() + "' appears twice in one object")
          .where(where)
          .expected("each key once per object (Python's json.load would silently keep the later value)");
    }
    return true;
  };
  try {
    return ojson::parse(input.begin(), input.end(), duplicates);
  } catch (const ojson::parse_error& e) {
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where);
  } catch (const ojson::exception& e) {  // a number too large for a double (1e999): Python would read inf
    std::string msg = e.what();
    if (const auto p = msg.find("] "); p != std::string::npos) msg = msg.substr(p + 2);
    throw Error(ErrorKind::kInvalidInput, "not valid JSON: " + msg).where(where).expected("finite numbers");
  }
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits (what Python's repr picks too), then Python's layout rules.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exp10 = 0;
  std::string_view es = s.substr(e + 1);
  if (es.front() == '+') es.remove_prefix(1);
  std::from_chars(es.data(), es.data() + es.size(), exp10);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // x = 0.DIGITS * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    const int ex = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt < n) {
    out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  } else {
    out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  }
  return out;
}

std::string dump_python(const ojson& value, int indent, std::string_view nan_token) {
  std::string out;
  dump_value(out, value, indent, 0, nan_token);
  return out;
}

}  // namespace bev::eval
