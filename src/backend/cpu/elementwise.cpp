// The row kernels (layer_norm, softmax) have an AVX-512 path chosen at run time (the build has no
// -march), the rest are plain loops the compiler vectorizes. softmax's AVX-512 path has its own
// exp (within ~2 ulp of libm's expf; PyTorch's CPU softmax uses Sleef's, also not libm), so the
// two paths agree to rounding, not bit for bit; one machine always takes the same path.
#include "backend/cpu/elementwise.h"

#include <atomic>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernel_check.h"
#include "backend/cpu/vec_avx512.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

using namespace avx512;  // NOLINT(google-build-using-namespace): the kernels' vocabulary

// x must be contiguous f32 of any rank >= 1 (a [M, C] view); returns C.
int64_t expect_rows(const char* op, const Tensor& x, const char* what) {
  if (!x.defined() || x.dtype() != DType::kF32 || x.device() != Device::kCpu || x.dim() < 1 || !x.is_contiguous()) {
    bad_tensor(op, x, what, "contiguous host f32 [..., C]");
  }
  return x.size(-1);
}

// Output y may alias an input exactly (in place) but must not overlap it partially.
// With may_alias false (a broadcast input) any overlap is refused.
void expect_no_partial_overlap(const char* op, const Tensor& in, const Tensor& y, bool may_alias = true) {
  const auto* a = static_cast<const char*>(in.raw_data());
  const auto* b = static_cast<const char*>(y.raw_data());
  const size_t n = in.nbytes();
  if (!(may_alias && a == b && n == y.nbytes()) && a < b + y.nbytes() && b < a + n) {
    throw Error(ErrorKind::kInvalidInput, "output overlaps an input partially").where(op)
        .expected("y either the same memory as the input or disjoint from it");
  }
}

// ---- layer_norm ----

void ln_rows_scalar(const float* x, const float* g, const float* b, float eps, float* y, int64_t c_len,
                    int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c_len;
    float* yr = y + r * c_len;
    float sum = 0.0f;
    for (int64_t c = 0; c < c_len; ++c) sum += xr[c];
    const float mean = sum / static_cast<float>(c_len);
    float sq = 0.0f;
    for (int64_t c = 0; c < c_len; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    const float rstd = 1.0f / std::sqrt(sq / static_cast<float>(c_len) + eps);
    for (int64_t c = 0; c < c_len; ++c) yr[c] = (xr[c] - mean) * rstd * g[c] + b[c];
  }
}

__attribute__((target("avx512f"))) void ln_rows_avx512(const float* x, const float* g, const float* b, float eps,
                                                        float* y, int64_t c_len, int64_t r0, int64_t r1) {
  const int64_t full = c_len / 16 * 16;
  const __mmask16 tm = tail_mask(c_len - full);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c_len;
    float* yr = y + r * c_len;
    __m512 s = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(xr + c));
    if (tm) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tm, xr + full));
    const float mean = hsum16(s) / static_cast<float>(c_len);
    const __m512 vmean = _mm512_set1_ps(mean);
    __m512 q = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(xr + c), vmean);
      q = _mm512_fmadd_ps(d, d, q);
    }
    if (tm) {
      const __m512 d = _mm512_maskz_sub_ps(tm, _mm512_maskz_loadu_ps(tm, xr + full), vmean);
      q = _mm512_fmadd_ps(d, d, q);
    }
    const float rstd = 1.0f / std::sqrt(hsum16(q) / static_cast<float>(c_len) + eps);
    const __m512 vr = _mm512_set1_ps(rstd);
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmean), vr);
      _mm512_storeu_ps(yr + c, _mm512_fmadd_ps(d, _mm512_loadu_ps(g + c), _mm512_loadu_ps(b + c)));
    }
    if (tm) {
      const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, xr + full), vmean), vr);
      const __m512 gv = _mm512_maskz_loadu_ps(tm, g + full), bv = _mm512_maskz_loadu_ps(tm, b + full);
      _mm512_mask_storeu_ps(yr + full, tm, _mm512_fmadd_ps(d, gv, bv));
    }
  }
}

// ---- softmax ----

void softmax_rows_scalar(const float* x, float* y, int64_t c_len, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c_len;
    float* yr = y + r * c_len;
    float mx = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < c_len; ++c) {
      nan |= std::isnan(xr[c]);
      mx = xr[c] > mx ? xr[c] : mx;
    }
    if (nan) mx = std::numeric_limits<float>::quiet_NaN();  // as PyTorch: NaN anywhere poisons the row
    float sum = 0.0f;
    for (int64_t c = 0; c < c_len; ++c) {
      yr[c] = std::exp(xr[c] - mx);
      sum += yr[c];
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < c_len; ++c) yr[c] *= inv;
  }
}

__attribute__((target("avx512f"))) void softmax_rows_avx512(const float* x, float* y, int64_t c_len, int64_t r0,
                                                             int64_t r1) {
  const int64_t full = c_len / 16 * 16;
  const __mmask16 tm = tail_mask(c_len - full);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c_len;
    float* yr = y + r * c_len;
    const float mx = row_max_avx512(xr, full, tm);
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmx));
      _mm512_storeu_ps(yr + c, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tm) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, xr + full), vmx));
      _mm512_mask_storeu_ps(yr + full, tm, e);
      sum = _mm512_mask_add_ps(sum, tm, sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / hsum16(sum));
    for (int64_t c = 0; c < full; c += 16) _mm512_storeu_ps(yr + c, _mm512_mul_ps(_mm512_loadu_ps(yr + c), inv));
    if (tm) _mm512_mask_storeu_ps(yr + full, tm, _mm512_mul_ps(_mm512_maskz_loadu_ps(tm, yr + full), inv));
  }
}

// How the numerators leave the kernel: in place as f32, or rounded to bf16 by float_to_bf16_x16
// (exact, subnormals kept) or by the CPU's vcvtneps2bf16 (one instruction for ~8; round to
// nearest even as well, but subnormal inputs become zero: a probability under 1.2e-38, against
// the bf16 product's 2^-9 relative rounding).
enum class NumeratorOut { kF32, kBf16, kBf16Native };

template <NumeratorOut kOut>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void store_numerators(
    float* xr, uint16_t* yr, int64_t c, __mmask16 m, __m512 e) {
  if constexpr (kOut == NumeratorOut::kF32) {
    _mm512_mask_storeu_ps(xr + c, m, e);
  } else if constexpr (kOut == NumeratorOut::kBf16) {
    _mm256_mask_storeu_epi16(yr + c, m, float_to_bf16_x16(e));
  } else {
    _mm256_mask_storeu_epi16(yr + c, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
  }
}

// exp(x - max) of each row, in place or rounded into y_bf16, and the row's sum (of the f32 values).
template <NumeratorOut kOut>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void softmax_numerator_rows(
    float* x, uint16_t* y_bf16, float* sums, int64_t c_len, int64_t r0, int64_t r1) {
  const int64_t full = c_len / 16 * 16;
  const __mmask16 tm = tail_mask(c_len - full);
  for (int64_t r = r0; r < r1; ++r) {
    float* xr = x + r * c_len;
    uint16_t* yr = kOut == NumeratorOut::kF32 ? nullptr : y_bf16 + r * c_len;
    const __m512 vmx = _mm512_set1_ps(row_max_avx512(xr, full, tm));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t c = 0; c < full; c += 16) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmx));
      store_numerators<kOut>(xr, yr, c, 0xFFFF, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tm) {
      const __m512 e = exp16_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, xr + full), vmx));
      store_numerators<kOut>(xr, yr, full, tm, e);
      sum = _mm512_mask_add_ps(sum, tm, sum, e);
    }
    sums[r] = hsum16(sum);
  }
}

// Each instantiation behind its own entry, so that only the native one is reached on a CPU with
// AVX512-BF16 (the template's target names it for the intrinsic; the others use none of it).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void softmax_numerator_rows_native_bf16(
    float* x, uint16_t* y, float* sums, int64_t c_len, int64_t r0, int64_t r1) {
  softmax_numerator_rows<NumeratorOut::kBf16Native>(x, y, sums, c_len, r0, r1);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void softmax_numerator_rows_avx512(
    float* x, uint16_t* y, float* sums, int64_t c_len, int64_t r0, int64_t r1) {
  if (y == nullptr) return softmax_numerator_rows<NumeratorOut::kF32>(x, y, sums, c_len, r0, r1);
  softmax_numerator_rows<NumeratorOut::kBf16>(x, y, sums, c_len, r0, r1);
}

void softmax_numerator_rows_scalar(float* x, uint16_t* y_bf16, float* sums, int64_t c_len, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float* xr = x + r * c_len;
    float mx = -std::numeric_limits<float>::infinity();
    bool nan = false;
    for (int64_t c = 0; c < c_len; ++c) {
      nan |= std::isnan(xr[c]);
      mx = xr[c] > mx ? xr[c] : mx;
    }
    if (nan) mx = std::numeric_limits<float>::quiet_NaN();
    float sum = 0.0f;
    for (int64_t c = 0; c < c_len; ++c) {
      const float e = std::exp(xr[c] - mx);
      sum += e;
      if (y_bf16) {
        y_bf16[r * c_len + c] = float_to_bf16(e);
      } else {
        xr[c] = e;
      }
    }
    sums[r] = sum;
  }
}

// Rows narrower than a vector (TSA's and the decoder's 4 points per head): one exp16 per row
// would waste most lanes and pay a horizontal max and sum per row, so the rows are shifted by
// their max in scalar code, exponentiated as one flat array, then normalized row by row.
__attribute__((target("avx512f"))) void softmax_narrow_rows_avx512(const float* x, float* y, int64_t c_len,
                                                                    int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * c_len;
    float* yr = y + r * c_len;
    float mx = xr[0];
    bool nan = false;
    for (int64_t c = 0; c < c_len; ++c) {
      nan |= std::isnan(xr[c]);
      mx = xr[c] > mx ? xr[c] : mx;
    }
    if (nan) mx = std::numeric_limits<float>::quiet_NaN();
    for (int64_t c = 0; c < c_len; ++c) yr[c] = xr[c] - mx;
  }
  float* flat = y + r0 * c_len;
  const int64_t n = (r1 - r0) * c_len, full = n / 16 * 16;
  for (int64_t i = 0; i < full; i += 16) _mm512_storeu_ps(flat + i, exp16(_mm512_loadu_ps(flat + i)));
  if (const __mmask16 tm = tail_mask(n - full)) {
    _mm512_mask_storeu_ps(flat + full, tm, exp16(_mm512_maskz_loadu_ps(tm, flat + full)));
  }
  for (int64_t r = r0; r < r1; ++r) {
    float* yr = y + r * c_len;
    float sum = 0.0f;
    for (int64_t c = 0; c < c_len; ++c) sum += yr[c];
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < c_len; ++c) yr[c] *= inv;
  }
}

// Rows of 2, 4 or 8 (TSA's and the decoder's 4 points per head, SCA's 8 in tiny), 16 / c_len of
// them to a vector: every step in lanes, where softmax_narrow_rows_avx512 finds each row's max and
// sum in scalar loops (base's TSA softmax, [640000, 4]: see docs/PERF.md). The bits are that
// kernel's: the max is exact in any order, x - max and exp16 are lane-wise, each row's sum is
// ((e0 + e1) + e2) + ... in column order (element k of every row broadcast across its row's lanes
// by a permute), and 1 / sum is the one correctly rounded division; a row with a NaN takes that
// kernel's quiet-NaN max, so even the NaNs' bits agree. Rows past the last full vector go to
// softmax_narrow_rows_avx512.
__attribute__((target("avx512f"))) void softmax_pow2_rows_avx512(const float* x, float* y, int64_t c_len, int64_t r0,
                                                                  int64_t r1) {
  const int64_t per = 16 / c_len, full = r0 + (r1 - r0) / per * per;
  __m512i column[8];  // column[k]: lane i reads element k of its own row
  for (int64_t k = 0; k < c_len; ++k) {
    alignas(64) int32_t idx[16];
    for (int i = 0; i < 16; ++i) idx[i] = static_cast<int32_t>(i / c_len * c_len + k);
    column[k] = _mm512_load_si512(idx);
  }
  const __m512 one = _mm512_set1_ps(1.0f), nan = _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN());
  // The maskz spellings with a full mask: GCC 12 flags the plain forms' undefined pass-through.
  for (int64_t r = r0; r < full; r += per) {
    const __m512 v = _mm512_loadu_ps(x + r * c_len);
    __m512 mx = _mm512_maskz_permutexvar_ps(0xFFFF, column[0], v);
    for (int64_t k = 1; k < c_len; ++k) mx = max16(_mm512_maskz_permutexvar_ps(0xFFFF, column[k], v), mx);
    // NaN anywhere poisons its row, as PyTorch's softmax does: the max becomes the one-row kernel's
    // quiet NaN, so every lane's NaN is the bits it gives (the max above skips a NaN).
    if (const __mmask16 nans = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
      __mmask16 rows = 0;
      for (int64_t j = 0; j < per; ++j) {
        const auto lanes = static_cast<__mmask16>(((1u << c_len) - 1u) << (j * c_len));
        if (nans & lanes) rows |= lanes;
      }
      mx = _mm512_mask_mov_ps(mx, rows, nan);
    }
    const __m512 e = exp16(_mm512_sub_ps(v, mx));
    __m512 sum = _mm512_maskz_permutexvar_ps(0xFFFF, column[0], e);
    for (int64_t k = 1; k < c_len; ++k) sum = _mm512_add_ps(sum, _mm512_maskz_permutexvar_ps(0xFFFF, column[k], e));
    _mm512_storeu_ps(y + r * c_len, _mm512_mul_ps(e, _mm512_div_ps(one, sum)));
  }
  if (full < r1) softmax_narrow_rows_avx512(x, y, c_len, full, r1);
}

// Elementwise map over a flat range, split across the pool in 16K-element chunks.
template <typename Fn>
void map_flat(ThreadPool* pool, int64_t n, const Fn& fn) {
  for_chunks(pool, n, int64_t{1} << 14, fn);
}

// ---- add / mul with broadcasting of b ----

// a's shape as runs of merged dims, outermost first, each with b's element stride along it:
// 0 where b broadcasts, b's contiguous stride where it follows a. a's unit dims are dropped
// (b's extent there is 1 too), and neighbouring dims of one kind merge, so [6, hw, C] + [6, 1, C]
// becomes {6: C, hw: 0, C: 1} and [HW, C] * [HW, 1] becomes {HW: 1, C: 0}.
// Inline (Shape): add and mul run on replayed frames, which must not allocate.
struct BroadcastRuns {
  Shape size, b_stride;
};

BroadcastRuns broadcast_runs(const Tensor& a, const Tensor& b) {
  BroadcastRuns r;
  int64_t b_contig = 1;  // b's contiguous stride at dim d, built from the innermost dim out
  Shape bs(static_cast<size_t>(a.dim()));
  for (int64_t d = a.dim() - 1; d >= 0; --d) {
    bs[static_cast<size_t>(d)] = b.size(d) == 1 ? 0 : b_contig;
    b_contig *= b.size(d);
  }
  for (int64_t d = 0; d < a.dim(); ++d) {
    const int64_t n = a.size(d), st = bs[static_cast<size_t>(d)];
    if (n == 1) continue;
    if (!r.size.empty() && ((st == 0 && r.b_stride.back() == 0) || (st != 0 && r.b_stride.back() == st * n))) {
      r.size.back() *= n;
      r.b_stride.back() = st;
      continue;
    }
    r.size.push_back(n);
    r.b_stride.push_back(st);
  }
  if (r.size.empty()) {  // a holds one element
    r.size.push_back(1);
    r.b_stride.push_back(0);
  }
  return r;
}

// y's n elements from flat index i: f(j) for j < n, stored as f32, or rounded to bf16 (core/half.h's
// float_to_bf16) 256 at a time from the stack (a replayed plan allocates nothing).
template <typename F>
inline void store_run(float* yp, uint16_t* yh, int64_t i, int64_t n, const F& f) {
  if (yp != nullptr) {
    for (int64_t j = 0; j < n; ++j) yp[i + j] = f(j);
    return;
  }
  constexpr int64_t kBlock = 256;
  float sums[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t m = std::min(kBlock, n - j0);
    for (int64_t j = 0; j < m; ++j) sums[j] = f(j0 + j);
    float_to_bf16_n(sums, yh + i + j0, static_cast<size_t>(m));
  }
}

// bf16_ok: y may be bf16 (add's bf16 output: each f32 result rounded once).
template <typename Op>
void binary(const char* op, const Tensor& a, const Tensor& b, Tensor& y, ThreadPool* pool, Op fn, bool bf16_ok) {
  expect_rows(op, a, "input a");
  const bool bf16_out = bf16_ok && y.defined() && y.dtype() == DType::kBF16;
  expect_host_shape(op, y, "output y", bf16_out ? DType::kBF16 : DType::kF32, a.shape());
  const float* ap = a.data<float>();
  float* yp = bf16_out ? nullptr : y.data<float>();
  auto* yh = bf16_out ? static_cast<uint16_t*>(y.raw_data()) : nullptr;
  if (b.defined() && b.shape() == a.shape()) {
    expect_f32_shape(op, b, "input b", a.shape());
    // In place only in f32: across dtypes any overlap would read results back as inputs.
    expect_no_partial_overlap(op, a, y, !bf16_out);
    expect_no_partial_overlap(op, b, y, !bf16_out);
    const float* bp = b.data<float>();
    map_flat(pool, a.numel(), [&](int64_t s, int64_t e) {
      store_run(yp, yh, s, e - s, [&](int64_t j) { return fn(ap[s + j], bp[s + j]); });
    });
    return;
  }
  bool ok = b.defined() && b.dtype() == DType::kF32 && b.device() == Device::kCpu && b.is_contiguous() &&
            b.dim() == a.dim();
  for (int64_t d = 0; ok && d < a.dim(); ++d) ok = b.size(d) == a.size(d) || b.size(d) == 1;
  if (!ok) bad_tensor(op, b, "input b", "contiguous host f32 of a's rank, each extent " + shape_str(a.shape()) + "'s or 1");
  expect_no_partial_overlap(op, a, y, !bf16_out);
  expect_no_partial_overlap(op, b, y, /*may_alias=*/false);
  if (a.numel() == 0) return;
  const BroadcastRuns runs = broadcast_runs(a, b);
  const auto nd = runs.size.size();
  const int64_t inner = runs.size.back(), inner_st = runs.b_stride.back();
  const float* bp = b.data<float>();
  // Each chunk [s, e) of the flat index walks rows of the innermost run, carrying b's offset in
  // per-run counters that are set up once per chunk.
  map_flat(pool, a.numel(), [&](int64_t s, int64_t e) {
    Shape ctr(nd, 0);
    int64_t row = s / inner, col = s % inner, boff = 0;
    for (size_t k = nd - 1; k-- > 0;) {
      ctr[k] = row % runs.size[k];
      row /= runs.size[k];
      boff += ctr[k] * runs.b_stride[k];
    }
    for (int64_t i = s; i < e;) {
      const int64_t n = std::min(inner - col, e - i);
      const float* ar = ap + i;
      if (inner_st == 0) {
        const float v = bp[boff];
        store_run(yp, yh, i, n, [&](int64_t j) { return fn(ar[j], v); });
      } else {
        const float* br = bp + boff + col;
        store_run(yp, yh, i, n, [&](int64_t j) { return fn(ar[j], br[j]); });
      }
      i += n;
      col = 0;
      for (size_t k = nd - 1; k-- > 0;) {  // next row: bump the counters, innermost outer run first
        boff += runs.b_stride[k];
        if (++ctr[k] < runs.size[k]) break;
        boff -= runs.size[k] * runs.b_stride[k];
        ctr[k] = 0;
      }
    }
  });
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y, ThreadPool* pool,
                const Tensor* residual) {
  const char* op = "layer_norm";
  const int64_t c_len = expect_rows(op, x, "input x");
  expect_f32_shape(op, gamma, "gamma", {c_len});
  expect_f32_shape(op, beta, "beta", {c_len});
  expect_f32_shape(op, y, "output y", x.shape());
  expect_no_partial_overlap(op, x, y);
  if (residual) {
    expect_f32_shape(op, *residual, "residual", x.shape());
    expect_no_partial_overlap(op, *residual, y);
  }
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / c_len;
  const float* xp = x.data<float>();
  const float* rp = residual ? residual->data<float>() : nullptr;
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  float* yp = y.data<float>();
  // Chunks of about 16 KiB: with a residual, the sums are made into y and normalized in place
  // while they are in L1 (the row kernels read a row fully before writing it).
  for_chunks(pool, rows, std::max<int64_t>(1, 4096 / c_len),
             [&](int64_t r0, int64_t r1) { layer_norm_rows(xp, rp, g, b, eps, yp, c_len, r0, r1); });
}

void layer_norm_rows(const float* x, const float* residual, const float* gamma, const float* beta, float eps, float* y,
                     int64_t c_len, int64_t r0, int64_t r1) {
  const float* src = x;
  if (residual) {
    for (int64_t i = r0 * c_len; i < r1 * c_len; ++i) y[i] = x[i] + residual[i];
    src = y;
  }
  if (avx512::has_f()) {
    ln_rows_avx512(src, gamma, beta, eps, y, c_len, r0, r1);
  } else {
    ln_rows_scalar(src, gamma, beta, eps, y, c_len, r0, r1);
  }
}

void softmax_rows(const float* x, float* y, int64_t c_len, int64_t r0, int64_t r1) {
  const bool f = avx512::has_f();
  if (f && (c_len == 2 || c_len == 4 || c_len == 8)) {
    softmax_pow2_rows_avx512(x, y, c_len, r0, r1);
  } else if (f && c_len < 16) {
    softmax_narrow_rows_avx512(x, y, c_len, r0, r1);
  } else if (f) {
    softmax_rows_avx512(x, y, c_len, r0, r1);
  } else {
    softmax_rows_scalar(x, y, c_len, r0, r1);
  }
}

void softmax(const Tensor& x, Tensor& y, ThreadPool* pool) {
  const char* op = "softmax";
  const int64_t c_len = expect_rows(op, x, "input x");
  expect_f32_shape(op, y, "output y", x.shape());
  expect_no_partial_overlap(op, x, y);
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / c_len;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  for_chunks(pool, rows, std::max<int64_t>(1, 4096 / c_len),
           [&](int64_t r0, int64_t r1) { softmax_rows(xp, yp, c_len, r0, r1); });
}

void softmax_numerators(float* x, uint16_t* y_bf16, float* sums, int64_t c_len, int64_t r0, int64_t r1) {
  const bool bw = avx512::has_bw(), native_bf16 = avx512::has_bf16();
  if (native_bf16 && y_bf16 != nullptr) {
    softmax_numerator_rows_native_bf16(x, y_bf16, sums, c_len, r0, r1);
  } else if (bw) {
    softmax_numerator_rows_avx512(x, y_bf16, sums, c_len, r0, r1);
  } else {
    softmax_numerator_rows_scalar(x, y_bf16, sums, c_len, r0, r1);
  }
}

void relu(const Tensor& x, Tensor& y, ThreadPool* pool) {
  expect_rows("relu", x, "input x");
  expect_f32_shape("relu", y, "output y", x.shape());
  expect_no_partial_overlap("relu", x, y);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  map_flat(pool, x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = (xp[i] > 0.0f || std::isnan(xp[i])) ? xp[i] : 0.0f;
  });
}

namespace {

// Values in [b, e) whose exponent bits are all set (NaN or infinity): one integer test per value.
template <typename Word>
int64_t nonfinite_scalar(const Word* p, int64_t b, int64_t e) {
  constexpr Word kExp = sizeof(Word) == 4 ? Word(0x7f800000u) : Word(0x7f80u);
  int64_t c = 0;
  for (int64_t i = b; i < e; ++i) c += (p[i] & kExp) == kExp;
  return c;
}

// The same 64 bytes a step: the build targets baseline x86-64, whose auto-vectorized loop read the
// base frame's 95 MB of image features at 7 GB/s (13 ms), where memory gives 28.
template <typename Word>
__attribute__((target("avx512f,avx512bw"))) int64_t nonfinite_avx512(const Word* p, int64_t b, int64_t e) {
  constexpr bool kF32 = sizeof(Word) == 4;
  constexpr int64_t kStep = 64 / sizeof(Word);
  const __m512i exp = kF32 ? _mm512_set1_epi32(0x7f800000) : _mm512_set1_epi16(0x7f80);
  int64_t c = 0, i = b;
  for (; i + kStep <= e; i += kStep) {
    const __m512i v = _mm512_and_si512(_mm512_loadu_si512(p + i), exp);
    c += kF32 ? __builtin_popcount(_mm512_cmpeq_epi32_mask(v, exp))
              : __builtin_popcountll(_mm512_cmpeq_epi16_mask(v, exp));
  }
  return c + nonfinite_scalar(p, i, e);
}

template <typename Word>
int64_t nonfinite(const Word* p, int64_t b, int64_t e) {
  return avx512::has_bw() ? nonfinite_avx512(p, b, e) : nonfinite_scalar(p, b, e);
}

}  // namespace

void count_nonfinite(const Tensor& x, Tensor& out, ThreadPool* pool) {
  if (!x.defined() || (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16) || x.device() != Device::kCpu ||
      !x.is_contiguous()) {
    bad_tensor("count_nonfinite", x, "input x", "contiguous host f32 or bf16");
  }
  const int64_t groups = out.defined() && out.dim() == 1 ? out.size(0) : 0;
  if (!out.defined() || out.dtype() != DType::kI64 || !out.is_contiguous() || groups < 1 || x.numel() % groups != 0) {
    bad_tensor("count_nonfinite", out, "output", "i64 [G], G dividing the input's element count");
  }
  // The exponent bits all set is NaN or infinity, in either dtype.
  const int64_t per = x.numel() / groups;
  int64_t* counts = out.data<int64_t>();
  for (int64_t g = 0; g < groups; ++g) {
    std::atomic<int64_t> total{0};
    if (x.dtype() == DType::kF32) {
      const auto* p = static_cast<const uint32_t*>(x.raw_data()) + g * per;
      map_flat(pool, per, [&](int64_t b, int64_t e) { total += nonfinite(p, b, e); });
    } else {
      const auto* p = static_cast<const uint16_t*>(x.raw_data()) + g * per;
      map_flat(pool, per, [&](int64_t b, int64_t e) { total += nonfinite(p, b, e); });
    }
    counts[g] = total.load();
  }
}

void sigmoid(const Tensor& x, Tensor& y, ThreadPool* pool) {
  expect_rows("sigmoid", x, "input x");
  expect_f32_shape("sigmoid", y, "output y", x.shape());
  expect_no_partial_overlap("sigmoid", x, y);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  map_flat(pool, x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = sigmoid_scalar(xp[i]);
  });
}

void inverse_sigmoid(const Tensor& x, float eps, Tensor& y, ThreadPool* pool) {
  expect_rows("inverse_sigmoid", x, "input x");
  expect_f32_shape("inverse_sigmoid", y, "output y", x.shape());
  expect_no_partial_overlap("inverse_sigmoid", x, y);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  map_flat(pool, x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = inverse_sigmoid_scalar(xp[i], eps);
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& y, ThreadPool* pool) {
  binary("add", a, b, y, pool, [](float u, float v) { return u + v; }, /*bf16_ok=*/true);
}

void mul(const Tensor& a, const Tensor& b, Tensor& y, ThreadPool* pool) {
  binary("mul", a, b, y, pool, [](float u, float v) { return u * v; }, /*bf16_ok=*/false);
}

void zeros(Tensor& y, ThreadPool* pool) {
  if (!y.defined() || y.device() != Device::kCpu || !y.is_contiguous()) {
    bad_tensor("zeros", y, "output y", "a contiguous host tensor");
  }
  auto* p = static_cast<char*>(y.raw_data());
  const auto bytes = static_cast<int64_t>(y.nbytes());
  if (bytes == 0) return;
  constexpr int64_t kPiece = int64_t{1} << 18;  // 256 KiB per chunk
  for_chunks(pool, (bytes + kPiece - 1) / kPiece, 4, [&](int64_t k0, int64_t k1) {
    const int64_t b0 = k0 * kPiece, b1 = std::min(bytes, k1 * kPiece);
    std::memset(p + b0, 0, static_cast<size_t>(b1 - b0));
  });
}

void add_rows(const Tensor& a, const Tensor& row, Tensor& y, ThreadPool* pool) {
  const int64_t c_len = expect_rows("add_rows", a, "input a");
  expect_f32_shape("add_rows", row, "row", {c_len});
  const bool bf16_out = y.defined() && y.dtype() == DType::kBF16;
  expect_host_shape("add_rows", y, "output y", bf16_out ? DType::kBF16 : DType::kF32, a.shape());
  // In place only in f32: across dtypes any overlap would read sums back as inputs.
  expect_no_partial_overlap("add_rows", a, y, /*may_alias=*/!bf16_out);
  expect_no_partial_overlap("add_rows", row, y, /*may_alias=*/false);
  if (a.numel() == 0) return;
  const float* ap = a.data<float>();
  const float* rp = row.data<float>();
  float* yp = bf16_out ? nullptr : y.data<float>();
  auto* yh = bf16_out ? static_cast<uint16_t*>(y.raw_data()) : nullptr;
  for_chunks(pool, a.numel() / c_len, std::max<int64_t>(1, 16384 / c_len), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* ar = ap + r * c_len;
      store_run(yp, yh, r * c_len, c_len, [&](int64_t c) { return ar[c] + rp[c]; });
    }
  });
}

namespace {

// One row of feat_flatten: (a + cam) + lvl over C columns, 16 at a time, rounded as float_to_bf16.
template <bool BF16>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void flatten_row_avx512(const float* a, const float* cam,
                                                                              const float* lvl, void* y,
                                                                              int64_t c_len) {
  for (int64_t c = 0; c < c_len; c += 16) {
    const __mmask16 m = static_cast<__mmask16>(c_len - c >= 16 ? 0xFFFF : (1u << (c_len - c)) - 1u);
    __m512 v = _mm512_maskz_loadu_ps(m, a + c);
    if (cam) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, cam + c));
    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, lvl + c));
    if constexpr (BF16) {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + c, m, float_to_bf16_x16(v));
    } else {
      _mm512_mask_storeu_ps(static_cast<float*>(y) + c, m, v);
    }
  }
}

template <bool BF16>
void flatten_row_scalar(const float* a, const float* cam, const float* lvl, void* y, int64_t c_len) {
  for (int64_t c = 0; c < c_len; ++c) {
    float v = a[c];
    if (cam) v += cam[c];
    v += lvl[c];
    if constexpr (BF16) {
      static_cast<uint16_t*>(y)[c] = float_to_bf16(v);
    } else {
      static_cast<float*>(y)[c] = v;
    }
  }
}

}  // namespace

void feat_flatten(std::span<const Tensor> levels, std::span<const Tensor> level_rows, const Tensor* cams_embeds,
                  Tensor& y, ThreadPool* pool) {
  const char* op = "feat_flatten";
  if (levels.empty() || level_rows.size() != levels.size() || !levels[0].defined() || levels[0].dim() != 3) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(levels.size()) + " levels, " +
                                              std::to_string(level_rows.size()) + " level rows")
        .where(op)
        .expected("one or more levels [images, hw, C] and a row per level");
  }
  const int64_t images = levels[0].size(0), c_len = levels[0].size(2);
  constexpr size_t kMaxLevels = 8;  // starts on the stack: a replayed plan allocates nothing
  if (levels.size() > kMaxLevels) {
    throw Error(ErrorKind::kInvalidInput, std::to_string(levels.size()) + " levels").where(op).expected("at most 8");
  }
  int64_t start[kMaxLevels + 1] = {0};
  for (size_t l = 0; l < levels.size(); ++l) {
    const Tensor& f = levels[l];
    const int64_t hw = f.defined() && f.dim() == 3 ? f.size(1) : 0;
    expect_f32_shape(op, f, "level", {images, hw, c_len});
    expect_f32_shape(op, level_rows[l], "level_embeds row", {c_len});
    start[l + 1] = start[l] + hw;
  }
  const int64_t total = start[levels.size()];
  int64_t cams = 0;
  if (cams_embeds) {
    cams = cams_embeds->defined() && cams_embeds->dim() == 2 ? cams_embeds->size(0) : 0;
    if (cams < 1 || images % cams != 0) {
      bad_tensor(op, *cams_embeds, "cams_embeds", "f32 [cams, " + std::to_string(c_len) + "], cams dividing " +
                                                      std::to_string(images) + " images");
    }
    expect_f32_shape(op, *cams_embeds, "cams_embeds", {cams, c_len});
  }
  const bool bf16_out = y.defined() && y.dtype() == DType::kBF16;
  expect_host_shape(op, y, "output y", bf16_out ? DType::kBF16 : DType::kF32, {images, total, c_len});
  for (size_t l = 0; l < levels.size(); ++l) {
    if (overlaps(levels[l], y) || overlaps(level_rows[l], y)) {
      bad_tensor(op, y, "output y", "memory apart from the inputs");
    }
  }
  if (cams_embeds && overlaps(*cams_embeds, y)) bad_tensor(op, y, "output y", "memory apart from the inputs");
  if (y.numel() == 0) return;
  const bool vec = avx512::has_bw();
  auto* row_fn = bf16_out ? (vec ? &flatten_row_avx512<true> : &flatten_row_scalar<true>)
                          : (vec ? &flatten_row_avx512<false> : &flatten_row_scalar<false>);
  const size_t es = bf16_out ? 2 : 4;
  auto* yp = static_cast<char*>(y.raw_data());
  const float* cp = cams_embeds ? cams_embeds->data<float>() : nullptr;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, c_len));
  for_chunks(pool, images * total, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t image = r / total, j = r % total;
      size_t l = 0;
      while (j >= start[l + 1]) ++l;
      const int64_t hw = start[l + 1] - start[l];
      const float* a = levels[l].data<float>() + (image * hw + (j - start[l])) * c_len;
      const float* cam = cp ? cp + (image % cams) * c_len : nullptr;
      row_fn(a, cam, level_rows[l].data<float>(), yp + static_cast<size_t>(r * c_len) * es, c_len);
    }
  });
}

}  // namespace bev::cpu
