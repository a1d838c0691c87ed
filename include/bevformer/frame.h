// A frame as the engine takes it (DESIGN §4, docs/FORMATS.md "Frames"): one multi-camera frame
// of a stream — stream id, timestamp, optional scene and sample token, ego pose, the BEV (lidar)
// frame's pose in the ego frame, optional raw CAN-bus values, and per camera its image (a file, or
// encoded bytes) with either intrinsics + extrinsics or a ready lidar2img. parse_frame reads the
// frame JSON into it with every check; callers that have the parts already (a server, a Python
// binding) fill it directly and hand it to Model::detect, so nothing is written out as text and
// parsed again.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bev {

using Mat3 = std::array<double, 9>;   // row-major 3x3
using Mat4 = std::array<double, 16>;  // row-major 4x4

// Encoded image bytes (JPEG or PNG) that the frame does not copy: a view, and whatever keeps the
// viewed memory alive (null when the caller guarantees it for the duration of a call).
struct ImageBytes {
  std::shared_ptr<const void> owner;
  std::span<const uint8_t> bytes;

  bool empty() const { return bytes.empty(); }
  size_t size() const { return bytes.size(); }
  // An owning copy of `data`.
  static ImageBytes copy_of(std::span<const uint8_t> data);
  // Takes the vector over (no copy).
  static ImageBytes adopt(std::vector<uint8_t> data);
  bool operator==(const ImageBytes& other) const;  // the same bytes
};

// Decoded pixels instead of an encoded image (the Python binding's HxWx3 uint8 arrays): height
// rows of width x 3 bytes, contiguous, in BGR order (what decoding a file gives, mmcv.imread's
// order). Not copied: `owner` keeps them alive (null when the caller guarantees it for the
// duration of a call). They enter the test pipeline exactly where a decoded file's pixels do, so
// a PNG of the same pixels gives the same detections bit for bit.
struct ImagePixels {
  std::shared_ptr<const void> owner;
  const uint8_t* data = nullptr;
  int64_t height = 0, width = 0;

  bool empty() const { return data == nullptr; }
  bool operator==(const ImagePixels& other) const;  // the same size and pixels
};

struct Camera {
  std::string name;                    // unique in the frame (nuScenes: CAM_FRONT, ...)
  std::string image_path;              // a file, relative to the frame file's folder; "" when image_bytes is set
  ImageBytes image_bytes;              // the encoded image, when it came inline or attached
  std::optional<Mat3> K;               // intrinsics at the image's own resolution
  std::optional<Mat4> T_ego_from_cam;  // p_ego = T p_cam (camera x right, y down, z forward)
  std::optional<Mat4> lidar2img;       // instead of K + T_ego_from_cam
  ImagePixels pixels;                  // decoded pixels instead of a file or bytes (never parsed from JSON)
  bool operator==(const Camera&) const = default;
};

struct Frame {
  std::string stream;                      // the stream (history) this frame belongs to
  double timestamp = 0;                    // seconds, |t| <= 1e11
  std::optional<std::string> scene;        // a change of token resets the history
  std::optional<std::string> token;        // the sample token (keys results_nusc.json)
  std::optional<Mat4> T_world_from_ego;    // ego pose (world z-up, ego x forward)
  std::optional<Mat4> T_ego_from_lidar;    // the BEV frame in the ego frame; identity if absent
  std::optional<std::array<double, 18>> can_bus;  // raw nuScenes layout (spec §3)
  std::vector<Camera> cameras;             // in the model's camera slot order
  bool operator==(const Frame&) const = default;
};

// The frame JSON text (docs/FORMATS.md) with every check; Error(kInvalidInput) names the field
// path ("request frame: cameras[2].K"); `where` names the source.
Frame parse_frame(std::string_view json, const std::string& where = "frame");
// A frame JSON file (a regular file of at most 1 GiB); image paths stay relative to its folder.
Frame read_frame(const std::string& path);
// The frame as JSON text (inline images base64-encoded, decoded pixels as a base64 PNG of them);
// parse_frame of it gives an equal Frame, except that pixels come back as the PNG's bytes.
std::string frame_json(const Frame& frame);

// A JPEG or PNG decoded as the engine decodes a camera image (BGR, every damage refused:
// Error(kInvalidInput) naming `name`), into pixels that own their memory.
ImagePixels decode_image_pixels(std::span<const uint8_t> bytes, const std::string& name = "image");
// The same from a file (Error(kNotFound) when it does not exist, kIo when it cannot be read).
ImagePixels read_image_pixels(const std::string& path);

// Frame `index` of a synthetic drive for a config (a preset name or a config file): one smooth
// pattern plus seeded noise per camera at the config's image size (the same bytes for the same
// config, seed and index everywhere), lidar2img of six cameras around the ego at the image's
// own resolution, the ego 1 m forward and 2 degrees left per frame, stream and scene
// "synthetic-<seed>". For trying the engine, benchmarks and tests without a dataset.
Frame synthetic_camera_frame(const std::string& config, uint64_t seed, int index);

}  // namespace bev
