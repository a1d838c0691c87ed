#include "backend/cpu/pool_resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <limits>
#include <string>

#include "backend/cpu/kernel_check.h"
#include "backend/cpu/vec_avx512.h"
#include "core/half.h"

namespace bev::cpu {
namespace {


void expect_nhwc(const char* op, const Tensor& t, const char* what, bool bf16_ok = false, bool u8_ok = false) {
  if (!t.defined() ||
      !(t.dtype() == DType::kF32 || (bf16_ok && t.dtype() == DType::kBF16) || (u8_ok && t.dtype() == DType::kU8)) ||
      t.device() != Device::kCpu || t.dim() != 4 || !t.is_contiguous() || t.size(1) < 1 || t.size(2) < 1) {
    bad_tensor(op, t, what,
               std::string("contiguous host ") + (u8_ok ? "f32, bf16 or u8" : bf16_ok ? "f32 or bf16" : "f32") +
                   " [N, H, W, C] with H, W >= 1");
  }
}

template <typename Fn>
void for_rows(ThreadPool* pool, int64_t rows, const Fn& fn) {
  if (pool == nullptr || pool->size() == 1 || rows < 2) {
    fn(int64_t{0}, rows);
  } else {
    pool->parallel_for(rows, 1, fn);
  }
}

}  // namespace

Shape max_pool2d_3x3_s2_p1_shape(const Shape& x) {
  if (x.size() != 4 || x[1] < 1 || x[2] < 1) {
    throw Error(ErrorKind::kInvalidInput, "input x has shape " + shape_str(x))
        .where("max_pool2d_3x3_s2_p1")
        .expected("[N, H, W, C] with H, W >= 1");
  }
  return {x[0], (x[1] + 2 - 3) / 2 + 1, (x[2] + 2 - 3) / 2 + 1, x[3]};
}

namespace {

// PyTorch's max: a NaN wins and then stays (`v > m || isnan(v)` keeps a NaN m too).
inline float nan_max(float m, float v) { return (v > m || std::isnan(v)) ? v : m; }

// One output pixel's window, 16 channels per vector: the window's rows are read once each,
// the running maxima stay in registers (the stem's pool reads 147 MB for tiny; this keeps it
// at the memory's speed).
__attribute__((target("avx512f"))) void pool_pixel_avx512(const float* const* taps, int n_taps, int64_t C, float* out) {
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int t = 0; t < n_taps; ++t) {
      const __m512 v = _mm512_loadu_ps(taps[t] + c);
      const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_mask_mov_ps(m, take, v);
    }
    _mm512_storeu_ps(out + c, m);
  }
  for (; c < C; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < n_taps; ++t) m = nan_max(m, taps[t][c]);
    out[c] = m;
  }
}

void pool_pixel_scalar(const float* const* taps, int n_taps, int64_t C, float* out) {
  for (int64_t c = 0; c < C; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < n_taps; ++t) m = nan_max(m, taps[t][c]);
    out[c] = m;
  }
}

// bf16 maps (the stem's output in bf16 precision): compared as f32 (widen, core/half.h), stored
// back by dropping the low half, which is exact because every value came from bf16 (the max of
// rounded values is the rounded max: rounding is monotone, so this equals pooling in f32 and
// rounding after).
inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

void pool_pixel_bf16_scalar(const uint16_t* const* taps, int n_taps, int64_t C, uint16_t* out) {
  for (int64_t c = 0; c < C; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < n_taps; ++t) m = nan_max(m, widen(taps[t][c]));
    out[c] = narrow(m);
  }
}

__attribute__((target("avx512f"))) void pool_pixel_bf16_avx512(const uint16_t* const* taps, int n_taps, int64_t C,
                                                                uint16_t* out) {
  int64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int t = 0; t < n_taps; ++t) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(taps[t] + c));
      const __m512 v = bf16_to_float_x16(raw);
      const __mmask16 take = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_mask_mov_ps(m, take, v);
    }
    const __m256i packed =
        _mm512_maskz_cvtepi32_epi16(0xFFFF, _mm512_maskz_srli_epi32(0xFFFF, _mm512_castps_si512(m), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), packed);
  }
  for (; c < C; ++c) {
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < n_taps; ++t) m = nan_max(m, widen(taps[t][c]));
    out[c] = narrow(m);
  }
}

// u8 maps (the stem's codes in int8 precision): quantizing is monotone, so the max of the codes
// is the code of the max, and a window never holds a NaN.
void pool_pixel_u8_scalar(const uint8_t* const* taps, int n_taps, int64_t C, uint8_t* out) {
  for (int64_t c = 0; c < C; ++c) {
    uint8_t m = 0;
    for (int t = 0; t < n_taps; ++t) m = std::max(m, taps[t][c]);
    out[c] = m;
  }
}

__attribute__((target("avx512bw"))) void pool_pixel_u8_avx512(const uint8_t* const* taps, int n_taps, int64_t C,
                                                               uint8_t* out) {
  int64_t c = 0;
  for (; c + 64 <= C; c += 64) {
    __m512i m = _mm512_setzero_si512();
    for (int t = 0; t < n_taps; ++t) m = _mm512_max_epu8(m, _mm512_loadu_si512(taps[t] + c));
    _mm512_storeu_si512(out + c, m);
  }
  if (c < C) {
    const __mmask64 tail = (1ULL << (C - c)) - 1;  // C - c < 64
    __m512i m = _mm512_setzero_si512();
    for (int t = 0; t < n_taps; ++t) m = _mm512_max_epu8(m, _mm512_maskz_loadu_epi8(tail, taps[t] + c));
    _mm512_mask_storeu_epi8(out + c, tail, m);
  }
}

}  // namespace

namespace {

// While an output row pools, the two input rows that only the next output row reads are
// prefetched, column by column as the window moves: reading the stem's 147 MB map (tiny) as three
// row streams per core, the hardware prefetcher alone kept too few lines in flight (6.1-10.5 ms on
// 2 cores; 3.6-5.8 ms with this; a read-only pass over the map: 2.1-3.6 ms).
template <typename T, typename Pixel>
void max_pool_rows(const T* xp, T* yp, const Shape& xs, const Shape& ys, ThreadPool* pool, Pixel pixel) {
  const int64_t H = xs[1], W = xs[2], C = xs[3], Ho = ys[1], Wo = ys[2];
  const size_t pair_bytes = 2 * static_cast<size_t>(C) * sizeof(T);  // input columns 2ow, 2ow + 1
  for_rows(pool, ys[0] * Ho, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / Ho, oh = r % Ho;
      const T* image = xp + n * H * W * C;
      const int64_t h0 = std::max<int64_t>(0, oh * 2 - 1), h1 = std::min<int64_t>(H, oh * 2 + 2);
      const T* next[2] = {oh * 2 + 2 < H ? image + (oh * 2 + 2) * W * C : nullptr,
                          oh * 2 + 3 < H ? image + (oh * 2 + 3) * W * C : nullptr};
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(0, ow * 2 - 1), w1 = std::min<int64_t>(W, ow * 2 + 2);
        const size_t bytes = std::min<size_t>(pair_bytes, static_cast<size_t>(W - ow * 2) * C * sizeof(T));
        for (const T* row : next) {
          if (row == nullptr) continue;
          const char* p = reinterpret_cast<const char*>(row + ow * 2 * C);
          for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
        }
        const T* taps[9];
        int n_taps = 0;
        for (int64_t h = h0; h < h1; ++h) {
          for (int64_t w = w0; w < w1; ++w) taps[n_taps++] = image + (h * W + w) * C;
        }
        pixel(taps, n_taps, C, yp + (r * Wo + ow) * C);
      }
    }
  });
}

}  // namespace

void max_pool2d_3x3_s2_p1(const Tensor& x, Tensor& y, ThreadPool* pool) {
  const char* op = "max_pool2d_3x3_s2_p1";
  // f32, bf16 (bf16 precision) or u8 codes (int8 precision), the output in the input's dtype.
  const DType dt = x.defined() ? x.dtype() : DType::kF32;
  expect_nhwc(op, x, "input x", /*bf16_ok=*/true, /*u8_ok=*/true);
  const Shape ys = max_pool2d_3x3_s2_p1_shape(x.shape());
  expect_host_shape(op, y, "output y (the input's dtype)", dt, ys);
  const bool f = avx512::has_f(), bw = avx512::has_bw();
  if (dt == DType::kF32) {
    max_pool_rows(x.data<float>(), y.data<float>(), x.shape(), ys, pool,
                  f ? pool_pixel_avx512 : pool_pixel_scalar);
  } else if (dt == DType::kU8) {
    max_pool_rows(x.data<uint8_t>(), y.data<uint8_t>(), x.shape(), ys, pool,
                  bw ? pool_pixel_u8_avx512 : pool_pixel_u8_scalar);
  } else {
    max_pool_rows(static_cast<const uint16_t*>(x.raw_data()), static_cast<uint16_t*>(y.raw_data()), x.shape(), ys,
                  pool, f ? pool_pixel_bf16_avx512 : pool_pixel_bf16_scalar);
  }
}

int64_t nearest_source_index(int64_t dst, int64_t in_size, int64_t out_size) {
  // PyTorch's nearest_idx: exact shortcuts for 1x and 2x, else the f32 scale in/out.
  if (out_size == in_size) return dst;
  if (out_size == 2 * in_size) return dst >> 1;
  const float scale = static_cast<float>(in_size) / static_cast<float>(out_size);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * scale)), in_size - 1);
}

void upsample_nearest2x_add(const Tensor& coarse, Tensor& fine, ThreadPool* pool) {
  const char* op = "upsample_nearest2x_add";
  expect_nhwc(op, coarse, "coarse");
  expect_nhwc(op, fine, "fine");
  if (fine.size(0) != coarse.size(0) || fine.size(3) != coarse.size(3)) {
    bad_tensor(op, fine, "fine", "f32[" + std::to_string(coarse.size(0)) + ", H, W, " + std::to_string(coarse.size(3)) +
                              "] (batch and channels of coarse " + coarse.describe() + ")");
  }
  const int64_t N = fine.size(0), H = fine.size(1), W = fine.size(2), C = fine.size(3);
  const int64_t h = coarse.size(1), w = coarse.size(2);
  const float* cp = coarse.data<float>();
  float* fp = fine.data<float>();
  for_rows(pool, N * H, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / H, y = r % H;
      const float* src_row = cp + (n * h + nearest_source_index(y, h, H)) * w * C;
      float* dst = fp + r * W * C;
      for (int64_t x = 0; x < W; ++x) {
        // The source column per pixel, not from a table (that would allocate on every run);
        // for FPN's 2x it is a shift.
        const float* s = src_row + nearest_source_index(x, w, W) * C;
        float* d = dst + x * C;
        for (int64_t c = 0; c < C; ++c) d[c] += s[c];
      }
    }
  });
}

}  // namespace bev::cpu
