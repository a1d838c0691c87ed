// A POST /v1/streams/{id}/frames body turned into what Model::detect takes, before any queueing:
// every check that needs no model runs here (so a bad request costs no queue slot) and the
// fuzz target drives exactly this code.
//
// Two encodings:
//   application/json      the frame JSON (docs/FORMATS.md), images inline as {"base64": ...};
//   multipart/form-data   a part named "frame" holding the frame JSON, and one part per image;
//                         a camera's "image" string is the name of its part.
// Either way the frame's "stream" must equal the path's {id}; image file paths are refused
// (a server never reads its own files on a client's word).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bevformer/model.h"

namespace bev::server {

struct RequestLimits {
  size_t max_cameras = 12;
  int max_image_width = 4096;
  int max_image_height = 4096;
  size_t max_parts = 32;
};

struct FrameRequest {
  std::string stream;
  double timestamp = 0;
  size_t cameras = 0;
  std::string frame_json;  // the frame again, every camera's "image" naming an entry of `images`
  AttachedImages images;   // views into `storage`
  std::vector<std::shared_ptr<const std::string>> storage;
};

// Stream ids: 1 to 128 characters of [A-Za-z0-9._:-].
bool valid_stream_id(std::string_view id);

// Throws ApiError (400 malformed, 413 over a limit, 415 unsupported content type).
FrameRequest parse_frame_request(std::string_view stream, std::string_view content_type, std::string body,
                                 const RequestLimits& limits);

}  // namespace bev::server
