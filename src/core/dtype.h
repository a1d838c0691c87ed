// Element types. The compute dtypes are f32, f16, bf16, i32, i64 and u8; f64, i16, i8 and bool
// exist so that any checkpoint storage can be held as it was saved and converted once at load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bev {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64,
                                       DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                       DType::kU8,  DType::kBool};

size_t dtype_size(DType t);
bool dtype_is_float(DType t);

// Short lower-case name used in messages and reports: "f32", "bf16", "i64", "bool".
const char* dtype_name(DType t);

// safetensors' spelling ("F32", "BF16", "I64", "BOOL"); parse returns false for unknown names.
const char* dtype_safetensors_name(DType t);
bool dtype_from_safetensors_name(std::string_view name, DType* out);

// PyTorch storage class names ("FloatStorage", "BFloat16Storage", ...), as pickled in checkpoints.
const char* dtype_torch_storage_name(DType t);
bool dtype_from_torch_storage_name(std::string_view name, DType* out);

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<int16_t>() { return DType::kI16; }
template <> constexpr DType dtype_of<int8_t>() { return DType::kI8; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<bool>() { return DType::kBool; }

}  // namespace bev
