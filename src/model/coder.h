// NMSFreeCoder.decode + get_bboxes (spec §2.14), on the host: the last layer's top-k scores and
// box codes in, boxes out.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "io/detection.h"
#include "model/config.h"

namespace bev {

// scores/indices: topk of the flattened sigmoid scores (f32 [k], i64 [k], index = query * classes
// + class); bbox_preds: the last layer's f32 [Q, code_size] (centres in metres). Boxes whose
// centre lies outside post_center_range are dropped; score_threshold applies when set.
std::vector<Detection> decode_detections(const HeadConfig& head, const Tensor& top_scores, const Tensor& top_indices,
                                         const Tensor& bbox_preds);

}  // namespace bev
