// The ResNet stem's max pool (NHWC f32 or bf16) and FPN's top-down nearest upsample (NHWC f32).
#pragma once

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// [N, (H-1)/2+1, (W-1)/2+1, C] = floor((H + 2 - 3) / 2) + 1 per side (ceil_mode false).
Shape max_pool2d_3x3_s2_p1_shape(const Shape& x_nhwc);

// nn.MaxPool2d(3, stride=2, padding=1): padding counts as -inf (never selected; every window
// holds at least one real pixel), and a NaN in the window wins, as in PyTorch. f32, bf16 or u8
// codes (y in x's dtype); rows split over `pool`.
void max_pool2d_3x3_s2_p1(const Tensor& x_nhwc, Tensor& y_nhwc, ThreadPool* pool = nullptr);

// FPN's top-down step, lat[i-1] += F.interpolate(lat[i], size=lat[i-1].shape[-2:], mode='nearest'):
// fine [N, H, W, C] += coarse [N, h, w, C] at src = min(floor(dst * (float)h / H), h - 1) per
// axis, with the scale in f32 exactly as PyTorch's legacy 'nearest' computes it (for H == 2h
// this is dst / 2). Named for FPN's 2x step, it takes any sizes, including H != 2h.
void upsample_nearest2x_add(const Tensor& coarse_nhwc, Tensor& fine_nhwc, ThreadPool* pool = nullptr);

// PyTorch's nearest source index for one axis (exposed for tests).
int64_t nearest_source_index(int64_t dst, int64_t in_size, int64_t out_size);

}  // namespace bev::cpu
