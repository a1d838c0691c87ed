// The frame JSON (DESIGN §4, docs/FORMATS.md "Frames"): one multi-camera frame of a stream —
// stream id, timestamp, optional scene token, ego pose, the BEV (lidar) frame's pose in the ego
// frame, optional raw CAN-bus values, and per camera its image (a file or inline base64) with
// either intrinsics + extrinsics or a ready lidar2img. Parsed strictly into Frame: unknown or
// duplicate fields, wrong matrix shapes, non-finite numbers, non-rigid poses, bad base64 and
// duplicate camera names are Error(kInvalidInput) naming the field path ("cameras[2].Kx").
// Nothing here decodes images or knows the model (runtime/prepare.h does both).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/frame.h"
#include "core/mat4.h"  // Mat3, Mat4 and their helpers (mat4_mul, mat4_inverse, ...)

namespace bev {

// The largest frame file read_frame_json reads (inline images make frames large).
constexpr uint64_t kMaxFrameFileBytes = uint64_t{1} << 30;

// Timestamps are seconds; a larger magnitude is a unit mistake or a sentinel, refused at parse.
constexpr double kMaxTimestampSeconds = 1e11;

// Frame and Camera (the parsed form, bevformer/frame.h) are public: the API takes them as they are.

// Parses frame JSON text; `where` names the source in errors (a file path, "request.frame").
// Also refuses duplicate keys and nesting deeper than 16.
Frame parse_frame_json(std::string_view text, const std::string& where = "frame");
// The same for a text the caller gives up: it is freed once parsed, and each inline image's
// base64 text once decoded, so the peak stays near the text's size plus one tree of it (the
// server parses request bodies of up to --max-body-mb this way).
Frame parse_frame_json_owned(std::string text, const std::string& where = "frame");
// The same checks on an already parsed value (duplicate keys cannot be seen here).
Frame frame_from_json(const nlohmann::json& j, const std::string& where = "frame");
// Reads and parses a regular file of at most kMaxFrameFileBytes (read_regular_file: kNotFound if
// it does not exist, kInvalidInput for a directory, FIFO or device); image paths stay relative:
// resolve them against the file's directory (prepare_frame's base_dir).
Frame read_frame_json(const std::string& path);

// The frame as JSON (fields in schema order; inline images base64-encoded). parse_frame_json of
// its text gives back an equal Frame.
nlohmann::ordered_json to_json(const Frame& spec);
// to_json pretty-printed with one matrix row per line, and a final newline.
std::string frame_json_text(const Frame& spec);
void write_frame_json(const std::string& path, const Frame& spec);

// RFC 4648 base64 (standard alphabet, '=' padding). The decoder skips ASCII whitespace (line
// breaks of wrapped encoders) and refuses anything else outside the alphabet, misplaced padding
// and a length that is not a multiple of 4; errors name `where` and the character offset.
std::string base64_encode(std::span<const uint8_t> bytes);
std::vector<uint8_t> base64_decode(std::string_view text, const std::string& where);

// Any JSON document with the frame parser's strictness: duplicate keys and nesting deeper than 16
// refused, errors naming `where`, the field path and the byte (the server's Open Inference
// Protocol requests).
nlohmann::json parse_json_strict(std::string_view text, const std::string& where);

// A row-major matrix from nested JSON lists of finite numbers; errors name "where: path[r][c]".
Mat3 mat3_from_json(const nlohmann::json& v, const std::string& where, const std::string& path);
Mat4 mat4_from_json(const nlohmann::json& v, const std::string& where, const std::string& path);

}  // namespace bev
