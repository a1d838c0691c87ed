#include "model/bevformer.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "backend/ops.h"
#include "bevformer/error.h"
#include "model/decoder.h"
#include "model/encoder.h"
#include "model/fpn.h"
#include "model/geometry.h"
#include "model/head.h"
#include "model/resnet.h"
#include "model/weights.h"

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

// NHWC -> the golden sets' NCHW.
Tensor nchw(const Tensor& nhwc) { return nhwc.permute({0, 3, 1, 2}); }

// The geometry that depends only on the rig (lidar2img and the padded image size), kept until
// the rig changes.
struct RigGeometry {
  std::vector<std::array<double, 16>> lidar2img;
  int pad_w = 0, pad_h = 0;
  PointSampling sampling;
  ScaPlan plan;
};

}  // namespace

struct BevFormer::Impl {
  ModelConfig cfg;
  Ops ops;
  ResNetWeights resnet;
  FpnWeights fpn;
  Tensor cams_embeds;                // pts_bbox_head.transformer.cams_embeds [num_cams, C]
  std::vector<Tensor> level_embeds;  // pts_bbox_head.transformer.level_embeds rows [C]
  EncoderWeights encoder;
  DecoderWeights decoder;
  HeadWeights head;

  TemporalState state;
  Tensor prev_bev;  // [HW, C]
  std::optional<RigGeometry> rig;

  Impl(ModelConfig c, const Checkpoint& ckpt, Backend& backend) : cfg(std::move(c)), ops(backend) {
    validate_config(cfg);
    const WeightSource w(cfg, ckpt);
    resnet = load_resnet(ops, w, cfg.backbone);
    fpn = load_fpn(ops, w, cfg.neck);
    const std::string tr = "pts_bbox_head.transformer";
    cams_embeds = w.get(tr + ".cams_embeds");
    const Tensor levels = w.get(tr + ".level_embeds");
    if (cfg.neck.num_outs > levels.size(0) || cfg.neck.num_outs != cfg.transformer.sca.num_levels) {
      throw Error(ErrorKind::kInvalidInput, "the neck gives " + std::to_string(cfg.neck.num_outs) +
                                                " level(s), SCA reads " + std::to_string(cfg.transformer.sca.num_levels) +
                                                ", level_embeds has " + std::to_string(levels.size(0)))
          .where("config")
          .expected("img_neck.num_outs == SCA num_levels <= num_feature_levels");
    }
    for (int l = 0; l < cfg.neck.num_outs; ++l) level_embeds.push_back(levels.select(0, l).contiguous());
    encoder = load_encoder(ops, w, cfg);
    head = load_head(ops, w, cfg);
    decoder = load_decoder(ops, w, cfg);
  }

  void check_frame(const FrameInput& f) const {
    const int cams = cfg.transformer.num_cams;
    if (!f.img.defined() || f.img.dtype() != DType::kF32 || f.img.dim() != 4 || f.img.size(1) != 3) {
      bad_frame("img is " + (f.img.defined() ? f.img.describe() : std::string("missing")), "f32 [cameras, 3, H, W]");
    }
    if (f.img.size(0) != cams) {
      bad_frame(std::to_string(f.img.size(0)) + " camera image(s)",
                std::to_string(cams) + " (the model's num_cams; cams_embeds is learned per camera slot)");
    }
    if (f.img.size(2) < 32 || f.img.size(3) < 32) bad_frame("img is " + f.img.describe(), "H, W >= 32");
    if (static_cast<int>(f.lidar2img.size()) != cams) {
      bad_frame(std::to_string(f.lidar2img.size()) + " lidar2img matrices", std::to_string(cams) + ", one per camera");
    }
    for (size_t i = 0; i < f.lidar2img.size(); ++i) {
      for (double v : f.lidar2img[i]) {
        if (!std::isfinite(v)) bad_frame("lidar2img of camera " + std::to_string(i) + " has a non-finite entry", "finite");
      }
    }
    for (double v : f.can_bus) {
      if (!std::isfinite(v)) bad_frame("can_bus has a non-finite entry", "18 finite values");
    }
  }

  const RigGeometry& rig_geometry(const FrameInput& f) {
    const int pad_w = static_cast<int>(f.img.size(3)), pad_h = static_cast<int>(f.img.size(2));
    if (!rig || rig->lidar2img != f.lidar2img || rig->pad_w != pad_w || rig->pad_h != pad_h) {
      RigGeometry g;
      g.lidar2img = f.lidar2img;
      g.pad_w = pad_w;
      g.pad_h = pad_h;
      g.sampling = point_sampling(cfg, f.lidar2img, pad_w, pad_h);
      g.plan = sca_plan(g.sampling);
      rig = std::move(g);
    }
    return *rig;
  }

  // The image stage: backbone, neck, flattened camera features with their embeddings, and every
  // encoder layer's SCA value projection.
  std::vector<ScaInputs> image_stage(const Tensor& img, Taps* taps) {
    const int64_t cams = img.size(0), c = cfg.transformer.embed_dims, heads = cfg.transformer.sca.num_heads;
    ops.set_stage("img.stem");
    const Tensor x = ops.permute(img, {0, 2, 3, 1}, "img.nhwc");
    const std::vector<Tensor> feats = resnet_forward(ops, resnet, cfg.backbone, x);
    const std::vector<Tensor> levels = fpn_forward(ops, fpn, cfg.neck, feats);
    if (taps) {
      taps->put("img", img);
      for (size_t i = 0; i < feats.size(); ++i) taps->put("backbone." + std::to_string(i), nchw(feats[i]));
      for (size_t i = 0; i < levels.size(); ++i) taps->put("neck." + std::to_string(i), nchw(levels[i]));
    }

    ops.set_stage("img.values");
    SpatialShapes shapes;
    std::vector<int64_t> starts;
    std::vector<Tensor> flat;
    int64_t total = 0;
    const Tensor cam_rows = cams_embeds.reshape({cams, 1, c});
    for (size_t l = 0; l < levels.size(); ++l) {
      const int64_t h = levels[l].size(1), w = levels[l].size(2);
      shapes.emplace_back(h, w);
      starts.push_back(total);
      total += h * w;
      Tensor f = levels[l].reshape({cams, h * w, c});
      if (cfg.transformer.use_cams_embeds) f = ops.add(f, cam_rows, "feat_flatten.cams_embeds." + std::to_string(l));
      flat.push_back(ops.add_rows(f, level_embeds[l], "feat_flatten.level_embeds." + std::to_string(l)));
    }
    const Tensor feat = flat.size() == 1 ? flat[0] : ops.concat(flat, 1, "feat_flatten");
    if (taps) {
      std::vector<int64_t> ss;
      for (const auto& [h, w] : shapes) {
        ss.push_back(h);
        ss.push_back(w);
      }
      taps->put("dbg.spatial_shapes", i64_tensor(ss).reshape({static_cast<int64_t>(shapes.size()), 2}));
      taps->put("dbg.level_start_index", i64_tensor(starts));
    }
    std::vector<ScaInputs> sca;
    for (size_t i = 0; i < encoder.layers.size(); ++i) {
      ScaInputs s;
      s.value = ops.linear(feat, encoder.layers[i].sca.value_proj,
                           "encoder.layers." + std::to_string(i) + ".attentions.1.deformable_attention.value_proj")
                    .reshape({cams, total, heads, c / heads});
      s.spatial_shapes = shapes;
      s.level_start = starts;
      sca.push_back(std::move(s));
    }
    return sca;
  }

  FrameOutput forward(const FrameInput& f, Taps* taps) {
    check_frame(f);
    const TemporalStep step = temporal_step(state, f.scene_token, f.can_bus, cfg.video_test_mode);
    if (!step.use_prev_bev) prev_bev = Tensor();
    const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;
    const int64_t hw = int64_t{bev_h} * bev_w, c = cfg.transformer.embed_dims;

    // Host geometry (float64/float32 as upstream), written into the stages' input tensors.
    const RigGeometry& rg = rig_geometry(f);
    const std::array<float, 2> shift = bev_shift(step.can_bus, cfg);
    EncoderInputs in;
    in.can_bus = Tensor::empty({1, 18}, DType::kF32);
    for (int i = 0; i < 18; ++i) in.can_bus.data<float>()[i] = static_cast<float>(step.can_bus[static_cast<size_t>(i)]);
    in.tsa_reference = tsa_reference(cfg, shift, step.use_prev_bev);
    if (step.use_prev_bev) {
      in.prev_bev = prev_bev;
      in.rotation_index = i64_tensor(
          rotation_source_index(bev_h, bev_w, step.can_bus[17], cfg.transformer.rotate_center));
    }
    if (taps) {
      Tensor cb = Tensor::empty({18}, DType::kF64);
      std::memcpy(cb.raw_data(), step.can_bus.data(), sizeof(double) * 18);
      taps->put("dbg.can_bus", cb);
      taps->put("dbg.shift", Tensor::from_floats({1, 2}, shift));
      const Tensor& rpc = rg.sampling.reference_points_cam;
      taps->put("dbg.reference_points_cam", rpc.reshape({rpc.size(0), 1, rpc.size(1), rpc.size(2), 2}));
      const Tensor& mask = rg.sampling.bev_mask;
      taps->put("dbg.bev_mask", mask.reshape({mask.size(0), 1, mask.size(1), mask.size(2)}));
      taps->put("dbg.bev_mask_count", i64_tensor(rg.plan.count_per_camera));
    }

    in.sca = image_stage(f.img, taps);
    for (ScaInputs& s : in.sca) {
      s.query_index = rg.plan.query_index;
      s.reference = rg.plan.reference;
      s.inv_count = rg.plan.inv_count;
    }

    // The bev stage.
    const Tensor bev_embed = encoder_forward(ops, encoder, cfg, in, taps);
    if (taps) taps->put("bev_embed", bev_embed.reshape({hw, 1, c}));
    const DecoderOutputs dec = decoder_forward(ops, decoder, head, cfg, bev_embed, taps);

    ops.set_stage("dec.heads");
    const int64_t q_len = decoder.query.size(0), layers = static_cast<int64_t>(dec.states.size());
    const int64_t classes = cfg.head.num_classes, code = cfg.head.code_size;
    const BboxDenormalizeAttrs denorm = bbox_denormalize_attrs(cfg.head.pc_range);
    std::vector<Tensor> cls, preds;
    for (int64_t l = 0; l < layers; ++l) {
      const auto li = static_cast<size_t>(l);
      cls.push_back(cls_branch_forward(ops, head.cls[li], dec.states[li], "cls_branches." + std::to_string(l))
                        .reshape({1, q_len, classes}));
      preds.push_back(ops.bbox_denormalize(dec.reg[li], dec.refined[li], denorm, "bbox_preds." + std::to_string(l))
                          .reshape({1, q_len, code}));
    }
    ops.set_stage("dec.pack");
    FrameOutput out;
    out.all_cls_scores = layers == 1 ? cls[0] : ops.concat(cls, 0, "all_cls_scores");
    out.all_bbox_preds = layers == 1 ? preds[0] : ops.concat(preds, 0, "all_bbox_preds");
    const Tensor scores = ops.sigmoid(cls.back().reshape({q_len * classes}), "scores");
    const int64_t k = std::min<int64_t>(cfg.head.max_num, q_len * classes);
    const auto [top_scores, top_index] = ops.topk(scores, k, "topk");
    out.detections = decode_detections(cfg.head, top_scores, top_index, preds.back().reshape({q_len, code}));
    if (taps) {
      taps->put("all_cls_scores", out.all_cls_scores.reshape({layers, 1, q_len, classes}));
      taps->put("all_bbox_preds", out.all_bbox_preds.reshape({layers, 1, q_len, code}));
    }
    out.bev_embed = bev_embed;
    out.used_history = step.use_prev_bev;

    prev_bev = bev_embed;
    state.has_prev_bev = true;
    return out;
  }
};

BevFormer::BevFormer(ModelConfig cfg, const Checkpoint& checkpoint, Backend& backend)
    : impl_(std::make_unique<Impl>(std::move(cfg), checkpoint, backend)) {}
BevFormer::~BevFormer() = default;

const ModelConfig& BevFormer::config() const { return impl_->cfg; }

FrameOutput BevFormer::forward(const FrameInput& frame, Taps* taps) { return impl_->forward(frame, taps); }

void BevFormer::reset_history() {
  impl_->state = TemporalState{};
  impl_->prev_bev = Tensor();
}

}  // namespace bev
