// The frame JSON (DESIGN §4, docs/FORMATS.md "Frames"): one multi-camera frame of a stream —
// stream id, timestamp, optional scene token, ego pose, the BEV (lidar) frame's pose in the ego
// frame, optional raw CAN-bus values, and per camera its image (a file or inline base64) with
// either intrinsics + extrinsics or a ready lidar2img. Parsed strictly into FrameSpec: unknown or
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

#include "core/mat4.h"  // Mat3, Mat4 and their helpers (mat4_mul, mat4_inverse, ...)

namespace bev {

// The largest frame file read_frame_json reads (inline images make frames large).
constexpr uint64_t kMaxFrameFileBytes = uint64_t{1} << 30;

// Timestamps are seconds; a larger magnitude is a unit mistake or a sentinel, refused at parse.
constexpr double kMaxTimestampSeconds = 1e11;

struct CameraSpec {
  std::string name;                  // "name": unique in the frame (nuScenes: CAM_FRONT, ...)
  std::string image_path;            // "image": "file.jpg", relative to the frame file's folder
  std::vector<uint8_t> image_bytes;  // "image": {"base64": "..."}, decoded (image_path is "" then)
  std::optional<Mat3> K;               // "K": intrinsics at the image's own resolution
  std::optional<Mat4> T_ego_from_cam;  // "T_ego_from_cam": p_ego = T p_cam (camera x right, y down, z forward)
  std::optional<Mat4> lidar2img;       // "lidar2img": instead of K + T_ego_from_cam
  bool operator==(const CameraSpec&) const = default;
};

struct FrameSpec {
  std::string stream;                      // "stream": the stream (history) this frame belongs to
  double timestamp = 0;                    // "timestamp": seconds, |t| <= kMaxTimestampSeconds
  std::optional<std::string> scene;        // "scene": a change of token resets the history
  std::optional<std::string> token;        // "token": the sample token (keys results_nusc.json)
  std::optional<Mat4> T_world_from_ego;    // "T_world_from_ego": ego pose (world z-up, ego x forward)
  std::optional<Mat4> T_ego_from_lidar;    // "T_ego_from_lidar": the BEV frame in the ego frame; identity if absent
  std::optional<std::array<double, 18>> can_bus;  // "can_bus": raw nuScenes layout (spec §3)
  std::vector<CameraSpec> cameras;         // "cameras": in the model's camera slot order
  bool operator==(const FrameSpec&) const = default;
};

// Parses frame JSON text; `where` names the source in errors (a file path, "request.frame").
// Also refuses duplicate keys and nesting deeper than 16.
FrameSpec parse_frame_json(std::string_view text, const std::string& where = "frame");
// The same for a text the caller gives up: it is freed once parsed, and each inline image's
// base64 text once decoded, so the peak stays near the text's size plus one tree of it (the
// server parses request bodies of up to --max-body-mb this way).
FrameSpec parse_frame_json_owned(std::string text, const std::string& where = "frame");
// The same checks on an already parsed value (duplicate keys cannot be seen here).
FrameSpec frame_from_json(const nlohmann::json& j, const std::string& where = "frame");
// Reads and parses a regular file of at most kMaxFrameFileBytes (read_regular_file: kNotFound if
// it does not exist, kInvalidInput for a directory, FIFO or device); image paths stay relative:
// resolve them against the file's directory (prepare_frame's base_dir).
FrameSpec read_frame_json(const std::string& path);

// The frame as JSON (fields in schema order; inline images base64-encoded). parse_frame_json of
// its text gives back an equal FrameSpec.
nlohmann::ordered_json to_json(const FrameSpec& spec);
// to_json pretty-printed with one matrix row per line, and a final newline.
std::string frame_json_text(const FrameSpec& spec);
void write_frame_json(const std::string& path, const FrameSpec& spec);

// RFC 4648 base64 (standard alphabet, '=' padding). The decoder skips ASCII whitespace (line
// breaks of wrapped encoders) and refuses anything else outside the alphabet, misplaced padding
// and a length that is not a multiple of 4; errors name `where` and the character offset.
std::string base64_encode(std::span<const uint8_t> bytes);
std::vector<uint8_t> base64_decode(std::string_view text, const std::string& where);

// A row-major matrix from nested JSON lists of finite numbers; errors name "where: path[r][c]".
Mat3 mat3_from_json(const nlohmann::json& v, const std::string& where, const std::string& path);
Mat4 mat4_from_json(const nlohmann::json& v, const std::string& where, const std::string& path);

}  // namespace bev
