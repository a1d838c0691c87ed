// The image stage's first op on the CPU: upstream's test-time pipeline on decoded camera pixels
// (ImagePreprocessAttrs, backend/op.h), with the OpenCV calls mmcv makes, so the network input is
// upstream's to the bit.
#pragma once

#include "backend/op.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace bev::cpu {

// bgr u8 [N, H, W, 3] (contiguous, host) -> y f32 [N, padded_height, padded_width, 3]; images
// split over `pool`.
void image_preprocess(const Tensor& bgr, const ImagePreprocessAttrs& attrs, Tensor& y, ThreadPool* pool = nullptr);

}  // namespace bev::cpu
