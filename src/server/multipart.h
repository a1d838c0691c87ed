// multipart/form-data bodies (RFC 7578 over RFC 2046): the boundary from the Content-Type, then
// the parts — each with its name (Content-Disposition), optional filename and Content-Type, and
// its bytes as a view into the body. Strict: a missing closing boundary (a truncated upload), a
// part without headers or name, a duplicate name or too many parts are ApiError 400 saying which.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bev::server {

struct MultipartPart {
  std::string name;          // Content-Disposition: form-data; name="..."
  std::string filename;      // filename="..." ("" when absent)
  std::string content_type;  // the part's Content-Type ("" when absent)
  std::string_view body;     // into the request body
};

// The boundary parameter of a multipart/form-data Content-Type (quoted or not; 1..70 chars).
std::string multipart_boundary(std::string_view content_type);

std::vector<MultipartPart> parse_multipart(std::string_view body, std::string_view boundary, size_t max_parts);

// The value of parameter `key` (case-insensitive) of a Content-Type value, unquoted; nullopt when
// absent. ApiError 400 for an unterminated quoted value.
std::optional<std::string> content_type_parameter(std::string_view content_type, std::string_view key);

// Lower-cased media type of a Content-Type value, parameters and spaces dropped.
std::string media_type(std::string_view content_type);

}  // namespace bev::server
