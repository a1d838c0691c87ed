#include "server/multipart.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "server/api_error.h"

namespace bev::server {
namespace {

constexpr size_t kMaxPartHeaderBytes = 8192;

[[noreturn]] void bad(const std::string& message) { throw ApiError(400, "invalid_multipart", message); }

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of parameter `key` in "type; a=1; b=\"x y\"" (case-insensitive key), or nullopt.
std::optional<std::string> parameter(std::string_view header, std::string_view key) {
  size_t pos = header.find(';');
  while (pos != std::string_view::npos) {
    std::string_view rest = header.substr(pos + 1);
    const size_t eq = rest.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string name = lower(trim(rest.substr(0, eq)));
    rest = trim(rest.substr(eq + 1));
    std::string value;
    size_t consumed = 0;
    if (!rest.empty() && rest.front() == '"') {
      size_t i = 1;
      for (; i < rest.size() && rest[i] != '"'; ++i) {
        if (rest[i] == '\\' && i + 1 < rest.size()) ++i;
        value += rest[i];
      }
      if (i >= rest.size()) bad("unterminated quoted parameter in '" + std::string(header.substr(0, 200)) + "'");
      consumed = i + 1;
    } else {
      consumed = std::min(rest.find(';'), rest.size());
      value = std::string(trim(rest.substr(0, consumed)));
    }
    if (name == key) return value;
    const size_t next = rest.find(';', consumed);
    if (next == std::string_view::npos) return std::nullopt;
    pos = static_cast<size_t>(rest.data() - header.data()) + next;
  }
  return std::nullopt;
}

void parse_part_headers(std::string_view block, MultipartPart& part) {
  bool disposition = false;
  while (!block.empty()) {
    const size_t eol = block.find("\r\n");
    const std::string_view line = block.substr(0, eol);
    block = eol == std::string_view::npos ? std::string_view() : block.substr(eol + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) bad("a part header line has no ':' ('" + std::string(line.substr(0, 100)) + "')");
    const std::string name = lower(trim(line.substr(0, colon)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-disposition") {
      if (lower(value.substr(0, std::min(value.find(';'), value.size()))) != "form-data") {
        bad("a part's Content-Disposition is not form-data");
      }
      part.name = parameter(value, "name").value_or("");
      part.filename = parameter(value, "filename").value_or("");
      disposition = true;
    } else if (name == "content-type") {
      part.content_type = std::string(value);
    }
  }
  if (!disposition) bad("a part has no Content-Disposition header");
  if (part.name.empty()) bad("a part has no name (Content-Disposition: form-data; name=\"...\")");
}

}  // namespace

std::optional<std::string> content_type_parameter(std::string_view content_type, std::string_view key) {
  return parameter(content_type, lower(key));
}

std::string media_type(std::string_view content_type) {
  return lower(trim(content_type.substr(0, std::min(content_type.find(';'), content_type.size()))));
}

std::string multipart_boundary(std::string_view content_type) {
  const std::optional<std::string> b = parameter(content_type, "boundary");
  if (!b || b->empty() || b->size() > 70) {
    bad("multipart/form-data needs a boundary parameter of 1 to 70 characters");
  }
  return *b;
}

std::vector<MultipartPart> parse_multipart(std::string_view body, std::string_view boundary, size_t max_parts) {
  const std::string delimiter = "--" + std::string(boundary);
  // The first delimiter opens the body or follows a preamble's CRLF.
  size_t pos = 0;
  if (body.substr(0, delimiter.size()) != delimiter) {
    pos = body.find("\r\n" + delimiter);
    if (pos == std::string_view::npos) bad("the body does not contain the boundary '" + std::string(boundary) + "'");
    pos += 2;
  }
  std::vector<MultipartPart> parts;
  std::set<std::string> names;
  const std::string next_delimiter = "\r\n" + delimiter;
  while (true) {
    pos += delimiter.size();
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter; an epilogue is ignored
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;  // transport padding
    if (body.substr(pos, 2) != "\r\n") {
      bad(pos >= body.size() ? "the body is truncated: the closing boundary '--" + std::string(boundary) + "--' is missing"
                             : "a boundary line is not followed by CRLF");
    }
    pos += 2;
    if (parts.size() >= max_parts) bad("more than " + std::to_string(max_parts) + " parts");
    const size_t headers_end = body.find("\r\n\r\n", pos);
    if (body.substr(pos, 2) == "\r\n") bad("a part has no headers (it needs Content-Disposition)");
    if (headers_end == std::string_view::npos) bad("the body is truncated inside a part's headers");
    if (headers_end - pos > kMaxPartHeaderBytes) bad("a part's headers exceed " + std::to_string(kMaxPartHeaderBytes) + " bytes");
    MultipartPart part;
    parse_part_headers(body.substr(pos, headers_end - pos), part);
    const size_t start = headers_end + 4;
    const size_t end = body.find(next_delimiter, start);
    if (end == std::string_view::npos) {
      bad("the body is truncated: part '" + part.name + "' has no closing boundary");
    }
    part.body = body.substr(start, end - start);
    if (!names.insert(part.name).second) bad("two parts are named '" + part.name + "'");
    parts.push_back(std::move(part));
    pos = end + 2;
  }
}

}  // namespace bev::server
