#include "model/bevformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "bevformer/error.h"
#include "model/weights.h"
#include "core/number_text.h"

namespace bev {
namespace {

[[noreturn]] void bad_frame(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("frame").expected(expected);
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI64);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// NHWC -> the golden sets' NCHW (a view; taps are read back as contiguous host copies).
Tensor nchw(const Tensor& nhwc) { return nhwc.permute({0, 3, 1, 2}); }

}  // namespace

BevFormer::BevFormer(ModelConfig cfg, const Checkpoint& checkpoint, Ops& ops, const Calibration* calibration,
                     const std::string& calibration_source)
    : cfg_(std::move(cfg)) {
  validate_config(cfg_);
  const WeightSource w(cfg_, checkpoint, calibration, calibration_source);
  resnet_ = load_resnet(ops, w, cfg_.backbone);
  fpn_ = load_fpn(ops, w, cfg_.neck);
  const std::string tr = "pts_bbox_head.transformer";
  cams_embeds_ = ops.constant(w.get(tr + ".cams_embeds"));
  const Tensor levels = w.get(tr + ".level_embeds");
  if (cfg_.neck.num_outs > levels.size(0) || cfg_.neck.num_outs != cfg_.transformer.sca.num_levels) {
    throw Error(ErrorKind::kInvalidInput, "the neck gives " + std::to_string(cfg_.neck.num_outs) +
                                              " level(s), SCA reads " + std::to_string(cfg_.transformer.sca.num_levels) +
                                              ", level_embeds has " + std::to_string(levels.size(0)))
        .where("config")
        .expected("img_neck.num_outs == SCA num_levels <= num_feature_levels");
  }
  for (int l = 0; l < cfg_.neck.num_outs; ++l) level_embeds_.push_back(ops.constant(levels.select(0, l)));
  encoder_ = load_encoder(ops, w, cfg_);
  head_ = load_head(ops, w, cfg_);
  decoder_ = load_decoder(ops, w, cfg_);
}

ImagePreprocessAttrs image_preprocess_attrs(const ImageConfig& ic, int64_t height, int64_t width) {
  const ImageSize original{static_cast<int>(width), static_cast<int>(height)};
  const ImageSize resized = image_resized_size(ic, original), padded = image_padded_size(ic, original);
  ImagePreprocessAttrs a;
  for (int c = 0; c < 3; ++c) {
    a.mean[c] = ic.mean[static_cast<size_t>(c)];
    a.std[c] = ic.std[static_cast<size_t>(c)];
  }
  a.to_rgb = ic.to_rgb;
  a.resized_height = resized.height;
  a.resized_width = resized.width;
  a.padded_height = padded.height;
  a.padded_width = padded.width;
  return a;
}

std::array<int64_t, 2> BevFormer::network_image_size(const Tensor& img) const {
  if (img.dtype() != DType::kU8) return {img.size(1), img.size(2)};
  const ImagePreprocessAttrs a = image_preprocess_attrs(cfg_.image, img.size(1), img.size(2));
  return {a.padded_height, a.padded_width};
}

void BevFormer::check_frame(const FrameInput& f) const {
  const int cams = cfg_.transformer.num_cams;
  if (!f.img.defined() || (f.img.dtype() != DType::kF32 && f.img.dtype() != DType::kU8) || f.img.dim() != 4 ||
      f.img.size(3) != 3) {
    bad_frame("img is " + (f.img.defined() ? f.img.describe() : std::string("missing")),
              "u8 [cameras, H, W, 3] (BGR pixels) or f32 [cameras, H, W, 3] (the network input, NHWC)");
  }
  if (f.img.size(0) != cams) {
    bad_frame(std::to_string(f.img.size(0)) + " camera image(s)",
              std::to_string(cams) + " (the model's num_cams; cams_embeds is learned per camera slot)");
  }
  if (f.img.dtype() == DType::kU8) {
    // Pixels become the network input inside: its size is what the backbone must take.
    constexpr int64_t kMaxSide = 1 << 15;
    if (f.img.size(1) > kMaxSide || f.img.size(2) > kMaxSide) {
      bad_frame("img is " + f.img.describe(), "H, W <= " + std::to_string(kMaxSide));
    }
    const ImagePreprocessAttrs a = image_preprocess_attrs(cfg_.image, f.img.size(1), f.img.size(2));
    if (a.resized_height < 1 || a.resized_width < 1 || a.padded_height < 32 || a.padded_width < 32) {
      bad_frame("img is " + f.img.describe() + ", " + std::to_string(a.padded_width) + "x" +
                    std::to_string(a.padded_height) + " after resize (scale " + number_text(cfg_.image.resize_scale) +
                    ") and padding",
                "a network input of at least 32x32");
    }
  } else if (f.img.size(1) < 32 || f.img.size(2) < 32) {
    bad_frame("img is " + f.img.describe(), "H, W >= 32");
  }
  if (static_cast<int>(f.lidar2img.size()) != cams) {
    bad_frame(std::to_string(f.lidar2img.size()) + " lidar2img matrices", std::to_string(cams) + ", one per camera");
  }
  for (size_t i = 0; i < f.lidar2img.size(); ++i) {
    for (double v : f.lidar2img[i]) {
      if (!std::isfinite(v)) bad_frame("lidar2img of camera " + std::to_string(i) + " has a non-finite entry", "finite");
    }
  }
  for (size_t i = 0; i < f.lidar2img.size(); ++i) {
    for (double v : f.lidar2img[i]) {
      if (std::fabs(v) > std::numeric_limits<float>::max()) {
        bad_frame("lidar2img of camera " + std::to_string(i) + " has an entry of " + number_text(v),
                  "values within float32 (the model projects in float32)");
      }
    }
  }
  for (size_t i = 0; i < f.can_bus.size(); ++i) {
    if (!std::isfinite(f.can_bus[i])) bad_frame("can_bus has a non-finite entry", "18 finite values");
    if (std::fabs(f.can_bus[i]) > std::numeric_limits<float>::max()) {
      throw Error(ErrorKind::kInvalidInput, "can_bus[" + std::to_string(i) + "] is " + number_text(f.can_bus[i]))
          .where("frame")
          .expected("values within float32 (the CAN-bus MLP computes in float32)")
          .hint("can_bus[0:7] come from T_world_from_ego when the frame has a pose, [7:16] from its \"can_bus\"");
    }
  }
}

RigGeometry BevFormer::rig_geometry(const FrameInput& f) const {
  RigGeometry g;
  g.lidar2img = f.lidar2img;
  const auto [h, w] = network_image_size(f.img);
  g.pad_h = static_cast<int>(h);
  g.pad_w = static_cast<int>(w);
  g.sampling = point_sampling(cfg_, f.lidar2img, g.pad_w, g.pad_h);
  g.queries = sca_query_lists(g.sampling);
  return g;
}

BevStepInputs BevFormer::forward_test_step(TemporalState& state, const FrameInput& f) const {
  BevStepInputs s;
  s.step = temporal_step(state, f.scene_token, f.can_bus, cfg_.video_test_mode);
  for (size_t i = 0; i < 18; ++i) {
    // A pose jump whose delta from the previous frame overflows float32 (both ends within it).
    if (std::fabs(s.step.can_bus[i]) > std::numeric_limits<float>::max()) {
      throw Error(ErrorKind::kInvalidInput, "can_bus[" + std::to_string(i) + "] after the change from the previous frame is " +
                                                number_text(s.step.can_bus[i]))
          .where("frame")
          .expected("a change within float32 from the stream's previous frame");
    }
  }
  s.shift = bev_shift(s.step.can_bus, cfg_);
  s.can_bus = Tensor::empty({1, 18}, DType::kF32);
  for (int i = 0; i < 18; ++i) s.can_bus.data<float>()[i] = static_cast<float>(s.step.can_bus[static_cast<size_t>(i)]);
  s.tsa_reference = tsa_reference(cfg_, s.shift, s.step.use_prev_bev);
  if (s.step.use_prev_bev) {
    s.rotation_index = i64_tensor(
        rotation_source_index(cfg_.head.bev_h, cfg_.head.bev_w, s.step.can_bus[17], cfg_.transformer.rotate_center));
  }
  return s;
}

void BevFormer::tap_geometry(const BevStepInputs& s, const RigGeometry& rig, Taps& taps) const {
  Tensor cb = Tensor::empty({18}, DType::kF64);
  std::memcpy(cb.raw_data(), s.step.can_bus.data(), sizeof(double) * 18);
  taps.put("dbg.can_bus", cb);
  taps.put("dbg.shift", Tensor::from_floats({1, 2}, s.shift));
  const Tensor& rpc = rig.sampling.reference_points_cam;
  taps.put("dbg.reference_points_cam", rpc.reshape({rpc.size(0), 1, rpc.size(1), rpc.size(2), 2}));
  const Tensor& mask = rig.sampling.bev_mask;
  taps.put("dbg.bev_mask", mask.reshape({mask.size(0), 1, mask.size(1), mask.size(2)}));
  taps.put("dbg.bev_mask_count", i64_tensor(rig.queries.count_per_camera));
}

ImageOutputs BevFormer::image_stage(Ops& o, const Tensor& input, Taps* taps) const {
  // B frames of `cams` cameras; each frame's cameras take the learned embedding of their slot.
  const int64_t images = input.size(0), cams = cfg_.transformer.num_cams, batch = images / cams;
  const int64_t c = cfg_.transformer.embed_dims, heads = cfg_.transformer.sca.num_heads;
  Tensor img = input;
  if (input.dtype() == DType::kU8) {  // camera pixels: upstream's test pipeline first
    o.set_stage("img.preprocess");
    img = o.image_preprocess(input, image_preprocess_attrs(cfg_.image, input.size(1), input.size(2)), "img");
  }
  o.set_stage("img.stem");
  const std::vector<Tensor> feats = resnet_forward(o, resnet_, cfg_.backbone, img);
  const std::vector<Tensor> levels = fpn_forward(o, fpn_, cfg_.neck, feats);
  if (taps) {
    taps->put("img", nchw(img));
    for (size_t i = 0; i < feats.size(); ++i) taps->put("backbone." + std::to_string(i), nchw(feats[i]));
    for (size_t i = 0; i < levels.size(); ++i) taps->put("neck." + std::to_string(i), nchw(levels[i]));
  }

  o.set_stage("img.values");
  SpatialShapes shapes;
  std::vector<int64_t> starts;
  int64_t total = 0;
  std::vector<Tensor> maps;
  for (size_t l = 0; l < levels.size(); ++l) {
    const int64_t h = levels[l].size(1), w = levels[l].size(2);
    shapes.emplace_back(h, w);
    starts.push_back(total);
    total += h * w;
    maps.push_back(levels[l].reshape({images, h * w, c}));
  }
  // Only the value projections read the features: bf16 in bf16 precision (compact_dtype), so the
  // six of them share one conversion instead of each making its own.
  const std::vector<Tensor> level_rows(level_embeds_.begin(),
                                       level_embeds_.begin() + static_cast<std::ptrdiff_t>(levels.size()));
  const Tensor feat = o.feat_flatten(maps, level_rows, cfg_.transformer.use_cams_embeds ? cams_embeds_ : Tensor(),
                                     "feat_flatten", compact_dtype(o));
  ImageOutputs out;
  out.nonfinite = o.count_nonfinite(feat, batch, "feat_flatten.nonfinite");
  if (taps) {
    std::vector<int64_t> ss;
    for (const auto& [h, w] : shapes) {
      ss.push_back(h);
      ss.push_back(w);
    }
    taps->put("dbg.spatial_shapes", i64_tensor(ss).reshape({static_cast<int64_t>(shapes.size()), 2}));
    taps->put("dbg.level_start_index", i64_tensor(starts));
  }
  std::vector<ScaInputs>& sca = out.sca;
  for (size_t i = 0; i < encoder_.layers.size(); ++i) {
    ScaInputs s;
    s.value = o.linear(feat, encoder_.layers[i].sca.value_proj,
                       "encoder.layers." + std::to_string(i) + ".attentions.1.deformable_attention.value_proj",
                       compact_dtype(o))
                  .reshape({images, total, heads, c / heads});
    s.spatial_shapes = shapes;
    s.level_start = starts;
    sca.push_back(std::move(s));
  }
  return out;
}

BevOutputs BevFormer::bev_stage(Ops& o, const EncoderInputs& in, Taps* taps) const {
  const int64_t hw = int64_t{cfg_.head.bev_h} * cfg_.head.bev_w, c = cfg_.transformer.embed_dims, batch = in.batch;
  if (batch > 1 && taps) throw Error(ErrorKind::kInternal, "taps of a batched bev stage");
  BevOutputs r;
  r.bev_embed = encoder_forward(o, encoder_, cfg_, in, taps);
  r.nonfinite = o.count_nonfinite(r.bev_embed, batch, "bev_embed.nonfinite");  // stage enc.out
  if (taps) taps->put("bev_embed", r.bev_embed.reshape({hw, 1, c}));
  const DecoderOutputs dec = decoder_forward(o, decoder_, head_, cfg_, r.bev_embed, taps);

  o.set_stage("dec.heads");
  const int64_t q_len = decoder_.query.size(0) * batch, layers = static_cast<int64_t>(dec.states.size());
  const int64_t classes = cfg_.head.num_classes, code = cfg_.head.code_size;
  const BboxDenormalizeAttrs denorm = bbox_denormalize_attrs(cfg_.head.pc_range);
  std::vector<Tensor> cls, preds;
  for (int64_t l = 0; l < layers; ++l) {
    const auto li = static_cast<size_t>(l);
    cls.push_back(cls_branch_forward(o, head_.cls[li], dec.states[li], "cls_branches." + std::to_string(l))
                      .reshape({1, q_len, classes}));
    preds.push_back(o.bbox_denormalize(dec.reg[li], dec.refined[li], denorm, "bbox_preds." + std::to_string(l))
                        .reshape({1, q_len, code}));
  }
  o.set_stage("dec.pack");
  r.all_cls = (layers == 1 ? cls[0] : o.concat(cls, 0, "all_cls_scores")).reshape({layers, q_len, classes});
  r.all_preds = (layers == 1 ? preds[0] : o.concat(preds, 0, "all_bbox_preds")).reshape({layers, q_len, code});
  r.last_preds = preds.back().reshape({q_len, code});
  const Tensor scores = o.sigmoid(cls.back().reshape({q_len * classes}), "scores");
  // One top-k per sample, over its own queries' scores.
  const int64_t per_sample = q_len / batch * classes, k = std::min<int64_t>(cfg_.head.max_num, per_sample);
  for (int64_t b = 0; b < batch; ++b) {
    const Tensor sample_scores = batch == 1 ? scores : scores.slice(0, b * per_sample, (b + 1) * per_sample);
    auto [values, index] = o.topk(sample_scores, k, batch == 1 ? "topk" : "topk." + std::to_string(b));
    r.top_scores.push_back(values);
    r.top_index.push_back(index);
  }
  if (taps) {
    taps->put("all_cls_scores", r.all_cls.reshape({layers, 1, q_len, classes}));
    taps->put("all_bbox_preds", r.all_preds.reshape({layers, 1, q_len, code}));
  }
  return r;
}

std::vector<Detection> BevFormer::decode(const Tensor& top_scores, const Tensor& top_index,
                                         const Tensor& last_preds) const {
  return decode_detections(cfg_.head, top_scores, top_index, last_preds);
}

}  // namespace bev
