// Device memory for tensors on CUDA: allocation, and copies between host and device. Tensors
// keep the Device::kCuda tag so host code never dereferences device pointers by mistake.
#pragma once

#include "core/tensor.h"

namespace bev::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();
// A short description of device `index` ("NVIDIA H200, sm_90, 139.8 GiB"), or throws Error.
std::string device_description(int index);

Tensor empty(const Shape& shape, DType dtype);
Tensor to_device(const Tensor& host);  // contiguous copy on the current device
Tensor to_host(const Tensor& device);  // contiguous copy in host memory
// f32 <-> f16/bf16 on the device, rounding to nearest even exactly as core/half.h does.
Tensor convert(const Tensor& device, DType dtype);

}  // namespace bev::cuda
