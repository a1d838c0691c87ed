#include "core/dtype.h"

namespace bev {
namespace {

struct DTypeInfo {
  DType type;
  size_t size;
  bool is_float;
  const char* name;
  const char* safetensors;
  const char* torch_storage;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kF32, 4, true, "f32", "F32", "FloatStorage"},
    {DType::kF16, 2, true, "f16", "F16", "HalfStorage"},
    {DType::kBF16, 2, true, "bf16", "BF16", "BFloat16Storage"},
    {DType::kF64, 8, true, "f64", "F64", "DoubleStorage"},
    {DType::kI64, 8, false, "i64", "I64", "LongStorage"},
    {DType::kI32, 4, false, "i32", "I32", "IntStorage"},
    {DType::kI16, 2, false, "i16", "I16", "ShortStorage"},
    {DType::kI8, 1, false, "i8", "I8", "CharStorage"},
    {DType::kU8, 1, false, "u8", "U8", "ByteStorage"},
    {DType::kBool, 1, false, "bool", "BOOL", "BoolStorage"},
};

const DTypeInfo& info(DType t) { return kInfo[static_cast<size_t>(t)]; }

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
bool dtype_is_float(DType t) { return info(t).is_float; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).safetensors; }
const char* dtype_torch_storage_name(DType t) { return info(t).torch_storage; }

bool dtype_from_safetensors_name(std::string_view name, DType* out) {
  for (const auto& i : kInfo) {
    if (name == i.safetensors) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

bool dtype_from_torch_storage_name(std::string_view name, DType* out) {
  for (const auto& i : kInfo) {
    if (name == i.torch_storage) {
      *out = i.type;
      return true;
    }
  }
  return false;
}

}  // namespace bev
