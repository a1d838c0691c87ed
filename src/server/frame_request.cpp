#include "server/frame_request.h"

#include <cctype>
#include <optional>
#include <span>
#include <set>

#include "io/frame_json.h"
#include "io/image.h"
#include "server/api_error.h"
#include "server/multipart.h"

namespace bev::server {
namespace {

std::string size_text(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

Frame parse_frame(std::string text, const std::string& where) {
  try {
    return parse_frame_json_owned(std::move(text), where);
  } catch (const Error& e) {
    throw api_error_from(e, ErrorStage::kRequest);
  }
}

// JSON is UTF-8 (RFC 8259 8.1); a body declared in another charset would be read as garbage.
void check_charset(std::string_view content_type) {
  const std::optional<std::string> charset = content_type_parameter(content_type, "charset");
  if (charset && media_type(*charset) != "utf-8" && media_type(*charset) != "utf8") {
    throw ApiError(415, "unsupported_media_type",
                   "charset=" + charset->substr(0, 40) + " is not accepted; JSON is read as UTF-8 (RFC 8259)");
  }
}

// The structure, the size limits and every compressed byte, before the frame is queued.
ImageHeader check_image(std::string_view bytes, const std::string& name, const RequestLimits& limits) {
  const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ImageHeader h;
  try {
    h = inspect_image(data, name);
  } catch (const Error& e) {
    // inspect_image calls an image over its pixel bound unsupported: too large, not malformed.
    if (e.kind() == ErrorKind::kUnsupported) throw ApiError(413, "image_too_large", e.what());
    throw ApiError(400, "invalid_image", e.what());
  }
  if (h.width > limits.max_image_width || h.height > limits.max_image_height) {
    throw ApiError(413, "image_too_large",
                   name + ": the image is " + size_text(h.width, h.height) + "; this server takes at most " +
                       size_text(limits.max_image_width, limits.max_image_height));
  }
  try {
    verify_image_data(data, h, name);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_image", e.what());
  }
  return h;
}

size_t decoded_size(const ImageHeader& h) { return static_cast<size_t>(h.width) * static_cast<size_t>(h.height) * 3; }

}  // namespace

bool valid_stream_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (const char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != ':') return false;
  }
  return true;
}

FrameRequest parse_frame_request(std::string_view stream, std::string_view content_type, std::string body,
                                 const RequestLimits& limits) {
  const std::string media = media_type(content_type);
  FrameRequest req;
  std::string frame_text;
  std::vector<MultipartPart> parts;
  std::shared_ptr<const std::string> multipart_body;  // the parts' owner: camera images view it
  if (media == "application/json") {
    check_charset(content_type);
    frame_text = std::move(body);
  } else if (media == "multipart/form-data") {
    auto owned = std::make_shared<const std::string>(std::move(body));
    multipart_body = owned;
    req.held_bytes += owned->size();
    parts = parse_multipart(*owned, multipart_boundary(content_type), limits.max_parts);
    bool found = false;
    for (const MultipartPart& p : parts) {
      if (p.name != "frame") continue;
      if (!p.content_type.empty() && media_type(p.content_type) != "application/json") {
        throw ApiError(415, "unsupported_media_type", "the \"frame\" part is " + p.content_type + "; expected application/json");
      }
      if (!p.content_type.empty()) check_charset(p.content_type);
      frame_text = std::string(p.body);
      found = true;
    }
    if (!found) throw ApiError(400, "invalid_multipart", "no part named \"frame\" (the frame JSON)");
  } else {
    throw ApiError(415, "unsupported_media_type",
                   "Content-Type '" + std::string(content_type.substr(0, 200)) +
                       "' is not accepted; send application/json (images as base64) or multipart/form-data");
  }

  Frame spec = parse_frame(std::move(frame_text), "request frame");
  if (spec.stream != stream) {
    throw ApiError(400, "stream_mismatch",
                   "the frame's \"stream\" is '" + spec.stream.substr(0, 200) + "' but the URL names stream '" +
                       std::string(stream) + "'");
  }
  if (spec.cameras.size() > limits.max_cameras) {
    throw ApiError(413, "too_many_cameras", "the frame has " + std::to_string(spec.cameras.size()) +
                                                " cameras; this server takes at most " + std::to_string(limits.max_cameras));
  }
  std::set<std::string_view> used;
  for (size_t i = 0; i < spec.cameras.size(); ++i) {
    Camera& cam = spec.cameras[i];
    const std::string place = "cameras[" + std::to_string(i) + "].image";
    if (!cam.image_bytes.empty()) {  // inline base64, decoded once by the parser: the frame owns it
      const std::string_view view(reinterpret_cast<const char*>(cam.image_bytes.bytes.data()), cam.image_bytes.size());
      req.held_bytes += view.size();
      req.decoded_bytes += decoded_size(check_image(view, place, limits));
      continue;
    }
    const MultipartPart* part = nullptr;
    for (const MultipartPart& p : parts) {
      if (p.name == cam.image_path && p.name != "frame") part = &p;
    }
    if (!part) {
      throw ApiError(400, "missing_image",
                     place + " is '" + cam.image_path.substr(0, 200) +
                         (parts.empty() ? "', a file path; send the image inline ({\"base64\": ...}) or as a multipart part"
                                        : "' but no part has that name"));
    }
    req.decoded_bytes += decoded_size(check_image(part->body, place + " (part '" + part->name + "')", limits));
    cam.image_bytes.owner = multipart_body;
    cam.image_bytes.bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(part->body.data()), part->body.size());
    cam.image_path.clear();
    used.insert(part->name);
  }
  for (const MultipartPart& p : parts) {
    if (p.name != "frame" && !used.count(p.name)) {
      throw ApiError(400, "invalid_multipart", "the part '" + p.name + "' is named by no camera's \"image\"");
    }
  }
  req.frame = std::move(spec);
  return req;
}

FrameRequest check_frame_images(Frame frame, const RequestLimits& limits) {
  if (frame.cameras.size() > limits.max_cameras) {
    throw ApiError(413, "too_many_cameras", "the frame has " + std::to_string(frame.cameras.size()) +
                                                " cameras; this server takes at most " + std::to_string(limits.max_cameras));
  }
  FrameRequest req;
  for (size_t i = 0; i < frame.cameras.size(); ++i) {
    const Camera& cam = frame.cameras[i];
    const std::string place = "cameras[" + std::to_string(i) + "].image";
    if (cam.image_bytes.empty()) {
      throw ApiError(400, "missing_image", place + " has no image bytes (a file path is never read by a server)");
    }
    const std::string_view view(reinterpret_cast<const char*>(cam.image_bytes.bytes.data()), cam.image_bytes.size());
    req.decoded_bytes += decoded_size(check_image(view, place, limits));
  }
  req.frame = std::move(frame);
  return req;
}

}  // namespace bev::server
