// Checkpoint inspection, the public face of the native readers: what a checkpoint holds, and
// whether it fits a model config. Works on official BEVFormer .pth files and on safetensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bev {

struct TensorSummary {
  std::string name;
  std::string dtype;           // "f32", "i64", ...
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

struct ConfigCheck {
  std::string config;           // preset name or file it came from
  std::string config_summary;   // a few lines describing the model
  bool ok = false;
  size_t matched = 0;
  int64_t expected_parameters = 0;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
  struct Mismatch {
    std::string name, expected, got;
  };
  std::vector<Mismatch> mismatched;
  std::string report;           // the human-readable report
};

struct CheckpointReport {
  std::string path;
  std::string format;           // "pytorch" or "safetensors"
  uint64_t file_bytes = 0;
  uint64_t tensor_bytes = 0;
  int64_t elements = 0;
  std::vector<TensorSummary> tensors;  // in file order
  std::string meta_json;               // the checkpoint's metadata as JSON text
  std::vector<std::string> classes;
  std::string mmcv_version;
  std::string config_text;
  std::vector<std::string> top_level_keys;
  bool has_config_check = false;
  ConfigCheck config_check;
};

struct InspectOptions {
  std::string config;       // "" (none), a preset (tiny|small|base) or a JSON config file
  bool verify_crc = true;   // .pth: verify every archive entry's CRC-32
};

// Throws bev::Error on unreadable or malformed files and on a bad config.
CheckpointReport inspect_checkpoint(const std::string& path, const InspectOptions& options = {});

}  // namespace bev
