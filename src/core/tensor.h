// Tensor: a strided view (shape, strides in elements, element offset) into a shared Storage.
// Storage is either owned (64-byte aligned heap memory), borrowed from a longer-lived owner (a
// memory-mapped checkpoint, a backend's arena), or memory a backend allocated; the device tag
// says which memory space it is. Only kCpu memory is the host's to read and write: the host
// accessors (raw_data, data<T>, bytes, clone, to) refuse any other, and backends reach theirs
// through device_ptr().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bevformer/error.h"
#include "core/dtype.h"
#include "core/small_vector.h"

namespace bev {

// kCpu: host memory. kCuda: a CUDA device's. kForeign: host memory that only the foreign test
// backend may touch (backend/foreign), so that a host access the runtime should not make fails.
enum class Device : uint8_t { kCpu, kCuda, kForeign };
const char* device_name(Device d);

// Extents (or strides) of a tensor, inline up to rank 8: copying a tensor or making a view never
// allocates (see small_vector.h).
using Shape = SmallVector<int64_t, 8>;

std::string shape_str(const Shape& shape);  // "[6, 3, 64, 128]"
// Product of the extents; throws Error on a negative extent or on overflow of int64.
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

class Storage {
 public:
  // Owned, 64-byte aligned, uninitialized host memory.
  static std::shared_ptr<Storage> allocate(size_t bytes);
  // Memory that `owner` keeps alive (for example a file mapping); not freed by the Storage.
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes, std::shared_ptr<const void> owner,
                                         Device device = Device::kCpu);
  // Memory released by `deleter` (backends use this for device allocations).
  static std::shared_ptr<Storage> adopt(void* data, size_t bytes, Device device,
                                        std::function<void(void*)> deleter);
  // bytes [offset, offset + bytes) of `parent`, on its device, keeping it alive (a recorded
  // stage's buffers in its arena).
  static std::shared_ptr<Storage> slice(std::shared_ptr<Storage> parent, size_t offset, size_t bytes);
  // A buffer whose size is known but whose memory comes later (a recorded stage's
  // intermediates: the stage places them in its arena, or in backend memory of their own).
  // Reading its data before then is an internal error.
  static std::shared_ptr<Storage> deferred(size_t bytes);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool is_deferred() const { return deferred_; }
  // Gives a deferred storage the memory of `memory` (at least as many bytes, any device), which
  // it keeps alive; a no-op for any other storage.
  void place(std::shared_ptr<Storage> memory);
  // An execution's binding (Backend::execute): until unbind(), this storage addresses `target`'s
  // memory from `byte_offset` on. Only a backend does this, to a storage of its own, while it runs
  // the stage that holds it.
  void bind_to(const Storage& target, size_t byte_offset);
  void unbind();
  // Host memory a backend gave for staging (Backend::host_empty): the backend it came from, which
  // copies from and to it without a bounce buffer (page-locked on a device); null otherwise.
  const void* staging_owner() const { return staging_owner_; }
  void set_staging_owner(const void* backend) { staging_owner_ = backend; }

 private:
  Storage() = default;
  bool deferred_ = false;
  void* data_ = nullptr;
  void* unbound_data_ = nullptr;  // data_ while bound elsewhere
  size_t bytes_ = 0;
  Device device_ = Device::kCpu;
  const void* staging_owner_ = nullptr;
  std::shared_ptr<const void> owner_;
  std::function<void(void*)> deleter_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() is false

  // New contiguous host tensor, uninitialized (backend memory comes from Backend::empty).
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  // A view of `storage`; checks that every addressed element lies inside it.
  static Tensor view_of(std::shared_ptr<Storage> storage, DType dtype, const Shape& shape,
                        const Shape& strides, int64_t offset_elems);
  // Copies `values` into a new contiguous f32 tensor of `shape` (sizes must match).
  static Tensor from_floats(const Shape& shape, std::span<const float> values);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::kCpu; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Pointer to the first element, for the host: throws Error(kInternal) unless the memory is the
  // host's (Device::kCpu). Typed access checks the dtype too.
  void* raw_data() const;
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  // The first element's address in the tensor's own memory space, never dereferenced on the host
  // unless device() is kCpu: what a backend hands its kernels.
  void* device_ptr() const;
  // Raw bytes of a contiguous host tensor (throws if it is not contiguous).
  std::span<const uint8_t> bytes() const;

  // Views (no copy).
  Tensor reshape(const Shape& shape) const;  // contiguous only; one extent may be -1
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor permute(const std::vector<int64_t>& order) const;

  // Copies.
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor clone() const;       // always a new contiguous copy
  // Converts between float dtypes (f32/f16/bf16/f64) and integer dtypes; result is contiguous.
  Tensor to(DType dtype) const;

  void check_dtype(DType expected) const;
  std::string describe() const;  // "f32[6, 3, 64, 128]"

 private:
  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
};

}  // namespace bev
