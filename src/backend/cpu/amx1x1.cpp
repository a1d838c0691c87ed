#include "backend/cpu/amx1x1.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/vec_avx512.h"
#include "bevformer/error.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

constexpr int64_t kRows = 32;        // pixels per block: two A tiles of 16
constexpr int64_t kCols = 32;        // output channels per block: two B tiles of 16
constexpr int64_t kStep = 32;        // input channels per tile product: a tile row of bf16
constexpr int64_t kTileElems = 512;  // bf16 in a 16 x 64-byte tile

enum class Residual { kNone, kBF16, kF32 };

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("cpu::Amx1x1").expected(expected);
}

struct Args {
  const uint16_t* w;
  const float* b;
  const void* res;
  void* y;
  int64_t k, o;
  size_t res_size;  // bytes per residual element (0: none)
  const char* extra;  // Amx1x1::run's `spread`: bytes to ask L2 for over the call's blocks
  int64_t extra_lines;
};

// What the block after this one reads (x and the residual, into L1), and this block's share of the
// caller's `spread` (into L2), asked for a column block at a time while the tiles compute: a burst
// of prefetches stalls the core until memory delivers them, a few at a time do not.
struct Ahead {
  const char* x = nullptr;    // the next block's rows of x (contiguous), or null
  const char* res = nullptr;  // and of the residual
  int64_t x_lines = 0, res_lines = 0;
  const char* extra = nullptr;
  int64_t extra_lines = 0;

  void share(int64_t part, int64_t parts) const {
    for (int64_t l = extra_lines * part / parts; l < extra_lines * (part + 1) / parts; ++l) {
      _mm_prefetch(extra + 64 * l, _MM_HINT_T1);
    }
    for (int64_t l = x_lines * part / parts; l < x_lines * (part + 1) / parts; ++l) _mm_prefetch(x + 64 * l, _MM_HINT_T0);
    for (int64_t l = res_lines * part / parts; l < res_lines * (part + 1) / parts; ++l) {
      _mm_prefetch(res + 64 * l, _MM_HINT_T0);
    }
  }
};

// B tiles that pass 32 bf16 channels of A through unchanged: kIdentity[0] to column j the
// channel j, kIdentity[1] the channel 16 + j (pairs: row r holds channels 2r and 2r + 1).
struct IdentityTiles {
  alignas(64) uint16_t t[2][kTileElems] = {};
  constexpr IdentityTiles() {
    for (int half = 0; half < 2; ++half) {
      for (int ch = 16 * half; ch < 16 * half + 16; ++ch) t[half][(ch / 2) * 32 + (ch - 16 * half) * 2 + ch % 2] = 0x3F80;
    }
  }
};
constexpr IdentityTiles kIdentity{};  // constant-initialized: usable from any static initializer

// One block: the 32 rows of x at xa (a row is K bf16) by every column block, written to output rows
// [row0 + r0, row0 + r1). Accumulators in tiles 4-7 start from the bias (a tile load of stride 0
// repeats its row); x's rows in 0-1, the weights in 2-3. A bf16 residual (rows row0 .. row0 + 32 of
// a.res, all of them readable) is added by the tile unit too, as its channels times an identity:
// the epilogue, which bounds a conv of few input channels (conv3 of layer1: 64), is left with the
// ReLU and the rounding. Each sum is the same one f32 addition the vector code would make (the
// identity's other products are exact zeros), except that the tile unit flushes a subnormal
// result to zero; a NaN or infinite residual channel, times the identity's zeros, makes the pixel's
// other 31 channels of its column block NaN (an infinity keeps its own channel infinite), where the
// vector add kept it to its own channel (the next conv mixes every channel of the pixel anyway).
template <Residual R, bool YBF16, bool RELU>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))) void block(
    const Args& a, const uint16_t* xa, int64_t row0, int64_t r0, int64_t r1, float* acc, const Ahead& ahead) {
  const int64_t steps = a.k / kStep, col_blocks = a.o / kCols;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t nb = 0; nb < col_blocks; ++nb) {
    ahead.share(nb, col_blocks);
    const uint16_t* w0 = a.w + (2 * nb) * steps * kTileElems;
    const uint16_t* w1 = w0 + steps * kTileElems;
    _tile_loadd(4, a.b + nb * kCols, 0);
    _tile_loadd(5, a.b + nb * kCols + 16, 0);
    _tile_loadd(6, a.b + nb * kCols, 0);
    _tile_loadd(7, a.b + nb * kCols + 16, 0);
    for (int64_t s = 0; s < steps; ++s) {
      _tile_loadd(0, xa + s * kStep, a.k * 2);
      _tile_loadd(1, xa + 16 * a.k + s * kStep, a.k * 2);
      _tile_loadd(2, w0 + s * kTileElems, 64);
      _tile_loadd(3, w1 + s * kTileElems, 64);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    if constexpr (R == Residual::kBF16) {
      const uint16_t* rp = static_cast<const uint16_t*>(a.res) + row0 * a.o + nb * kCols;
      _tile_loadd(0, rp, a.o * 2);
      _tile_loadd(1, rp + 16 * a.o, a.o * 2);
      _tile_loadd(2, kIdentity.t[0], 64);
      _tile_loadd(3, kIdentity.t[1], 64);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    // Row r of the block: its 32 sums at acc + 32 r.
    _tile_stored(4, acc, kCols * 4);
    _tile_stored(5, acc + 16, kCols * 4);
    _tile_stored(6, acc + 16 * kCols, kCols * 4);
    _tile_stored(7, acc + 16 * kCols + 16, kCols * 4);
    amx::compiler_barrier();
    for (int64_t r = r0; r < r1; ++r) {
      __m512 v0 = _mm512_load_ps(acc + r * kCols);
      __m512 v1 = _mm512_load_ps(acc + r * kCols + 16);
      const int64_t off = (row0 + r) * a.o + nb * kCols;
      if constexpr (R == Residual::kF32) {
        const float* rp = static_cast<const float*>(a.res) + off;
        v0 = _mm512_add_ps(v0, _mm512_loadu_ps(rp));
        v1 = _mm512_add_ps(v1, _mm512_loadu_ps(rp + 16));
      }
      if constexpr (RELU) {  // max(0, v): the second operand wins on NaN, so NaN stays NaN
        v0 = avx512::max16(zero, v0);
        v1 = avx512::max16(zero, v1);
      }
      if constexpr (YBF16) {
        _mm512_storeu_si512(static_cast<uint16_t*>(a.y) + off, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v1, v0)));
      } else {
        float* yp = static_cast<float*>(a.y) + off;
        _mm512_storeu_ps(yp, v0);
        _mm512_storeu_ps(yp + 16, v1);
      }
    }
  }
}

// Pixels [p0, p1) of a call over `pixels` >= 32 pixels: blocks of 32 from p0; a partial last block
// is the 32 pixels that end at p1, of which only the rows from its predecessor's end are written.
template <Residual R, bool YBF16, bool RELU>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))) void range(
    const Args& a, const uint16_t* x, int64_t p0, int64_t p1) {
  alignas(64) float acc[kRows * kCols];
  _tile_loadconfig(&amx::kFullTiles);
  amx::compiler_barrier();
  const int64_t nblk = (p1 - p0 + kRows - 1) / kRows;
  for (int64_t m = p0; m < p1; m += kRows) {
    const int64_t start = std::min(m, p1 - kRows);
    Ahead ahead;
    if (a.extra_lines > 0) {
      const int64_t i = (m - p0) / kRows, l0 = a.extra_lines * i / nblk, l1 = a.extra_lines * (i + 1) / nblk;
      ahead.extra = a.extra + 64 * l0;
      ahead.extra_lines = l1 - l0;
    }
    if (const int64_t next = m + kRows; next < p1) {
      const int64_t rows = std::min(kRows, p1 - next);
      ahead.x = reinterpret_cast<const char*>(x + next * a.k);
      ahead.x_lines = (rows * a.k * 2 + 63) / 64;
      if (a.res) {
        ahead.res = static_cast<const char*>(a.res) + static_cast<size_t>(next * a.o) * a.res_size;
        ahead.res_lines = (rows * a.o * static_cast<int64_t>(a.res_size) + 63) / 64;
      }
    }
    block<R, YBF16, RELU>(a, x + start * a.k, start, m - start, kRows, acc, ahead);
  }
  _tile_release();
}

// Rows [p0, p1), fewer than 32: x (and a bf16 residual, which the tiles read 32 rows of) copied into
// zero-padded blocks of the thread's own, so that no tile reads a row past the end. The blocks grow
// once and are reused: replays allocate nothing.
template <Residual R, bool YBF16, bool RELU>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))) void small(
    const Args& a, const uint16_t* x, int64_t p0, int64_t p1) {
  thread_local std::vector<uint16_t> padded_x, padded_res;
  alignas(64) float acc[kRows * kCols];
  const int64_t pixels = p1 - p0;
  auto fill = [pixels](std::vector<uint16_t>& block, const uint16_t* rows, int64_t width) {
    const size_t used = static_cast<size_t>(pixels * width), all = static_cast<size_t>(kRows * width);
    if (block.size() < all) block.resize(all);
    std::memcpy(block.data(), rows, used * sizeof(uint16_t));
    std::fill(block.begin() + static_cast<std::ptrdiff_t>(used), block.begin() + static_cast<std::ptrdiff_t>(all),
              uint16_t{0});
  };
  fill(padded_x, x + p0 * a.k, a.k);
  Args b = a;  // row 0 of the call is row p0
  b.y = static_cast<char*>(a.y) + static_cast<size_t>(p0 * a.o) * (YBF16 ? 2 : 4);
  if constexpr (R == Residual::kBF16) {
    fill(padded_res, static_cast<const uint16_t*>(a.res) + p0 * a.o, a.o);
    b.res = padded_res.data();
  } else if constexpr (R == Residual::kF32) {
    b.res = static_cast<const float*>(a.res) + p0 * a.o;
  }
  _tile_loadconfig(&amx::kFullTiles);
  amx::compiler_barrier();
  block<R, YBF16, RELU>(b, padded_x.data(), 0, 0, pixels, acc, Ahead{});
  _tile_release();
}

template <Residual R, bool YBF16, bool RELU>
void run_typed(const Args& a, const uint16_t* x, int64_t pixels) {
  if (pixels < kRows) {
    small<R, YBF16, RELU>(a, x, 0, pixels);
  } else {
    range<R, YBF16, RELU>(a, x, 0, pixels);
  }
}

template <Residual R, bool YBF16>
void run_relu(const Args& a, const uint16_t* x, int64_t pixels, bool relu) {
  if (relu) {
    run_typed<R, YBF16, true>(a, x, pixels);
  } else {
    run_typed<R, YBF16, false>(a, x, pixels);
  }
}

template <Residual R>
void run_out(const Args& a, const uint16_t* x, int64_t pixels, bool relu, DType y_dtype) {
  if (y_dtype == DType::kBF16) {
    run_relu<R, true>(a, x, pixels, relu);
  } else {
    run_relu<R, false>(a, x, pixels, relu);
  }
}

}  // namespace

bool Amx1x1::supports(const Conv2dAttrs& at, int64_t in_channels, int64_t out_channels, int64_t kh, int64_t kw,
                      Precision arithmetic) {
  return arithmetic == Precision::kBF16 && kh == 1 && kw == 1 && at.stride_h == 1 && at.stride_w == 1 &&
         at.pad_h == 0 && at.pad_w == 0 && at.dilation_h == 1 && at.dilation_w == 1 && at.groups == 1 &&
         in_channels >= kStep && in_channels % kStep == 0 && out_channels >= kCols && out_channels % kCols == 0 &&
         in_channels * out_channels <= kMaxWeights && isa_has_amx() && amx::tile_state_granted();
}

Amx1x1::Amx1x1(const Tensor& weight_oihw, const Tensor* bias, bool relu) : relu_(relu) {
  if (!weight_oihw.defined() || weight_oihw.dtype() != DType::kF32 || weight_oihw.dim() != 4 ||
      weight_oihw.size(2) != 1 || weight_oihw.size(3) != 1 || weight_oihw.size(0) < kCols ||
      weight_oihw.size(0) % kCols != 0 || weight_oihw.size(1) < kStep || weight_oihw.size(1) % kStep != 0) {
    invalid("weight is " + (weight_oihw.defined() ? weight_oihw.describe() : std::string("undefined")),
            "f32 [O, K, 1, 1] with O and K multiples of 32");
  }
  o_ = weight_oihw.size(0);
  k_ = weight_oihw.size(1);
  const Tensor w = weight_oihw.contiguous();
  const float* wp = w.data<float>();
  const int64_t steps = k_ / kStep;
  w_.resize(static_cast<size_t>(o_ * k_));
  for (int64_t oc = 0; oc < o_; ++oc) {
    for (int64_t c = 0; c < k_; ++c) {
      const int64_t tile = (oc / 16) * steps + c / kStep;
      const int64_t at = tile * kTileElems + (c % kStep / 2) * 32 + (oc % 16) * 2 + c % 2;
      w_[static_cast<size_t>(at)] = float_to_bf16(wp[oc * k_ + c]);
    }
  }
  b_.assign(static_cast<size_t>(o_), 0.0f);
  if (bias) {
    if (!bias->defined() || bias->dtype() != DType::kF32 || bias->shape() != Shape{o_}) {
      invalid("bias is " + (bias->defined() ? bias->describe() : std::string("undefined")),
              "f32 [" + std::to_string(o_) + "]");
    }
    const Tensor b = bias->contiguous();
    std::copy(b.data<float>(), b.data<float>() + o_, b_.begin());
  }
}

void Amx1x1::run(const uint16_t* x, const void* residual, DType res_dtype, void* y, DType y_dtype, int64_t pixels,
                 const void* spread, size_t spread_bytes) const {
  if (pixels < 1) return;
  if (y_dtype != DType::kBF16 && y_dtype != DType::kF32) {
    invalid(std::string("output dtype ") + dtype_name(y_dtype), "bf16 or f32");
  }
  const Args a{w_.data(), b_.data(), residual, y, k_, o_, residual ? dtype_size(res_dtype) : 0,
               static_cast<const char*>(spread), spread ? static_cast<int64_t>((spread_bytes + 63) / 64) : 0};
  if (!residual) {
    run_out<Residual::kNone>(a, x, pixels, relu_, y_dtype);
  } else if (res_dtype == DType::kBF16) {
    run_out<Residual::kBF16>(a, x, pixels, relu_, y_dtype);
  } else if (res_dtype == DType::kF32) {
    run_out<Residual::kF32>(a, x, pixels, relu_, y_dtype);
  } else {
    invalid(std::string("residual dtype ") + dtype_name(res_dtype), "bf16 or f32");
  }
}

}  // namespace bev::cpu
