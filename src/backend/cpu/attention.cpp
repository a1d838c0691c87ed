#include "backend/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/attention_amx.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/plan_cache.h"
#include "core/half.h"

namespace bev::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Scores of one block for all heads, f32. Measured on the AMX Xeon (tiny's decoder, 8 heads, 900
// queries and keys, 2 threads, bf16, B = 1 and 3): 256 KiB 18.8 ms, 1 MiB 11.3-11.8, 2 MiB
// 12.1-13.9, 4 MiB 13.8, 32 MiB (one block) 12.4 for the two cases together.
constexpr int64_t kBlockBytes = int64_t{1} << 20;

// One sample's src [L, C] -> for each block of `block` rows from l0 (n rows, the last block
// shorter): [heads][n][hd] at element l0 * C of dst, in dst's dtype.
void pack_heads(const float* src, void* dst, bool bf16, int64_t len, int64_t c, int heads, int64_t block,
                ThreadPool* pool) {
  const int64_t hd = c / heads;
  auto rows = [&](int64_t r0, int64_t r1) {
    for (int64_t l = r0; l < r1; ++l) {
      const int64_t l0 = l / block * block, n = std::min(block, len - l0);
      const int64_t base = l0 * c + (l - l0) * hd;
      for (int h = 0; h < heads; ++h) {
        const float* s = src + l * c + h * hd;
        const int64_t at = base + h * n * hd;
        if (bf16) {
          float_to_bf16_n(s, static_cast<uint16_t*>(dst) + at, static_cast<size_t>(hd));
        } else {
          std::memcpy(static_cast<float*>(dst) + at, s, static_cast<size_t>(hd) * 4);
        }
      }
    }
  };
  if (pool == nullptr || pool->size() == 1) return rows(0, len);
  pool->parallel_for(len, std::max<int64_t>(1, 8192 / c), rows);
}

// One sample's shape: a batch runs its samples one after the other on the same plan.
struct Key {
  int64_t q_len, k_len, c;
  int heads;
  Precision precision;
  float scale;
  auto tie() const { return std::tie(q_len, k_len, c, heads, precision, scale); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// The two products for blocks of one row count (shared by the threads: primitives are
// immutable, and a thread's call runs on that thread alone inside the pool's parallel region).
struct BlockPrims {
  int64_t rows = 0;
  dnnl::matmul::primitive_desc scores_pd, context_pd;
  dnnl::matmul scores, context;
};

// One thread's scratch: a block's f32 scores, probabilities (bf16 only), context and softmax
// denominators, and per row count the products' scratchpads and argument handles (unbound,
// pointed at the buffers per block).
struct Lane {
  dnnl::memory s, p, ctx;
  std::vector<float> sums;  // [heads, rows]
  struct Args {
    dnnl::memory scores_pad, context_pad;
    dnnl::memory q, s, p, ctx;
  };
  std::vector<Args> args;  // one per BlockPrims
};

struct Plan {
  int64_t block = 0;                // rows of every block but the last
  std::vector<BlockPrims> prims;    // [full] or [full, last]
  dnnl::memory qp, kp, vp;          // one sample's packed q, k, v (compute dtype)
  // One sample's k^T and v in the layouts the products asked for (format any), reordered once per
  // sample: given plain layouts, oneDNN's AMX kernel repacked them inside every block's call.
  dnnl::reorder k_reorder, v_reorder;
  dnnl::memory k_plain, v_plain;    // unbound: one sample of kp, vp
  dnnl::memory k_packed, v_packed;  // owned
  std::vector<Lane> lanes;          // one per pool thread, made on first use
  std::mutex mu;
};

dnnl::memory buffer(int64_t elements, dt type) { return dnnl::memory({{elements}, type, tag::x}, engine()); }

struct Descs {
  dnnl::memory::desc kt_plain, v_plain;  // k [h, K, hd] viewed as k^T [h, hd, K]; v [h, K, hd]
};

Descs plain_descs(const Key& key) {
  const int64_t h = key.heads, hd = key.c / key.heads, kl = key.k_len;
  const dt cdt = key.precision == Precision::kBF16 ? dt::bf16 : dt::f32;
  return {dnnl::memory::desc({h, hd, kl}, cdt, dnnl::memory::dims{kl * hd, 1, hd}),
          dnnl::memory::desc({h, kl, hd}, cdt, tag::abc)};
}

// `kt_md`, `v_md`: format any for the first row count; then the layouts it chose, so that every
// row count reads the same packed k^T and v.
BlockPrims make_prims(const Key& key, int64_t rows, const dnnl::memory::desc& kt_md, const dnnl::memory::desc& v_md) {
  const int64_t h = key.heads, hd = key.c / key.heads, kl = key.k_len;
  const dt cdt = key.precision == Precision::kBF16 ? dt::bf16 : dt::f32;
  BlockPrims b;
  b.rows = rows;
  const dnnl::memory::desc q_md({h, rows, hd}, cdt, tag::abc);
  const dnnl::memory::desc s_md({h, rows, kl}, dt::f32, tag::abc);
  const dnnl::memory::desc p_md({h, rows, kl}, cdt, tag::abc);
  const dnnl::memory::desc ctx_md({h, rows, hd}, dt::f32, tag::abc);
  dnnl::primitive_attr scaled;
  if (key.scale != 1.0f) scaled.set_output_scales(0, {key.scale});
  scaled.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::primitive_attr plain;
  plain.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  b.scores_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(q_md, kt_md, s_md), scaled, engine());
  b.context_pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p_md, v_md, ctx_md), plain, engine());
  const auto& spd = b.scores_pd;
  const auto& cpd = b.context_pd;
  b.scores = dnnl::matmul(spd);
  b.context = dnnl::matmul(cpd);
  return b;
}

std::unique_ptr<Plan> make_plan(const Key& key) {
  auto p = std::make_unique<Plan>();
  p->block = attention_block_rows(key.q_len, key.k_len, key.heads);
  const int64_t last = key.q_len - (key.q_len - 1) / p->block * p->block;
  const dt cdt = key.precision == Precision::kBF16 ? dt::bf16 : dt::f32;
  const int64_t h = key.heads, hd = key.c / key.heads, kl = key.k_len;
  p->prims.push_back(make_prims(key, p->block, dnnl::memory::desc({h, hd, kl}, cdt, tag::any),
                                dnnl::memory::desc({h, kl, hd}, cdt, tag::any)));
  const dnnl::memory::desc kt_md = p->prims[0].scores_pd.weights_desc();
  const dnnl::memory::desc v_md = p->prims[0].context_pd.weights_desc();
  if (last != p->block) p->prims.push_back(make_prims(key, last, kt_md, v_md));
  const Descs plain = plain_descs(key);
  p->k_plain = unbound(plain.kt_plain);
  p->v_plain = unbound(plain.v_plain);
  p->k_packed = dnnl::memory(kt_md, engine());
  p->v_packed = dnnl::memory(v_md, engine());
  p->k_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain.kt_plain, engine(), kt_md));
  p->v_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), plain.v_plain, engine(), v_md));
  p->qp = buffer(key.q_len * key.c, cdt);
  p->kp = buffer(key.k_len * key.c, cdt);
  p->vp = buffer(key.k_len * key.c, cdt);
  return p;
}

Lane make_lane(const Key& key, const Plan& plan) {
  const bool bf16 = key.precision == Precision::kBF16;
  Lane l;
  l.s = buffer(key.heads * plan.block * key.k_len, dt::f32);
  if (bf16) l.p = buffer(key.heads * plan.block * key.k_len, dt::bf16);
  l.ctx = buffer(plan.block * key.c, dt::f32);
  l.sums.resize(static_cast<size_t>(key.heads * plan.block));
  for (const BlockPrims& b : plan.prims) {
    Lane::Args a;
    a.scores_pad = dnnl::memory(b.scores_pd.scratchpad_desc(), engine());
    a.context_pad = dnnl::memory(b.context_pd.scratchpad_desc(), engine());
    a.q = unbound(b.scores_pd.src_desc());
    a.s = unbound(b.scores_pd.dst_desc());
    a.p = unbound(b.context_pd.src_desc());
    a.ctx = unbound(b.context_pd.dst_desc());
    l.args.push_back(std::move(a));
  }
  return l;
}

PlanCache<Key, Plan>& plans() {
  static PlanCache<Key, Plan> cache;
  return cache;
}

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("cpu::attention").expected(expected);
}

}  // namespace

// Balanced: every block holds the same rows but the last, which is at most a few rows short.
int64_t attention_block_rows(int64_t q_len, int64_t k_len, int heads) {
  const int64_t at_most = std::clamp<int64_t>(kBlockBytes / (heads * k_len * 4), 1, q_len);
  const int64_t nblocks = (q_len + at_most - 1) / at_most;
  return (q_len + nblocks - 1) / nblocks;
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads, float scale, Tensor& y,
               Precision precision, ThreadPool* pool) {
  const char* op = "cpu::attention";
  expect_f32_contiguous(op, "q", q);
  expect_f32_contiguous(op, "k", k);
  expect_f32_contiguous(op, "v", v);
  expect_f32_contiguous(op, "y", y);
  if (q.dim() != 3 || q.numel() == 0) invalid("q is " + q.describe(), "f32[B, Q, C], non-empty");
  const int64_t batch = q.size(0), q_len = q.size(1), c = q.size(2);
  if (heads < 1 || c % heads != 0) {
    invalid(std::to_string(heads) + " heads for " + std::to_string(c) + " channels", "C a multiple of heads >= 1");
  }
  if (k.dim() != 3 || k.size(0) != batch || k.size(2) != c || k.size(1) < 1) {
    invalid("k is " + k.describe() + " for q " + q.describe(), "f32[" + std::to_string(batch) + ", K, " + std::to_string(c) + "]");
  }
  if (v.shape() != k.shape()) invalid("v is " + v.describe() + " for k " + k.describe(), "v shaped as k");
  if (y.shape() != q.shape()) invalid("y is " + y.describe(), "f32" + shape_str(q.shape()));
  if (overlaps(y, q) || overlaps(y, k) || overlaps(y, v)) invalid("y overlaps an input", "disjoint tensors");

  const Precision arithmetic = precision == Precision::kBF16 ? Precision::kBF16 : Precision::kF32;
  if (arithmetic == Precision::kBF16 && attention_amx_applies(c, heads, scale)) {
    return attention_amx(q, k, v, heads, scale, y, pool);
  }
  const Key key{q_len, k.size(1), c, heads, arithmetic, scale};
  Plan* plan = &plans().get(key, [&] {
    const OneThreadTeam one;  // its products run one per participant: made for one thread
    return make_plan(key);
  });
  std::lock_guard<std::mutex> lock(plan->mu);
  const int threads = pool == nullptr ? 1 : pool->size();
  while (static_cast<int>(plan->lanes.size()) < threads) plan->lanes.push_back(make_lane(key, *plan));
  const bool bf16 = arithmetic == Precision::kBF16;
  const int64_t k_len = key.k_len, hd = c / heads, esz = bf16 ? 2 : 4;
  auto* qp = static_cast<char*>(plan->qp.get_data_handle());
  auto* kp = static_cast<char*>(plan->kp.get_data_handle());
  auto* vp = static_cast<char*>(plan->vp.get_data_handle());
  float* yp = y.data<float>();
  const int64_t nblocks = (q_len + plan->block - 1) / plan->block;

  // Each thread runs whole query blocks: scores, softmax and context of a block stay in its
  // cache, and the small products (M = block rows, K or N = hd) run one call per block on that
  // thread alone (oneDNN's OpenMP runs a primitive called inside the pool's OpenMP region on its
  // caller: the CPU backend's pool is an OpenMP one). Splitting each product over the threads
  // instead cost a fork and join per product and per softmax, three times a block (decoder
  // self-attention, tiny: see PERF.md).
  auto blocks = [&](int64_t b, int64_t blk0, int64_t blk1, int lane) {
    Lane& l = plan->lanes[static_cast<size_t>(lane)];
    auto* s = static_cast<float*>(l.s.get_data_handle());
    void* p = bf16 ? l.p.get_data_handle() : static_cast<void*>(s);
    auto* ctx = static_cast<float*>(l.ctx.get_data_handle());
    float* sums = l.sums.data();
    dnnl::stream& st = stream();
    for (int64_t blk = blk0; blk < blk1; ++blk) {
      const int64_t q0 = blk * plan->block, rows = std::min(plan->block, q_len - q0);
      const size_t which = rows == plan->block ? 0 : 1;
      const BlockPrims& m = plan->prims[which];
      Lane::Args& a = l.args[which];
      bind(a.q, qp + q0 * c * esz);
      bind(a.s, s);
      execute(m.scores, st,
              {{DNNL_ARG_SRC, a.q.get()}, {DNNL_ARG_WEIGHTS, plan->k_packed.get()}, {DNNL_ARG_DST, a.s.get()},
               {DNNL_ARG_SCRATCHPAD, a.scores_pad.get()}});
      st.wait();
      // exp(s - max) (in place, or rounded to bf16 for the second product) and the row sums.
      softmax_numerators(s, bf16 ? static_cast<uint16_t*>(p) : nullptr, sums, k_len, 0, heads * rows);
      bind(a.p, p);
      bind(a.ctx, ctx);
      execute(m.context, st,
              {{DNNL_ARG_SRC, a.p.get()}, {DNNL_ARG_WEIGHTS, plan->v_packed.get()}, {DNNL_ARG_DST, a.ctx.get()},
               {DNNL_ARG_SCRATCHPAD, a.context_pad.get()}});
      st.wait();
      // y[b, q0 + i, h * hd + d] = ctx[h, i, d] / sum[h, i]: softmax's division, on hd values
      // instead of K (as PyTorch, by the reciprocal).
      float* out = yp + (b * q_len + q0) * c;
      for (int64_t i = 0; i < rows; ++i) {
        for (int h = 0; h < heads; ++h) {
          const float inv = 1.0f / sums[h * rows + i];
          const float* from = ctx + (h * rows + i) * hd;
          float* to = out + i * c + h * hd;
          for (int64_t d = 0; d < hd; ++d) to[d] = from[d] * inv;
        }
      }
    }
  };

  dnnl::stream& st = stream();
  for (int64_t b = 0; b < batch; ++b) {
    pack_heads(q.data<float>() + b * q_len * c, qp, bf16, q_len, c, heads, plan->block, pool);
    pack_heads(k.data<float>() + b * k_len * c, kp, bf16, k_len, c, heads, k_len, pool);
    pack_heads(v.data<float>() + b * k_len * c, vp, bf16, k_len, c, heads, k_len, pool);
    bind(plan->k_plain, kp);
    bind(plan->v_plain, vp);
    execute_reorder(plan->k_reorder, st, plan->k_plain, plan->k_packed);
    execute_reorder(plan->v_reorder, st, plan->v_plain, plan->v_packed);
    st.wait();
    if (threads == 1 || nblocks == 1) {
      const OneThreadTeam one;  // as a participant runs them
      blocks(b, 0, nblocks, 0);
    } else {
      pool->parallel_for_indexed(nblocks, 1, [&](int64_t b0, int64_t b1, int lane) { blocks(b, b0, b1, lane); });
    }
  }
}

}  // namespace bev::cpu
