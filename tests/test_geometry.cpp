// Host geometry of a frame (model/geometry.h) against the golden micro set: point_sampling and its
// mask, SCA's rebatching plan, forward_test's CAN-bus deltas, the BEV shift, the rotation of the
// previous BEV and TSA's reference points; plus hand-checked awkward cases (rectangular grids,
// identity and quarter-turn rotations, points behind a camera, scene changes).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bevformer/error.h"
#include "io/checkpoint.h"
#include "micro_frames.h"
#include "model/config.h"
#include "model/geometry.h"

namespace bev {
namespace {

using json = nlohmann::json;

const std::string& kMicro = testing::kMicroDir;
json read_json(const std::string& path) { return testing::read_json_file(path); }

struct Frame {
  Checkpoint tensors;
  json meta;
};

const Frame& frame(int k) {
  static std::vector<Frame> frames = [] {
    std::vector<Frame> v;
    for (int i = 0; i < 3; ++i) {
      const std::string base = kMicro + "/frame" + std::to_string(i);
      v.push_back({load_checkpoint(base + ".safetensors"), read_json(base + "_meta.json")});
    }
    return v;
  }();
  return frames.at(static_cast<size_t>(k));
}

const Tensor& golden(int k, const std::string& name) {
  const Tensor* t = frame(k).tensors.find(name);
  if (t == nullptr) throw std::runtime_error("frame" + std::to_string(k) + ": no tensor " + name);
  return *t;
}

const ModelConfig& micro_config() {
  static const ModelConfig cfg = load_config(kMicro + "/config.json");
  return cfg;
}

std::vector<std::array<double, 16>> meta_lidar2img(const json& meta) {
  std::vector<std::array<double, 16>> out;
  for (const auto& cam : meta.at("lidar2img")) {
    std::array<double, 16> m{};
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) m[static_cast<size_t>(r * 4 + c)] = cam.at(r).at(c).get<double>();
    }
    out.push_back(m);
  }
  return out;
}

std::array<double, 18> meta_can_bus(const json& meta, const char* key) {
  const auto v = meta.at(key).get<std::vector<double>>();
  EXPECT_EQ(v.size(), 18u);
  std::array<double, 18> a{};
  for (size_t i = 0; i < 18 && i < v.size(); ++i) a[i] = v[i];
  return a;
}

PointSampling micro_point_sampling() {
  const json& meta = frame(0).meta;
  const auto& pad = meta.at("img_shape").at(0);  // [H, W, 3], padded
  return point_sampling(micro_config(), meta_lidar2img(meta), pad.at(1).get<int>(), pad.at(0).get<int>());
}

// Runs forward_test's state machine over the three frames, as one engine instance would.
std::vector<TemporalStep> micro_steps() {
  TemporalState state;
  std::vector<TemporalStep> steps;
  for (int k = 0; k < 3; ++k) {
    const json& meta = frame(k).meta;
    steps.push_back(temporal_step(state, meta.at("scene_token").get<std::string>(), meta_can_bus(meta, "can_bus"),
                                  micro_config().video_test_mode));
    state.has_prev_bev = true;
  }
  return steps;
}

// Rows of `bev` [HW, 1, C] gathered through `src` (-1 -> zeros), the rotated previous BEV.
std::vector<float> gather_rows(const Tensor& bev, const std::vector<int64_t>& src) {
  const Tensor b = bev.contiguous();
  const int64_t hw = b.size(0), c = b.numel() / hw;
  std::vector<float> out(static_cast<size_t>(b.numel()), 0.0f);
  const float* p = b.data<float>();
  for (int64_t q = 0; q < hw; ++q) {
    if (src[static_cast<size_t>(q)] < 0) continue;
    std::memcpy(&out[static_cast<size_t>(q * c)], p + src[static_cast<size_t>(q)] * c, sizeof(float) * static_cast<size_t>(c));
  }
  return out;
}

// --- golden --------------------------------------------------------------------------------------

TEST(GeometryGolden, PointSamplingMatchesUpstream) {
  const PointSampling ps = micro_point_sampling();
  const Tensor& want_uv = golden(0, "dbg.reference_points_cam");  // [6, 1, 400, 4, 2]
  const Tensor& want_mask = golden(0, "dbg.bev_mask");            // [6, 1, 400, 4]
  ASSERT_EQ(want_uv.shape(), (Shape{6, 1, 400, 4, 2}));
  ASSERT_EQ(ps.reference_points_cam.shape(), (Shape{6, 400, 4, 2}));
  ASSERT_EQ(ps.bev_mask.shape(), (Shape{6, 400, 4}));
  ASSERT_EQ(ps.bev_mask.dtype(), DType::kU8);

  const Tensor wu = want_uv.contiguous();
  const float* got = ps.reference_points_cam.data<float>();
  const float* want = wu.data<float>();
  double max_rel = 0;
  int64_t exact = 0;
  for (int64_t i = 0; i < wu.numel(); ++i) {
    const double g = got[i], w = want[i];
    max_rel = std::max(max_rel, std::abs(g - w) / std::max(std::abs(w), 1e-3));
    exact += std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]) ? 1 : 0;
  }
  EXPECT_LT(max_rel, 1e-6);
  RecordProperty("uv_max_rel", std::to_string(max_rel));
  RecordProperty("uv_bit_exact", std::to_string(exact) + "/" + std::to_string(wu.numel()));
  std::printf("point_sampling: max rel diff %.3g, bit-exact %lld / %lld\n", max_rel, static_cast<long long>(exact),
              static_cast<long long>(wu.numel()));

  const Tensor wm = want_mask.to(DType::kU8);
  const uint8_t* gm = ps.bev_mask.data<uint8_t>();
  const uint8_t* wmp = wm.data<uint8_t>();
  int64_t mismatches = 0, visible = 0;
  for (int64_t i = 0; i < wm.numel(); ++i) {
    mismatches += (gm[i] != 0) != (wmp[i] != 0) ? 1 : 0;
    visible += gm[i] != 0 ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(visible, 1944);  // README: visible (camera, cell, anchor) triples
}

TEST(GeometryGolden, ScaQueryListsMatchUpstreamCoverage) {
  const PointSampling ps = micro_point_sampling();
  const ScaQueryLists plan = sca_query_lists(ps);
  const Tensor counts = golden(0, "dbg.bev_mask_count").to(DType::kI64);
  ASSERT_EQ(counts.numel(), 6);
  const std::vector<int64_t> readme = {69, 82, 84, 103, 78, 81};
  ASSERT_EQ(plan.count_per_camera.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(plan.count_per_camera[i], counts.data<int64_t>()[i]) << "camera " << i;
    EXPECT_EQ(plan.count_per_camera[i], readme[i]) << "camera " << i;
  }
  EXPECT_EQ(plan.max_len, 103);
  ASSERT_EQ(plan.query_index.shape(), (Shape{6 * 103}));
  ASSERT_EQ(plan.reference.shape(), (Shape{6 * 103, 1, 4, 2}));
  ASSERT_EQ(plan.inv_count.shape(), (Shape{400, 1}));

  // Slots: ascending visible cells, then padding (-1, zero references).
  const int64_t* qi = plan.query_index.data<int64_t>();
  const float* ref = plan.reference.data<float>();
  const float* uv = ps.reference_points_cam.data<float>();
  const uint8_t* mask = ps.bev_mask.data<uint8_t>();
  std::vector<int> seen_by(400, 0);
  for (int64_t n = 0; n < 6; ++n) {
    int64_t prev = -1;
    for (int64_t k = 0; k < plan.max_len; ++k) {
      const int64_t slot = n * plan.max_len + k;
      const int64_t q = qi[slot];
      if (k < plan.count_per_camera[static_cast<size_t>(n)]) {
        ASSERT_GT(q, prev);
        prev = q;
        bool any = false;
        for (int d = 0; d < 4; ++d) any = any || mask[(n * 400 + q) * 4 + d] != 0;
        EXPECT_TRUE(any);
        EXPECT_EQ(std::memcmp(ref + slot * 8, uv + (n * 400 + q) * 8, 8 * sizeof(float)), 0);
        ++seen_by[static_cast<size_t>(q)];
      } else {
        EXPECT_EQ(q, -1);
        for (int e = 0; e < 8; ++e) EXPECT_EQ(ref[slot * 8 + e], 0.0f);
      }
    }
  }
  int by0 = 0, by1 = 0, by2plus = 0;
  const float* ic = plan.inv_count.data<float>();
  for (int q = 0; q < 400; ++q) {
    const int s = seen_by[static_cast<size_t>(q)];
    (s == 0 ? by0 : s == 1 ? by1 : by2plus)++;
    EXPECT_EQ(ic[q], 1.0f / static_cast<float>(std::max(s, 1))) << "cell " << q;
  }
  EXPECT_EQ(by0, 1);  // README coverage: cells seen by 0 / 1 / >= 2 cameras
  EXPECT_EQ(by1, 301);
  EXPECT_EQ(by2plus, 98);
}

TEST(GeometryGolden, TemporalStepGivesConsumedCanBus) {
  const std::vector<TemporalStep> steps = micro_steps();
  for (int k = 0; k < 3; ++k) {
    const Tensor want = golden(k, "dbg.can_bus").to(DType::kF64);
    ASSERT_EQ(want.numel(), 18);
    const auto meta_after = meta_can_bus(frame(k).meta, "can_bus_after_test_time_delta");
    for (int i = 0; i < 18; ++i) {
      EXPECT_EQ(steps[static_cast<size_t>(k)].can_bus[static_cast<size_t>(i)], want.data<double>()[i])
          << "frame " << k << " can_bus[" << i << "]";
      EXPECT_EQ(steps[static_cast<size_t>(k)].can_bus[static_cast<size_t>(i)], meta_after[static_cast<size_t>(i)])
          << "frame " << k << " can_bus[" << i << "]";
    }
    EXPECT_EQ(steps[static_cast<size_t>(k)].use_prev_bev, frame(k).meta.at("prev_bev_used").get<bool>()) << k;
  }
  EXPECT_FALSE(steps[0].use_prev_bev);
  EXPECT_TRUE(steps[1].use_prev_bev);
  EXPECT_TRUE(steps[2].use_prev_bev);
}

TEST(GeometryGolden, BevShiftMatchesUpstream) {
  const std::vector<TemporalStep> steps = micro_steps();
  for (int k = 0; k < 3; ++k) {
    const Tensor want = golden(k, "dbg.shift").contiguous();
    ASSERT_EQ(want.shape(), (Shape{1, 2}));
    const auto got = bev_shift(steps[static_cast<size_t>(k)].can_bus, micro_config());
    EXPECT_EQ(got[0], want.data<float>()[0]) << "frame " << k << " shift_x";
    EXPECT_EQ(got[1], want.data<float>()[1]) << "frame " << k << " shift_y";
  }
  // README table, to its printed precision.
  const auto s1 = bev_shift(steps[1].can_bus, micro_config());
  EXPECT_NEAR(s1[0], -0.002983, 5e-7);
  EXPECT_NEAR(s1[1], 0.014258, 5e-7);
}

TEST(GeometryGolden, RotationReproducesPrevBevRotated) {
  const ModelConfig& cfg = micro_config();
  ASSERT_EQ(cfg.transformer.rotate_center, (std::array<double, 2>{10, 10}));
  const std::vector<TemporalStep> steps = micro_steps();
  for (int k = 1; k < 3; ++k) {
    const double angle = steps[static_cast<size_t>(k)].can_bus[17];
    const std::vector<int64_t> src =
        rotation_source_index(cfg.head.bev_h, cfg.head.bev_w, angle, cfg.transformer.rotate_center);
    ASSERT_EQ(src.size(), 400u);
    const std::vector<float> got = gather_rows(golden(k - 1, "bev_embed"), src);
    const Tensor want = golden(k, "dbg.prev_bev_rotated").contiguous();
    ASSERT_EQ(want.shape(), (Shape{400, 1, 32}));
    int64_t mismatched_cells = 0, zero_cells = 0;
    for (int64_t q = 0; q < 400; ++q) {
      zero_cells += src[static_cast<size_t>(q)] < 0 ? 1 : 0;
      mismatched_cells += std::memcmp(&got[static_cast<size_t>(q * 32)], want.data<float>() + q * 32, 32 * sizeof(float)) != 0;
    }
    EXPECT_EQ(mismatched_cells, 0) << "frame " << k << " angle " << angle;
    EXPECT_GT(zero_cells, 0) << "an off-centre rotation leaves some cells empty";
  }
}

TEST(GeometryGolden, TsaReferenceShiftsQueueZeroOnly) {
  ModelConfig cfg = micro_config();
  const std::vector<TemporalStep> steps = micro_steps();
  const auto shift = bev_shift(steps[1].can_bus, cfg);
  for (bool alias : {false, true}) {
    cfg.transformer.shift_ref_2d_alias = alias;
    const Tensor with = tsa_reference(cfg, shift, true);
    const Tensor without = tsa_reference(cfg, shift, false);
    ASSERT_EQ(with.shape(), (Shape{400, 2, 1, 2}));
    const float* w = with.data<float>();
    const float* wo = without.data<float>();
    for (int row = 0; row < 20; ++row) {
      for (int col = 0; col < 20; ++col) {
        const int q = row * 20 + col;
        const float x = (static_cast<float>(col) + 0.5f) / 20.0f, y = (static_cast<float>(row) + 0.5f) / 20.0f;
        EXPECT_EQ(w[q * 4 + 0], x + shift[0]);
        EXPECT_EQ(w[q * 4 + 1], y + shift[1]);
        EXPECT_EQ(w[q * 4 + 2], alias ? x + shift[0] : x);
        EXPECT_EQ(w[q * 4 + 3], alias ? y + shift[1] : y);
        if (!alias) {
          for (int e = 0; e < 4; ++e) EXPECT_EQ(wo[q * 4 + e], e % 2 == 0 ? x : y);
        }
      }
    }
  }
  // Without history the shift is zero, so both semantics give [ref, ref].
  cfg.transformer.shift_ref_2d_alias = true;
  const auto s0 = bev_shift(steps[0].can_bus, cfg);
  const Tensor a = tsa_reference(cfg, s0, false);
  cfg.transformer.shift_ref_2d_alias = false;
  const Tensor b = tsa_reference(cfg, s0, false);
  EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()), 0);
}

// --- awkward cases ------------------------------------------------------------------------------

TEST(Geometry, LinspaceMatchesTorchOnExactGrids) {
  // Steps of exactly 1: every path gives k + 0.5.
  const auto v = torch_linspace_f32(0.5, 49.5, 50);
  for (int k = 0; k < 50; ++k) EXPECT_EQ(v[static_cast<size_t>(k)], static_cast<float>(k) + 0.5f);
  // torch.linspace(0.5, 7.5, 4, dtype=float32) / 8 = [0.0625, 0.35416666, 0.6458333, 0.9375]
  const auto z = torch_linspace_f32(0.5, 7.5, 4);
  const float step = 7.0f / 3.0f;
  EXPECT_EQ(z[0], 0.5f);
  EXPECT_EQ(z[1], 0.5f + step);
  EXPECT_EQ(z[2], 7.5f - step);
  EXPECT_EQ(z[3], 7.5f);
  EXPECT_EQ(torch_linspace_f32(0.5, 7.5, 1), std::vector<float>{0.5f});
  EXPECT_TRUE(torch_linspace_f32(0.0, 1.0, 0).empty());
}

TEST(Geometry, RotationByZeroIsIdentity) {
  for (auto [h, w] : {std::pair{20, 20}, std::pair{7, 13}, std::pair{50, 50}, std::pair{200, 200}, std::pair{1, 5}}) {
    for (std::array<double, 2> c : {std::array<double, 2>{100, 100}, std::array<double, 2>{w / 2.0, h / 2.0}}) {
      const auto src = rotation_source_index(h, w, 0.0, c);
      ASSERT_EQ(src.size(), static_cast<size_t>(h * w));
      for (int64_t q = 0; q < h * w; ++q) EXPECT_EQ(src[static_cast<size_t>(q)], q) << h << "x" << w;
    }
  }
}

TEST(Geometry, RotationByNinetyAboutCentre) {
  // Square grid, centre at the grid centre: output (i, j) reads (row j, col W-1-i), i.e. the
  // content turns counter-clockwise in the lidar xy plane (rows along +y, cols along +x).
  {
    const int n = 6;
    const auto src = rotation_source_index(n, n, 90.0, {n / 2.0, n / 2.0});
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) EXPECT_EQ(src[static_cast<size_t>(i * n + j)], j * n + (n - 1 - i)) << i << "," << j;
    }
    const auto back = rotation_source_index(n, n, -90.0, {n / 2.0, n / 2.0});
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) EXPECT_EQ(back[static_cast<size_t>(i * n + j)], (n - 1 - j) * n + i) << i << "," << j;
    }
  }
  // Rectangular 4x6 (h x w) about its centre: source col = 4 - i, source row = j - 1; the corners
  // that fall outside read zero.
  {
    const int h = 4, w = 6;
    const auto src = rotation_source_index(h, w, 90.0, {w / 2.0, h / 2.0});
    for (int i = 0; i < h; ++i) {
      for (int j = 0; j < w; ++j) {
        const int r = j - 1, c = 4 - i;
        const int64_t want = (r >= 0 && r < h && c >= 0 && c < w) ? r * w + c : -1;
        EXPECT_EQ(src[static_cast<size_t>(i * w + j)], want) << i << "," << j;
      }
    }
  }
  // Off-centre (upstream's [100, 100] default on a 50x50 grid): the centre cell (99.5, 99.5) is
  // outside the grid, so a quarter turn moves everything out of it.
  {
    const auto src = rotation_source_index(50, 50, 90.0, {100, 100});
    for (int64_t s : src) EXPECT_EQ(s, -1);
  }
}

TEST(Geometry, RotationSmallAngleMatchesSpecFormula) {
  // Away from rounding ties the float32 emulation agrees with the float64 formula of the spec.
  const int h = 30, w = 20;
  const std::array<double, 2> c = {100, 100};
  for (double angle : {3.51, -4.84, -358.6, 1.4}) {
    const auto src = rotation_source_index(h, w, angle, c);
    const double a = angle * std::numbers::pi / 180;
    int checked = 0;
    for (int i = 0; i < h; ++i) {
      for (int j = 0; j < w; ++j) {
        const double ix = std::cos(a) * (j + 0.5 - c[0]) - std::sin(a) * (i + 0.5 - c[1]) + c[0] - 0.5;
        const double iy = std::sin(a) * (j + 0.5 - c[0]) + std::cos(a) * (i + 0.5 - c[1]) + c[1] - 0.5;
        const auto near_tie = [](double v) { return std::abs(v - std::floor(v) - 0.5) < 1e-3; };
        if (near_tie(ix) || near_tie(iy)) continue;
        const double rx = std::nearbyint(ix), ry = std::nearbyint(iy);
        const int64_t want = (rx >= 0 && rx < w && ry >= 0 && ry < h) ? static_cast<int64_t>(ry) * w + static_cast<int64_t>(rx) : -1;
        EXPECT_EQ(src[static_cast<size_t>(i * w + j)], want) << angle << " " << i << "," << j;
        ++checked;
      }
    }
    EXPECT_GT(checked, h * w / 2);
  }
}

// A forward-looking pinhole camera at the lidar origin: cam x = lidar x, cam y = -lidar z,
// cam z = lidar y (forward), K with focal f and principal point (cx, cy).
std::array<double, 16> forward_camera(double f, double cx, double cy) {
  return {f, cx, 0, 0,  //
          0, cy, -f, 0,
          0, 1, 0, 0,
          0, 0, 0, 1};
}

TEST(Geometry, PointSamplingRectangularGridAndBehindCamera) {
  ModelConfig cfg = micro_config();
  cfg.head.bev_h = 4;  // rows along y
  cfg.head.bev_w = 6;  // cols along x
  cfg.transformer.num_points_in_pillar = 3;
  const int pad_w = 64, pad_h = 32;
  const auto cam = forward_camera(20, 32, 16);
  const PointSampling ps = point_sampling(cfg, {cam, cam}, pad_w, pad_h);
  ASSERT_EQ(ps.reference_points_cam.shape(), (Shape{2, 24, 3, 2}));
  ASSERT_EQ(ps.bev_mask.shape(), (Shape{2, 24, 3}));
  const float* uv = ps.reference_points_cam.data<float>();
  const uint8_t* mask = ps.bev_mask.data<uint8_t>();
  const auto& pc = cfg.transformer.pc_range;
  for (int n = 0; n < 2; ++n) {
    for (int row = 0; row < 4; ++row) {
      for (int col = 0; col < 6; ++col) {
        for (int d = 0; d < 3; ++d) {
          const double x = (col + 0.5) / 6 * (pc[3] - pc[0]) + pc[0];
          const double y = (row + 0.5) / 4 * (pc[4] - pc[1]) + pc[1];
          const double z = (0.5 + d * (8.0 - 1.0) / 2) / 8 * (pc[5] - pc[2]) + pc[2];
          const double depth = y;
          const double u = (20 * x + 32 * y) / std::max(depth, 1e-5) / pad_w;
          const double v = (16 * y - 20 * z) / std::max(depth, 1e-5) / pad_h;
          const int64_t o = ((n * 24) + row * 6 + col) * 3 + d;
          EXPECT_NEAR(uv[o * 2], u, 1e-5 * std::max(1.0, std::abs(u))) << row << "," << col << "," << d;
          EXPECT_NEAR(uv[o * 2 + 1], v, 1e-5 * std::max(1.0, std::abs(v))) << row << "," << col << "," << d;
          const bool want = depth > 1e-5 && u > 0 && u < 1 && v > 0 && v < 1;
          EXPECT_EQ(mask[o] != 0, want) << row << "," << col << "," << d;
          if (row < 2) {
            // Rows 0-1 lie behind the camera (y < 0): masked, coordinates blown up by 1/1e-5.
            EXPECT_EQ(mask[o], 0);
            EXPECT_GT(std::abs(uv[o * 2 + 1]), 1e4f);
          }
        }
      }
    }
  }
  // Something in front is visible: the cells straight ahead at mid height.
  int visible = 0;
  for (int64_t i = 0; i < ps.bev_mask.numel(); ++i) visible += mask[i];
  EXPECT_GT(visible, 0);

  // SCA plan on the rectangular grid: identical cameras give identical lists and count 2.
  const ScaQueryLists plan = sca_query_lists(ps);
  ASSERT_EQ(plan.count_per_camera.size(), 2u);
  EXPECT_EQ(plan.count_per_camera[0], plan.count_per_camera[1]);
  EXPECT_EQ(plan.max_len, plan.count_per_camera[0]);
  ASSERT_EQ(plan.reference.shape(), (Shape{2 * plan.max_len, 1, 3, 2}));
  const float* ic = plan.inv_count.data<float>();
  for (int q = 0; q < 24; ++q) {
    bool any = false;
    for (int d = 0; d < 3; ++d) any = any || mask[q * 3 + d] != 0;
    EXPECT_EQ(ic[q], any ? 0.5f : 1.0f) << q;
  }
}

TEST(Geometry, ScaQueryListsWithNothingVisibleHaveOnePaddingSlot) {
  ModelConfig cfg = micro_config();
  cfg.head.bev_h = 3;
  cfg.head.bev_w = 5;
  // Depth -1 for every point: the whole grid lies behind the camera.
  const std::array<double, 16> away = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, -1, 0, 0, 0, 1};
  const ScaQueryLists plan = sca_query_lists(point_sampling(cfg, {away}, 32, 32));
  EXPECT_EQ(plan.count_per_camera, std::vector<int64_t>{0});
  EXPECT_EQ(plan.max_len, 1);
  EXPECT_EQ(plan.query_index.data<int64_t>()[0], -1);
  for (int q = 0; q < 15; ++q) EXPECT_EQ(plan.inv_count.data<float>()[q], 1.0f);
}

TEST(Geometry, TsaReferenceRectangularGrid) {
  ModelConfig cfg = micro_config();
  cfg.head.bev_h = 3;
  cfg.head.bev_w = 7;
  const std::array<float, 2> shift = {0.25f, -0.125f};
  const Tensor r = tsa_reference(cfg, shift, true);
  ASSERT_EQ(r.shape(), (Shape{21, 2, 1, 2}));
  const float* p = r.data<float>();
  for (int row = 0; row < 3; ++row) {
    for (int col = 0; col < 7; ++col) {
      const int q = row * 7 + col;
      const float x = (static_cast<float>(col) + 0.5f) / 7.0f, y = (static_cast<float>(row) + 0.5f) / 3.0f;
      EXPECT_EQ(p[q * 4 + 0], x + 0.25f);
      EXPECT_EQ(p[q * 4 + 1], y - 0.125f);
      EXPECT_EQ(p[q * 4 + 2], x);
      EXPECT_EQ(p[q * 4 + 3], y);
    }
  }
}

TEST(Geometry, BevShiftRectangularGridAndUseShift) {
  ModelConfig cfg = micro_config();
  cfg.head.bev_h = 10;
  cfg.head.bev_w = 40;
  cfg.head.pc_range = {-40, -20, -5, 40, 20, 3};  // 80 m wide, 40 m deep
  std::array<double, 18> can{};
  // Yaw 90 deg (ego x-axis = global +y), moved 2 m along global +y: 2 m forward.
  can[16] = std::numbers::pi / 2;
  can[1] = 2.0;
  auto s = bev_shift(can, cfg);
  EXPECT_NEAR(s[0], 0.0f, 1e-7);
  EXPECT_NEAR(s[1], 2.0 / 40, 1e-7);
  // Moved 4 m along global +x: to the ego's right (spec §3 closed form: shift_x = -left / 80).
  can[1] = 0.0;
  can[0] = 4.0;
  s = bev_shift(can, cfg);
  EXPECT_NEAR(s[0], 4.0 / 80, 1e-7);
  EXPECT_NEAR(s[1], 0.0f, 1e-7);
  cfg.transformer.use_shift = false;
  s = bev_shift(can, cfg);
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], 0.0f);
}

TEST(Geometry, TemporalStepSceneChangeAndVideoMode) {
  TemporalState st;
  std::array<double, 18> can{};
  for (int i = 0; i < 18; ++i) can[static_cast<size_t>(i)] = 10.0 * i + 1;
  can[17] = 359.0;
  auto s = temporal_step(st, "a", can, true);
  EXPECT_FALSE(s.use_prev_bev);
  EXPECT_EQ(s.can_bus[0], 0.0);
  EXPECT_EQ(s.can_bus[17], 0.0);
  EXPECT_EQ(s.can_bus[16], can[16]);  // never changed
  EXPECT_EQ(s.can_bus[3], can[3]);
  st.has_prev_bev = true;

  auto can2 = can;
  can2[0] += 1.5;
  can2[17] = 1.0;  // crossed 0 deg: the delta is not wrapped
  s = temporal_step(st, "a", can2, true);
  EXPECT_TRUE(s.use_prev_bev);
  EXPECT_EQ(s.can_bus[0], can2[0] - can[0]);
  EXPECT_EQ(s.can_bus[1], 0.0);
  EXPECT_EQ(s.can_bus[17], 1.0 - 359.0);
  st.has_prev_bev = true;

  // New scene: history dropped, deltas zero, state follows the new frame.
  s = temporal_step(st, "b", can, true);
  EXPECT_FALSE(s.use_prev_bev);
  EXPECT_FALSE(st.has_prev_bev);
  EXPECT_EQ(st.scene_token, std::optional<std::string>("b"));
  EXPECT_EQ(s.can_bus[17], 0.0);
  EXPECT_EQ(st.prev_angle, can[17]);
  st.has_prev_bev = true;

  // video_test_mode false: never any history, even in the same scene.
  s = temporal_step(st, "b", can2, false);
  EXPECT_FALSE(s.use_prev_bev);
  EXPECT_EQ(s.can_bus[0], 0.0);
  EXPECT_EQ(st.prev_pos[0], can2[0]);
}

TEST(Geometry, RejectsEmptyInputs) {
  ModelConfig cfg = micro_config();
  EXPECT_THROW(point_sampling(cfg, {}, 32, 32), Error);
  EXPECT_THROW(point_sampling(cfg, {forward_camera(1, 1, 1)}, 0, 32), Error);
  EXPECT_THROW(rotation_source_index(0, 5, 1.0, {0, 0}), Error);
  EXPECT_THROW(sca_query_lists(PointSampling{}), Error);
}

}  // namespace
}  // namespace bev
