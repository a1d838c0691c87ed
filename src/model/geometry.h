// The host-side geometry of one frame (docs/bevformer-spec.md §2.6-2.9 and §3): forward_test's
// history state machine and CAN-bus delta, the BEV shift, the nearest-neighbour rotation of the
// previous BEV as a gather index, TSA's hybrid reference points, point_sampling (reference
// points projected into every camera, with the visibility mask) and SCA's per-camera query
// lists. Everything here runs on the CPU in float64 / float32 exactly as upstream computes it
// (numpy float64 for the CAN-bus maths, torch float32 for grids and projections); no ops.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace bev {

// forward_test's state machine (spec §3): history flag, scene, previous raw pos/angle.
struct TemporalState {
  bool has_prev_bev = false;
  std::optional<std::string> scene_token;
  std::array<double, 3> prev_pos{};
  double prev_angle = 0;  // degrees, raw can_bus[17] of the previous frame
};

struct TemporalStep {
  std::array<double, 18> can_bus{};  // after the test-time delta (what the model consumes)
  bool use_prev_bev = false;         // TSA uses the previous BEV (shift + rotation apply)
};

// Steps 1-3 of forward_test, and the prev_pos/prev_angle/scene update of step 4: a new scene (or
// video_test_mode false) clears state.has_prev_bev; with history can_bus[0:3] -= prev_pos and
// can_bus[17] -= prev_angle (not wrapped), else both are set to 0. The caller sets
// state.has_prev_bev = true after the frame ran (and keeps the BEV).
TemporalStep temporal_step(TemporalState& state, const std::string& scene_token,
                           const std::array<double, 18>& raw_can_bus, bool video_test_mode);

// [shift_x, shift_y] in BEV fractions (spec §2.6; float64 then cast to float32), times use_shift.
// Uses the head's pc_range and bev_h/bev_w (upstream's BEVFormerHead.real_w/real_h).
std::array<float, 2> bev_shift(const std::array<double, 18>& can_bus, const ModelConfig& cfg);

// torchvision rotate(NEAREST, expand=False, zero fill) of a bev_h x bev_w grid by angle_deg about
// center (pixels [x=col, y=row]): for every output cell q = row*bev_w + col, the source cell, or
// -1 (zero). Emulates torchvision 0.10 on a CPU torch: theta built in float64 and cast to
// float32, the affine grid in float32 (base grid from linspace, bmm as a fused multiply-add chain
// in k order), grid_sample(nearest, zeros, align_corners=False) unnormalizing as
// (g + 1) * (size / 2) - 0.5 (fused, as the vectorized CPU kernel) and rounding half to even.
std::vector<int64_t> rotation_source_index(int bev_h, int bev_w, double angle_deg,
                                           const std::array<double, 2>& center);

// TSA's hybrid reference points (spec §2.7): f32 [HW, 2 (queue), 1, 2] of (x, y) =
// ((col+0.5)/W, (row+0.5)/H) computed as upstream (linspace in float32, then divide). Queue 0 =
// ref + shift when use_prev_bev (HEAD clone semantics), queue 1 = ref. With
// cfg.transformer.shift_ref_2d_alias both queues are ref + shift whatever use_prev_bev (the
// original release shifts ref_2d in place; without history the shift is zero there).
Tensor tsa_reference(const ModelConfig& cfg, const std::array<float, 2>& shift, bool use_prev_bev);

// point_sampling (spec §2.8), float32 like upstream: lidar2img per camera, row-major 4x4
// (float64, cast to float32), padded image size (the normalizer of u and v).
struct PointSampling {
  Tensor reference_points_cam;  // f32 [N, HW, D, 2] (u/W_pad, v/H_pad)
  Tensor bev_mask;              // u8 [N, HW, D]
};
PointSampling point_sampling(const ModelConfig& cfg, const std::vector<std::array<double, 16>>& lidar2img,
                             int pad_w, int pad_h);

// SCA's per-camera query lists (spec §2.9), rebatched like upstream: camera i's visible cells
// (any anchor visible, ascending) in rows [i*max_len, i*max_len + count_i), the rest padding.
struct ScaQueryLists {
  int64_t max_len = 0;                    // largest count over cameras (at least 1)
  std::vector<int64_t> count_per_camera;  // = dbg.bev_mask_count
  Tensor query_index;  // i64 [N*max_len]: BEV cell of each slot, -1 for padding
  Tensor reference;    // f32 [N*max_len, 1, D, 2]: reference_points_cam of the slot's cell (all D anchors, also invisible), zeros for padding
  Tensor inv_count;    // f32 [HW, 1]: 1 / max(number of cameras seeing the cell, 1), computed as 1.0f / float(count)
};
ScaQueryLists sca_query_lists(const PointSampling& ps);

// torch.linspace(start, end, steps) in float32 as the CPU kernel computes it (start and end cast
// to float32 first; the first half counts up from start, the second half down from end, with
// the AVX2 kernel's 8-wide vector blocks counting up from each block's first element).
std::vector<float> torch_linspace_f32(double start, double end, int64_t steps);

}  // namespace bev
