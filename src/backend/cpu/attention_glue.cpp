#include "backend/cpu/attention_glue.h"

#include <algorithm>
#include <string>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_check.h"

namespace bev::cpu {
namespace {

bool is_f32_rank(const Tensor& t, int64_t rank) {
  return t.defined() && t.dtype() == DType::kF32 && t.device() == Device::kCpu && t.dim() == rank && t.is_contiguous();
}

// Contiguous host f32 of rank `rank`; the extents are checked by the caller. (A C string: a
// std::string parameter would be built, and past 15 characters allocated, on every call.)
void expect_f32_rank(const char* op, const Tensor& t, const char* what, int64_t rank, const char* shape_desc) {
  if (!is_f32_rank(t, rank)) bad_tensor(op, t, what, std::string("contiguous host f32 ") + shape_desc);
}

// y may be the very same memory as `in` when may_alias, else it must be disjoint from it.
void expect_no_overlap(const char* op, const Tensor& in, const Tensor& y, bool may_alias) {
  const auto* a = static_cast<const char*>(in.raw_data());
  const auto* b = static_cast<const char*>(y.raw_data());
  const size_t n = in.nbytes();
  if (n == 0 || y.nbytes() == 0) return;
  if (!(may_alias && a == b && n == y.nbytes()) && a < b + y.nbytes() && b < a + n) {
    throw Error(ErrorKind::kInvalidInput, "output overlaps an input").where(op).expected(
        may_alias ? "the output either the same memory as the input or disjoint from it"
                  : "the output disjoint from the input");
  }
}

// fn(m0, m1) over rows, split across the pool in chunks of about 16K output floats.
template <typename Fn>
void for_rows(ThreadPool* pool, int64_t rows, int64_t floats_per_row, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, floats_per_row));
  if (pool == nullptr || pool->size() == 1 || rows <= grain) {
    fn(int64_t{0}, rows);
  } else {
    pool->parallel_for(rows, grain, fn);
  }
}

constexpr float kInverseSigmoidEps = 1e-5f;  // upstream's inverse_sigmoid default

}  // namespace

void sampling_locations(const Tensor& offsets, const Tensor& reference,
                        const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes, Tensor& out,
                        ThreadPool* pool) {
  const char* op = "sampling_locations";
  const auto levels = static_cast<int64_t>(spatial_shapes.size());
  const auto l_str = [levels] { return std::to_string(levels); };  // for errors only
  if (!is_f32_rank(offsets, 5) || offsets.size(2) != levels || offsets.size(4) != 2) {
    bad_tensor(op, offsets, "offsets", "contiguous host f32 [M, heads, " + l_str() + ", P, 2]");
  }
  const int64_t m_len = offsets.size(0), heads = offsets.size(1), points = offsets.size(3);
  expect_f32_rank(op, reference, "reference", 4, "[M, Lr, R, D]");
  const int64_t lr = reference.size(1), r_len = reference.size(2), d_len = reference.size(3);
  if (reference.size(0) != m_len || (lr != 1 && lr != levels) || r_len < 1 || points % r_len != 0 || d_len < 2) {
    bad_tensor(op, reference, "reference",
               "contiguous host f32 [" + std::to_string(m_len) + ", 1 or " + l_str() + ", R dividing " +
                   std::to_string(points) + ", >= 2]");
  }
  for (int64_t l = 0; l < levels; ++l) {
    const auto [h, w] = spatial_shapes[static_cast<size_t>(l)];
    if (h < 1 || w < 1) {
      throw Error(ErrorKind::kInvalidInput,
                  "level " + std::to_string(l) + " is " + std::to_string(h) + " x " + std::to_string(w))
          .where(op)
          .expected("spatial shapes (H, W) >= 1");
    }
  }
  expect_f32_shape(op, out, "output out", offsets.shape());
  expect_no_overlap(op, offsets, out, /*may_alias=*/true);
  expect_no_overlap(op, reference, out, /*may_alias=*/false);
  if (offsets.numel() == 0) return;
  const float* offp = offsets.data<float>();
  const float* rp = reference.data<float>();
  float* yp = out.data<float>();
  for_rows(pool, m_len, heads * levels * points * 2, [&](int64_t m0, int64_t m1) {
    sampling_locations_rows(offp, rp, lr, r_len, d_len, heads, points, spatial_shapes, yp, m0, m1);
  });
}

void sampling_locations_rows(const float* offp, const float* rp, int64_t lr, int64_t r_len, int64_t d_len, int64_t heads,
                             int64_t points, const std::vector<std::pair<int64_t, int64_t>>& spatial_shapes, float* yp,
                             int64_t m0, int64_t m1) {
  const auto levels = static_cast<int64_t>(spatial_shapes.size());
  const int64_t per_head = levels * points * 2, row = heads * per_head;
  // Every head of a row m shares one pattern over its (level, point, xy) block: divisors (W_l, H_l)
  // and reference points. Built once per row (the divisors once per call), the heads' blocks are
  // then y = ref + offset / divisor elementwise, which the compiler vectorizes: true division and
  // the same two roundings as the scalar form (divide, then add; nothing to contract into an FMA),
  // so the bits are unchanged. Scalar divisions bounded it before: `test_backend_ops --perf`, base,
  // 2 threads, AMX Xeon: SCA 22.6 -> 10.5 ms, TSA 4.6 -> 2.3 ms. Blocks wider than the stack
  // patterns (never in BEVFormer: SCA's is 4 levels x 8 points x 2 = 64) go point by point.
  constexpr int64_t kMaxBlock = 256;
  const bool blocked = per_head <= kMaxBlock;
  float divisor[kMaxBlock];
  if (blocked) {
    for (int64_t l = 0; l < levels; ++l) {
      // The divisors as float, as PyTorch converts the int64 offset_normalizer in f32 / i64.
      const float w = static_cast<float>(spatial_shapes[static_cast<size_t>(l)].second);
      const float hh = static_cast<float>(spatial_shapes[static_cast<size_t>(l)].first);
      for (int64_t p = 0; p < points; ++p) {
        divisor[(l * points + p) * 2] = w;
        divisor[(l * points + p) * 2 + 1] = hh;
      }
    }
  }
  for (int64_t m = m0; m < m1; ++m) {
    const float* ref_m = rp + m * lr * r_len * d_len;
    if (blocked) {
      float ref_row[kMaxBlock];
      for (int64_t l = 0; l < levels; ++l) {
        const float* ref_l = ref_m + (lr == 1 ? 0 : l) * r_len * d_len;
        for (int64_t p = 0; p < points; ++p) {
          ref_row[(l * points + p) * 2] = ref_l[(p % r_len) * d_len];
          ref_row[(l * points + p) * 2 + 1] = ref_l[(p % r_len) * d_len + 1];
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float* o = offp + m * row + h * per_head;
        float* y = yp + m * row + h * per_head;  // may be o (in place): elementwise, so fine
        for (int64_t i = 0; i < per_head; ++i) y[i] = ref_row[i] + o[i] / divisor[i];
      }
      continue;
    }
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t l = 0; l < levels; ++l) {
        const float* ref_l = ref_m + (lr == 1 ? 0 : l) * r_len * d_len;
        const float w = static_cast<float>(spatial_shapes[static_cast<size_t>(l)].second);
        const float hh = static_cast<float>(spatial_shapes[static_cast<size_t>(l)].first);
        const int64_t base = ((m * heads + h) * levels + l) * points * 2;
        const float* o = offp + base;
        float* y = yp + base;
        for (int64_t p = 0; p < points; ++p) {
          const float* ref = ref_l + (p % r_len) * d_len;
          const float ox = o[2 * p] / w;
          const float oy = o[2 * p + 1] / hh;
          y[2 * p] = ref[0] + ox;
          y[2 * p + 1] = ref[1] + oy;
        }
      }
    }
  }
}

void reference_refine(const Tensor& reg, const Tensor& reference, Tensor& out, ThreadPool* pool) {
  const char* op = "reference_refine";
  expect_f32_rank(op, reg, "reg", 2, "[M, code >= 5]");
  const int64_t m_len = reg.size(0), code = reg.size(1);
  if (code < 5) bad_tensor(op, reg, "reg", "contiguous host f32 [M, code >= 5]");
  expect_f32_shape(op, reference, "reference", {m_len, 3});
  expect_f32_shape(op, out, "output out", {m_len, 3});
  expect_no_overlap(op, reference, out, /*may_alias=*/true);
  expect_no_overlap(op, reg, out, /*may_alias=*/false);
  if (m_len == 0) return;
  const float* gp = reg.data<float>();
  const float* rp = reference.data<float>();
  float* yp = out.data<float>();
  for_rows(pool, m_len, 3, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* g = gp + m * code;
      const float* r = rp + m * 3;
      // Every input of the row is read before the row is written (out may be reference).
      const float x = g[0] + inverse_sigmoid_scalar(r[0], kInverseSigmoidEps);
      const float y = g[1] + inverse_sigmoid_scalar(r[1], kInverseSigmoidEps);
      const float z = g[4] + inverse_sigmoid_scalar(r[2], kInverseSigmoidEps);
      float* o = yp + m * 3;
      o[0] = sigmoid_scalar(x);
      o[1] = sigmoid_scalar(y);
      o[2] = sigmoid_scalar(z);
    }
  });
}

void bbox_denormalize(const Tensor& reg, const Tensor& refined, const BboxDenormalizeAttrs& attrs, Tensor& out,
                      ThreadPool* pool) {
  const char* op = "bbox_denormalize";
  expect_f32_rank(op, reg, "reg", 2, "[M, code >= 5]");
  const int64_t m_len = reg.size(0), code = reg.size(1);
  if (code < 5) bad_tensor(op, reg, "reg", "contiguous host f32 [M, code >= 5]");
  expect_f32_shape(op, refined, "refined", {m_len, 3});
  expect_f32_shape(op, out, "output out", reg.shape());
  expect_no_overlap(op, reg, out, /*may_alias=*/true);
  expect_no_overlap(op, refined, out, /*may_alias=*/false);
  if (m_len == 0) return;
  const float* gp = reg.data<float>();
  const float* rp = refined.data<float>();
  float* yp = out.data<float>();
  const bool in_place = gp == yp;
  static constexpr int64_t kChannel[3] = {0, 1, 4};
  for_rows(pool, m_len, code, [&](int64_t m0, int64_t m1) {
    if (!in_place) std::copy(gp + m0 * code, gp + m1 * code, yp + m0 * code);
    for (int64_t m = m0; m < m1; ++m) {
      for (int k = 0; k < 3; ++k) {
        const float scaled = rp[m * 3 + k] * attrs.scale[k];
        yp[m * code + kChannel[k]] = scaled + attrs.offset[k];
      }
    }
  });
}

}  // namespace bev::cpu
