#include "backend/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "backend/cuda/convert_kernels.h"
#include "bevformer/error.h"

namespace bev::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(status == cudaErrorMemoryAllocation ? ErrorKind::kIo : ErrorKind::kInternal,
                std::string(what) + " failed: " + cudaGetErrorString(status))
        .where("cuda");
  }
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int index) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + mem;
}

Tensor empty(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  auto storage = Storage::adopt(p, bytes, Device::kCuda, [](void* q) { cudaFree(q); });
  return Tensor::view_of(std::move(storage), dtype, shape, contiguous_strides(shape), 0);
}

Tensor to_device(const Tensor& host) {
  if (host.device() != Device::kCpu) throw Error(ErrorKind::kInternal, "to_device of a device tensor");
  const Tensor src = host.contiguous();
  Tensor dst = empty(src.shape(), src.dtype());
  check(cudaMemcpy(dst.device_ptr(), src.raw_data(), src.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return dst;
}

Tensor to_host(const Tensor& device) {
  if (device.device() != Device::kCuda) throw Error(ErrorKind::kInternal, "to_host of a host tensor");
  if (!device.is_contiguous()) throw Error(ErrorKind::kUnsupported, "to_host of a strided device tensor");
  Tensor dst = Tensor::empty(device.shape(), device.dtype());
  check(cudaMemcpy(dst.raw_data(), device.device_ptr(), device.nbytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return dst;
}

Tensor convert(const Tensor& device, DType dtype) {
  if (device.device() != Device::kCuda || !device.is_contiguous()) {
    throw Error(ErrorKind::kInternal, "convert needs a contiguous device tensor");
  }
  if (dtype == device.dtype()) return device;
  Tensor out = empty(device.shape(), dtype);
  const size_t n = static_cast<size_t>(device.numel());
  int status = -1;
  const DType from = device.dtype();
  if (from == DType::kF32 && dtype == DType::kBF16) {
    status = kernels::f32_to_bf16(static_cast<const float*>(device.device_ptr()), static_cast<uint16_t*>(out.device_ptr()), n, nullptr);
  } else if (from == DType::kF32 && dtype == DType::kF16) {
    status = kernels::f32_to_f16(static_cast<const float*>(device.device_ptr()), static_cast<uint16_t*>(out.device_ptr()), n, nullptr);
  } else if (from == DType::kBF16 && dtype == DType::kF32) {
    status = kernels::bf16_to_f32(static_cast<const uint16_t*>(device.device_ptr()), static_cast<float*>(out.device_ptr()), n, nullptr);
  } else if (from == DType::kF16 && dtype == DType::kF32) {
    status = kernels::f16_to_f32(static_cast<const uint16_t*>(device.device_ptr()), static_cast<float*>(out.device_ptr()), n, nullptr);
  } else {
    throw Error(ErrorKind::kUnsupported, std::string("device conversion ") + dtype_name(from) + " -> " + dtype_name(dtype));
  }
  check(static_cast<cudaError_t>(status), "conversion kernel launch");
  check(cudaDeviceSynchronize(), "conversion kernel");
  return out;
}

}  // namespace bev::cuda
