// Writes small seed inputs for the fuzz targets: DIR/fuzz_pth, DIR/fuzz_safetensors,
// DIR/fuzz_pickle, DIR/fuzz_frame_json. Small files keep every fuzz iteration fast.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "io/frame_json.h"
#include "io/image.h"
#include "io/pth_writer.h"
#include "io/safetensors.h"
#include "io/zip_reader.h"

namespace {

void write(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

bev::Tensor filled(const bev::Shape& s, bev::DType t, uint32_t seed) {
  bev::Tensor x = bev::Tensor::empty(s, t);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(x.raw_data());
  for (size_t i = 0; i < x.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() & (t == bev::DType::kBool ? 1 : 0xff));
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  for (const char* t : {"fuzz_pth", "fuzz_safetensors", "fuzz_pickle", "fuzz_frame_json"}) {
    std::filesystem::create_directories(dir / t);
  }
  using bev::DType;
  const std::vector<std::vector<std::pair<std::string, bev::Tensor>>> sets = {
      {{"w", filled({3, 2}, DType::kF32, 1)}},
      {{"a.weight", filled({2, 3, 1, 1}, DType::kF32, 2)}, {"a.num_batches_tracked", filled({}, DType::kI64, 3)},
       {"h", filled({5}, DType::kF16, 4)}, {"b", filled({2}, DType::kBF16, 5)}, {"m", filled({3}, DType::kBool, 6)}},
      {{"x", filled({0}, DType::kF64, 7)}, {"y", filled({4}, DType::kI8, 8)}},
  };
  int i = 0;
  for (const auto& s : sets) {
    bev::PthWriteOptions o;
    o.meta = {{"CLASSES", {"car", "truck"}}, {"mmcv_version", "1.4.0"}, {"epoch", 1}, {"lr", 0.5}, {"none", nullptr}};
    o.mmcv_layout = (i % 2) == 0;
    const auto pth = bev::encode_pth(s, o);
    write(dir / "fuzz_pth" / ("seed" + std::to_string(i)), pth);
    write(dir / "fuzz_safetensors" / ("seed" + std::to_string(i)), bev::encode_safetensors(s, {{"format", "pt"}}));
    bev::ZipReader zip(bev::ByteSource::from_bytes(pth, "seed"));
    const auto pkl = zip.data(*zip.find("archive/data.pkl"));
    write(dir / "fuzz_pickle" / ("seed" + std::to_string(i)), std::vector<uint8_t>(pkl.begin(), pkl.end()));
    ++i;
  }
  // Frames: K + extrinsics with an inline PNG, a ready lidar2img with an image path, can_bus only;
  // and a tiny PNG and JPEG on their own (the target decodes inputs that look like images).
  const bev::Tensor pixels = filled({3, 4, 3}, DType::kU8, 9);
  const std::vector<uint8_t> png = bev::encode_image(pixels, ".png");
  const std::vector<uint8_t> jpg = bev::encode_image(pixels, ".jpg");
  write(dir / "fuzz_frame_json" / "image0", png);
  write(dir / "fuzz_frame_json" / "image1", jpg);
  bev::Frame f;
  f.stream = "car-1";
  f.timestamp = 1533151603.54759;
  f.scene = "scene-0001";
  f.T_world_from_ego = bev::Mat4{0, -1, 0, 411.3, 1, 0, 0, 1180.9, 0, 0, 1, 0, 0, 0, 0, 1};
  f.T_ego_from_lidar = bev::Mat4{0, 1, 0, 0.94, -1, 0, 0, 0, 0, 0, 1, 1.84, 0, 0, 0, 1};
  bev::Camera a;
  a.name = "CAM_FRONT";
  a.image_bytes = bev::ImageBytes::adopt(png);
  a.K = bev::Mat3{88.6, 0, 57.1, 0, 88.6, 34.4, 0, 0, 1};
  a.T_ego_from_cam = bev::Mat4{0, 0, 1, 1.7, -1, 0, 0, 0, 0, -1, 0, 1.5, 0, 0, 0, 1};
  bev::Camera b;
  b.name = "CAM_BACK";
  b.image_path = "images/back.jpg";
  b.lidar2img = bev::Mat4{88.4, 57.4, 1.66, -42.3, 0.47, 36.0, -88.0, -54.9, -0.0036, 0.9998, 0.0186, -0.759, 0, 0, 0, 1};
  f.cameras = {a, b};
  auto text = [](const bev::Frame& spec) {
    const std::string t = bev::frame_json_text(spec);
    return std::vector<uint8_t>(t.begin(), t.end());
  };
  write(dir / "fuzz_frame_json" / "frame0", text(f));
  f.T_world_from_ego.reset();
  f.T_ego_from_lidar.reset();
  f.scene.reset();
  f.can_bus = std::array<double, 18>{411.3, 1180.9, 0, 0.7071067811865476, 0, 0, 0.7071067811865476, 0.2, -0.1, 9.8,
                                     0, 0, 0.01, 5.1, 0, 0, 1.5707963267948966, 90};
  f.cameras = {b};
  write(dir / "fuzz_frame_json" / "frame1", text(f));
  return 0;
}
