#include "runtime/prepare.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>

#include "bevformer/error.h"
#include "core/mat4.h"
#include "io/byte_source.h"
#include "io/image.h"

namespace bev {
namespace {

// nuScenes' camera slots (the insertion order of info['cams'], which indexes cams_embeds).
constexpr const char* kNuScenesSlots[] = {"CAM_FRONT",      "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT",
                                          "CAM_BACK",       "CAM_BACK_LEFT",   "CAM_BACK_RIGHT"};

std::string size_text(int w, int h) { return std::to_string(w) + "x" + std::to_string(h); }

std::string camera_place(const Frame& spec, size_t i) {
  return "cameras[" + std::to_string(i) + "] (" + spec.cameras[i].name + ")";
}

// Six nuScenes camera names in another order would silently feed each image to the wrong
// cams_embeds slot: refuse, naming the first camera out of place.
void check_nuscenes_order(const Frame& spec) {
  if (spec.cameras.size() != 6) return;
  size_t known = 0;
  for (const Camera& c : spec.cameras) {
    for (const char* s : kNuScenesSlots) known += c.name == s;
  }
  if (known != 6) return;
  for (size_t i = 0; i < 6; ++i) {
    if (spec.cameras[i].name != kNuScenesSlots[i]) {
      throw Error(ErrorKind::kInvalidInput, "the nuScenes cameras are out of slot order")
          .where(camera_place(spec, i))
          .expected(std::string(kNuScenesSlots[i]) +
                    " here (slot order CAM_FRONT, CAM_FRONT_RIGHT, CAM_FRONT_LEFT, CAM_BACK, CAM_BACK_LEFT, "
                    "CAM_BACK_RIGHT)")
          .hint("the camera's position in the list picks its learned camera embedding");
    }
  }
}

// A camera's decoded pixels (bevformer/frame.h ImagePixels) as the u8 [H, W, 3] BGR tensor a
// decoded file gives, borrowed (the owner rides along), after the checks a file's header gets.
Tensor camera_pixels(const Camera& cam, const std::string& place, const ImageConfig& ic) {
  const std::string name = place + " image (pixels)";
  if (!cam.image_path.empty() || !cam.image_bytes.empty()) {
    throw Error(ErrorKind::kInvalidInput, "the camera has decoded pixels and also an encoded image")
        .where(name)
        .expected("one image per camera");
  }
  const ImagePixels& px = cam.pixels;
  if (px.height <= 0 || px.width <= 0 || px.height * px.width > kMaxImagePixels) {
    throw Error(ErrorKind::kInvalidInput, "the pixels are " + std::to_string(px.width) + "x" + std::to_string(px.height))
        .where(name)
        .expected("a positive size of at most " + std::to_string(kMaxImagePixels) + " pixels");
  }
  if (px.width != ic.width || px.height != ic.height) {
    throw Error(ErrorKind::kInvalidInput, "the image is " + size_text(static_cast<int>(px.width), static_cast<int>(px.height)) +
                                              " but the model's camera rig is " + size_text(ic.width, ic.height))
        .where(name)
        .expected("every camera image at the config's size (" + size_text(ic.width, ic.height) + ")")
        .hint("K and lidar2img refer to the original image; resize happens inside (resize_scale " +
              std::to_string(ic.resize_scale) + ")");
  }
  const Shape shape{px.height, px.width, 3};
  const size_t bytes = static_cast<size_t>(px.height * px.width * 3);
  // Read only: preprocessing and rendering never write the decoded image.
  return Tensor::view_of(Storage::borrow(const_cast<uint8_t*>(px.data), bytes, px.owner), DType::kU8, shape,
                         contiguous_strides(shape), 0);
}

}  // namespace

Mat4 camera_lidar2img(const Camera& cam, const Mat4& T_ego_from_lidar) {
  if (cam.lidar2img) return *cam.lidar2img;
  if (!cam.K || !cam.T_ego_from_cam) {
    throw Error(ErrorKind::kInvalidInput, "has no calibration").where(cam.name).expected("K and T_ego_from_cam, or lidar2img");
  }
  const std::optional<Mat4> cam_from_ego = mat4_inverse(*cam.T_ego_from_cam);
  if (!cam_from_ego) throw Error(ErrorKind::kInvalidInput, "T_ego_from_cam is singular").where(cam.name);
  const Mat4 lidar2cam = mat4_mul(*cam_from_ego, T_ego_from_lidar);
  return mat4_mul(mat4_from_intrinsics(*cam.K), lidar2cam);
}

Mat4 scale_lidar2img(const Mat4& m, double s) {
  Mat4 out = m;
  for (int c = 0; c < 4; ++c) {
    out[c] = s * m[c];
    out[4 + c] = s * m[4 + c];
  }
  return out;
}

std::array<double, 4> rotation_quaternion_wxyz(const Mat4& t) {
  const double r00 = t[0], r01 = t[1], r02 = t[2];
  const double r10 = t[4], r11 = t[5], r12 = t[6];
  const double r20 = t[8], r21 = t[9], r22 = t[10];
  const double tr = r00 + r11 + r22;
  std::array<double, 4> q{};  // w, x, y, z
  if (tr > 0) {
    const double s = std::sqrt(tr + 1) * 2;
    q = {s / 4, (r21 - r12) / s, (r02 - r20) / s, (r10 - r01) / s};
  } else if (r00 > r11 && r00 > r22) {
    const double s = std::sqrt(1 + r00 - r11 - r22) * 2;
    q = {(r21 - r12) / s, s / 4, (r01 + r10) / s, (r02 + r20) / s};
  } else if (r11 > r22) {
    const double s = std::sqrt(1 + r11 - r00 - r22) * 2;
    q = {(r02 - r20) / s, (r01 + r10) / s, s / 4, (r12 + r21) / s};
  } else {
    const double s = std::sqrt(1 + r22 - r00 - r11) * 2;
    q = {(r10 - r01) / s, (r02 + r20) / s, (r12 + r21) / s, s / 4};
  }
  const double n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  const double sign = q[0] < 0 ? -1.0 : 1.0;
  for (double& v : q) v = sign * v / n;
  return q;
}

std::array<double, 18> absolute_can_bus(const Frame& spec) {
  if (!spec.T_world_from_ego) {
    if (!spec.can_bus) {
      throw Error(ErrorKind::kInvalidInput, "the frame has neither T_world_from_ego nor can_bus")
          .expected("the ego pose");
    }
    return *spec.can_bus;
  }
  // get_data_info: can_bus[:3] = ego2global translation, [3:7] = its rotation (w, x, y, z);
  // patch_angle = quaternion_yaw(rotation) / pi * 180 (+360 when negative);
  // can_bus[-2] = patch_angle / 180 * pi; can_bus[-1] = patch_angle.
  const Mat4& t = *spec.T_world_from_ego;
  std::array<double, 18> cb{};
  if (spec.can_bus) cb = *spec.can_bus;
  cb[0] = t[3];
  cb[1] = t[7];
  cb[2] = t[11];
  const auto q = rotation_quaternion_wxyz(t);
  for (int i = 0; i < 4; ++i) cb[3 + i] = q[i];
  const double yaw = std::atan2(t[4], t[0]);  // R @ [1, 0, 0] projected on the xy-plane
  double patch_angle = yaw / std::numbers::pi * 180;
  if (patch_angle < 0) patch_angle += 360;
  cb[16] = patch_angle / 180 * std::numbers::pi;
  cb[17] = patch_angle;
  return cb;
}

PreparedFrame prepare_frame(const Frame& spec, const ModelConfig& cfg, const std::string& base_dir,
                            ThreadPool* pool, Backend* staging) {
  namespace fs = std::filesystem;
  const ImageConfig& ic = cfg.image;
  const size_t n = spec.cameras.size();
  if (n != static_cast<size_t>(cfg.transformer.num_cams)) {
    throw Error(ErrorKind::kInvalidInput, "the frame has " + std::to_string(n) + " camera" + (n == 1 ? "" : "s"))
        .where("cameras")
        .expected(std::to_string(cfg.transformer.num_cams) + " (the model's camera slots, cams_embeds)");
  }
  check_nuscenes_order(spec);

  PreparedFrame p;
  p.stream = spec.stream;
  p.timestamp = spec.timestamp;
  p.scene = spec.scene.value_or("");
  p.T_world_from_ego = spec.T_world_from_ego;
  p.T_ego_from_lidar = spec.T_ego_from_lidar.value_or(mat4_identity());
  p.images.resize(n);
  p.camera_names.resize(n);
  p.lidar2img_original.resize(n);

  // The cameras' pixels side by side, as the image stage takes them (it preprocesses them itself).
  const Shape img_shape{static_cast<int64_t>(n), ic.height, ic.width, 3};
  Tensor img = staging != nullptr && staging->wants_staging() ? staging->host_empty(img_shape, DType::kU8)
                                                              : Tensor::empty(img_shape, DType::kU8);
  const size_t per_camera = static_cast<size_t>(3) * ic.height * ic.width;
  auto one = [&](size_t i) {
    const Camera& cam = spec.cameras[i];
    const std::string place = camera_place(spec, i);
    if (!cam.pixels.empty()) {
      std::memcpy(img.data<uint8_t>() + i * per_camera, camera_pixels(cam, place, ic).data<uint8_t>(), per_camera);
      p.camera_names[i] = cam.name;
      p.lidar2img_original[i] = camera_lidar2img(cam, p.T_ego_from_lidar);
      return;
    }
    std::shared_ptr<const ByteSource> file;
    std::span<const uint8_t> bytes = cam.image_bytes.bytes;
    std::string name = place + " image (base64)";
    if (!cam.image_path.empty()) {
      const fs::path path = fs::path(cam.image_path).is_absolute() ? fs::path(cam.image_path) : fs::path(base_dir) / cam.image_path;
      name = place + " image " + path.string();
      try {
        file = ByteSource::map_file(path.string(), kMaxImageFileBytes);
      } catch (Error& e) {
        throw e.where(name);
      }
      bytes = file->span();
    }
    const ImageHeader h = inspect_image(bytes, name);
    if (h.width != ic.width || h.height != ic.height) {
      throw Error(ErrorKind::kInvalidInput, "the image is " + size_text(h.width, h.height) +
                                                " but the model's camera rig is " + size_text(ic.width, ic.height))
          .where(name)
          .expected("every camera image at the config's size (" + size_text(ic.width, ic.height) + ")")
          .hint("K and lidar2img refer to the original image; resize happens inside (resize_scale " +
                std::to_string(ic.resize_scale) + ")");
    }
    decode_image_into(bytes, name, img.select(0, static_cast<int64_t>(i)));
    p.camera_names[i] = cam.name;
    p.lidar2img_original[i] = camera_lidar2img(cam, p.T_ego_from_lidar);
  };
  if (pool != nullptr && pool->size() > 1) {
    pool->parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) one(static_cast<size_t>(i));
    });
  } else {
    for (size_t i = 0; i < n; ++i) one(i);
  }

  for (size_t i = 0; i < n; ++i) p.images[i] = img.select(0, static_cast<int64_t>(i));
  p.input.img = std::move(img);
  p.input.lidar2img.resize(n);
  for (size_t i = 0; i < n; ++i) p.input.lidar2img[i] = scale_lidar2img(p.lidar2img_original[i], ic.resize_scale);
  p.input.can_bus = absolute_can_bus(spec);
  p.input.scene_token = spec.scene ? *spec.scene : spec.stream;
  return p;
}

}  // namespace bev
