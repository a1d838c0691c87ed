// Host geometry of one frame; see geometry.h. Every float32 step mirrors one upstream tensor op
// in the same order (one rounding per op, no contraction into fused multiply-adds except where
// the emulated kernel itself fuses, written as std::fma).
#include "model/geometry.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "bevformer/error.h"

namespace bev {
namespace {

constexpr double kPi = std::numbers::pi;

void check_grid(int bev_h, int bev_w, const char* what) {
  if (bev_h <= 0 || bev_w <= 0) {
    throw Error(ErrorKind::kInvalidInput, "BEV grid " + std::to_string(bev_h) + "x" +
                                              std::to_string(bev_w) + " is empty")
        .where(what)
        .expected("bev_h > 0 and bev_w > 0");
  }
}

// ((k + 0.5) / n) for k < n as upstream's get_reference_points: linspace(0.5, n - 0.5, n) / n.
std::vector<float> cell_centres(int n) {
  std::vector<float> v = torch_linspace_f32(0.5, static_cast<double>(n) - 0.5, n);
  const float fn = static_cast<float>(n);
  for (float& x : v) x = x / fn;
  return v;
}

}  // namespace

std::vector<float> torch_linspace_f32(double start_d, double end_d, int64_t steps) {
  if (steps < 0) throw Error(ErrorKind::kInvalidInput, "linspace with negative steps");
  std::vector<float> out(static_cast<size_t>(steps));
  if (steps == 0) return out;
  const float start = static_cast<float>(start_d);
  const float end = static_cast<float>(end_d);
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  auto scalar = [&](int64_t idx) -> float {
    if (idx < halfway) return start + step * static_cast<float>(idx);
    return end - step * static_cast<float>(steps - idx - 1);
  };
  // cpu_serial_kernel_vec: blocks of 2 vectors (8 floats each on AVX2), each vector being
  // arange(first, step) = first + k * step with its first element computed like the scalar path.
  constexpr int64_t kVec = 8;
  int64_t i = 0;
  for (; i + 2 * kVec <= steps; i += 2 * kVec) {
    for (int64_t v = i; v < i + 2 * kVec; v += kVec) {
      const float base = scalar(v);
      for (int64_t k = 0; k < kVec; ++k) out[static_cast<size_t>(v + k)] = base + static_cast<float>(k) * step;
    }
  }
  for (; i < steps; ++i) out[static_cast<size_t>(i)] = scalar(i);
  return out;
}

TemporalStep temporal_step(TemporalState& state, const std::string& scene_token,
                           const std::array<double, 18>& raw_can_bus, bool video_test_mode) {
  // 1. A new scene (or no video mode) drops the history; the scene is remembered either way.
  if (!state.scene_token.has_value() || *state.scene_token != scene_token) state.has_prev_bev = false;
  state.scene_token = scene_token;
  if (!video_test_mode) state.has_prev_bev = false;

  // 2. The raw position and angle become the next frame's reference.
  const std::array<double, 3> tmp_pos = {raw_can_bus[0], raw_can_bus[1], raw_can_bus[2]};
  const double tmp_angle = raw_can_bus[17];

  // 3. Deltas against the previous frame (not wrapped), or zeros without history.
  TemporalStep step;
  step.can_bus = raw_can_bus;
  step.use_prev_bev = state.has_prev_bev;
  if (state.has_prev_bev) {
    for (int i = 0; i < 3; ++i) step.can_bus[i] -= state.prev_pos[i];
    step.can_bus[17] -= state.prev_angle;
  } else {
    step.can_bus[17] = 0;
    step.can_bus[0] = step.can_bus[1] = step.can_bus[2] = 0;
  }

  // 4. (after the model ran, in upstream; nothing in between reads them)
  state.prev_pos = tmp_pos;
  state.prev_angle = tmp_angle;
  return step;
}

std::array<float, 2> bev_shift(const std::array<double, 18>& can_bus, const ModelConfig& cfg) {
  const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;
  check_grid(bev_h, bev_w, "bev_shift");
  const auto& pc = cfg.head.pc_range;  // BEVFormerHead.pc_range = bbox_coder.pc_range
  const double real_w = pc[3] - pc[0];
  const double real_h = pc[4] - pc[1];
  const double grid_length_y = real_h / bev_h;
  const double grid_length_x = real_w / bev_w;

  const double delta_x = can_bus[0];
  const double delta_y = can_bus[1];
  const double ego_angle = can_bus[16] / kPi * 180;
  const double translation_length = std::sqrt(delta_x * delta_x + delta_y * delta_y);
  const double translation_angle = std::atan2(delta_y, delta_x) / kPi * 180;
  const double bev_angle = ego_angle - translation_angle;
  double shift_y = translation_length * std::cos(bev_angle / 180 * kPi) / grid_length_y / bev_h;
  double shift_x = translation_length * std::sin(bev_angle / 180 * kPi) / grid_length_x / bev_w;
  const double use_shift = cfg.transformer.use_shift ? 1.0 : 0.0;  // numpy: value * bool
  shift_y = shift_y * use_shift;
  shift_x = shift_x * use_shift;
  return {static_cast<float>(shift_x), static_cast<float>(shift_y)};
}

std::vector<int64_t> rotation_source_index(int bev_h, int bev_w, double angle_deg,
                                           const std::array<double, 2>& center) {
  check_grid(bev_h, bev_w, "rotation_source_index");
  const int h = bev_h, w = bev_w;

  // torchvision.transforms.functional.rotate: centre relative to the image centre, then
  // _get_inverse_affine_matrix(center_f, -angle, [0, 0], 1.0, [0, 0]) in float64.
  const double cx = 1.0 * (center[0] - w * 0.5);
  const double cy = 1.0 * (center[1] - h * 0.5);
  const double rot = -angle_deg * (kPi / 180.0);  // math.radians
  const double sx = 0.0, sy = 0.0;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  double m[6] = {d, -b, 0.0, -c, a, 0.0};
  const double tx = 0.0, ty = 0.0;
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;

  // functional_tensor.rotate: theta in the image dtype (float32), _gen_affine_grid.
  float theta[6];
  for (int i = 0; i < 6; ++i) theta[i] = static_cast<float>(m[i]);
  const float half_w = static_cast<float>(0.5 * w), half_h = static_cast<float>(0.5 * h);
  // rescaled_theta = theta^T / [0.5 w, 0.5 h]: r[k][0] = theta[0][k] / (w/2), r[k][1] = theta[1][k] / (h/2)
  float r[3][2];
  for (int k = 0; k < 3; ++k) {
    r[k][0] = theta[k] / half_w;
    r[k][1] = theta[3 + k] / half_h;
  }
  const std::vector<float> xs = torch_linspace_f32(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, w);
  const std::vector<float> ys = torch_linspace_f32(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, h);

  // grid_sample(nearest, zeros, align_corners=False), the vectorized CPU kernel:
  // pixel = (g + 1) * (size / 2) - 0.5, rounded half to even, out of range -> zero.
  const float scale_w = static_cast<float>(w) / 2, scale_h = static_cast<float>(h) / 2;
  std::vector<int64_t> src(static_cast<size_t>(h) * static_cast<size_t>(w));
  for (int i = 0; i < h; ++i) {
    for (int j = 0; j < w; ++j) {
      const float bx = xs[static_cast<size_t>(j)], by = ys[static_cast<size_t>(i)];
      // [bx, by, 1] @ rescaled_theta (a BLAS gemm: a fused multiply-add chain over k).
      float gx = bx * r[0][0];
      gx = std::fma(by, r[1][0], gx);
      gx = std::fma(1.0f, r[2][0], gx);
      float gy = bx * r[0][1];
      gy = std::fma(by, r[1][1], gy);
      gy = std::fma(1.0f, r[2][1], gy);
      const float px = std::nearbyint(std::fma(gx + 1.0f, scale_w, -0.5f));
      const float py = std::nearbyint(std::fma(gy + 1.0f, scale_h, -0.5f));
      int64_t s = -1;
      if (px > -1.0f && px < static_cast<float>(w) && py > -1.0f && py < static_cast<float>(h)) {
        s = static_cast<int64_t>(py) * w + static_cast<int64_t>(px);
      }
      src[static_cast<size_t>(i) * static_cast<size_t>(w) + static_cast<size_t>(j)] = s;
    }
  }
  return src;
}

Tensor tsa_reference(const ModelConfig& cfg, const std::array<float, 2>& shift, bool use_prev_bev) {
  const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;
  check_grid(bev_h, bev_w, "tsa_reference");
  const std::vector<float> xs = cell_centres(bev_w);
  const std::vector<float> ys = cell_centres(bev_h);
  const bool alias = cfg.transformer.shift_ref_2d_alias;
  // HEAD: [ref + shift, ref] with history, [ref, ref] without. Alias: ref itself was shifted.
  const bool shift_q0 = alias || use_prev_bev;
  const bool shift_q1 = alias;
  const int64_t hw = static_cast<int64_t>(bev_h) * bev_w;
  Tensor out = Tensor::empty({hw, 2, 1, 2}, DType::kF32);
  float* p = out.data<float>();
  for (int row = 0; row < bev_h; ++row) {
    for (int col = 0; col < bev_w; ++col) {
      const float x = xs[static_cast<size_t>(col)], y = ys[static_cast<size_t>(row)];
      float* q = p + (static_cast<int64_t>(row) * bev_w + col) * 4;
      q[0] = shift_q0 ? x + shift[0] : x;
      q[1] = shift_q0 ? y + shift[1] : y;
      q[2] = shift_q1 ? x + shift[0] : x;
      q[3] = shift_q1 ? y + shift[1] : y;
    }
  }
  return out;
}

PointSampling point_sampling(const ModelConfig& cfg, const std::vector<std::array<double, 16>>& lidar2img,
                             int pad_w, int pad_h) {
  const int bev_h = cfg.head.bev_h, bev_w = cfg.head.bev_w;
  check_grid(bev_h, bev_w, "point_sampling");
  const int num_d = cfg.transformer.num_points_in_pillar;
  if (num_d <= 0) {
    throw Error(ErrorKind::kInvalidInput, "num_points_in_pillar is " + std::to_string(num_d))
        .where("point_sampling")
        .expected("at least 1");
  }
  if (lidar2img.empty()) {
    throw Error(ErrorKind::kInvalidInput, "no cameras").where("point_sampling").expected("one lidar2img per camera");
  }
  if (pad_w <= 0 || pad_h <= 0) {
    throw Error(ErrorKind::kInvalidInput,
                "padded image size " + std::to_string(pad_w) + "x" + std::to_string(pad_h) + " is empty")
        .where("point_sampling");
  }
  const auto& pc = cfg.transformer.pc_range;  // the encoder's pc_range

  // get_reference_points(dim='3d'): normalized (x, y, z) in float32.
  const double z_len = pc[5] - pc[2];
  std::vector<float> zs = torch_linspace_f32(0.5, z_len - 0.5, num_d);
  for (float& z : zs) z = z / static_cast<float>(z_len);
  const std::vector<float> xs = cell_centres(bev_w);
  const std::vector<float> ys = cell_centres(bev_h);

  // point_sampling: to metres, tensor * (float)scale + (float)offset (two float32 ops).
  const float sx = static_cast<float>(pc[3] - pc[0]), ox = static_cast<float>(pc[0]);
  const float sy = static_cast<float>(pc[4] - pc[1]), oy = static_cast<float>(pc[1]);
  const float sz = static_cast<float>(pc[5] - pc[2]), oz = static_cast<float>(pc[2]);
  std::vector<float> mx(xs.size()), my(ys.size()), mz(zs.size());
  for (size_t i = 0; i < xs.size(); ++i) mx[i] = xs[i] * sx + ox;
  for (size_t i = 0; i < ys.size(); ++i) my[i] = ys[i] * sy + oy;
  for (size_t i = 0; i < zs.size(); ++i) mz[i] = zs[i] * sz + oz;

  const int64_t n_cam = static_cast<int64_t>(lidar2img.size());
  const int64_t hw = static_cast<int64_t>(bev_h) * bev_w;
  PointSampling ps;
  ps.reference_points_cam = Tensor::empty({n_cam, hw, num_d, 2}, DType::kF32);
  ps.bev_mask = Tensor::empty({n_cam, hw, num_d}, DType::kU8);
  float* uv = ps.reference_points_cam.data<float>();
  uint8_t* mask = ps.bev_mask.data<uint8_t>();
  const float eps = static_cast<float>(1e-5);
  const float fw = static_cast<float>(pad_w), fh = static_cast<float>(pad_h);

  for (int64_t n = 0; n < n_cam; ++n) {
    float l[16];
    for (int k = 0; k < 16; ++k) l[k] = static_cast<float>(lidar2img[static_cast<size_t>(n)][static_cast<size_t>(k)]);
    for (int64_t q = 0; q < hw; ++q) {
      const float x = mx[static_cast<size_t>(q % bev_w)], y = my[static_cast<size_t>(q / bev_w)];
      for (int d = 0; d < num_d; ++d) {
        const float p[4] = {x, y, mz[static_cast<size_t>(d)], 1.0f};
        // torch.matmul (4x4 @ 4x1 per point): the naive bmm kernel, acc += a[k] * b[k] in order.
        float res[3];
        for (int row = 0; row < 3; ++row) {
          float acc = 0.0f;
          for (int k = 0; k < 4; ++k) {
            const float prod = l[row * 4 + k] * p[k];
            acc = acc + prod;
          }
          res[row] = acc;
        }
        const bool in_front = res[2] > eps;
        const float den = std::max(res[2], eps);  // torch.maximum (a NaN depth stays NaN)
        float u = res[0] / den;
        float v = res[1] / den;
        u = u / fw;
        v = v / fh;
        const bool visible = in_front && v > 0.0f && v < 1.0f && u < 1.0f && u > 0.0f;
        const int64_t o = (n * hw + q) * num_d + d;
        uv[o * 2] = u;
        uv[o * 2 + 1] = v;
        mask[o] = visible ? 1 : 0;
      }
    }
  }
  return ps;
}

ScaQueryLists sca_query_lists(const PointSampling& ps) {
  const Tensor& mask_t = ps.bev_mask;
  const Tensor& ref_t = ps.reference_points_cam;
  if (!mask_t.defined() || !ref_t.defined() || mask_t.dim() != 3 || ref_t.dim() != 4 ||
      ref_t.size(0) != mask_t.size(0) || ref_t.size(1) != mask_t.size(1) || ref_t.size(2) != mask_t.size(2) ||
      ref_t.size(3) != 2) {
    throw Error(ErrorKind::kInvalidInput, "point sampling result has inconsistent shapes")
        .where("sca_query_lists")
        .expected("reference_points_cam f32 [N, HW, D, 2] and bev_mask u8 [N, HW, D]");
  }
  const Tensor mask_c = mask_t.contiguous();
  const Tensor ref_c = ref_t.contiguous();
  const uint8_t* mask = mask_c.data<uint8_t>();
  const float* ref = ref_c.data<float>();
  const int64_t n_cam = mask_t.size(0), hw = mask_t.size(1), num_d = mask_t.size(2);

  ScaQueryLists plan;
  std::vector<std::vector<int64_t>> cells(static_cast<size_t>(n_cam));
  std::vector<int64_t> seen_by(static_cast<size_t>(hw), 0);
  for (int64_t n = 0; n < n_cam; ++n) {
    for (int64_t q = 0; q < hw; ++q) {
      bool any = false;
      for (int64_t d = 0; d < num_d; ++d) any = any || mask[(n * hw + q) * num_d + d] != 0;
      if (any) {
        cells[static_cast<size_t>(n)].push_back(q);
        ++seen_by[static_cast<size_t>(q)];
      }
    }
    const int64_t count = static_cast<int64_t>(cells[static_cast<size_t>(n)].size());
    plan.count_per_camera.push_back(count);
    plan.max_len = std::max(plan.max_len, count);
  }
  plan.max_len = std::max<int64_t>(plan.max_len, 1);

  const int64_t slots = n_cam * plan.max_len;
  plan.query_index = Tensor::empty({slots}, DType::kI64);
  plan.reference = Tensor::zeros({slots, 1, num_d, 2}, DType::kF32);
  int64_t* qi = plan.query_index.data<int64_t>();
  float* pr = plan.reference.data<float>();
  std::fill(qi, qi + slots, int64_t{-1});
  for (int64_t n = 0; n < n_cam; ++n) {
    const auto& list = cells[static_cast<size_t>(n)];
    for (size_t k = 0; k < list.size(); ++k) {
      const int64_t slot = n * plan.max_len + static_cast<int64_t>(k);
      const int64_t q = list[k];
      qi[slot] = q;
      std::copy_n(ref + (n * hw + q) * num_d * 2, num_d * 2, pr + slot * num_d * 2);
    }
  }
  plan.inv_count = Tensor::empty({hw, 1}, DType::kF32);
  float* ic = plan.inv_count.data<float>();
  for (int64_t q = 0; q < hw; ++q) {
    ic[q] = 1.0f / static_cast<float>(std::max<int64_t>(seen_by[static_cast<size_t>(q)], 1));
  }
  return plan;
}

}  // namespace bev
