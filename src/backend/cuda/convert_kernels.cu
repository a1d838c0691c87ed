#include "backend/cuda/convert_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bev::cuda::kernels {
namespace {

// One grid-stride loop for every conversion; the element conversions round to nearest even,
// matching core/half.h bit for bit (NaN stays NaN).
template <typename Src, typename Dst, typename Convert>
__global__ void k_convert(const Src* src, Dst* dst, size_t n, Convert convert) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = convert(src[i]);
  }
}

struct ToBf16 {
  __device__ uint16_t operator()(float x) const { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};
struct ToF16 {
  __device__ uint16_t operator()(float x) const { return __half_as_ushort(__float2half_rn(x)); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t x) const { return __bfloat162float(__ushort_as_bfloat16(x)); }
};
struct FromF16 {
  __device__ float operator()(uint16_t x) const { return __half2float(__ushort_as_half(x)); }
};

unsigned blocks_for(size_t n) {
  const size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b ? b : 1) : 4096);
}

template <typename Src, typename Dst, typename Convert>
int launch(const Src* src, Dst* dst, size_t n, void* stream) {
  k_convert<<<blocks_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, n, Convert{});
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int f32_to_bf16(const float* src, uint16_t* dst, size_t n, void* stream) { return launch<float, uint16_t, ToBf16>(src, dst, n, stream); }
int f32_to_f16(const float* src, uint16_t* dst, size_t n, void* stream) { return launch<float, uint16_t, ToF16>(src, dst, n, stream); }
int bf16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream) { return launch<uint16_t, float, FromBf16>(src, dst, n, stream); }
int f16_to_f32(const uint16_t* src, float* dst, size_t n, void* stream) { return launch<uint16_t, float, FromF16>(src, dst, n, stream); }

}  // namespace bev::cuda::kernels
