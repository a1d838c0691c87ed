#include "model/bevformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <tuple>
#include <utility>

#include "backend/ops.h"
#include "backend/plan.h"
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

// The geometry that depends only on the rig (lidar2img and the padded image size), cached per rig.
struct RigGeometry {
  std::vector<std::array<double, 16>> lidar2img;
  int pad_w = 0, pad_h = 0;
  PointSampling sampling;
  ScaPlan plan;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The model's image lanes: which are held by a frame between its two stages. A lane's image
// plan (or, eager, nothing) belongs to the frame holding it, so a frame's image outputs stay
// intact until its bev stage has read them.
class LanePool {
 public:
  explicit LanePool(int lanes) : busy_(static_cast<size_t>(lanes), false) {}
  int size() const { return static_cast<int>(busy_.size()); }

  int acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    size_t k = 0;
    cv_.wait(lock, [&] {
      for (k = 0; k < busy_.size(); ++k) {
        if (!busy_[k]) return true;
      }
      return false;
    });
    busy_[k] = true;
    return static_cast<int>(k);
  }
  void release(int lane) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      busy_[static_cast<size_t>(lane)] = false;
    }
    cv_.notify_all();
  }

  // Every lane, taken in order (so two callers cannot each hold half), released on destruction.
  class All {
   public:
    explicit All(LanePool& p) : pool_(p) {
      std::unique_lock<std::mutex> lock(p.mu_);
      for (size_t k = 0; k < p.busy_.size(); ++k) {
        p.cv_.wait(lock, [&] { return !p.busy_[k]; });
        p.busy_[k] = true;
      }
    }
    ~All() {
      for (int k = 0; k < pool_.size(); ++k) pool_.release(k);
    }
    All(const All&) = delete;
    All& operator=(const All&) = delete;

   private:
    LanePool& pool_;
  };

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
};

}  // namespace

struct StagedFrame::State {
  LanePool* lanes = nullptr;  // the model's; the lane goes back when this is destroyed
  int lane = -1;
  Shape img_shape;
  std::vector<ScaInputs> sca;  // eager: the image stage's outputs (replay: in the lane's plan)
  Clock::time_point started;
  double image_seconds = 0;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (lanes && lane >= 0) lanes->release(lane);
  }
};

StagedFrame::StagedFrame() = default;
StagedFrame::~StagedFrame() = default;
StagedFrame::StagedFrame(StagedFrame&&) noexcept = default;
StagedFrame& StagedFrame::operator=(StagedFrame&&) noexcept = default;
std::chrono::steady_clock::time_point StagedFrame::started() const { return s_ ? s_->started : Clock::time_point{}; }
double StagedFrame::image_seconds() const { return s_ ? s_->image_seconds : 0; }

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

  bool replay = true;        // record each stage once, replay it after (false: eager every frame)
  LanePool lanes;            // frames in flight between their stages (1, or 2 when pipelined)
  // Each stage runs one frame at a time. image_mu: `ops` (eager) and the image plans being
  // recorded or replayed; bev_mu: `bev_ops`, the rig cache and its bev plans.
  std::mutex image_mu, bev_mu;
  Ops bev_ops;
  StreamHistory default_history;

  Impl(ModelConfig c, const Checkpoint& ckpt, Backend& backend, bool replay_stages, bool pipelined)
      : cfg(std::move(c)), ops(backend), replay(replay_stages), lanes(pipelined ? 2 : 1), bev_ops(backend) {
    image_plans.resize(static_cast<size_t>(lanes.size()));
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

  // The image stage: backbone, neck, flattened camera features with their embeddings, and every
  // encoder layer's SCA value projection.
  std::vector<ScaInputs> image_stage(Ops& o, const Tensor& img, Taps* taps) {
    const int64_t cams = img.size(0), c = cfg.transformer.embed_dims, heads = cfg.transformer.sca.num_heads;
    o.set_stage("img.stem");
    const Tensor x = o.permute(img, {0, 2, 3, 1}, "img.nhwc");
    const std::vector<Tensor> feats = resnet_forward(o, resnet, cfg.backbone, x);
    const std::vector<Tensor> levels = fpn_forward(o, fpn, cfg.neck, feats);
    if (taps) {
      taps->put("img", img);
      for (size_t i = 0; i < feats.size(); ++i) taps->put("backbone." + std::to_string(i), nchw(feats[i]));
      for (size_t i = 0; i < levels.size(); ++i) taps->put("neck." + std::to_string(i), nchw(levels[i]));
    }

    o.set_stage("img.values");
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
      if (cfg.transformer.use_cams_embeds) f = o.add(f, cam_rows, "feat_flatten.cams_embeds." + std::to_string(l));
      flat.push_back(o.add_rows(f, level_embeds[l], "feat_flatten.level_embeds." + std::to_string(l)));
    }
    const Tensor feat = flat.size() == 1 ? flat[0] : o.concat(flat, 1, "feat_flatten");
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
      s.value = o.linear(feat, encoder.layers[i].sca.value_proj,
                           "encoder.layers." + std::to_string(i) + ".attentions.1.deformable_attention.value_proj")
                    .reshape({cams, total, heads, c / heads});
      s.spatial_shapes = shapes;
      s.level_start = starts;
      sca.push_back(std::move(s));
    }
    return sca;
  }

  // The bev stage: encoder, decoder, heads and the top-k (everything after the host geometry).
  struct BevOutputs {
    Tensor bev_embed;   // [HW, C]
    Tensor all_cls;     // [layers, Q, classes]
    Tensor all_preds;   // [layers, Q, code]
    Tensor last_preds;  // [Q, code]
    Tensor top_scores, top_index;
  };

  BevOutputs bev_stage(Ops& o, const EncoderInputs& in, Taps* taps) {
    const int64_t hw = int64_t{cfg.head.bev_h} * cfg.head.bev_w, c = cfg.transformer.embed_dims;
    BevOutputs r;
    r.bev_embed = encoder_forward(o, encoder, cfg, in, taps);
    if (taps) taps->put("bev_embed", r.bev_embed.reshape({hw, 1, c}));
    const DecoderOutputs dec = decoder_forward(o, decoder, head, cfg, r.bev_embed, taps);

    o.set_stage("dec.heads");
    const int64_t q_len = decoder.query.size(0), layers = static_cast<int64_t>(dec.states.size());
    const int64_t classes = cfg.head.num_classes, code = cfg.head.code_size;
    const BboxDenormalizeAttrs denorm = bbox_denormalize_attrs(cfg.head.pc_range);
    std::vector<Tensor> cls, preds;
    for (int64_t l = 0; l < layers; ++l) {
      const auto li = static_cast<size_t>(l);
      cls.push_back(cls_branch_forward(o, head.cls[li], dec.states[li], "cls_branches." + std::to_string(l))
                        .reshape({1, q_len, classes}));
      preds.push_back(o.bbox_denormalize(dec.reg[li], dec.refined[li], denorm, "bbox_preds." + std::to_string(l))
                          .reshape({1, q_len, code}));
    }
    o.set_stage("dec.pack");
    r.all_cls = (layers == 1 ? cls[0] : o.concat(cls, 0, "all_cls_scores")).reshape({layers, q_len, classes});
    r.all_preds = (layers == 1 ? preds[0] : o.concat(preds, 0, "all_bbox_preds")).reshape({layers, q_len, code});
    r.last_preds = preds.back().reshape({q_len, code});
    const Tensor scores = o.sigmoid(cls.back().reshape({q_len * classes}), "scores");
    const int64_t k = std::min<int64_t>(cfg.head.max_num, q_len * classes);
    std::tie(r.top_scores, r.top_index) = o.topk(scores, k, "topk");
    if (taps) {
      taps->put("all_cls_scores", r.all_cls.reshape({layers, 1, q_len, classes}));
      taps->put("all_bbox_preds", r.all_preds.reshape({layers, 1, q_len, code}));
    }
    return r;
  }

  // ---- recorded plans: each stage recorded once per shape, then replayed ----

  struct ImagePlan {
    Shape shape;
    bool tapped = false;
    uint64_t generation = 0;      // which recording: bev plans read the outputs of one
    Tensor img;                   // the input, rewritten in place every frame
    std::vector<ScaInputs> sca;   // the outputs (kept out of the arena)
    Taps taps{true};
    Plan plan;
  };
  struct BevPlan {
    bool use_prev = false;
    bool tapped = false;
    int lane = 0;                  // whose image outputs it reads...
    uint64_t image_generation = 0;  // ...as that lane's plan was recorded then
    EncoderInputs in;             // can_bus, tsa_reference, prev_bev, rotation_index: rewritten per frame
    BevOutputs out;
    Taps taps{true};
    Plan plan;
  };
  // One image plan per lane (a frame in flight between its stages). Lane k's plan belongs to the
  // frame holding lane k: its image stage records or replays it (under image_mu), then its bev
  // stage reads the outputs (under bev_mu); no other frame touches it meanwhile.
  std::vector<std::unique_ptr<ImagePlan>> image_plans;
  uint64_t image_recordings = 0;  // under image_mu

  // A rig's geometry and its bev plans (one per history variant, tap setting and lane), which
  // read the rig's SCA query lists. Several vehicles with different rigs share one model, so the
  // last kMaxRigs rigs stay recorded; the least recently used beyond them is dropped.
  struct RigEntry {
    size_t id = 0;  // 1 for the first rig this model saw, 2 for the next new one...
    RigGeometry geometry;
    std::vector<std::unique_ptr<BevPlan>> bev_plans;
  };
  static constexpr size_t kMaxRigs = 4;
  std::vector<std::unique_ptr<RigEntry>> rigs;  // most recently used first; under bev_mu
  size_t rigs_computed = 0;                     // rig geometries computed so far (tests, describe)

  // The frame's rig, moved to the front; computed (and the oldest dropped) when it is new.
  RigEntry& rig_entry(const FrameInput& f) {
    const int pad_w = static_cast<int>(f.img.size(3)), pad_h = static_cast<int>(f.img.size(2));
    auto it = std::find_if(rigs.begin(), rigs.end(), [&](const std::unique_ptr<RigEntry>& r) {
      return r->geometry.lidar2img == f.lidar2img && r->geometry.pad_w == pad_w && r->geometry.pad_h == pad_h;
    });
    if (it == rigs.end()) {
      auto e = std::make_unique<RigEntry>();
      e->geometry.lidar2img = f.lidar2img;
      e->geometry.pad_w = pad_w;
      e->geometry.pad_h = pad_h;
      e->geometry.sampling = point_sampling(cfg, f.lidar2img, pad_w, pad_h);
      e->geometry.plan = sca_plan(e->geometry.sampling);
      e->id = ++rigs_computed;
      if (rigs.size() == kMaxRigs) rigs.pop_back();
      rigs.insert(rigs.begin(), std::move(e));
    } else {
      std::rotate(rigs.begin(), it, it + 1);
    }
    return *rigs.front();
  }

  static std::vector<Tensor> tap_tensors(const Taps& t) {
    std::vector<Tensor> v;
    for (const auto& [name, tensor] : t.all()) v.push_back(tensor);
    return v;
  }
  static void copy_into(const Tensor& dst, const Tensor& src) {
    if (dst.shape() != src.shape() || dst.dtype() != src.dtype()) {
      throw Error(ErrorKind::kInternal, "plan input " + dst.describe() + " given " + src.describe());
    }
    const Tensor c = src.contiguous();
    std::memcpy(dst.raw_data(), c.raw_data(), c.nbytes());
  }
  static void materialize(const Taps& refs, const Plan& plan, Taps& out) {
    for (const auto& [name, t] : refs.all()) out.put(name, plan.resolve(t));
  }

  void image_planned(int lane, const Tensor& img, Taps* taps) {
    const bool tapped = taps != nullptr;
    std::unique_ptr<ImagePlan>& image_plan = image_plans[static_cast<size_t>(lane)];
    if (!image_plan || image_plan->shape != img.shape() || image_plan->tapped != tapped) {
      auto p = std::make_unique<ImagePlan>();
      p->shape = img.shape();
      p->tapped = tapped;
      p->generation = ++image_recordings;  // this lane's bev plans read the old outputs: stale now
      p->img = img.clone();
      // Recorded without running (each intermediate would otherwise hold its own memory until
      // the plan exists: tiny 1050 MiB against a 281 MiB arena), then computed by the first replay.
      Ops rec(ops.backend(), Ops::Mode::kPlan);
      p->sca = image_stage(rec, p->img, tapped ? &p->taps : nullptr);
      std::vector<Tensor> keep = tap_tensors(p->taps);
      for (const ScaInputs& s : p->sca) keep.push_back(s.value);
      p->plan = Plan(lane == 0 ? "image" : "image (lane " + std::to_string(lane + 1) + ")", rec.take_nodes(), keep);
      image_plan = std::move(p);
    } else {
      copy_into(image_plan->img, img);
    }
    image_plan->plan.replay(ops.backend());
    if (taps) materialize(image_plan->taps, image_plan->plan, *taps);
  }

  const BevOutputs& bev_planned(const EncoderInputs& in, RigEntry& rig, int lane, Taps* taps) {
    const RigGeometry& rg = rig.geometry;
    const ImagePlan& image_plan = *image_plans[static_cast<size_t>(lane)];
    std::vector<std::unique_ptr<BevPlan>>& bev_plans = rig.bev_plans;
    // Plans that read an earlier recording of this lane's image plan would replay on its stale
    // outputs (which they keep alive: for base about 1.1 GB each). Every rig's go, not only this
    // one's: a new image size is also a new rig, so the old rig's plans would otherwise linger.
    for (auto& r : rigs) {
      std::erase_if(r->bev_plans, [&](const std::unique_ptr<BevPlan>& p) {
        return p->lane == lane && p->image_generation != image_plan.generation;
      });
    }
    const bool use_prev = in.prev_bev.defined(), tapped = taps != nullptr;
    BevPlan* plan = nullptr;
    for (auto& p : bev_plans) {
      if (p->use_prev == use_prev && p->tapped == tapped && p->lane == lane) plan = p.get();
    }
    if (plan == nullptr) {
      auto p = std::make_unique<BevPlan>();
      p->use_prev = use_prev;
      p->tapped = tapped;
      p->lane = lane;
      p->image_generation = image_plan.generation;
      p->in.can_bus = in.can_bus.clone();
      p->in.tsa_reference = in.tsa_reference.clone();
      if (use_prev) {
        p->in.prev_bev = in.prev_bev.clone();
        p->in.rotation_index = in.rotation_index.clone();
      }
      p->in.sca = image_plan.sca;
      for (ScaInputs& s : p->in.sca) {
        s.query_index = rg.plan.query_index;
        s.reference = rg.plan.reference;
        s.inv_count = rg.plan.inv_count;
      }
      Ops rec(ops.backend(), Ops::Mode::kPlan);  // computed by the replay below, as the image plan
      p->out = bev_stage(rec, p->in, tapped ? &p->taps : nullptr);
      std::vector<Tensor> keep = tap_tensors(p->taps);
      for (const Tensor& t : {p->out.bev_embed, p->out.all_cls, p->out.all_preds, p->out.last_preds, p->out.top_scores,
                              p->out.top_index}) {
        keep.push_back(t);
      }
      std::string name = use_prev ? "bev (with history" : "bev (first frame";
      if (rig.id > 1) name += ", rig " + std::to_string(rig.id);
      if (lane > 0) name += ", lane " + std::to_string(lane + 1);
      p->plan = Plan(name + ")", rec.take_nodes(), keep);
      plan = p.get();
      bev_plans.push_back(std::move(p));
    } else {
      copy_into(plan->in.can_bus, in.can_bus);
      copy_into(plan->in.tsa_reference, in.tsa_reference);
      if (use_prev) {
        copy_into(plan->in.prev_bev, in.prev_bev);
        copy_into(plan->in.rotation_index, in.rotation_index);
      }
    }
    plan->plan.replay(ops.backend());
    if (taps) materialize(plan->taps, plan->plan, *taps);
    return plan->out;
  }

  // ---- the two stages of a frame, apart ----

  std::unique_ptr<StagedFrame::State> run_image(const FrameInput& f, Taps* taps) {
    check_frame(f);
    auto st = std::make_unique<StagedFrame::State>();
    st->lane = lanes.acquire();  // released when st is destroyed (by run_bev, or on a throw)
    st->lanes = &lanes;
    st->img_shape = f.img.shape();
    const std::lock_guard<std::mutex> lock(image_mu);
    st->started = Clock::now();
    if (replay) {
      image_planned(st->lane, f.img, taps);
    } else {
      st->sca = image_stage(ops, f.img, taps);
    }
    st->image_seconds = seconds_since(st->started);
    return st;
  }

  FrameOutput run_bev(const FrameInput& f, std::unique_ptr<StagedFrame::State> st, StreamHistory& history,
                      Taps* taps) {
    if (!st || st->lanes != &lanes) {
      throw Error(ErrorKind::kInvalidInput, st ? "a frame staged by another model" : "an empty staged frame")
          .where("run_bev")
          .expected("the result of this model's run_image for the same frame");
    }
    if (f.img.shape() != st->img_shape) {
      bad_frame("img is " + f.img.describe() + " but the staged frame's was " + shape_str(st->img_shape),
                "the frame given to run_image");
    }
    check_frame(f);
    const std::lock_guard<std::mutex> lock(bev_mu);
    FrameOutput out;
    out.image_seconds = st->image_seconds;
    auto t_part = Clock::now();
    // The history changes only when the frame completes: a failure leaves it as it was.
    TemporalState next_state = history.state;
    const TemporalStep step = temporal_step(next_state, f.scene_token, f.can_bus, cfg.video_test_mode);
    const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;

    // Host geometry (float64/float32 as upstream), the stages' per-frame inputs.
    RigEntry& rig = rig_entry(f);
    const RigGeometry& rg = rig.geometry;
    const std::array<float, 2> shift = bev_shift(step.can_bus, cfg);
    EncoderInputs in;
    in.can_bus = Tensor::empty({1, 18}, DType::kF32);
    for (int i = 0; i < 18; ++i) in.can_bus.data<float>()[i] = static_cast<float>(step.can_bus[static_cast<size_t>(i)]);
    in.tsa_reference = tsa_reference(cfg, shift, step.use_prev_bev);
    if (step.use_prev_bev) {
      in.prev_bev = history.prev_bev;
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
    out.geometry_seconds = seconds_since(t_part);

    t_part = Clock::now();
    BevOutputs r;
    if (replay) {
      r = bev_planned(in, rig, st->lane, taps);
      // The plan's buffers are reused by the next frame (of any stream): copy what leaves.
      for (Tensor* t : {&r.bev_embed, &r.all_cls, &r.all_preds, &r.last_preds, &r.top_scores, &r.top_index}) {
        *t = t->clone();
      }
    } else {
      in.sca = std::move(st->sca);
      for (ScaInputs& s : in.sca) {
        s.query_index = rg.plan.query_index;
        s.reference = rg.plan.reference;
        s.inv_count = rg.plan.inv_count;
      }
      r = bev_stage(bev_ops, in, taps);
    }
    st.reset();  // the lane's outputs are read: the next frame's image stage may take it
    out.bev_seconds = seconds_since(t_part);

    t_part = Clock::now();
    out.detections = decode_detections(cfg.head, r.top_scores, r.top_index, r.last_preds);
    out.decode_seconds = seconds_since(t_part);
    out.bev_embed = r.bev_embed;
    out.all_cls_scores = r.all_cls;
    out.all_bbox_preds = r.all_preds;
    out.used_history = step.use_prev_bev;

    next_state.has_prev_bev = true;
    history.state = std::move(next_state);
    history.prev_bev = r.bev_embed;
    return out;
  }

  FrameOutput forward(const FrameInput& f, StreamHistory& history, Taps* taps) {
    return run_bev(f, run_image(f, taps), history, taps);
  }

  // Every lane (no frame in flight) and both stages' locks: for replays outside frames and for
  // reading the plans.
  struct Quiet {
    explicit Quiet(Impl& m) : held(m.lanes), lock(m.image_mu, m.bev_mu) {}
    LanePool::All held;
    std::scoped_lock<std::mutex, std::mutex> lock;
  };

  std::string describe() const {
    std::string s;
    for (const auto& p : image_plans) {
      if (p) s += p->plan.describe();
    }
    for (const auto& r : rigs) {
      for (const auto& p : r->bev_plans) s += p->plan.describe();
    }
    return s;
  }
};

BevFormer::BevFormer(ModelConfig cfg, const Checkpoint& checkpoint, Backend& backend, bool replay, bool pipelined)
    : impl_(std::make_unique<Impl>(std::move(cfg), checkpoint, backend, replay, pipelined)) {}
BevFormer::~BevFormer() = default;

const ModelConfig& BevFormer::config() const { return impl_->cfg; }

FrameOutput BevFormer::forward(const FrameInput& frame, StreamHistory& history, Taps* taps) {
  return impl_->forward(frame, history, taps);
}

FrameOutput BevFormer::forward(const FrameInput& frame, Taps* taps) {
  return impl_->forward(frame, impl_->default_history, taps);
}

void BevFormer::reset_history() {
  const std::lock_guard<std::mutex> lock(impl_->bev_mu);  // run_bev reads and writes it
  impl_->default_history = StreamHistory{};
}

StagedFrame BevFormer::run_image(const FrameInput& frame, Taps* taps) {
  StagedFrame staged;
  staged.s_ = impl_->run_image(frame, taps);
  return staged;
}

FrameOutput BevFormer::run_bev(const FrameInput& frame, StagedFrame staged, StreamHistory& history, Taps* taps) {
  return impl_->run_bev(frame, std::move(staged.s_), history, taps);
}

FrameOutput BevFormer::run_bev(const FrameInput& frame, StagedFrame staged, Taps* taps) {
  return impl_->run_bev(frame, std::move(staged.s_), impl_->default_history, taps);
}

int BevFormer::lanes() const { return impl_->lanes.size(); }

void BevFormer::replay_recorded_stages() {
  const Impl::Quiet quiet(*impl_);
  for (const auto& p : impl_->image_plans) {
    if (p) p->plan.replay(impl_->ops.backend());
  }
  for (const auto& r : impl_->rigs) {
    for (const auto& p : r->bev_plans) p->plan.replay(impl_->ops.backend());
  }
}

bool BevFormer::replay_image_stage() {
  const Impl::Quiet quiet(*impl_);
  const auto& p = impl_->image_plans.front();
  if (!p) return false;
  p->plan.replay(impl_->ops.backend());
  return true;
}

bool BevFormer::replay_bev_stage(bool with_history) {
  const Impl::Quiet quiet(*impl_);
  if (impl_->rigs.empty()) return false;
  // The last frame's rig; lane 0's plan, the one a plain model has (a pipelined model's lane 2
  // may hold another frame's inputs).
  for (int lane = 0; lane < impl_->lanes.size(); ++lane) {
    for (const auto& p : impl_->rigs.front()->bev_plans) {
      if (p->lane == lane && p->use_prev == with_history && !p->tapped) {
        p->plan.replay(impl_->ops.backend());
        return true;
      }
    }
  }
  return false;
}

std::vector<BevFormer::PlanInfo> BevFormer::plan_info() const {
  const Impl::Quiet quiet(*impl_);
  std::vector<PlanInfo> out;
  auto add = [&out](const Plan& p) {
    out.push_back({p.name(), p.nodes().size(), p.buffers(), p.arena_bytes(), p.no_reuse_bytes()});
  };
  for (const auto& p : impl_->image_plans) {
    if (p) add(p->plan);
  }
  for (const auto& r : impl_->rigs) {
    for (const auto& p : r->bev_plans) add(p->plan);
  }
  return out;
}

size_t BevFormer::rigs_seen() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->rigs_computed;
}

std::string BevFormer::describe() const {
  const Impl::Quiet quiet(*impl_);
  return impl_->describe();
}

}  // namespace bev
