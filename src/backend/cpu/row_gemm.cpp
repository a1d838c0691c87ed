#include "backend/cpu/row_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bevformer/error.h"
#include "core/cpu_features.h"

namespace bev::cpu {
namespace {

constexpr int kCols = 16;  // a panel: two ymm of output columns
constexpr int kRows = 6;   // a tile: 6 x 2 accumulators + 2 panel loads + 1 broadcast = 15 ymm
// K is taken in blocks of kDepth: a panel's block (16 KiB) stays in L1 while the tiles of a chunk
// pass over it, and a chunk's x rows of the block (96 KiB) in L2. Between blocks a tile's sums go
// to y as they are (f32, exact) and come back for the next block, so every element is still one
// FMA chain in k order: the bits do not depend on kDepth. DCNv2's K of 2304-4608 needs this.
constexpr int64_t kDepth = 256;
constexpr int64_t kChunkRows = 96;

// One tile of R rows over k in [k0, k1): y[r][0..cols) continues each element's FMA chain (from 0
// when `first`, else from the sums y holds), and when `last` adds the bias and applies the ReLU.
template <int R>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* panel, int64_t k0,
                                                    int64_t k1, bool first, bool last, const float* bias, bool relu,
                                                    float* y, int64_t ldy, int cols) {
  alignas(32) float buf[kCols];
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (first) {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    } else if (cols == kCols) {
      acc[r][0] = _mm256_loadu_ps(y + r * ldy);
      acc[r][1] = _mm256_loadu_ps(y + r * ldy + 8);
    } else {
      std::memcpy(buf, y + r * ldy, sizeof(float) * static_cast<size_t>(cols));
      acc[r][0] = _mm256_load_ps(buf);
      acc[r][1] = _mm256_load_ps(buf + 8);
    }
  }
  for (int64_t t = k0; t < k1; ++t) {
    const __m256 b0 = _mm256_load_ps(panel + t * kCols), b1 = _mm256_load_ps(panel + t * kCols + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + t);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  const __m256 bias0 = _mm256_load_ps(bias), bias1 = _mm256_load_ps(bias + 8), zero = _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    __m256 v0 = acc[r][0], v1 = acc[r][1];
    if (last) {
      v0 = _mm256_add_ps(v0, bias0);
      v1 = _mm256_add_ps(v1, bias1);
      if (relu) {  // max(0, v) keeps a NaN (the second operand is returned when either is NaN)
        v0 = _mm256_max_ps(zero, v0);
        v1 = _mm256_max_ps(zero, v1);
      }
    }
    float* out = y + r * ldy;
    if (cols == kCols) {
      _mm256_storeu_ps(out, v0);
      _mm256_storeu_ps(out + 8, v1);
    } else {
      _mm256_store_ps(buf, v0);
      _mm256_store_ps(buf + 8, v1);
      std::memcpy(out, buf, sizeof(float) * static_cast<size_t>(cols));
    }
  }
}

// The same order without vectors, where the CPU has no AVX2 + FMA: std::fma per step, so the
// bits are those of the AVX2 tile (both round each product-sum once).
void tile_scalar(const float* x, int64_t ldx, int rows, const float* panel, int64_t k0, int64_t k1, bool first,
                 bool last, const float* bias, bool relu, float* y, int64_t ldy, int cols) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float acc = first ? 0.0f : y[r * ldy + c];
      for (int64_t t = k0; t < k1; ++t) acc = std::fma(x[r * ldx + t], panel[t * kCols + c], acc);
      if (last) {
        acc += bias[c];
        if (relu) acc = 0.0f > acc ? 0.0f : acc;  // vmaxps(0, acc) exactly: NaN and -0 stay
      }
      y[r * ldy + c] = acc;
    }
  }
}

using Tile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, bool, bool, const float*, bool, float*,
                      int64_t, int);
constexpr Tile kTiles[kRows + 1] = {nullptr,      tile_avx2<1>, tile_avx2<2>, tile_avx2<3>,
                                    tile_avx2<4>, tile_avx2<5>, tile_avx2<6>};

}  // namespace

bool row_gemm_needed() {
  // oneDNN's brgemm matmul (avx512_core and up) computes a row alike for every M; gemm:jit below
  // it does not. cpu_features' kAvx512 is avx512_core under the same ONEDNN_MAX_CPU_ISA.
  return !cpu_features::has(cpu_features::Isa::kAvx512);
}

const char* RowGemm::impl_name() {
  return cpu_features::has(cpu_features::Isa::kAvx2) ? "row_gemm:avx2" : "row_gemm:scalar";
}

RowGemm::RowGemm(const float* weight, int64_t out, int64_t in, const float* bias, bool relu)
    : in_(in), out_(out), panels_((out + kCols - 1) / kCols), relu_(relu) {
  if (out < 1 || in < 1) {
    throw Error(ErrorKind::kInvalidInput, "weight [" + std::to_string(out) + ", " + std::to_string(in) + "]")
        .where("cpu::RowGemm")
        .expected("[out, in] with out, in >= 1");
  }
  packed_ = Tensor::zeros({panels_, in_, kCols}, DType::kF32);
  bias_ = Tensor::zeros({panels_ * kCols}, DType::kF32);
  float* p = packed_.data<float>();
  for (int64_t o = 0; o < out; ++o) {
    float* col = p + (o / kCols) * in * kCols + o % kCols;
    for (int64_t t = 0; t < in; ++t) col[t * kCols] = weight[o * in + t];
  }
  if (bias) std::memcpy(bias_.data<float>(), bias, sizeof(float) * static_cast<size_t>(out));
}

void RowGemm::run_rows(const float* x, int64_t rows, float* y) const {
  const float* packed = packed_.data<float>();
  const float* bias = bias_.data<float>();
  const bool avx2 = cpu_features::has(cpu_features::Isa::kAvx2);
  for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
    const int64_t r1 = std::min(rows, r0 + kChunkRows);
    for (int64_t k0 = 0; k0 < in_; k0 += kDepth) {
      const int64_t k1 = std::min(in_, k0 + kDepth);
      const bool first = k0 == 0, last = k1 == in_;
      for (int64_t p = 0; p < panels_; ++p) {
        const float* panel = packed + p * in_ * kCols;
        const int cols = static_cast<int>(std::min<int64_t>(kCols, out_ - p * kCols));
        for (int64_t r = r0; r < r1; r += kRows) {
          const int n = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
          const float* xr = x + r * in_;
          float* yr = y + r * out_ + p * kCols;
          if (avx2) {
            kTiles[n](xr, in_, panel, k0, k1, first, last, bias + p * kCols, relu_, yr, out_, cols);
          } else {
            tile_scalar(xr, in_, n, panel, k0, k1, first, last, bias + p * kCols, relu_, yr, out_, cols);
          }
        }
      }
    }
  }
}

void RowGemm::run(const float* x, int64_t rows, float* y, ThreadPool* pool) const {
  if (pool == nullptr || pool->size() < 2 || rows <= kChunkRows) return run_rows(x, rows, y);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  pool->parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    const int64_t r0 = c0 * kChunkRows, r1 = std::min(rows, c1 * kChunkRows);
    run_rows(x + r0 * in_, r1 - r0, y + r0 * out_);
  });
}

}  // namespace bev::cpu
