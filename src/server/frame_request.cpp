#include "server/frame_request.h"

#include <cctype>
#include <set>

#include "io/frame_json.h"
#include "io/image.h"
#include "server/api_error.h"
#include "server/multipart.h"

namespace bev::server {
namespace {

std::string size_text(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

FrameSpec parse_frame(std::string_view text, const std::string& where) {
  try {
    return parse_frame_json(text, where);
  } catch (const Error& e) {
    throw api_error_from(e, ErrorStage::kRequest);
  }
}

void check_image(std::string_view bytes, const std::string& name, const RequestLimits& limits) {
  ImageHeader h;
  try {
    h = inspect_image({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, name);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_image", e.what());
  }
  if (h.width > limits.max_image_width || h.height > limits.max_image_height) {
    throw ApiError(413, "image_too_large",
                   name + ": the image is " + size_text(h.width, h.height) + "; this server takes at most " +
                       size_text(limits.max_image_width, limits.max_image_height));
  }
}

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
  auto owned = std::make_shared<const std::string>(std::move(body));
  req.storage.push_back(owned);
  std::string_view frame_text;
  std::vector<MultipartPart> parts;
  if (media == "application/json") {
    frame_text = *owned;
  } else if (media == "multipart/form-data") {
    parts = parse_multipart(*owned, multipart_boundary(content_type), limits.max_parts);
    bool found = false;
    for (const MultipartPart& p : parts) {
      if (p.name.rfind("inline:", 0) == 0) {
        throw ApiError(400, "invalid_multipart", "part names starting with 'inline:' are reserved ('" + p.name + "')");
      }
      if (p.name != "frame") continue;
      if (!p.content_type.empty() && media_type(p.content_type) != "application/json") {
        throw ApiError(415, "unsupported_media_type", "the \"frame\" part is " + p.content_type + "; expected application/json");
      }
      frame_text = p.body;
      found = true;
    }
    if (!found) throw ApiError(400, "invalid_multipart", "no part named \"frame\" (the frame JSON)");
  } else {
    throw ApiError(415, "unsupported_media_type",
                   "Content-Type '" + std::string(content_type.substr(0, 200)) +
                       "' is not accepted; send application/json (images as base64) or multipart/form-data");
  }

  FrameSpec spec = parse_frame(frame_text, "request frame");
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
    CameraSpec& cam = spec.cameras[i];
    const std::string place = "cameras[" + std::to_string(i) + "].image";
    if (!cam.image_bytes.empty()) {  // inline base64: kept beside the JSON under a reserved name
      const std::string name = "inline:" + std::to_string(i);
      auto bytes = std::make_shared<const std::string>(cam.image_bytes.begin(), cam.image_bytes.end());
      req.storage.push_back(bytes);
      check_image(*bytes, place, limits);
      req.images.emplace(name, *bytes);
      cam.image_bytes.clear();
      cam.image_path = name;
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
    check_image(part->body, place + " (part '" + part->name + "')", limits);
    req.images.emplace(part->name, part->body);
    used.insert(part->name);
  }
  for (const MultipartPart& p : parts) {
    if (p.name != "frame" && !used.count(p.name)) {
      throw ApiError(400, "invalid_multipart", "the part '" + p.name + "' is named by no camera's \"image\"");
    }
  }
  req.stream = spec.stream;
  req.timestamp = spec.timestamp;
  req.cameras = spec.cameras.size();
  req.frame_json = frame_json_text(spec);
  return req;
}

}  // namespace bev::server
