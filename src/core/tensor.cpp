#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "core/half.h"

namespace bev {

const char* device_name(Device d) {
  switch (d) {
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
    case Device::kForeign: return "foreign";
  }
  return "?";
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t e : shape) {
    if (e < 0) throw Error(ErrorKind::kInvalidInput, "negative extent in shape " + shape_str(shape));
    if (e != 0 && n > std::numeric_limits<int64_t>::max() / e) {
      throw Error(ErrorKind::kInvalidInput, "element count of shape " + shape_str(shape) + " overflows");
    }
    n *= e;
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// ---- Storage ----

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  auto s = std::shared_ptr<Storage>(new Storage());
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(ErrorKind::kIo, "out of memory allocating " + std::to_string(bytes) + " bytes");
  s->data_ = p;
  s->bytes_ = bytes;
  s->deleter_ = [](void* q) { std::free(q); };
  return s;
}

std::shared_ptr<Storage> Storage::deferred(size_t bytes) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->bytes_ = bytes;
  s->deferred_ = true;
  return s;
}

std::shared_ptr<Storage> Storage::slice(std::shared_ptr<Storage> parent, size_t offset, size_t bytes) {
  if (!parent || parent->deferred_ || offset > parent->bytes_ || bytes > parent->bytes_ - offset) {
    throw Error(ErrorKind::kInternal, "slice [" + std::to_string(offset) + ", +" + std::to_string(bytes) +
                                          ") of a storage of " + std::to_string(parent ? parent->bytes_ : 0) + " bytes");
  }
  auto s = std::shared_ptr<Storage>(new Storage());
  // Address arithmetic only: the parent may be device memory.
  s->data_ = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(parent->data_) + offset);
  s->bytes_ = bytes;
  s->device_ = parent->device_;
  s->owner_ = std::move(parent);
  return s;
}

void Storage::place(std::shared_ptr<Storage> memory) {
  if (!deferred_) return;
  if (!memory || memory->deferred_ || memory->bytes_ < bytes_) {
    throw Error(ErrorKind::kInternal, "placing a buffer of " + std::to_string(bytes_) + " bytes in " +
                                          std::to_string(memory ? memory->bytes_ : 0));
  }
  data_ = memory->data_;
  device_ = memory->device_;
  owner_ = std::move(memory);
  deferred_ = false;
}

void Storage::bind_to(const Storage& target, size_t byte_offset) {
  if (deferred_ || unbound_data_ || target.deferred_ || target.device_ != device_ || byte_offset > target.bytes_ ||
      target.bytes_ - byte_offset < bytes_) {
    throw Error(ErrorKind::kInternal, "binding a buffer of " + std::to_string(bytes_) + " bytes to " +
                                          std::to_string(target.bytes_) + " bytes at offset " + std::to_string(byte_offset));
  }
  unbound_data_ = data_;
  data_ = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(target.data_) + byte_offset);
}

void Storage::unbind() {
  if (!unbound_data_) return;
  data_ = unbound_data_;
  unbound_data_ = nullptr;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, std::shared_ptr<const void> owner,
                                         Device device) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->data_ = data;
  s->bytes_ = bytes;
  s->device_ = device;
  s->owner_ = std::move(owner);
  return s;
}

std::shared_ptr<Storage> Storage::adopt(void* data, size_t bytes, Device device,
                                        std::function<void(void*)> deleter) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->data_ = data;
  s->bytes_ = bytes;
  s->device_ = device;
  s->deleter_ = std::move(deleter);
  return s;
}

Storage::~Storage() {
  unbind();
  if (deleter_ && data_) deleter_(data_);
}

// ---- Tensor ----

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / dtype_size(dtype)) {
    throw Error(ErrorKind::kInvalidInput, "tensor of shape " + shape_str(shape) + " is too large");
  }
  auto storage = Storage::allocate(static_cast<size_t>(n) * dtype_size(dtype));
  return view_of(std::move(storage), dtype, shape, contiguous_strides(shape), 0);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::view_of(std::shared_ptr<Storage> storage, DType dtype, const Shape& shape,
                       const Shape& strides, int64_t offset_elems) {
  if (!storage) throw Error(ErrorKind::kInternal, "view of a null storage");
  if (shape.size() != strides.size()) {
    throw Error(ErrorKind::kInvalidInput, "shape " + shape_str(shape) + " and strides " +
                                              shape_str(strides) + " differ in rank");
  }
  if (offset_elems < 0) throw Error(ErrorKind::kInvalidInput, "negative storage offset");
  const int64_t numel = shape_numel(shape);
  const uint64_t capacity = storage->bytes() / dtype_size(dtype);
  if (numel > 0) {
    // Highest addressed element, computed without overflow.
    uint64_t last = static_cast<uint64_t>(offset_elems);
    for (size_t i = 0; i < shape.size(); ++i) {
      if (strides[i] < 0) throw Error(ErrorKind::kInvalidInput, "negative stride " + shape_str(strides));
      const uint64_t extent = static_cast<uint64_t>(shape[i] - 1);
      const uint64_t stride = static_cast<uint64_t>(strides[i]);
      if (stride != 0 && extent > (std::numeric_limits<uint64_t>::max() - last) / stride) {
        throw Error(ErrorKind::kInvalidInput, "strides " + shape_str(strides) + " overflow");
      }
      last += extent * stride;
    }
    if (last >= capacity) {
      throw Error(ErrorKind::kInvalidInput,
                  std::string("view ") + dtype_name(dtype) + shape_str(shape) + " strides " + shape_str(strides) +
                      " offset " + std::to_string(offset_elems) + " reaches element " +
                      std::to_string(last) + " of a storage holding " + std::to_string(capacity))
          .expected("every element inside the storage");
    }
  }
  Tensor t;
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = strides;
  t.offset_ = offset_elems;
  t.numel_ = numel;
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, std::span<const float> values) {
  Tensor t = empty(shape, DType::kF32);
  if (static_cast<size_t>(t.numel()) != values.size()) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(values.size()) + " values for shape " +
                                              shape_str(shape));
  }
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t r = dim();
  if (d < 0) d += r;
  if (d < 0 || d >= r) {
    throw Error(ErrorKind::kInternal, "dimension " + std::to_string(d) + " of " + describe());
  }
  return shape_[static_cast<size_t>(d)];
}

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;  // nothing is addressed, so any strides describe it densely
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::device_ptr() const {
  if (!storage_) throw Error(ErrorKind::kInternal, "data of an undefined tensor");
  if (storage_->is_deferred()) {
    throw Error(ErrorKind::kInternal, "data of " + describe() + ", a planned buffer that has no memory yet")
        .hint("a stage recorded with Ops::Mode::kPlan computes nothing until a backend executes it");
  }
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(storage_->data()) +
                                 static_cast<uintptr_t>(offset_) * dtype_size(dtype_));
}

void* Tensor::raw_data() const {
  void* p = device_ptr();
  if (storage_->device() != Device::kCpu) {
    throw Error(ErrorKind::kInternal, "host access to " + describe() + ", which lives in " +
                                          device_name(storage_->device()) + " memory")
        .hint("backend memory is read and written through Backend::read / Backend::write");
  }
  return p;
}

std::span<const uint8_t> Tensor::bytes() const {
  if (!is_contiguous()) throw Error(ErrorKind::kInternal, "bytes() of a non-contiguous " + describe());
  return {static_cast<const uint8_t*>(raw_data()), nbytes()};
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (!is_contiguous()) throw Error(ErrorKind::kInternal, "reshape of a non-contiguous " + describe());
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1 && infer < 0) {
      infer = static_cast<int>(i);
    } else {
      if (s[i] < 0) throw Error(ErrorKind::kInternal, "bad reshape target " + shape_str(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<size_t>(infer)] = known ? numel_ / known : 0;
  if (shape_numel(s) != numel_) {
    throw Error(ErrorKind::kInternal, "cannot reshape " + describe() + " to " + shape_str(shape));
  }
  return view_of(storage_, dtype_, s, contiguous_strides(s), offset_);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  const int64_t r = dim();
  if (d < 0) d += r;
  const int64_t n = size(d);
  if (start < 0 || end > n || start > end) {
    throw Error(ErrorKind::kInternal, "slice [" + std::to_string(start) + ", " + std::to_string(end) +
                                          ") of dim " + std::to_string(d) + " of " + describe());
  }
  Shape s = shape_;
  s[static_cast<size_t>(d)] = end - start;
  return view_of(storage_, dtype_, s, strides_, offset_ + start * strides_[static_cast<size_t>(d)]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int64_t r = dim();
  if (d < 0) d += r;
  Tensor t = slice(d, index, index + 1);
  Shape s = t.shape_, st = t.strides_;
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return view_of(storage_, dtype_, s, st, t.offset_);
}

Tensor Tensor::permute(const std::vector<int64_t>& order) const {
  if (order.size() != shape_.size()) {
    throw Error(ErrorKind::kInternal, "permute order of rank " + std::to_string(order.size()) +
                                          " for " + describe());
  }
  Shape s(order.size()), st(order.size());
  SmallVector<bool, 8> seen(order.size(), false);  // inline: permute runs on replayed frames
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t o = order[i];
    if (o < 0 || o >= dim() || seen[static_cast<size_t>(o)]) {
      throw Error(ErrorKind::kInternal, "invalid permutation for " + describe());
    }
    seen[static_cast<size_t>(o)] = true;
    s[i] = shape_[static_cast<size_t>(o)];
    st[i] = strides_[static_cast<size_t>(o)];
  }
  return view_of(storage_, dtype_, s, st, offset_);
}

namespace {

// Visits every element of `t` in row-major order, calling fn(element_pointer).
template <typename Fn>
void for_each_element(const Tensor& t, Fn&& fn) {
  if (t.numel() == 0) return;
  const size_t es = dtype_size(t.dtype());
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  const size_t r = t.shape().size();
  if (r == 0) {
    fn(base);
    return;
  }
  std::vector<int64_t> idx(r, 0);
  const int64_t inner = t.shape()[r - 1];
  const int64_t inner_stride = t.strides()[r - 1];
  while (true) {
    int64_t off = 0;
    for (size_t i = 0; i + 1 < r; ++i) off += idx[i] * t.strides()[i];
    for (int64_t j = 0; j < inner; ++j) fn(base + static_cast<size_t>(off + j * inner_stride) * es);
    size_t k = r - 1;
    while (k > 0) {
      --k;
      if (++idx[k] < t.shape()[k]) break;
      idx[k] = 0;
      if (k == 0) return;
    }
    if (r == 1) return;
  }
}

double load_as_double(const uint8_t* p, DType t) {
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p, 2); return half_to_float(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
    case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kI8: return static_cast<int8_t>(*p);
    case DType::kU8: return *p;
    case DType::kBool: return *p ? 1.0 : 0.0;
  }
  return 0;
}

int64_t load_as_int(const uint8_t* p, DType t) {
  switch (t) {
    case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kI8: return static_cast<int8_t>(*p);
    case DType::kU8: return *p;
    case DType::kBool: return *p ? 1 : 0;
    default: return static_cast<int64_t>(load_as_double(p, t));
  }
}

void store(uint8_t* p, DType t, double d, int64_t i, bool from_int) {
  switch (t) {
    case DType::kF32: { float v = from_int ? static_cast<float>(i) : static_cast<float>(d); std::memcpy(p, &v, 4); return; }
    case DType::kF16: { uint16_t v = float_to_half(from_int ? static_cast<float>(i) : static_cast<float>(d)); std::memcpy(p, &v, 2); return; }
    case DType::kBF16: { uint16_t v = float_to_bf16(from_int ? static_cast<float>(i) : static_cast<float>(d)); std::memcpy(p, &v, 2); return; }
    case DType::kF64: { double v = from_int ? static_cast<double>(i) : d; std::memcpy(p, &v, 8); return; }
    case DType::kI64: { int64_t v = from_int ? i : static_cast<int64_t>(d); std::memcpy(p, &v, 8); return; }
    case DType::kI32: { int32_t v = static_cast<int32_t>(from_int ? i : static_cast<int64_t>(d)); std::memcpy(p, &v, 4); return; }
    case DType::kI16: { int16_t v = static_cast<int16_t>(from_int ? i : static_cast<int64_t>(d)); std::memcpy(p, &v, 2); return; }
    case DType::kI8: *p = static_cast<uint8_t>(static_cast<int8_t>(from_int ? i : static_cast<int64_t>(d))); return;
    case DType::kU8: *p = static_cast<uint8_t>(from_int ? i : static_cast<int64_t>(d)); return;
    case DType::kBool: *p = (from_int ? i != 0 : d != 0.0) ? 1 : 0; return;
  }
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const size_t es = dtype_size(dtype_);
  if (is_contiguous()) {
    std::memcpy(dst, raw_data(), nbytes());
    return out;
  }
  for_each_element(*this, [&](const uint8_t* p) {
    std::memcpy(dst, p, es);
    dst += es;
  });
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return contiguous();
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype);
  const auto* s = static_cast<const uint8_t*>(src.raw_data());
  auto* d = static_cast<uint8_t*>(out.raw_data());
  const size_t n = static_cast<size_t>(numel_);
  if (dtype_ == DType::kF32 && dtype == DType::kBF16) {
    float_to_bf16_n(reinterpret_cast<const float*>(s), reinterpret_cast<uint16_t*>(d), n);
    return out;
  }
  if (dtype_ == DType::kF32 && dtype == DType::kF16) {
    float_to_half_n(reinterpret_cast<const float*>(s), reinterpret_cast<uint16_t*>(d), n);
    return out;
  }
  const size_t ses = dtype_size(dtype_), des = dtype_size(dtype);
  const bool from_int = !dtype_is_float(dtype_);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = s + i * ses;
    store(d + i * des, dtype, from_int ? 0.0 : load_as_double(p, dtype_), from_int ? load_as_int(p, dtype_) : 0,
          from_int);
  }
  return out;
}

void Tensor::check_dtype(DType expected) const {
  if (dtype_ != expected) {
    throw Error(ErrorKind::kInternal, std::string("tensor ") + describe() + " accessed as " + dtype_name(expected));
  }
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return std::string(dtype_name(dtype_)) + shape_str(shape_);
}

}  // namespace bev
