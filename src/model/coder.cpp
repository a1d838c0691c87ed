#include "model/coder.h"

#include <cmath>
#include <string>

#include "bevformer/error.h"

namespace bev {

std::vector<Detection> decode_detections(const HeadConfig& head, const Tensor& top_scores, const Tensor& top_indices,
                                         const Tensor& bbox_preds) {
  const int64_t k = top_scores.numel(), q_len = bbox_preds.size(0), code = bbox_preds.size(1);
  if (top_indices.numel() != k || code < 8) {
    throw Error(ErrorKind::kInternal, "decode_detections: " + top_scores.describe() + ", " + top_indices.describe() +
                                          ", " + bbox_preds.describe());
  }
  const Tensor scores = top_scores.contiguous(), indices = top_indices.contiguous(), preds = bbox_preds.contiguous();
  const float* s = scores.data<float>();
  const int64_t* idx = indices.data<int64_t>();
  std::vector<Detection> out;
  out.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    Detection d;
    d.label = static_cast<int>(idx[i] % head.num_classes);
    d.query = idx[i] / head.num_classes;
    d.score = s[i];
    if (d.query < 0 || d.query >= q_len) throw Error(ErrorKind::kInternal, "top-k index out of range");
    const float* p = preds.data<float>() + d.query * code;
    // denormalize_bbox: [cx, cy, cz, w, l, h, atan2(sin, cos), vx, vy] from the code order
    // (cx, cy, log w, log l, cz, log h, sin, cos, vx, vy).
    const float cx = p[0], cy = p[1], cz = p[4];
    const float w = std::exp(p[2]), l = std::exp(p[3]), h = std::exp(p[5]);
    const float yaw = std::atan2(p[6], p[7]);
    const float vx = code > 8 ? p[8] : 0.0f, vy = code > 9 ? p[9] : 0.0f;
    if (head.post_center_range) {
      const auto& r = *head.post_center_range;
      const float c[3] = {cx, cy, cz};
      bool inside = true;
      for (int a = 0; a < 3; ++a) {
        inside = inside && c[a] >= static_cast<float>(r[static_cast<size_t>(a)]) &&
                 c[a] <= static_cast<float>(r[static_cast<size_t>(a + 3)]);
      }
      if (!inside) continue;
    }
    if (head.score_threshold && !(d.score > static_cast<float>(*head.score_threshold))) continue;
    // get_bboxes: gravity centre -> bottom centre.
    d.box = {cx, cy, cz - h * 0.5f, w, l, h, yaw, vx, vy};
    out.push_back(d);
  }
  return out;
}

}  // namespace bev
