// Pictures of what the engine sees: the six camera images with the 3D boxes projected into them,
// and a top-down BEV panel, in one PNG or JPEG. Images are bev::Tensor u8 [H, W, 3] BGR; no OpenCV type
// appears here.
//
// Box convention: bev::Detection's box [x, y, z_bottom, w, l, h, yaw, vx, vy] in the LiDAR frame
// (x right, y forward, z up), the heading (direction of the front face) being box_heading() =
// -yaw - pi/2 (io/detections_json.h). Ground truth in mmdetection3d >= 1.0 form converts with
// box_from_mmdet3d_info(); detections and ground truth then share box_corners().
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/detection.h"
#include "io/detections_json.h"

namespace bev {

// The 8 corners of a box in its own frame, metres. Corner order: bottom face 0..3, top face 4..7
// (corner i + 4 above corner i); 0 front-left, 1 front-right, 2 back-right, 3 back-left, where
// front = +heading and left = heading + 90 degrees. The front face is {0, 1, 5, 4}.
std::array<std::array<double, 3>, 8> box_corners(const Box9& box);
// The 12 edges as corner index pairs: bottom 4, top 4, verticals 4.
extern const std::array<std::array<int, 2>, 12> kBoxEdges;

// Points closer than this to the camera plane (metres) count as behind it.
inline constexpr double kMinDepth = 0.1;

struct ProjectedBox {
  std::array<std::array<double, 2>, 8> uv{};  // pixels (u right, v down); meaningful where depth > kMinDepth
  std::array<double, 8> depth{};              // camera-frame depth (the homogeneous w)
  std::array<bool, 8> visible{};              // depth > kMinDepth and inside [0, width) x [0, height)
  int num_visible = 0;
  std::array<double, 2> center_uv{};          // the gravity centre
  double center_depth = 0;
  bool center_visible = false;
};
// Projects the corners and the gravity centre through lidar2img (4x4 row-major, K at the image's
// own resolution, as upstream builds it: [K 0; 0 1] @ T_cam_from_lidar) into a width x height image.
ProjectedBox project_box_corners(const Box9& box, const std::array<double, 16>& lidar2img, int width, int height);

struct CameraView {
  std::string name;                    // "CAM_FRONT", ... (decides the tile; see RenderInput)
  Tensor image;                        // u8 [H, W, 3] BGR, on the host
  std::array<double, 16> lidar2img{};  // row-major, at this image's resolution
};

struct RenderInput {
  // The cameras in nuScenes slot order (CAM_FRONT, CAM_FRONT_RIGHT, CAM_FRONT_LEFT, CAM_BACK,
  // CAM_BACK_LEFT, CAM_BACK_RIGHT). They are laid out as nuScenes shows them: FRONT_LEFT, FRONT,
  // FRONT_RIGHT above BACK_LEFT, BACK, BACK_RIGHT, placed by name (with or without "CAM_"), or by
  // slot when the names are not nuScenes'; more than six cameras go on further rows of three.
  std::vector<CameraView> cameras;
  std::vector<Detection> detections;
  std::vector<std::string> class_names;  // indexed by Detection::label
  std::vector<Detection> ground_truth;   // drawn white and dashed; label indexes class_names

  std::string stream;
  double timestamp = 0;
  int64_t frame_index = 0;
  std::optional<bool> used_history;  // said in the title when known (a video shows where history starts)
  std::string model;
  // Untrained weights: the title says the boxes are meaningless, and the untrained_top_n best
  // boxes are drawn whatever their score (random weights give scores near 0.1-0.5, so a fixed
  // threshold would draw nothing or everything).
  bool untrained = false;
  float score_threshold = 0.3f;  // detections drawn: score >= this (trained weights)
  int untrained_top_n = 30;

  std::array<float, 4> bev_range = {-51.2f, -51.2f, 51.2f, 51.2f};  // x_min, y_min, x_max, y_max (m)
  int tile_width = 640;  // a camera tile's width; its height keeps the first camera's aspect
};

struct RenderSize {
  int width = 0;
  int height = 0;
};
// The picture's size for this input (what render_frame returns).
RenderSize render_size(const RenderInput& input);

// The picture: u8 [H, W, 3] BGR. A title band (stream, frame, timestamp, counts, threshold, and
// the untrained warning in red), the camera mosaic on the left, the BEV panel on the right, a
// legend band (class colours, ground truth) at the bottom.
Tensor render_frame(const RenderInput& input);
// The picture as PNG bytes (io/image.h's encode_image; decode_image reads it back).
std::vector<uint8_t> render_frame_png(const RenderInput& input);
// The encoding a picture path asks for by its extension: ".png", or ".jpg" for .jpg / .jpeg (any
// case); Error(kInvalidInput) naming both for anything else, so a caller can check a path before
// any work.
std::string picture_format(const std::string& path);
// Writes the picture to `path` as PNG or JPEG by its extension (Error kInvalidInput for another
// extension, kIo when it cannot be written).
void render_frame_to_file(const RenderInput& input, const std::string& path);

}  // namespace bev
