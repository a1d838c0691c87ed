// A loaded checkpoint: tensors by name (upstream's state_dict names, in file order) plus the
// metadata a checkpoint carries. Both readers produce this; tensors point into the memory-mapped
// file when its bytes are aligned for their dtype (zero copy), else into an aligned copy.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/byte_source.h"

namespace bev {

enum class CheckpointFormat { kPyTorch, kSafetensors };
const char* checkpoint_format_name(CheckpointFormat f);

struct CheckpointMeta {
  nlohmann::json raw = nlohmann::json::object();  // mmcv `meta` (pth) or `__metadata__` (safetensors)
  std::vector<std::string> classes;               // meta CLASSES, when present
  std::string mmcv_version;                       // meta mmcv_version, when present
  std::string config_text;                        // meta config (the training config's text)
  std::vector<std::string> top_level_keys;        // pth: keys of the saved dict ('meta', 'state_dict', ...)
  std::string state_dict_key;                     // pth: where the tensors came from ("state_dict", "" = top)
  std::vector<std::string> skipped_entries;       // pth: state_dict entries that are not tensors (also
                                                  // raw["skipped_entries"] when raw is an object)
};

class Checkpoint {
 public:
  std::string path;
  CheckpointFormat format = CheckpointFormat::kPyTorch;
  uint64_t file_bytes = 0;
  CheckpointMeta meta;

  void add(std::string name, Tensor t);  // throws on a duplicate name
  const std::vector<std::pair<std::string, Tensor>>& tensors() const { return tensors_; }
  const Tensor* find(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  uint64_t tensor_bytes() const;

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

struct LoadOptions {
  bool verify_crc = true;  // pth: check every archive entry's CRC-32 (detects bit flips)
};

// Picks the reader by content (ZIP magic -> PyTorch, else safetensors), not by extension.
Checkpoint load_checkpoint(const std::string& path, const LoadOptions& options = {});
Checkpoint load_checkpoint(std::shared_ptr<const ByteSource> source, const LoadOptions& options = {});

// A storage over `byte_size` bytes of `source` at `byte_offset`: zero copy when the address is
// aligned for `dtype`, else an aligned copy. The caller has checked that the range is in bounds.
std::shared_ptr<Storage> storage_over_source(const std::shared_ptr<const ByteSource>& source,
                                             uint64_t byte_offset, uint64_t byte_size, DType dtype);
Tensor tensor_over_source(const std::shared_ptr<const ByteSource>& source, uint64_t byte_offset,
                          uint64_t byte_size, DType dtype, const Shape& shape, const Shape& strides,
                          int64_t offset_elems);

}  // namespace bev
