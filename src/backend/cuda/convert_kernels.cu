#include "backend/cuda/convert_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bev::cuda::kernels {
namespace {

// Round to nearest even on the device, matching core/half.h bit for bit (NaN stays NaN).
__global__ void k_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
  }
}

__global__ void k_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __half_as_ushort(__float2half_rn(src[i]));
  }
}

__global__ void k_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
  }
}

__global__ void k_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __half2float(__ushort_as_half(src[i]));
  }
}

unsigned blocks_for(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b ? b : 1) : 4096);
}

}  // namespace

#define BEV_LAUNCH(kernel, src, dst, n, stream)                                                    \
  kernel<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n);               \
  return static_cast<int>(cudaGetLastError())

int f32_to_bf16(const float* src, uint16_t* dst, size_t n, void* stream) { BEV_LAUNCH(k_f32_to_bf16, src, dst, n, stream); }
int f32_to_f16(const float* src, uint16_t* dst, size_t n, void* stream) { BEV_LAUNCH(k_f32_to_f16, src, dst, n, stream); }
int bf16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream) { BEV_LAUNCH(k_bf16_to_f32, src, dst, n, stream); }
int f16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream) { BEV_LAUNCH(k_f16_to_f32, src, dst, n, stream); }

#undef BEV_LAUNCH

}  // namespace bev::cuda::kernels
