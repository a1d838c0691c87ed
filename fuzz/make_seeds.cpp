// Writes small seed inputs for the fuzz targets: DIR/fuzz_pth, DIR/fuzz_safetensors,
// DIR/fuzz_pickle. Small files keep every fuzz iteration fast.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

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
  for (const char* t : {"fuzz_pth", "fuzz_safetensors", "fuzz_pickle"}) std::filesystem::create_directories(dir / t);
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
  return 0;
}
