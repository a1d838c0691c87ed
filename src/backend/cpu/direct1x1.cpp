#include "backend/cpu/direct1x1.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include "backend/cpu/onednn.h"
#include "backend/cpu/vec_avx512.h"
#include "bevformer/error.h"

namespace bev::cpu {
namespace {

constexpr int kTile = 6;              // pixels per tile: 6 x 4 accumulators of 16 channels
constexpr int64_t kPrefetchTiles = 2;  // 64 -> 64, 2 threads: 0 -> 53-62%, 2 -> 97-101%, 4 -> 92-97% (docs/PERF.md)

// R pixels (R <= kTile) x every column block.
template <int R>
__attribute__((target("avx512f"))) void tile(const float* __restrict x, const float* __restrict w,
                                             const float* __restrict b, float* __restrict y, int64_t k, int64_t o,
                                             bool relu) {
  for (int64_t cb = 0; cb < o / 64; ++cb) {
    const float* wb = w + cb * k * 64;
    __m512 acc[R][4];
    for (int j = 0; j < 4; ++j) {
      const __m512 bias = _mm512_loadu_ps(b + cb * 64 + 16 * j);
      for (int r = 0; r < R; ++r) acc[r][j] = bias;
    }
#pragma GCC unroll 4
    for (int64_t c = 0; c < k; ++c) {
      const float* wc = wb + c * 64;
      const __m512 w0 = _mm512_loadu_ps(wc), w1 = _mm512_loadu_ps(wc + 16), w2 = _mm512_loadu_ps(wc + 32),
                   w3 = _mm512_loadu_ps(wc + 48);
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_set1_ps(x[r * k + c]);
        acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(xv, w3, acc[r][3]);
      }
    }
    const __m512 zero = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < 4; ++j) {
        // The maskz form with a full mask: GCC 12 flags the plain form's undefined pass-through.
        const __m512 v = relu ? _mm512_maskz_max_ps(0xFFFF, acc[r][j], zero) : acc[r][j];
        _mm512_storeu_ps(y + r * o + cb * 64 + 16 * j, v);
      }
    }
  }
}

using TileFn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, bool);
constexpr TileFn kTiles[kTile + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

}  // namespace

bool Direct1x1::supports(const Conv2dAttrs& a, int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                         Precision precision) {
  return avx512::has_f() && precision == Precision::kF32 && kh == 1 && kw == 1 && a.stride_h == 1 && a.stride_w == 1 &&
         a.pad_h == 0 && a.pad_w == 0 && a.dilation_h == 1 && a.dilation_w == 1 && a.groups == 1 && !a.residual &&
         in_channels >= 1 && in_channels <= kMaxInChannels && out_channels >= 64 && out_channels % 64 == 0 &&
         in_channels * out_channels <= kMaxWeights;
}

Direct1x1::Direct1x1(const Tensor& weight_oihw, const Tensor* bias, bool relu) : relu_(relu) {
  if (!weight_oihw.defined() || weight_oihw.dtype() != DType::kF32 || weight_oihw.dim() != 4 ||
      weight_oihw.size(2) != 1 || weight_oihw.size(3) != 1 || weight_oihw.size(0) % 64 != 0 || weight_oihw.size(1) < 1) {
    throw Error(ErrorKind::kInvalidInput, "weight is " + (weight_oihw.defined() ? weight_oihw.describe() : std::string("undefined")))
        .where("cpu::Direct1x1")
        .expected("f32 [O, K, 1, 1] with O a multiple of 64");
  }
  o_ = weight_oihw.size(0);
  k_ = weight_oihw.size(1);
  const Tensor w = weight_oihw.contiguous();
  const float* wp = w.data<float>();
  w_.resize(static_cast<size_t>(o_ * k_));
  for (int64_t oc = 0; oc < o_; ++oc) {
    for (int64_t c = 0; c < k_; ++c) w_[static_cast<size_t>(((oc / 64) * k_ + c) * 64 + oc % 64)] = wp[oc * k_ + c];
  }
  b_.assign(static_cast<size_t>(o_), 0.0f);
  if (bias) {
    if (!bias->defined() || bias->dtype() != DType::kF32 || bias->shape() != Shape{o_}) {
      throw Error(ErrorKind::kInvalidInput, "bias is " + (bias->defined() ? bias->describe() : std::string("undefined")))
          .where("cpu::Direct1x1")
          .expected("f32 [" + std::to_string(o_) + "]");
    }
    const Tensor b = bias->contiguous();
    std::copy(b.data<float>(), b.data<float>() + o_, b_.begin());
  }
}

void Direct1x1::run(const float* x, float* y, int64_t pixels) const {
  const int64_t tiles = (pixels + kTile - 1) / kTile;
  const int team = omp_in_parallel() ? 1 : static_cast<int>(std::min<int64_t>(std::max(1, num_threads()), tiles));
  auto range = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      // The input of the tile kPrefetchTiles on, asked for now: it arrives while this tile computes.
      if (const int64_t ahead = t + kPrefetchTiles; ahead < t1) {
        const char* p = reinterpret_cast<const char*>(x + ahead * kTile * k_);
        const int64_t bytes = std::min<int64_t>(kTile, pixels - ahead * kTile) * k_ * static_cast<int64_t>(sizeof(float));
        for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
      }
      const int64_t p0 = t * kTile, r = std::min<int64_t>(kTile, pixels - p0);
      kTiles[r](x + p0 * k_, w_.data(), b_.data(), y + p0 * o_, k_, o_, relu_);
    }
  };
  if (team <= 1) {
    range(0, tiles);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    // Contiguous ranges: each core streams its own part of the map.
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    range(tiles * t / n, tiles * (t + 1) / n);
  }
}

}  // namespace bev::cpu
