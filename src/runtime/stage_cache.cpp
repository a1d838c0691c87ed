#include "runtime/stage_cache.h"

#include <algorithm>
#include <utility>

#include "backend/ops.h"

namespace bev {
namespace {

std::vector<Tensor> tap_tensors(const Taps& t) {
  std::vector<Tensor> v;
  for (const auto& [name, tensor] : t.all()) v.push_back(tensor);
  return v;
}

}  // namespace

std::span<const StageBinding> bev_bindings(BevBindings& b, const BevRecording& s, const Tensor& new_bev,
                                          const RigLists& lists, const Tensor& prev_bev) {
  const ScaInputs& sca = s.in.sca.front();
  b = {StageBinding{s.out.bev_embed, new_bev}, StageBinding{sca.query_index, lists.query_index},
       StageBinding{sca.reference, lists.reference}, StageBinding{sca.inv_count, lists.inv_count},
       StageBinding{s.in.prev_bev, prev_bev}};
  return std::span<const StageBinding>(b.data(), s.use_prev ? 5 : 4);
}

StageCache::StageCache(const BevFormer& model, Backend& backend, int lanes)
    : model_(model), cfg_(model.config()), backend_(backend), images_(static_cast<size_t>(lanes)) {}

std::unique_ptr<ImageRecording> StageCache::record_image(const Shape& img_shape, DType img_dtype, bool tapped,
                                                         std::string name) {
  auto p = std::make_unique<ImageRecording>();
  p->shape = img_shape;
  p->dtype = img_dtype;
  p->tapped = tapped;
  p->generation = ++image_recordings_;
  p->img = backend_.empty(img_shape, img_dtype);
  // Recorded without running (each intermediate would otherwise hold its own memory until the
  // stage exists: tiny 1050 MiB against a 281 MiB arena), then computed by the first execution.
  Ops rec(backend_, Ops::Mode::kPlan);
  p->out = model_.image_stage(rec, p->img, tapped ? &p->taps : nullptr);
  std::vector<Tensor> keep = tap_tensors(p->taps);
  for (const ScaInputs& v : p->out.sca) keep.push_back(v.value);
  keep.push_back(p->out.nonfinite);
  p->stage = RecordedStage(std::move(name), rec.take_nodes(), keep, backend_);
  return p;
}

std::unique_ptr<BevRecording> StageCache::record_bev(const ImageOutputs& image, int64_t batch, bool use_prev,
                                                     bool tapped, int64_t capacity, int64_t anchors, std::string name) {
  const int64_t hw = int64_t{cfg_.head.bev_h} * cfg_.head.bev_w, c = cfg_.transformer.embed_dims;
  const int64_t cams = cfg_.transformer.num_cams;
  auto p = std::make_unique<BevRecording>();
  p->batch = batch;
  p->use_prev = use_prev;
  p->tapped = tapped;
  p->capacity = capacity;
  EncoderInputs& in = p->in;
  in.batch = batch;
  in.can_bus = backend_.empty({batch, 18}, DType::kF32);
  in.tsa_reference = backend_.empty({batch * hw, 2, 1, 2}, DType::kF32);
  if (batch == 1 && use_prev) {
    in.prev_bev = backend_.empty({hw, c}, DType::kF32);
    in.rotation_index = backend_.empty({hw}, DType::kI64);
  }
  if (batch > 1) {
    for (int64_t b = 0; b < batch; ++b) in.prev_bevs.push_back(backend_.empty({hw, c}, DType::kF32));
    in.value_index = backend_.empty({batch * 2 * hw}, DType::kI64);
    in.value0_index = backend_.empty({batch * hw}, DType::kI64);
  }
  const Tensor query_index = backend_.empty({batch * cams * capacity}, DType::kI64);
  const Tensor reference = backend_.empty({batch * cams * capacity, 1, anchors, 2}, DType::kF32);
  const Tensor inv_count = backend_.empty({batch * hw, 1}, DType::kF32);
  in.sca = image.sca;
  for (ScaInputs& v : in.sca) {
    v.query_index = query_index;
    v.reference = reference;
    v.inv_count = inv_count;
  }
  Ops rec(backend_, Ops::Mode::kPlan);  // computed by the first execution, as the image stage
  p->out = model_.bev_stage(rec, in, tapped ? &p->taps : nullptr);
  std::vector<Tensor> keep = tap_tensors(p->taps);
  for (const Tensor& t : {p->out.bev_embed, p->out.all_cls, p->out.all_preds, p->out.last_preds, p->out.nonfinite}) {
    keep.push_back(t);
  }
  keep.insert(keep.end(), p->out.top_scores.begin(), p->out.top_scores.end());
  keep.insert(keep.end(), p->out.top_index.begin(), p->out.top_index.end());
  // A single frame binds its stream's buffers and its rig's lists; a batch its samples' streams.
  const std::vector<Tensor> bindable =
      batch == 1 ? std::vector<Tensor>{in.prev_bev, p->out.bev_embed, query_index, reference, inv_count} : in.prev_bevs;
  p->stage = RecordedStage(std::move(name), rec.take_nodes(), keep, backend_, bindable);
  return p;
}

ImageRecording& StageCache::image(int lane, const Shape& img_shape, DType img_dtype, bool tapped, int& waits) {
  std::unique_ptr<ImageRecording>& s = images_[static_cast<size_t>(lane)];
  if (s && s->shape == img_shape && s->dtype == img_dtype && s->tapped == tapped) return *s;
  if (s) wait(waits);  // an issued execution of the stage replaced here may not have run
  // A new generation: this lane's bev stages read the old outputs, stale now.
  s = record_image(img_shape, img_dtype, tapped, lane == 0 ? "image" : "image (lane " + std::to_string(lane + 1) + ")");
  return *s;
}

BevRecording& StageCache::bev(int lane, bool use_prev, bool tapped, int64_t longest, int64_t anchors, int& waits) {
  const ImageRecording& image = *images_[static_cast<size_t>(lane)];
  // Stages that read an earlier recording of this lane's image stage would run on its stale
  // outputs (which they keep alive: for base about 1.1 GB each).
  const auto stale = [&](const std::unique_ptr<BevRecording>& p) {
    return p->lane == lane && p->image_generation != image.generation;
  };
  if (std::any_of(bevs_.begin(), bevs_.end(), stale)) {
    wait(waits);  // before stages that issued executions may have queued go
    std::erase_if(bevs_, stale);
  }
  int64_t capacity = longest;
  const int64_t hw = int64_t{cfg_.head.bev_h} * cfg_.head.bev_w;
  for (auto it = bevs_.begin(); it != bevs_.end(); ++it) {
    BevRecording& p = **it;
    if (p.use_prev != use_prev || p.tapped != tapped || p.lane != lane) continue;
    if (p.capacity >= longest && p.in.sca.front().reference.size(2) == anchors) return p;
    capacity = std::max(sca_capacity_for(hw, longest), p.capacity);
    wait(waits);
    bevs_.erase(it);
    break;
  }
  ++bev_recordings_;
  std::string name = use_prev ? "bev (with history" : "bev (first frame";
  if (lane > 0) name += ", lane " + std::to_string(lane + 1);
  auto p = record_bev(image.out, 1, use_prev, tapped, capacity, anchors, name + ")");
  p->lane = lane;
  p->image_generation = image.generation;
  bevs_.push_back(std::move(p));
  return *bevs_.back();
}

BatchRecording& StageCache::batch(int64_t batch, const Shape& img_shape, DType img_dtype, int64_t longest,
                                  int64_t anchors, int& waits) {
  const int64_t hw = int64_t{cfg_.head.bev_h} * cfg_.head.bev_w;
  auto it = std::find_if(batches_.begin(), batches_.end(), [&](const auto& p) { return p->batch == batch; });
  int64_t capacity = sca_capacity_for(hw, longest);
  if (it != batches_.end()) {
    std::rotate(batches_.begin(), it, it + 1);
    BatchRecording& front = *batches_.front();
    const bool same_images = front.img_shape == img_shape && front.img_dtype == img_dtype;
    if (same_images && front.capacity >= longest) return front;
    if (same_images) capacity = std::max(capacity, front.capacity);
    wait(waits);
    batches_.erase(batches_.begin());
  }
  if (batches_.size() >= kMaxBatchSizes) {
    wait(waits);
    batches_.pop_back();
  }
  auto p = std::make_unique<BatchRecording>();
  p->batch = batch;
  p->img_shape = img_shape;
  p->img_dtype = img_dtype;
  p->capacity = capacity;
  const std::string name = " (batch " + std::to_string(batch) + ")";
  p->image = record_image(img_shape, img_dtype, false, "image" + name);
  p->bev = record_bev(p->image->out, batch, false, false, capacity, anchors, "bev" + name);
  batches_.insert(batches_.begin(), std::move(p));
  return *batches_.front();
}

const BatchRecording* StageCache::batch_of(int64_t batch) const {
  for (const auto& p : batches_) {
    if (p->batch == batch) return p.get();
  }
  return nullptr;
}

void StageCache::for_each(const std::function<void(const RecordedStage&)>& f) const {
  for (const auto& p : images_) {
    if (p) f(p->stage);
  }
  for (const auto& p : bevs_) f(p->stage);
  for (const auto& p : batches_) {
    f(p->image->stage);
    f(p->bev->stage);
  }
}

}  // namespace bev
