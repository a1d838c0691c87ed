#include "runtime/batch_inputs.h"

#include <algorithm>

#include "backend/op.h"
#include "bevformer/error.h"

namespace bev {

BatchHostInputs batch_host_inputs(const ModelConfig& cfg, const std::vector<BatchRow>& rows, int64_t capacity) {
  const int64_t batch = static_cast<int64_t>(rows.size()), hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w;
  const int64_t cams = cfg.transformer.num_cams;
  const int64_t anchors = rows[0].rig->geometry.queries.reference.size(2);
  BatchHostInputs h;
  h.can_bus = Tensor::empty({batch, 18}, DType::kF32);
  h.tsa_reference = Tensor::empty({batch * hw, 2, 1, 2}, DType::kF32);
  h.value_index = Tensor::empty({batch * 2 * hw}, DType::kI64);
  h.value0_index = Tensor::empty({batch * hw}, DType::kI64);
  h.query_index = Tensor::empty({batch * cams * capacity}, DType::kI64);
  h.reference = Tensor::zeros({batch * cams * capacity, 1, anchors, 2}, DType::kF32);
  h.inv_count = Tensor::empty({batch * hw, 1}, DType::kF32);
  const int64_t ref_floats = anchors * 2;
  for (int64_t b = 0; b < batch; ++b) {
    const BatchRow& r = rows[static_cast<size_t>(b)];
    std::copy_n(r.step.can_bus.data<float>(), 18, h.can_bus.data<float>() + b * 18);
    std::copy_n(r.step.tsa_reference.data<float>(), hw * 4, h.tsa_reference.data<float>() + b * hw * 4);
    int64_t* v0 = h.value0_index.data<int64_t>() + b * hw;
    int64_t* stack = h.value_index.data<int64_t>() + b * 2 * hw;
    for (int64_t i = 0; i < hw; ++i) {
      if (!r.step.step.use_prev_bev) {
        v0[i] = stack[i] = stack[hw + i] = gather_multi_index(batch + 1, b * hw + i);
        continue;
      }
      int64_t src_row = i;
      if (cfg.transformer.rotate_prev_bev) src_row = r.step.rotation_index.data<int64_t>()[i];
      v0[i] = stack[i] = src_row < 0 ? -1 : gather_multi_index(b, src_row);
      stack[hw + i] = gather_multi_index(batch, b * hw + i);
    }
    const ScaQueryLists& q = r.rig->geometry.queries;
    if (q.reference.size(2) != anchors) {
      throw Error(ErrorKind::kInternal, "rigs of one batch with different pillar anchors");
    }
    for (int64_t n = 0; n < cams; ++n) {
      int64_t* qi = h.query_index.data<int64_t>() + (b * cams + n) * capacity;
      float* ref = h.reference.data<float>() + (b * cams + n) * capacity * ref_floats;
      const int64_t* src_qi = q.query_index.data<int64_t>() + n * q.max_len;
      const float* src_ref = q.reference.data<float>() + n * q.max_len * ref_floats;
      for (int64_t k = 0; k < capacity; ++k) qi[k] = k < q.max_len && src_qi[k] >= 0 ? src_qi[k] + b * hw : -1;
      std::copy_n(src_ref, q.max_len * ref_floats, ref);  // the rest stays zero, as the rig's own padding
    }
    std::copy_n(q.inv_count.data<float>(), hw, h.inv_count.data<float>() + b * hw);
  }
  return h;
}

void BatchTimings::note(int64_t batch, double seconds) {
  const std::lock_guard<std::mutex> lock(mu_);
  Timing& t = timings_[batch];
  const double per_frame = seconds / static_cast<double>(batch);
  if (t.runs == 1) t.per_frame = per_frame;
  if (t.runs > 1) t.per_frame = 0.7 * t.per_frame + 0.3 * per_frame;
  ++t.runs;
}

int64_t BatchTimings::chosen(int64_t n) const {
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = timings_.find(n);
  if (it == timings_.end() || it->second.runs < 2) return n;
  int64_t best = n;
  double best_time = it->second.per_frame;
  for (const auto& [b, t] : timings_) {
    if (b < n && t.runs >= 2 && t.per_frame < 0.97 * best_time) {
      best = b;
      best_time = t.per_frame;
    }
  }
  return best;
}

void BatchTimings::seed(int64_t batch, double seconds_per_frame) {
  const std::lock_guard<std::mutex> lock(mu_);
  Timing& t = timings_[batch];
  t.runs = std::max(t.runs, 2);
  t.per_frame = seconds_per_frame;
}

}  // namespace bev
