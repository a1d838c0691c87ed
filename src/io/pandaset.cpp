#include "io/pandaset.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "bevformer/error.h"
#include "io/byte_source.h"
#include "io/frame_json.h"
#include "io/image.h"

namespace bev {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;

json parse_json(std::string_view text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidInput, std::string("not JSON: ") + e.what()).where(where);
  }
}

std::string read_text(const fs::path& path) {
  return read_regular_file(path.string(), kMaxJsonBytes, "PandaSet file");
}

double number(const json& v, const char* key, const std::string& where) {
  if (!v.is_object() || !v.contains(key) || !v[key].is_number() || !std::isfinite(v[key].get<double>())) {
    throw Error(ErrorKind::kInvalidInput, std::string("no finite number \"") + key + "\"").where(where);
  }
  return v[key].get<double>();
}

// A rigid transform's inverse, [R^T, -R^T t]: exact where the general inverse would round.
Mat4 rigid_inverse(const Mat4& m) {
  Mat4 out = mat4_identity();
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) out[r * 4 + c] = m[c * 4 + r];
  }
  for (int r = 0; r < 3; ++r) {
    out[r * 4 + 3] = -(out[r * 4 + 0] * m[3] + out[r * 4 + 1] * m[7] + out[r * 4 + 2] * m[11]);
  }
  return out;
}

// A folder of the output, created if missing (Error kIo naming it when it cannot be).
void make_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create the output folder: " + ec.message()).where(dir.string());
}

std::string two_digits(size_t k) {
  const std::string s = std::to_string(k);
  return s.size() < 2 ? "0" + s : s;
}

// The camera image at the requested size (written under out/images) or as it is; returns the
// path the frame names, relative to out_dir, and the scale applied to K.
std::string place_image(const fs::path& src, const fs::path& out_dir, const std::string& camera, size_t k,
                        const PandasetOptions& o, double* sx, double* sy) {
  *sx = *sy = 1;
  if (o.width <= 0 || o.height <= 0) {
    if (!fs::is_regular_file(src)) throw Error(ErrorKind::kNotFound, "no such image").where(src.string());
    return fs::absolute(src).lexically_normal().lexically_relative(fs::absolute(out_dir).lexically_normal()).string();
  }
  const Tensor img = read_image(src.string());
  const int w = static_cast<int>(img.size(1)), h = static_cast<int>(img.size(0));
  const fs::path rel = fs::path("images") / camera / (two_digits(k) + ".jpg");
  make_folder(out_dir / rel.parent_path());
  Tensor out = img;
  if (w != o.width || h != o.height) {
    const cv::Mat m(h, w, CV_8UC3, const_cast<void*>(img.raw_data()));
    cv::Mat resized;
    cv::resize(m, resized, cv::Size(o.width, o.height), 0, 0, cv::INTER_AREA);
    out = Tensor::empty({o.height, o.width, 3}, DType::kU8);
    std::memcpy(out.raw_data(), resized.data, out.nbytes());
  }
  *sx = static_cast<double>(o.width) / w;
  *sy = static_cast<double>(o.height) / h;
  const std::vector<uint8_t> bytes = encode_image(out, ".jpg");
  const fs::path dst = out_dir / rel;
  FILE* f = std::fopen(dst.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    if (f) std::fclose(f);
    throw Error(ErrorKind::kIo, "cannot write the image").where(dst.string());
  }
  return rel.string();
}

}  // namespace

Mat4 pandaset_ego_from_lidar() { return {0, 1, 0, 0, -1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1}; }

Mat4 pandaset_pose(double x, double y, double z, double qw, double qx, double qy, double qz) {
  const double n = std::sqrt(qw * qw + qx * qx + qy * qy + qz * qz);
  const double w = qw / n, a = qx / n, b = qy / n, c = qz / n;
  return {1 - 2 * (b * b + c * c), 2 * (a * b - c * w),     2 * (a * c + b * w),     x,
          2 * (a * b + c * w),     1 - 2 * (a * a + c * c), 2 * (b * c - a * w),     y,
          2 * (a * c - b * w),     2 * (b * c + a * w),     1 - 2 * (a * a + b * b), z,
          0,                       0,                       0,                       1};
}

std::vector<Mat4> parse_pandaset_poses(std::string_view text, const std::string& where) {
  const json j = parse_json(text, where);
  if (!j.is_array()) throw Error(ErrorKind::kInvalidInput, "not a list of poses").where(where);
  std::vector<Mat4> out;
  for (size_t k = 0; k < j.size(); ++k) {
    const std::string at = where + ": [" + std::to_string(k) + "]";
    if (!j[k].is_object() || !j[k].contains("position") || !j[k].contains("heading")) {
      throw Error(ErrorKind::kInvalidInput, "a pose without \"position\" and \"heading\"").where(at);
    }
    const json& p = j[k]["position"];
    const json& h = j[k]["heading"];
    const double qw = number(h, "w", at + ".heading"), qx = number(h, "x", at + ".heading"),
                 qy = number(h, "y", at + ".heading"), qz = number(h, "z", at + ".heading");
    // The norm in long double: squares of finite doubles near DBL_MAX would overflow to inf.
    const long double n2 = static_cast<long double>(qw) * qw + static_cast<long double>(qx) * qx +
                           static_cast<long double>(qy) * qy + static_cast<long double>(qz) * qz;
    if (!(std::abs(std::sqrt(n2) - 1) <= 1e-3)) {
      throw Error(ErrorKind::kInvalidInput, "the heading is not a unit quaternion").where(at + ".heading");
    }
    out.push_back(pandaset_pose(number(p, "x", at + ".position"), number(p, "y", at + ".position"),
                                number(p, "z", at + ".position"), qw, qx, qy, qz));
  }
  return out;
}

std::vector<double> parse_pandaset_timestamps(std::string_view text, const std::string& where) {
  const json j = parse_json(text, where);
  if (!j.is_array()) throw Error(ErrorKind::kInvalidInput, "not a list of timestamps").where(where);
  std::vector<double> out;
  for (size_t k = 0; k < j.size(); ++k) {
    if (!j[k].is_number() || !std::isfinite(j[k].get<double>())) {
      throw Error(ErrorKind::kInvalidInput, "not a finite number").where(where + ": [" + std::to_string(k) + "]");
    }
    out.push_back(j[k].get<double>());
  }
  return out;
}

Mat3 parse_pandaset_intrinsics(std::string_view text, const std::string& where) {
  const json in = parse_json(text, where);
  const double fx = number(in, "fx", where), fy = number(in, "fy", where);
  if (!(fx > 0 && fy > 0)) {
    throw Error(ErrorKind::kInvalidInput, "focal lengths fx " + std::to_string(fx) + ", fy " + std::to_string(fy))
        .where(where)
        .expected("both positive (pixels)");
  }
  return {fx, 0, number(in, "cx", where), 0, fy, number(in, "cy", where), 0, 0, 1};
}

std::vector<std::string> convert_pandaset_sequence(const std::string& seq_dir, const std::string& out_dir,
                                                   const PandasetOptions& o) {
  const fs::path seq(seq_dir);
  if (!fs::is_directory(seq)) {
    throw Error(ErrorKind::kNotFound, "no such sequence folder").where(seq_dir).expected("a PandaSet sequence (camera/, lidar/)");
  }
  if ((o.width > 0) != (o.height > 0)) {
    throw Error(ErrorKind::kInvalidInput, "image size " + std::to_string(o.width) + "x" + std::to_string(o.height))
        .expected("both positive, or both 0 for the originals");
  }
  const fs::path lidar_poses_path = seq / "lidar" / "poses.json", lidar_times_path = seq / "lidar" / "timestamps.json";
  const std::vector<Mat4> lidar_poses = parse_pandaset_poses(read_text(lidar_poses_path), lidar_poses_path.string());
  const std::vector<double> times = parse_pandaset_timestamps(read_text(lidar_times_path), lidar_times_path.string());
  if (lidar_poses.size() != times.size() || times.empty()) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(lidar_poses.size()) + " lidar poses and " +
                                              std::to_string(times.size()) + " timestamps")
        .where((seq / "lidar").string())
        .expected("one pose per timestamp, at least one");
  }
  struct CameraFiles {
    Mat3 K{};
    std::vector<Mat4> poses;
  };
  std::vector<CameraFiles> cams;
  for (const char* name : kPandasetCameras) {
    const fs::path dir = seq / "camera" / name;
    const fs::path intrinsics = dir / "intrinsics.json", poses = dir / "poses.json";
    CameraFiles c;
    c.K = parse_pandaset_intrinsics(read_text(intrinsics), intrinsics.string());
    c.poses = parse_pandaset_poses(read_text(poses), poses.string());
    if (c.poses.size() != times.size()) {
      throw Error(ErrorKind::kInvalidInput, std::to_string(c.poses.size()) + " camera poses for " +
                                                std::to_string(times.size()) + " lidar frames")
          .where((dir / "poses.json").string());
    }
    cams.push_back(std::move(c));
  }
  const std::string stream = o.stream.empty() ? seq.lexically_normal().filename().string() : o.stream;
  const std::string sequence = seq.lexically_normal().filename().string();
  const Mat4 ego_from_lidar = pandaset_ego_from_lidar(), lidar_from_ego = rigid_inverse(ego_from_lidar);

  // Every frame is built and checked as detect will read it (parse_frame_json: the timestamp's
  // bound, rigid poses, finite numbers) before anything is written, as convert-info does: a
  // sequence with one bad frame writes nothing, and never frames detect would refuse.
  std::vector<std::string> written;
  for (size_t pass = 0; pass < 2; ++pass) {
    const bool place = pass == 1;
    if (place) make_folder(out_dir);
    for (size_t k = 0; k < times.size(); ++k) {
      Frame f;
      f.stream = stream;
      f.timestamp = times[k];
      f.scene = sequence;
      f.token = sequence + "/" + two_digits(k);
      const Mat4 world_from_ego = mat4_mul(lidar_poses[k], lidar_from_ego);
      const Mat4 ego_from_world = rigid_inverse(world_from_ego);
      f.T_world_from_ego = world_from_ego;
      f.T_ego_from_lidar = ego_from_lidar;
      for (size_t i = 0; i < cams.size(); ++i) {
        Camera cam;
        cam.name = kPandasetSlotNames[i];
        double sx = 1, sy = 1;
        const fs::path src = seq / "camera" / kPandasetCameras[i] / (two_digits(k) + ".jpg");
        if (place) {
          cam.image_path = place_image(src, out_dir, kPandasetCameras[i], k, o, &sx, &sy);
        } else {
          if (!fs::is_regular_file(src)) throw Error(ErrorKind::kNotFound, "no such image").where(src.string());
          cam.image_path = src.string();  // not read: the first pass writes nothing
        }
        Mat3 K = cams[i].K;
        K[0] *= sx;
        K[2] *= sx;
        K[4] *= sy;
        K[5] *= sy;
        cam.K = K;
        cam.T_ego_from_cam = mat4_mul(ego_from_world, cams[i].poses[k]);
        f.cameras.push_back(std::move(cam));
      }
      char name[48];
      std::snprintf(name, sizeof name, "frame_%04zu.json", k);
      const std::string path = (fs::path(out_dir) / name).string();
      if (!place) {
        parse_frame_json(frame_json_text(f), path);
        continue;
      }
      write_frame_json(path, f);  // whole or not at all (write_file_atomically)
      written.push_back(path);
    }
  }
  return written;
}

}  // namespace bev
