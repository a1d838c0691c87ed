// StageRunner::forward_batch: frames of distinct streams as one batch (stage_runner.h).
#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/ops.h"
#include "runtime/stage_runner_impl.h"

namespace bev {

using runner_detail::Clock;
using runner_detail::nonfinite;
using runner_detail::seconds_since;

// The samples' host steps; a sample that fails fails alone (its error in results).
std::vector<BatchRow> StageRunner::Impl::batch_rows(std::span<const BatchSample> samples,
                                                    const std::vector<size_t>& group,
                                                    std::vector<SampleOutput>& results) {
  std::vector<BatchRow> rows;
  for (const size_t i : group) {
    try {
      const auto t0 = Clock::now();
      const FrameInput& f = *samples[i].frame;
      const StreamHistory& history = *samples[i].history;
      BatchRow r;
      r.index = i;
      r.next_state = history.state;
      r.step = model.forward_test_step(r.next_state, f);
      if (r.step.step.use_prev_bev) check_history(history);
      r.rig = rigs.rig(f);
      r.geometry_seconds = seconds_since(t0);
      rows.push_back(std::move(r));
    } catch (...) {
      results[i].error = std::current_exception();
    }
  }
  return rows;
}

// One group of samples with images of one size, as one batch (at least two samples).
void StageRunner::Impl::run_batch(std::span<const BatchSample> samples, const std::vector<BatchRow>& rows,
                                  const FrameReads& reads, std::vector<SampleOutput>& results) {
  const int64_t batch = static_cast<int64_t>(rows.size()), hw = bev_cells(), c = cfg.transformer.embed_dims;
  const int64_t cams = cfg.transformer.num_cams;
  int64_t longest = 1;
  for (const BatchRow& r : rows) longest = std::max(longest, r.rig->geometry.queries.max_len);
  const int64_t anchors = rows[0].rig->geometry.queries.reference.size(2);
  Shape img_shape = samples[rows[0].index].frame->img.shape();
  img_shape[0] *= batch;
  const DType img_dtype = samples[rows[0].index].frame->img.dtype();

  const Quiet quiet(*this);
  auto t_part = Clock::now();
  ImageOutputs eager_image;
  BevOutputs eager_bev;
  Tensor img_nonfinite;
  BatchRecording* st = nullptr;
  int waits = 0;  // the batch's, its samples share them
  if (replay) {
    st = &stages.batch(batch, img_shape, img_dtype, longest, anchors, waits);
    for (int64_t b = 0; b < batch; ++b) {
      st->image->staging.write(backend, st->image->img.slice(0, b * cams, (b + 1) * cams),
                               samples[rows[static_cast<size_t>(b)].index].frame->img);
    }
    backend.execute(st->image->stage);
    img_nonfinite = st->image->out.nonfinite;
  } else {
    Tensor img = Tensor::empty(img_shape, img_dtype);
    const size_t per = static_cast<size_t>(img.nbytes() / static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      std::memcpy(static_cast<char*>(img.raw_data()) + static_cast<size_t>(b) * per,
                  samples[rows[static_cast<size_t>(b)].index].frame->img.raw_data(), per);
    }
    Ops eager(backend);
    eager_image = model.image_stage(eager, backend.upload(img), nullptr);
    img_nonfinite = eager_image.nonfinite;
  }
  const double image_seconds = seconds_since(t_part);

  t_part = Clock::now();
  const int64_t capacity = st ? st->capacity : sca_capacity_for(hw, longest);
  const BatchHostInputs host = batch_host_inputs(cfg, rows, capacity);
  const BevOutputs* out = nullptr;
  if (replay) {
    st->bev->staging.write(backend, st->bev->in.can_bus, host.can_bus);
    st->bev->staging.write(backend, st->bev->in.tsa_reference, host.tsa_reference);
    st->bev->staging.write(backend, st->bev->in.value_index, host.value_index);
    st->bev->staging.write(backend, st->bev->in.value0_index, host.value0_index);
    st->bev->staging.write(backend, st->bev->in.sca[0].query_index, host.query_index);
    st->bev->staging.write(backend, st->bev->in.sca[0].reference, host.reference);
    st->bev->staging.write(backend, st->bev->in.sca[0].inv_count, host.inv_count);
    std::vector<StageBinding> bindings;
    for (int64_t b = 0; b < batch; ++b) {
      const BatchRow& r = rows[static_cast<size_t>(b)];
      if (r.step.step.use_prev_bev) bindings.push_back({st->bev->in.prev_bevs[static_cast<size_t>(b)], samples[r.index].history->prev_bev});
    }
    backend.execute(st->bev->stage, bindings);
    out = &st->bev->out;
  } else {
    EncoderInputs in;
    in.batch = batch;
    in.can_bus = backend.upload(host.can_bus);
    in.tsa_reference = backend.upload(host.tsa_reference);
    in.value_index = backend.upload(host.value_index);
    in.value0_index = backend.upload(host.value0_index);
    const Tensor unread = backend.empty({1, c}, DType::kF32);  // a first frame's previous BEV: no index reads it
    for (const BatchRow& r : rows) {
      in.prev_bevs.push_back(r.step.step.use_prev_bev ? samples[r.index].history->prev_bev : unread);
    }
    const Tensor query_index = backend.upload(host.query_index), reference = backend.upload(host.reference),
                 inv_count = backend.upload(host.inv_count);
    in.sca = std::move(eager_image.sca);
    for (ScaInputs& v : in.sca) {
      v.query_index = query_index;
      v.reference = reference;
      v.inv_count = inv_count;
    }
    Ops eager(backend);
    eager_bev = model.bev_stage(eager, in, nullptr);
    out = &eager_bev;
  }
  // The new BEVs are read from the stage's output (what the histories get a copy of).
  const Results res = read_results(img_nonfinite, *out, out->bev_embed, batch, reads);
  const int64_t queries = res.last_preds.size(0) / batch;
  const double bev_seconds = seconds_since(t_part);
  note_timing(batch, image_seconds + bev_seconds);

  for (int64_t b = 0; b < batch; ++b) {
    const BatchRow& r = rows[static_cast<size_t>(b)];
    SampleOutput& result = results[r.index];
    result.batch_size = batch;
    result.output.host_waits = 1 + waits;
    const size_t k = static_cast<size_t>(b);
    if (std::exception_ptr e = nonfinite(res.image_nonfinite[k], res.bev_nonfinite[k], nonfinite_frames)) {
      result.error = std::move(e);
      continue;
    }
    StreamHistory& history = *samples[r.index].history;
    // The new BEV into the stream's own buffer (the bev stage has read the old one).
    if (!history.prev_bev.defined() || history.prev_bev.shape() != Shape{hw, c} ||
        history.prev_bev.device() != backend.device()) {
      history.prev_bev = backend.empty({hw, c}, DType::kF32);
    }
    backend.copy(history.prev_bev, out->bev_embed.slice(0, b * hw, (b + 1) * hw));
    FrameOutput& o = result.output;
    o.geometry_seconds = r.geometry_seconds;
    o.image_seconds = image_seconds;
    o.bev_seconds = bev_seconds;
    o.used_history = r.step.step.use_prev_bev;
    if (res.all_cls.defined()) {
      o.all_cls_scores = res.all_cls.slice(1, b * queries, (b + 1) * queries).contiguous();
      o.all_bbox_preds = res.all_preds.slice(1, b * queries, (b + 1) * queries).contiguous();
    }
    if (!res.bev_embed.empty()) o.bev_embed = res.bev_embed[k];
    const auto t_decode = Clock::now();
    o.detections = model.decode(res.top_scores[k], res.top_index[k],
                                res.last_preds.slice(0, b * queries, (b + 1) * queries).contiguous());
    o.decode_seconds = seconds_since(t_decode);
    history.state = r.next_state;
    history.state.has_prev_bev = true;
  }
}

std::vector<SampleOutput> StageRunner::Impl::forward_batch(std::span<const BatchSample> samples,
                                                          const FrameReads& reads) {
  if (reads.taps && samples.size() > 1) {
    throw Error(ErrorKind::kInvalidInput, "a batch of " + std::to_string(samples.size()) + " frames asked for taps")
        .where("forward_batch")
        .expected("batch size 1 to read a frame's stage tensors");
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!samples[i].frame || !samples[i].history) throw Error(ErrorKind::kInternal, "a batch sample without its frame or history");
    for (size_t j = 0; j < i; ++j) {
      if (samples[i].history == samples[j].history) {
        throw Error(ErrorKind::kInvalidInput, "samples " + std::to_string(j) + " and " + std::to_string(i) +
                                                  " of a batch are frames of one stream")
            .where("forward_batch")
            .expected("frames of distinct streams (one stream's frames run in order, one per batch)");
      }
    }
  }
  std::vector<SampleOutput> results(samples.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < samples.size(); ++i) {
    try {
      model.check_frame(*samples[i].frame);
      pending.push_back(i);
    } catch (...) {
      results[i].error = std::current_exception();
    }
  }
  // Groups of one image size and kind (pixels or network input), in order of their first sample.
  while (!pending.empty()) {
    const Tensor& first_img = samples[pending[0]].frame->img;
    const auto alike = [&](const Tensor& img) { return img.shape() == first_img.shape() && img.dtype() == first_img.dtype(); };
    std::vector<size_t> group, rest;
    for (const size_t i : pending) (alike(samples[i].frame->img) ? group : rest).push_back(i);
    pending = std::move(rest);
    const std::vector<BatchRow> rows = batch_rows(samples, group, results);
    const size_t chunk = static_cast<size_t>(chosen_batch(static_cast<int64_t>(rows.size())));
    for (size_t first = 0; first < rows.size(); first += chunk) {
      const std::vector<BatchRow> part(rows.begin() + static_cast<std::ptrdiff_t>(first),
                                       rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), first + chunk)));
      if (part.size() == 1) {
        const size_t i = part[0].index;
        try {
          results[i].output = forward(*samples[i].frame, *samples[i].history, reads);
        } catch (...) {
          results[i].error = std::current_exception();
        }
        continue;
      }
      try {
        run_batch(samples, part, reads, results);
      } catch (...) {
        // The batch as a whole failed (no memory, a backend fault): every sample of it did,
        // before any history changed.
        for (const BatchRow& r : part) results[r.index].error = std::current_exception();
      }
    }
  }
  return results;
}

}  // namespace bev
