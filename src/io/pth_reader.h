// PyTorch checkpoints (torch.save, zip format of torch >= 1.6): <prefix>/data.pkl (pickle),
// <prefix>/data/<key> (one raw little-endian storage per key), <prefix>/version, <prefix>/byteorder.
// The state dict is found under 'state_dict' (mmcv), 'model', or at the top level; the mmcv
// `meta` dict becomes CheckpointMeta. Optimizer state is parsed but never materialized.
#pragma once

#include <memory>

#include "io/byte_source.h"
#include "io/checkpoint.h"

namespace bev {

Checkpoint read_pth(std::shared_ptr<const ByteSource> source, const LoadOptions& options = {});

}  // namespace bev
