#include "io/checkpoint.h"

#include <cstring>

#include "bevformer/error.h"
#include "io/pth_reader.h"
#include "io/safetensors.h"
#include "io/zip_reader.h"

namespace bev {

const char* checkpoint_format_name(CheckpointFormat f) {
  return f == CheckpointFormat::kPyTorch ? "pytorch" : "safetensors";
}

void Checkpoint::add(std::string name, Tensor t) {
  if (index_.count(name)) throw Error(ErrorKind::kInvalidInput, "duplicate tensor name '" + name + "'").where(path);
  index_.emplace(name, tensors_.size());
  tensors_.emplace_back(std::move(name), std::move(t));
}

const Tensor* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second].second;
}

uint64_t Checkpoint::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [n, t] : tensors_) total += t.nbytes();
  return total;
}

std::shared_ptr<Storage> storage_over_source(const std::shared_ptr<const ByteSource>& source,
                                             uint64_t byte_offset, uint64_t byte_size, DType dtype) {
  const uint8_t* p = source->data() + byte_offset;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) == 0) {
    return Storage::borrow(const_cast<uint8_t*>(p), static_cast<size_t>(byte_size), source);
  }
  // Misaligned in the file (the writer did not pad): typed loads there would be undefined.
  auto s = Storage::allocate(static_cast<size_t>(byte_size));
  if (byte_size) std::memcpy(s->data(), p, static_cast<size_t>(byte_size));
  return s;
}

Tensor tensor_over_source(const std::shared_ptr<const ByteSource>& source, uint64_t byte_offset,
                          uint64_t byte_size, DType dtype, const Shape& shape, const Shape& strides,
                          int64_t offset_elems) {
  return Tensor::view_of(storage_over_source(source, byte_offset, byte_size, dtype), dtype, shape, strides,
                         offset_elems);
}

Checkpoint load_checkpoint(std::shared_ptr<const ByteSource> source, const LoadOptions& options) {
  if (looks_like_zip(source->span())) return read_pth(std::move(source), options);
  // safetensors: an 8-byte little-endian header length, then the header, which must begin with
  // '{'. Tested before the pickle magic: the length's first byte may be anything, 0x80 included
  // (a header of 128 + 256k bytes).
  const bool safetensors = source->size() >= 9 && read_le64(source->data()) <= source->size() - 8 && source->data()[8] == '{';
  if (safetensors) return read_safetensors(std::move(source));
  if (source->size() >= 2 && source->data()[0] == 0x80) return read_pth(std::move(source), options);  // names the legacy format
  // Neither signature matched. When the would-be safetensors header length cannot be right either,
  // say plainly that this is not a checkpoint rather than blaming a header it never had.
  if (source->size() < 8 || read_le64(source->data()) > source->size() - 8) {
    throw Error(ErrorKind::kInvalidInput, "not a checkpoint: neither a PyTorch archive (no ZIP signature) nor "
                                          "safetensors (its first 8 bytes are no valid header length)")
        .where(source->name())
        .expected("a .pth written by torch.save (torch >= 1.6) or a .safetensors file");
  }
  return read_safetensors(std::move(source));
}

Checkpoint load_checkpoint(const std::string& path, const LoadOptions& options) {
  return load_checkpoint(ByteSource::map_file(path), options);
}

}  // namespace bev
