#include "backend/cpu/select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/kernel_check.h"
#include "core/half.h"

namespace bev::cpu {
namespace {


void expect(const char* op, const Tensor& t, const char* what, DType dtype, const Shape& shape) {
  if (!t.defined() || t.dtype() != dtype || t.device() != Device::kCpu || t.shape() != shape || !t.is_contiguous()) {
    bad_tensor(op, t, what, std::string("contiguous host ") + dtype_name(dtype) + shape_str(shape));
  }
}

// Whether a copy may write `to` from `from`: the same dtype, or f32 rounded into bf16.
bool copies_into(DType from, DType to) { return from == to || (from == DType::kF32 && to == DType::kBF16); }

// n elements from src (dtype `from`) to dst (dtype `to`, copies_into(from, to)): moved as bytes, or
// rounded f32 -> bf16 to nearest even 16 lanes at a time.
void copy_elements(char* dst, DType to, const char* src, DType from, size_t n) {
  if (from == to) {
    std::memmove(dst, src, n * dtype_size(from));
  } else {
    float_to_bf16_n(reinterpret_cast<const float*>(src), reinterpret_cast<uint16_t*>(dst), n);
  }
}

bool is_contiguous_host(const Tensor& t) {
  return t.defined() && t.device() == Device::kCpu && t.is_contiguous() && t.dim() >= 1;
}

void expect_contiguous(const char* op, const Tensor& t, const char* what, const char* shape_desc) {
  if (!is_contiguous_host(t)) bad_tensor(op, t, what, std::string("contiguous host tensor ") + shape_desc);
}

// Row indices in [0, rows) or -1 (padding), checked before any write so a bad index leaves dst
// untouched.
const int64_t* checked_indices(const char* op, const Tensor& idx, int64_t count, int64_t rows) {
  expect(op, idx, "idx", DType::kI64, {count});
  const int64_t* ip = idx.data<int64_t>();
  for (int64_t m = 0; m < count; ++m) {
    if (ip[m] < -1 || ip[m] >= rows) {
      throw Error(ErrorKind::kInvalidInput, "idx[" + std::to_string(m) + "] = " + std::to_string(ip[m]) +
                                                " is out of range")
          .where(op)
          .expected("indices in [0, " + std::to_string(rows) + ") or -1 (padding)");
    }
  }
  return ip;
}

// Byte range [lo, hi) that a view can touch (strides are non-negative: Tensor::view_of checks).
std::pair<const char*, const char*> byte_span(const Tensor& t) {
  const auto* lo = static_cast<const char*>(t.raw_data());
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.strides()[static_cast<size_t>(d)];
  return {lo, lo + (last + 1) * static_cast<int64_t>(dtype_size(t.dtype()))};
}

// Dim indices (inline, like Shape: permute runs on replayed frames).
using Dims = SmallVector<int64_t, 8>;

// Calls fn(src_off, dst_off) for every index of the dims in `dims` (outermost first).
template <typename Fn>
void for_each_outer(const Dims& dims, const Shape& shape, const Shape& sst, const Shape& dst_st,
                    const Fn& fn) {
  for (int64_t d : dims) {
    if (shape[static_cast<size_t>(d)] == 0) return;
  }
  Dims ctr(dims.size(), 0);
  int64_t so = 0, dof = 0;
  while (true) {
    fn(so, dof);
    size_t i = dims.size();
    while (i > 0) {
      --i;
      const auto d = static_cast<size_t>(dims[i]);
      if (++ctr[i] < shape[d]) {
        so += sst[d];
        dof += dst_st[d];
        break;
      }
      so -= (shape[d] - 1) * sst[d];
      dof -= (shape[d] - 1) * dst_st[d];
      ctr[i] = 0;
      if (i == 0) return;
    }
    if (dims.empty()) return;
  }
}

template <typename T>
void strided_copy(const T* src, T* dst, const Shape& shape, const Shape& sst, ThreadPool* pool) {
  const int64_t r = static_cast<int64_t>(shape.size());
  const Shape dst_st = contiguous_strides(shape);
  const auto last = static_cast<size_t>(r - 1);
  Dims outer;  // walked outside the copied rows or blocks
  if (sst[last] == 1) {  // rows are contiguous on both sides
    for (int64_t d = 0; d < r - 1; ++d) outer.push_back(d);
    const size_t bytes = static_cast<size_t>(shape[last]) * sizeof(T);
    for_each_outer(outer, shape, sst, dst_st,
                   [&](int64_t so, int64_t dof) { std::memcpy(dst + dof, src + so, bytes); });
    return;
  }
  int64_t b = -1;  // the dim that is contiguous in src, if any: copy (b, last) in square blocks
  for (int64_t d = 0; d < r - 1; ++d) {
    if (sst[static_cast<size_t>(d)] == 1) b = d;
  }
  if (b < 0) {
    for (int64_t d = 0; d < r - 1; ++d) outer.push_back(d);
    const int64_t n = shape[last], s = sst[last];
    for_each_outer(outer, shape, sst, dst_st, [&](int64_t so, int64_t dof) {
      for (int64_t i = 0; i < n; ++i) dst[dof + i] = src[so + i * s];
    });
    return;
  }
  for (int64_t d = 0; d < r - 1; ++d) {
    if (d != b) outer.push_back(d);
  }
  constexpr int64_t kBlock = 32;
  const int64_t nb = shape[static_cast<size_t>(b)], nl = shape[last], sl = sst[last];
  const int64_t db = dst_st[static_cast<size_t>(b)];
  const int64_t n_blocks = (nb + kBlock - 1) / kBlock;
  // Large transposes (the camera images to NHWC: 7M elements) split their blocks over the pool.
  const bool split = pool != nullptr && pool->size() > 1 && n_blocks > 1 && nb * nl >= (int64_t{1} << 16);
  for_each_outer(outer, shape, sst, dst_st, [&](int64_t so, int64_t dof) {
    const auto blocks = [&](int64_t j0, int64_t j1) {
      for (int64_t b0 = j0 * kBlock; b0 < std::min(nb, j1 * kBlock); b0 += kBlock) {
        const int64_t b1 = std::min(nb, b0 + kBlock);
        for (int64_t l0 = 0; l0 < nl; l0 += kBlock) {
          const int64_t l1 = std::min(nl, l0 + kBlock);
          for (int64_t ib = b0; ib < b1; ++ib) {
            T* d = dst + dof + ib * db;
            const T* s = src + so + ib;
            for (int64_t il = l0; il < l1; ++il) d[il] = s[il * sl];
          }
        }
      }
    };
    if (split) {
      pool->parallel_for(n_blocks, 1, blocks);
    } else {
      blocks(0, n_blocks);
    }
  });
}

}  // namespace

void topk(const Tensor& scores, int64_t k, Tensor& values, Tensor& indices) {
  const char* op = "topk";
  if (!scores.defined() || scores.dtype() != DType::kF32 || scores.dim() != 1 || !scores.is_contiguous() ||
      scores.device() != Device::kCpu) {
    bad_tensor(op, scores, "scores", "contiguous host f32 [n]");
  }
  const int64_t n = scores.size(0);
  if (k < 0 || k > n) {
    throw Error(ErrorKind::kInvalidInput, "k = " + std::to_string(k) + " for " + std::to_string(n) + " scores")
        .where(op)
        .expected("0 <= k <= n");
  }
  expect(op, values, "values", DType::kF32, {k});
  expect(op, indices, "indices", DType::kI64, {k});
  const float* s = scores.data<float>();
  // A strict total order: numbers before NaN, larger first, then lower index first.
  auto before = [s](int64_t a, int64_t b) {
    const float va = s[a], vb = s[b];
    const bool na = std::isnan(va), nb = std::isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  // std::partial_sort's heap selection, done in `indices` itself instead of in an index array
  // of all n (no scratch to allocate): a heap of the k best so far with the worst on top, then
  // sorted. The order is total, so the result is the unique sorted top k either way.
  int64_t* ip = indices.data<int64_t>();
  float* vp = values.data<float>();
  if (k == 0) return;
  for (int64_t i = 0; i < k; ++i) ip[i] = i;
  std::make_heap(ip, ip + k, before);
  for (int64_t i = k; i < n; ++i) {
    if (before(i, ip[0])) {
      std::pop_heap(ip, ip + k, before);
      ip[k - 1] = i;
      std::push_heap(ip, ip + k, before);
    }
  }
  std::sort_heap(ip, ip + k, before);
  for (int64_t i = 0; i < k; ++i) vp[i] = s[ip[i]];
}

void gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst, ThreadPool* pool) {
  const char* op = "gather_rows";
  expect_contiguous(op, src, "src", "[N, ...]");
  const int64_t m = idx.defined() && idx.dim() == 1 ? idx.size(0) : -1;
  if (m < 0) bad_tensor(op, idx, "idx", "contiguous host i64 [M]");
  Shape want = src.shape();
  want[0] = m;
  const DType to = dst.defined() && copies_into(src.dtype(), dst.dtype()) ? dst.dtype() : src.dtype();
  expect(op, dst, "dst", to, want);
  if (to != src.dtype() && overlaps(src, dst)) bad_tensor(op, dst, "dst", "memory disjoint from src");
  const int64_t* ip = checked_indices(op, idx, m, src.size(0));
  const auto width = static_cast<size_t>(src.size(0) ? src.numel() / src.size(0) : 0);
  const size_t src_row = width * dtype_size(src.dtype()), dst_row = width * dtype_size(to);
  const auto* sp = static_cast<const char*>(src.raw_data());
  auto* dp = static_cast<char*>(dst.raw_data());
  // Rows in place (src == dst, the same indices) would race across threads: one thread then.
  for_chunks(overlaps(src, dst) ? nullptr : pool, m, std::max<int64_t>(1, int64_t{1 << 16} / static_cast<int64_t>(width + 1)),
        [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            if (ip[i] < 0) {
              std::memset(dp + i * dst_row, 0, dst_row);  // padding: all-zero bytes, 0 in every dtype
            } else {
              copy_elements(dp + i * dst_row, to, sp + ip[i] * src_row, src.dtype(), width);
            }
          }
        });
}

void gather_rows_multi(std::span<const Tensor> srcs, const Tensor& idx, Tensor& dst) {
  const char* op = "gather_rows_multi";
  if (srcs.empty()) throw Error(ErrorKind::kInvalidInput, "no sources").where(op).expected("at least one [N, C] tensor");
  for (const Tensor& s : srcs) {
    if (!s.defined() || s.dim() != 2 || !s.is_contiguous() || s.device() != Device::kCpu || s.dtype() != srcs[0].dtype() ||
        s.size(1) != srcs[0].size(1)) {
      bad_tensor(op, s, "a source", "contiguous host [N, C] of the first source's width and dtype");
    }
  }
  const int64_t m = idx.defined() && idx.dim() == 1 ? idx.size(0) : -1;
  if (m < 0) bad_tensor(op, idx, "idx", "contiguous host i64 [M]");
  expect(op, dst, "dst", srcs[0].dtype(), {m, srcs[0].size(1)});
  expect(op, idx, "idx", DType::kI64, {m});
  const int64_t* ip = idx.data<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    const int64_t s = ip[i] >> 32, r = ip[i] & 0xffffffffLL;
    if (ip[i] != -1 && (ip[i] < 0 || s >= static_cast<int64_t>(srcs.size()) || r >= srcs[static_cast<size_t>(s)].size(0))) {
      throw Error(ErrorKind::kInvalidInput, "idx[" + std::to_string(i) + "] = source " + std::to_string(s) + ", row " +
                                                std::to_string(r) + ", is out of range")
          .where(op)
          .expected(std::to_string(srcs.size()) + " sources, rows inside each, or -1 (padding)");
    }
  }
  const size_t row_bytes = static_cast<size_t>(srcs[0].size(1)) * dtype_size(srcs[0].dtype());
  auto* dp = static_cast<char*>(dst.raw_data());
  for (int64_t i = 0; i < m; ++i) {
    if (ip[i] < 0) {
      std::memset(dp + i * row_bytes, 0, row_bytes);
      continue;
    }
    const auto* sp = static_cast<const char*>(srcs[static_cast<size_t>(ip[i] >> 32)].raw_data());
    std::memmove(dp + i * row_bytes, sp + (ip[i] & 0xffffffffLL) * row_bytes, row_bytes);
  }
}

void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& dst) {
  const char* op = "scatter_add_rows";
  if (!src.defined() || src.dtype() != DType::kF32 || src.dim() != 2 || !src.is_contiguous() ||
      src.device() != Device::kCpu) {
    bad_tensor(op, src, "src", "contiguous host f32 [M, C]");
  }
  const int64_t m = src.size(0), c = src.size(1);
  if (!dst.defined() || dst.dim() != 2) bad_tensor(op, dst, "dst", "contiguous host f32 [N, " + std::to_string(c) + "]");
  expect(op, dst, "dst", DType::kF32, {dst.size(0), c});
  const int64_t* ip = checked_indices(op, idx, m, dst.size(0));
  const float* sp = src.data<float>();
  float* dp = dst.data<float>();
  // Serial: split over 2 threads by columns it measured no faster (base SCA, 6.1 against 6.2 ms:
  // it already streams at the machine's copy bandwidth).
  for (int64_t i = 0; i < m; ++i) {
    if (ip[i] < 0) continue;  // padding
    float* d = dp + ip[i] * c;
    const float* s = sp + i * c;
    for (int64_t j = 0; j < c; ++j) d[j] += s[j];
  }
}

void scatter_mean_rows(const Tensor& src, const Tensor& idx, const Tensor& scale, Tensor& y, ThreadPool* pool) {
  const char* op = "scatter_mean_rows";
  if (!src.defined() || src.dtype() != DType::kF32 || src.dim() != 2 || !src.is_contiguous() ||
      src.device() != Device::kCpu) {
    bad_tensor(op, src, "src", "contiguous host f32 [M, C]");
  }
  const int64_t m = src.size(0), c = src.size(1);
  if (!scale.defined() || scale.dim() != 2) bad_tensor(op, scale, "scale", "contiguous host f32 [N, 1]");
  const int64_t n = scale.size(0);
  expect(op, scale, "scale", DType::kF32, {n, 1});
  const bool bf16_out = y.defined() && y.dtype() == DType::kBF16;
  expect(op, y, "y", bf16_out ? DType::kBF16 : DType::kF32, {n, c});
  if (overlaps(src, y)) bad_tensor(op, y, "y", "a tensor disjoint from src");
  const int64_t* ip = checked_indices(op, idx, m, n);
  if (n == 0 || c == 0) return;
  const float* sp = src.data<float>();
  const float* kp = scale.data<float>();
  // Blocks of about 64 KiB of f32 sums (256 rows of base's 256 channels), each made whole while
  // in L2: as three ops, base's SCA wrote and read its [40000, 256] slots five times (zeros, the
  // scatter's read and write, the multiply's read and write). A bf16 y gets each block's sums
  // from a block on the stack, rounded once (a replay allocates nothing).
  constexpr int64_t kBlockFloats = int64_t{64} << 8;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockFloats / c);
  if (bf16_out && c > kBlockFloats) bad_tensor(op, y, "y", "bf16 rows of at most 16384 channels, or f32");
  const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
  // Counting sort of the rows of src by block, stable (increasing m within a block): the calling
  // thread's buffers, which only grow, so replays allocate nothing.
  thread_local std::vector<int64_t> start, order;
  if (start.size() < static_cast<size_t>(blocks + 1)) start.resize(static_cast<size_t>(blocks + 1));
  if (order.size() < static_cast<size_t>(m)) order.resize(static_cast<size_t>(m));
  std::fill(start.begin(), start.begin() + blocks + 1, int64_t{0});
  for (int64_t i = 0; i < m; ++i) {
    if (ip[i] >= 0) ++start[static_cast<size_t>(ip[i] / rows_per_block + 1)];
  }
  for (int64_t b = 0; b < blocks; ++b) start[static_cast<size_t>(b + 1)] += start[static_cast<size_t>(b)];
  {
    int64_t* next = start.data();  // start[b] advances through block b's slots; restored below
    for (int64_t i = 0; i < m; ++i) {
      if (ip[i] >= 0) order[static_cast<size_t>(next[ip[i] / rows_per_block]++)] = i;
    }
    for (int64_t b = blocks; b > 0; --b) start[static_cast<size_t>(b)] = start[static_cast<size_t>(b - 1)];
    start[0] = 0;
  }
  const int64_t* st = start.data();
  const int64_t* ord = order.data();
  for_chunks(pool, blocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) float stack_sums[kBlockFloats];  // 64 KiB, touched only for a bf16 y
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * rows_per_block, r1 = std::min(n, r0 + rows_per_block);
      // The block's rows r0.. at sums (y itself in f32).
      float* sums = bf16_out ? stack_sums : y.data<float>() + r0 * c;
      std::memset(sums, 0, static_cast<size_t>((r1 - r0) * c) * sizeof(float));
      for (int64_t k = st[b]; k < st[b + 1]; ++k) {
        const int64_t i = ord[k];
        float* d = sums + (ip[i] - r0) * c;
        const float* s = sp + i * c;
        for (int64_t j = 0; j < c; ++j) d[j] += s[j];
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float k = kp[r];
        float* d = sums + (r - r0) * c;
        for (int64_t j = 0; j < c; ++j) d[j] *= k;
      }
      if (bf16_out) {
        float_to_bf16_n(sums, static_cast<uint16_t*>(y.raw_data()) + r0 * c, static_cast<size_t>((r1 - r0) * c));
      }
    }
  });
}

void concat(std::span<const Tensor> inputs, int64_t axis, Tensor& dst, ThreadPool* pool) {
  const char* op = "concat";
  if (inputs.empty()) throw Error(ErrorKind::kInvalidInput, "no inputs").where(op).expected("at least one tensor");
  const Tensor& first = inputs[0];
  expect_contiguous(op, first, "inputs[0]", "of rank >= 1");
  const int64_t rank = first.dim();
  const int64_t ax = axis < 0 ? axis + rank : axis;
  if (ax < 0 || ax >= rank) {
    throw Error(ErrorKind::kInvalidInput, "axis " + std::to_string(axis) + " for rank " + std::to_string(rank))
        .where(op)
        .expected("an axis in [-rank, rank)");
  }
  Shape want = first.shape();
  want[static_cast<size_t>(ax)] = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const auto name = [i] { return "inputs[" + std::to_string(i) + "]"; };  // for errors only
    if (!is_contiguous_host(t)) bad_tensor(op, t, name(), "contiguous host tensor ");
    bool ok = t.dtype() == first.dtype() && t.dim() == rank;
    for (int64_t d = 0; d < rank && ok; ++d) ok = d == ax || t.size(d) == first.size(d);
    if (!ok) {
      Shape e = first.shape();
      e[static_cast<size_t>(ax)] = -1;
      bad_tensor(op, t, name(), std::string(dtype_name(first.dtype())) + shape_str(e) + " (-1: any extent on axis " +
                           std::to_string(ax) + ")");
    }
  }
  for (const Tensor& t : inputs) want[static_cast<size_t>(ax)] += t.size(ax);
  const DType from = first.dtype();
  const DType to = dst.defined() && copies_into(from, dst.dtype()) ? dst.dtype() : from;
  expect(op, dst, "dst", to, want);
  // Pieces are copied forward and in parallel: an input inside dst would be overwritten first.
  for (const Tensor& t : inputs)
    if (t.numel() > 0 && overlaps(t, dst)) bad_tensor(op, dst, "dst", "memory disjoint from every input");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= want[static_cast<size_t>(d)];
  for (int64_t d = ax + 1; d < rank; ++d) inner *= want[static_cast<size_t>(d)];
  const size_t in_es = dtype_size(from), out_es = dtype_size(to);
  const auto dst_row = static_cast<size_t>(want[static_cast<size_t>(ax)] * inner);  // elements
  auto* dp = static_cast<char*>(dst.raw_data());
  size_t at = 0;  // elements into a dst row
  for (const Tensor& t : inputs) {
    const auto row = static_cast<size_t>(t.size(ax) * inner);
    const auto* sp = static_cast<const char*>(t.raw_data());
    if (row > 0) {
      // outer rows of `row` elements, or (axis 0, outer 1) one block split into 64K-element pieces.
      const auto piece = static_cast<int64_t>(outer > 1 ? row : std::min<size_t>(row, size_t{1} << 16));
      const int64_t pieces_per_row = (static_cast<int64_t>(row) + piece - 1) / piece;
      for_chunks(pool, outer * pieces_per_row, std::max<int64_t>(1, int64_t{1 << 16} / piece), [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const int64_t o = k / pieces_per_row, first_el = k % pieces_per_row * piece;
          const int64_t n = std::min<int64_t>(piece, static_cast<int64_t>(row) - first_el);
          copy_elements(dp + (static_cast<size_t>(o) * dst_row + at + static_cast<size_t>(first_el)) * out_es, to,
                        sp + (static_cast<size_t>(o) * row + static_cast<size_t>(first_el)) * in_es, from,
                        static_cast<size_t>(n));
        }
      });
    }
    at += row;
  }
}

void permute_copy(const Tensor& src, Tensor& dst, ThreadPool* pool) {
  const char* op = "permute_copy";
  if (!src.defined() || src.device() != Device::kCpu) bad_tensor(op, src, "src", "a host tensor");
  expect(op, dst, "dst", src.dtype(), src.shape());
  if (src.numel() == 0) return;
  const auto [slo, shi] = byte_span(src);
  const auto [dlo, dhi] = byte_span(dst);
  if (slo < dhi && dlo < shi) {
    throw Error(ErrorKind::kInvalidInput, "src " + src.describe() + " and dst share memory")
        .where(op)
        .expected("disjoint src and dst");
  }
  // Drop unit dims and merge dims that are adjacent in src too (dst is contiguous, so they are
  // adjacent there): NHWC -> NCHW becomes a [N, C, H*W] copy with src strides [HWC, 1, C].
  Shape shape, sst;
  for (int64_t d = 0; d < src.dim(); ++d) {
    const int64_t n = src.size(d), st = src.strides()[static_cast<size_t>(d)];
    if (n == 1) continue;
    if (!shape.empty() && sst.back() == st * n) {
      shape.back() *= n;
      sst.back() = st;
    } else {
      shape.push_back(n);
      sst.push_back(st);
    }
  }
  if (shape.empty()) {
    shape.push_back(1);
    sst.push_back(1);
  }
  // Elements are moved as same-sized unsigned words, so one copy serves every dtype.
  const void* s = src.raw_data();
  void* d = dst.raw_data();
  switch (dtype_size(src.dtype())) {
    case 1: return strided_copy(static_cast<const uint8_t*>(s), static_cast<uint8_t*>(d), shape, sst, pool);
    case 2: return strided_copy(static_cast<const uint16_t*>(s), static_cast<uint16_t*>(d), shape, sst, pool);
    case 4: return strided_copy(static_cast<const uint32_t*>(s), static_cast<uint32_t*>(d), shape, sst, pool);
    case 8: return strided_copy(static_cast<const uint64_t*>(s), static_cast<uint64_t*>(d), shape, sst, pool);
    default: throw Error(ErrorKind::kInternal, "element size of " + src.describe()).where(op);
  }
}

}  // namespace bev::cpu
