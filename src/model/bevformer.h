// BEVFormer (upstream's BEVFormer.forward_test and its module tree): the weights of a checkpoint
// prepared on a backend, the two stages of DESIGN §1 as op graphs — `image_stage` (backbone,
// neck, SCA value projections) and `bev_stage` (encoder, decoder, heads, top-k) — and the
// host-side geometry forward_test computes around them (check_frame, the rig's camera geometry,
// the temporal step). It runs nothing by itself and keeps no per-frame state: runtime/
// records, executes and feeds the stages (StageRunner) and keeps the streams' histories.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "model/attention.h"
#include "model/calibration.h"
#include "model/coder.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/encoder.h"
#include "model/fpn.h"
#include "model/geometry.h"
#include "model/head.h"
#include "model/resnet.h"
#include "model/taps.h"

namespace bev {

// One frame as upstream's forward_test receives it, on the host. `img` is the cameras' decoded
// pixels, which the image stage runs upstream's test pipeline on first (resize, normalise, pad:
// image_preprocess_attrs), or the network input that pipeline made.
struct FrameInput {
  Tensor img;  // u8 [N, H, W, 3]: BGR pixels as decoded; or f32 [N, H_pad, W_pad, 3]: normalized, padded, NHWC
  std::vector<std::array<double, 16>> lidar2img;  // per camera, row-major 4x4 at the network input's scale
  std::array<double, 18> can_bus{};                // absolute, BEFORE the test-time delta (spec §3)
  std::string scene_token;                         // a change drops the history
};

// Upstream's test pipeline (Ops::image_preprocess) for camera images of height x width under the
// config's image settings (resize_scale, size_divisor, img_norm_cfg).
ImagePreprocessAttrs image_preprocess_attrs(const ImageConfig& image, int64_t height, int64_t width);

// The geometry that depends only on the camera rig (lidar2img and the padded image size), on the
// host: what the bev stage's SCA reads. The runtime caches it per rig.
struct RigGeometry {
  std::vector<std::array<double, 16>> lidar2img;
  int pad_w = 0, pad_h = 0;
  PointSampling sampling;
  ScaQueryLists queries;
};

// forward_test's host step for one frame (spec §3, §2.6, §2.7): the bev stage's per-frame inputs,
// on the host.
struct BevStepInputs {
  TemporalStep step;              // the CAN-bus vector after the delta; whether TSA uses the history
  std::array<float, 2> shift{};   // BEV fractions
  Tensor can_bus;                 // f32 [1, 18]
  Tensor tsa_reference;           // f32 [HW, 2, 1, 2]
  Tensor rotation_index;          // i64 [HW] (with history): source cell of the rotated previous BEV
};

// The image stage's results, in backend memory (B frames: [B*cams, ...], each frame's cameras
// together).
struct ImageOutputs {
  std::vector<ScaInputs> sca;  // every encoder layer's SCA values
  Tensor nonfinite;            // i64 [B]: NaN/inf among each frame's flattened camera features (0 for a sound frame)
};

// The bev stage's results, in backend memory. B frames: each sample's rows together ([B*HW, C],
// [layers, B*Q, ...]) and one top-k per sample.
struct BevOutputs {
  Tensor bev_embed;   // [B*HW, C]: the encoder output, the next frame's previous BEV
  Tensor all_cls;     // [layers, B*Q, classes]: logits
  Tensor all_preds;   // [layers, B*Q, code]: centres in metres (spec §2.13)
  Tensor last_preds;  // [B*Q, code]
  std::vector<Tensor> top_scores, top_index;  // per sample: the NMS-free top-k of the last layer's sigmoid scores
  Tensor nonfinite;   // i64 [B]: NaN/inf in each sample's bev_embed (0 for a sound frame; else it must not become history)
};

class BevFormer {
 public:
  // Binds and validates every weight the config needs (all problems reported at once), prepares
  // the weighted ops and uploads every other weight through `ops` to its backend. The checkpoint
  // need not outlive the model.
  // In int8 precision `calibration` gives the input and output ranges of the convs that run in
  // int8 (read from `calibration_source`, named in errors).
  BevFormer(ModelConfig cfg, const Checkpoint& checkpoint, Ops& ops, const Calibration* calibration = nullptr,
            const std::string& calibration_source = {});

  const ModelConfig& config() const { return cfg_; }

  // The frame fits the model (camera count, image layout and size, calibration and CAN bus finite
  // and within float32, which the model computes in); Error(kInvalidInput) naming what does not.
  void check_frame(const FrameInput& f) const;
  // point_sampling and the SCA query lists of the frame's rig.
  RigGeometry rig_geometry(const FrameInput& f) const;
  // The network input's height and width for a frame's img: its own (f32), or the padded size
  // its pixels become (u8).
  std::array<int64_t, 2> network_image_size(const Tensor& img) const;
  // forward_test steps 1-3 for one frame; `state` advances as the frame will leave it (the caller
  // commits it only when the frame completes).
  BevStepInputs forward_test_step(TemporalState& state, const FrameInput& f) const;
  // The host-side debugging tensors of a frame (dbg.can_bus, dbg.shift, dbg.reference_points_cam,
  // dbg.bev_mask, dbg.bev_mask_count).
  void tap_geometry(const BevStepInputs& step, const RigGeometry& rig, Taps& taps) const;

  // The image stage on img [B*N, H, W, 3] (a backend tensor; B frames of N cameras; u8 pixels,
  // preprocessed first, or the f32 network input): every encoder layer's SCA values.
  ImageOutputs image_stage(Ops& o, const Tensor& img, Taps* taps) const;
  // The bev stage: encoder, decoder, heads and the top-k, for in.batch frames (taps: batch 1 only).
  BevOutputs bev_stage(Ops& o, const EncoderInputs& in, Taps* taps) const;
  // NMSFreeCoder on the host copies of the top-k and the last layer's boxes.
  std::vector<Detection> decode(const Tensor& top_scores, const Tensor& top_index, const Tensor& last_preds) const;

 private:
  ModelConfig cfg_;
  ResNetWeights resnet_;
  FpnWeights fpn_;
  Tensor cams_embeds_;                // pts_bbox_head.transformer.cams_embeds [num_cams, C]
  std::vector<Tensor> level_embeds_;  // pts_bbox_head.transformer.level_embeds rows [C]
  EncoderWeights encoder_;
  DecoderWeights decoder_;
  HeadWeights head_;
};

}  // namespace bev
