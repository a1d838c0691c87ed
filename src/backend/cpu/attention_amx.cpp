#include "backend/cpu/attention_amx.h"

#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/plan_cache.h"
#include "backend/cpu/vec_avx512.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

using namespace avx512;  // NOLINT(google-build-using-namespace): the kernel's vocabulary
using amx::compiler_barrier;
using amx::tile_state_granted;

constexpr int64_t kHd = 32;    // a head's channels: one tile row of 32 bf16 (64 bytes)
constexpr int64_t kTile = 16;  // a tile's rows: queries per unit, keys per score tile
constexpr int64_t kStep = 32;  // keys per step of the second product: a tile row of bf16 numerators
constexpr int64_t kTileElems = kTile * kHd;  // bf16 in one 16 x 64-byte tile
constexpr int64_t kChunk = 64;  // keys per chunk: four score tiles, two steps of the second product

struct Key {
  int64_t q_len, k_len, c;
  int heads;
  auto tie() const { return std::tie(q_len, k_len, c, heads); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// One thread's scratch for a unit (a head's 16 queries), all of it in L1: a chunk's scores and
// numerators, and per row the running max and sum as 16 lanes each.
struct Lane {
  alignas(64) float s[kTile * kChunk];
  alignas(64) uint16_t p[kTile * kChunk];
  alignas(64) float max[kTile * 16];
  alignas(64) float sum[kTile * 16];
  alignas(64) float ctx[kTile * kHd];
};

struct Plan {
  Key key{};
  int64_t q_tiles = 0, k_chunks = 0;
  Tensor q;   // bf16 [q_tiles * 16, C]: one sample's q, rows past Q zero
  Tensor kt;  // bf16 [heads][k_chunks * 4] tiles of k^T in pairs: [d / 2][key % 16][d % 2]; keys past K zero
  Tensor vt;  // bf16 [heads][k_chunks * 2 steps][2 halves] tiles of v in pairs: [key % 32 / 2][d % 16][key % 2]; keys past K zero
  std::vector<std::unique_ptr<Lane>> lanes;
  std::mutex mu;
};

std::unique_ptr<Plan> make_plan(const Key& key) {
  auto p = std::make_unique<Plan>();
  p->key = key;
  p->q_tiles = (key.q_len + kTile - 1) / kTile;
  p->k_chunks = (key.k_len + kChunk - 1) / kChunk;
  p->q = Tensor::zeros({p->q_tiles * kTile, key.c}, DType::kBF16);
  p->kt = Tensor::zeros({key.heads, p->k_chunks * (kChunk / kTile), kTileElems}, DType::kBF16);
  p->vt = Tensor::zeros({key.heads, p->k_chunks * (kChunk / kStep), 2, kTileElems}, DType::kBF16);
  return p;
}

// [a | b]. The mask spelling: GCC 12's plain insert trips -Wmaybe-uninitialized.
__attribute__((target("avx512f"))) inline __m512i join(__m256i a, __m256i b) {
  const __m512i zero = _mm512_setzero_si512();
  return _mm512_mask_inserti64x4(zero, 0xFF, _mm512_mask_inserti64x4(zero, 0xFF, zero, a, 0), b, 1);
}

// 16 floats rounded to bf16 (zeros when not real: a key past K).
__attribute__((target("avx512f,avx512bf16"))) inline __m256i bf16x16(const float* x, bool real) {
  return real ? reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x))) : _mm256_setzero_si256();
}

// Row pairs [r0, r1) of one sample: rows [2 r0, 2 r1) of q rounded to bf16 into plan.q, and the
// same keys into the k^T and v tiles. A key's 32 channels of a head make 16 bf16 pairs, which go
// down column key % 16 of its k^T tile (one scatter); two keys' channels interleave into a row of
// each v tile (one permute).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void pack_rows(const float* q, const float* k,
                                                                                const float* v, Plan& plan, int64_t r0,
                                                                                int64_t r1) {
  const Key& key = plan.key;
  const int64_t c = key.c;
  auto* qb = static_cast<uint16_t*>(plan.q.raw_data());
  auto* kt = static_cast<uint16_t*>(plan.kt.raw_data());
  auto* vt = static_cast<uint16_t*>(plan.vt.raw_data());
  const int64_t tiles_per_head = plan.k_chunks * (kChunk / kTile);
  const __m512i down_a_column = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                   _mm512_set1_epi32(kTile));
  // bf16 lanes [a0..a15 | b0..b15] -> [a0 b0 a1 b1 ...]
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(kInterleave);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 2 * r; j < std::min(2 * r + 2, key.q_len); ++j) {
      for (int64_t ch = 0; ch < c; ch += 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + j * c + ch), bf16x16(q + j * c + ch, true));
      }
    }
    const int64_t j = 2 * r;
    if (j >= key.k_len) continue;
    const bool second = j + 1 < key.k_len;
    for (int h = 0; h < key.heads; ++h) {
      for (int64_t t = 0; t < 2; ++t) {
        if (t == 1 && !second) break;
        const float* kr = k + (j + t) * c + h * kHd;
        const __m512i kpairs = join(bf16x16(kr, true), bf16x16(kr + 16, true));
        uint16_t* tile = kt + (h * tiles_per_head + (j + t) / kTile) * kTileElems + ((j + t) % kTile) * 2;
        _mm512_i32scatter_epi32(tile, down_a_column, kpairs, 4);
      }
      uint16_t* vstep = vt + ((h * plan.k_chunks * (kChunk / kStep) + j / kStep) * 2) * kTileElems + (j % kStep / 2) * kHd;
      for (int64_t half = 0; half < 2; ++half) {
        const float* v0 = v + j * c + h * kHd + half * 16;
        const __m512i two = join(bf16x16(v0, true), bf16x16(v0 + c, second));
        _mm512_storeu_si512(vstep + half * kTileElems, _mm512_permutexvar_epi16(pairs, two));
      }
    }
  }
}

// The scores of a chunk (keys [64 chunk, +64)) for the 16 queries in tile 0, into lane.s [16, 64]:
// k^T tiles in 1 and 2, scores in 3 and 4. Ready for vector code on return.
__attribute__((target("amx-tile,amx-bf16"))) inline void chunk_scores(const uint16_t* kt_chunk, float* s) {
  for (int64_t t = 0; t < kChunk / kTile; t += 2) {
    _tile_zero(3);
    _tile_zero(4);
    _tile_loadd(1, kt_chunk + t * kTileElems, 64);
    _tile_loadd(2, kt_chunk + (t + 1) * kTileElems, 64);
    _tile_dpbf16ps(3, 0, 1);
    _tile_dpbf16ps(4, 0, 2);
    _tile_stored(3, s + t * kTile, kChunk * 4);
    _tile_stored(4, s + (t + 1) * kTile, kChunk * 4);
  }
  compiler_barrier();
}

// Units [u0, u1) of one sample: unit u is head u / q_tiles, queries from (u % q_tiles) * 16.
// Two passes over the keys in chunks of 64, so that scores and numerators never leave L1 (whole
// rows of 900 scores went to L2 and back, which doubled the numerators' time): the first takes
// each row's max, the second recomputes the scores (the tile products cost little beside exp),
// makes the numerators with the final max, as softmax does, and multiplies them into v at once.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))) void run_units(
    const Plan& plan, Lane& lane, float scale, float* y, int64_t u0, int64_t u1) {
  const Key& key = plan.key;
  const int64_t c = key.c;
  const int64_t chunk_tiles = kChunk / kTile, chunk_steps = kChunk / kStep;
  const auto* qb = static_cast<const uint16_t*>(plan.q.raw_data());
  const auto* kt = static_cast<const uint16_t*>(plan.kt.raw_data());
  const auto* vt = static_cast<const uint16_t*>(plan.vt.raw_data());
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // Lanes of the last chunk that hold keys (the rest are zero keys: no max, no numerator).
  const int64_t last_keys = key.k_len - (plan.k_chunks - 1) * kChunk;
  __mmask16 last_masks[kChunk / 16], all_masks[kChunk / 16];
  for (int64_t v = 0; v < kChunk / 16; ++v) {
    last_masks[v] = first_lanes(last_keys - v * 16);
    all_masks[v] = 0xFFFF;
  }

  _tile_loadconfig(&amx::kFullTiles);
  compiler_barrier();  // the packed q, k and v (pack_rows) before any tile loads them
  for (int64_t u = u0; u < u1; ++u) {
    const int h = static_cast<int>(u / plan.q_tiles);
    const int64_t q0 = (u % plan.q_tiles) * kTile, rows = std::min(kTile, key.q_len - q0);
    const uint16_t* kt_h = kt + h * plan.k_chunks * chunk_tiles * kTileElems;
    const uint16_t* vt_h = vt + h * plan.k_chunks * chunk_steps * 2 * kTileElems;
    _tile_loadd(0, qb + q0 * c + h * kHd, c * 2);

    // Pass 1: each row's max, as 16 lanes. No NaN test (unlike softmax's row_max_avx512): a NaN
    // score makes its own numerator NaN, hence its row's sum and every output of the row, as
    // PyTorch's softmax poisons the row.
    for (int64_t r = 0; r < kTile; ++r) _mm512_store_ps(lane.max + r * 16, ninf);
    for (int64_t ch = 0; ch < plan.k_chunks; ++ch) {
      chunk_scores(kt_h + ch * chunk_tiles * kTileElems, lane.s);
      const __mmask16* masks = ch + 1 == plan.k_chunks ? last_masks : all_masks;
      for (int64_t r = 0; r < rows; ++r) {
        __m512 m = _mm512_load_ps(lane.max + r * 16);
        for (int64_t v = 0; v < kChunk / 16; ++v) {
          m = max16(_mm512_mask_loadu_ps(ninf, masks[v], lane.s + r * kChunk + v * 16), m);
        }
        _mm512_store_ps(lane.max + r * 16, m);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      _mm512_store_ps(lane.max + r * 16, _mm512_set1_ps(hmax16(_mm512_load_ps(lane.max + r * 16)) * scale));
      _mm512_store_ps(lane.sum + r * 16, _mm512_setzero_ps());
    }

    // Pass 2: numerators exp(scale s - scale max) rounded to bf16 (zero past the keys), their f32
    // sums, and the numerators by v's two channel halves (tiles 1, 2), 32 keys a step (tile 5),
    // accumulated in tiles 6 and 7. The rounding of s * scale inside the fused multiply-subtract
    // may leave the max's own exponent a hair above 0: exp16_bf16_grade clamps only from below.
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t ch = 0; ch < plan.k_chunks; ++ch) {
      chunk_scores(kt_h + ch * chunk_tiles * kTileElems, lane.s);
      const __mmask16* masks = ch + 1 == plan.k_chunks ? last_masks : all_masks;
      for (int64_t r = 0; r < rows; ++r) {
        const __m512 vmx = _mm512_load_ps(lane.max + r * 16);
        __m512 sum = _mm512_load_ps(lane.sum + r * 16);
        for (int64_t v = 0; v < kChunk / 16; ++v) {
          const __m512 e = _mm512_maskz_mov_ps(
              masks[v], exp16_bf16_grade(_mm512_fmsub_ps(_mm512_load_ps(lane.s + r * kChunk + v * 16), vscale, vmx)));
          _mm256_store_si256(reinterpret_cast<__m256i*>(lane.p + r * kChunk + v * 16),
                             reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e)));
          sum = _mm512_add_ps(sum, e);
        }
        _mm512_store_ps(lane.sum + r * 16, sum);
      }
      compiler_barrier();
      const uint16_t* vt_chunk = vt_h + ch * chunk_steps * 2 * kTileElems;
      for (int64_t step = 0; step < chunk_steps; ++step) {
        _tile_loadd(5, lane.p + step * kStep, kChunk * 2);
        _tile_loadd(1, vt_chunk + step * 2 * kTileElems, 64);
        _tile_loadd(2, vt_chunk + (step * 2 + 1) * kTileElems, 64);
        _tile_dpbf16ps(6, 5, 1);
        _tile_dpbf16ps(7, 5, 2);
      }
    }
    _tile_stored(6, lane.ctx, kHd * 4);
    _tile_stored(7, lane.ctx + kTile, kHd * 4);
    compiler_barrier();

    // softmax's division, on the 32 context values of each row.
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 inv = _mm512_set1_ps(1.0f / hsum16(_mm512_load_ps(lane.sum + r * 16)));
      float* out = y + (q0 + r) * c + h * kHd;
      _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_load_ps(lane.ctx + r * kHd), inv));
      _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_load_ps(lane.ctx + r * kHd + 16), inv));
    }
  }
  _tile_release();
}

PlanCache<Key, Plan>& plans() {
  static PlanCache<Key, Plan> cache;
  return cache;
}

}  // namespace

bool attention_amx_applies(int64_t c, int heads, float scale) {
  return heads >= 1 && c == heads * kHd && std::isfinite(scale) && scale > 0.0f && isa_has_amx() &&
         tile_state_granted();
}

void attention_amx(const Tensor& q, const Tensor& k, const Tensor& v, int heads, float scale, Tensor& y,
                   ThreadPool* pool) {
  const int64_t batch = q.size(0), q_len = q.size(1), c = q.size(2), k_len = k.size(1);
  const Key key{q_len, k_len, c, heads};
  Plan* plan = &plans().get(key, [&] { return make_plan(key); });
  std::lock_guard<std::mutex> lock(plan->mu);
  const int threads = pool == nullptr ? 1 : pool->size();
  while (static_cast<int>(plan->lanes.size()) < threads) plan->lanes.push_back(std::make_unique<Lane>());
  const int64_t units = heads * plan->q_tiles;
  for (int64_t b = 0; b < batch; ++b) {
    const float* kb = k.data<float>() + b * k_len * c;
    const float* vb = v.data<float>() + b * k_len * c;
    float* yb = y.data<float>() + b * q_len * c;
    const float* qs = q.data<float>() + b * q_len * c;
    const int64_t row_pairs = (std::max(q_len, k_len) + 1) / 2;
    if (threads == 1) {
      pack_rows(qs, kb, vb, *plan, 0, row_pairs);
      run_units(*plan, *plan->lanes[0], scale, yb, 0, units);
      continue;
    }
    pool->parallel_for(row_pairs, 32, [&](int64_t r0, int64_t r1) { pack_rows(qs, kb, vb, *plan, r0, r1); });
    // Units in order, so that a thread's run stays on one or two heads' k and v tiles.
    pool->parallel_for_indexed(units, 1, [&](int64_t u0, int64_t u1, int lane) {
      run_units(*plan, *plan->lanes[static_cast<size_t>(lane)], scale, yb, u0, u1);
    });
  }
}

}  // namespace bev::cpu
