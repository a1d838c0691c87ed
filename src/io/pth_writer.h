// Writes PyTorch zip checkpoints the way torch.save does (stored entries, data aligned to 64
// bytes, pickle protocol 2 with _rebuild_tensor_v2 and persistent-id storages), as mmcv's
// save_checkpoint lays them out: {'meta': {...}, 'state_dict': OrderedDict(...)}. The tests and the
// load benchmark use it to make checkpoints (large, malformed) without Python.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace bev {

struct PthWriteOptions {
  std::string prefix = "archive";                    // the archive's top folder
  nlohmann::json meta = nlohmann::json::object();    // plain data; arrays become lists
  bool mmcv_layout = true;                           // false: the state dict is the top-level object
  bool align_data = true;                            // pad entry data to 64 bytes, as torch does
};

std::vector<uint8_t> encode_pth(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                const PthWriteOptions& options = {});
// A ZIP archive of stored entries, data aligned to 64 bytes as torch does.
std::vector<uint8_t> encode_stored_zip(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& entries,
                                       bool align_data = true);

void write_pth(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
               const PthWriteOptions& options = {});

}  // namespace bev
