// A POST /v1/streams/{id}/frames body turned into the Frame Model::detect takes, before any queueing:
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

#include "bevformer/frame.h"

namespace bev::server {

struct RequestLimits {
  size_t max_cameras = 12;
  int max_image_width = 4096;
  int max_image_height = 4096;
  size_t max_parts = 32;
};

struct FrameRequest {
  // The parsed frame, handed to the engine as it is: every camera's image_bytes views the
  // multipart body's part, or owns its decoded base64 (no copy either way, no image paths).
  Frame frame;
  size_t held_bytes = 0;     // the bytes the frame's images keep alive (the multipart body, or the decoded images)
  size_t decoded_bytes = 0;  // what the images decode to: width x height x 3 bytes each
};

// Stream ids: 1 to 128 characters of [A-Za-z0-9._:-].
bool valid_stream_id(std::string_view id);

// Throws ApiError (400 malformed, 413 over a limit, 415 unsupported content type or charset).
// Every image is decoded once here without keeping its pixels (io/image.h verify_image_data), so
// corrupt image data is a 400 before the frame takes a queue slot. The body is freed as soon as
// it is parsed (a JSON body) or kept as the images' storage (multipart: the parts are views).
FrameRequest parse_frame_request(std::string_view stream, std::string_view content_type, std::string body,
                                 const RequestLimits& limits);

// The same checks on a frame whose cameras already carry their image bytes (the Open Inference
// Protocol's FRAME and IMAGES): the camera count, and every image's structure, size and data.
// held_bytes is left 0 (the caller knows what keeps the bytes alive). Throws ApiError.
FrameRequest check_frame_images(Frame frame, const RequestLimits& limits);

}  // namespace bev::server
