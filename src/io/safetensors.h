// safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the raw little-endian data.
// The reader validates the header the way the reference implementation does (dtypes, shapes
// that match the byte ranges, ranges that tile the data exactly) and maps tensors zero-copy.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/byte_source.h"
#include "io/checkpoint.h"

namespace bev {

Checkpoint read_safetensors(std::shared_ptr<const ByteSource> source);

// Writes `tensors` (any dtype, any strides: written contiguous) in order, with the header padded
// to a multiple of 8 bytes so every tensor is aligned for its dtype when mapped.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
std::vector<uint8_t> encode_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});

}  // namespace bev
