// Element-type conversion kernels on the device (plain pointers, C++17, so nvcc needs nothing of
// the C++20 host headers). Used to turn f32 weights into f16/bf16 once they are on the GPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bev::cuda::kernels {

// Each returns the cudaError_t of the launch as an int (0 = success); `stream` is a cudaStream_t.
int f32_to_bf16(const float* src, uint16_t* dst, size_t n, void* stream);
int f32_to_f16(const float* src, uint16_t* dst, size_t n, void* stream);
int bf16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream);
int f16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream);

}  // namespace bev::cuda::kernels
