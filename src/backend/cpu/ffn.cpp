#include "backend/cpu/ffn.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/linear.h"
#include "bevformer/error.h"

namespace bev::cpu {
namespace {

[[noreturn]] void invalid(const std::string& problem, const std::string& expected) {
  throw Error(ErrorKind::kInvalidInput, problem).where("ffn_norm").expected(expected);
}

// A participant's chunk of hidden rows takes about this much scratch (measured on the AMX Xeon:
// docs/PERF.md).
constexpr int64_t kChunkBytes = int64_t{256} << 10;

bool is_f32_host(const Tensor& t) {
  return t.defined() && t.device() == Device::kCpu && t.dtype() == DType::kF32 && t.is_contiguous();
}

}  // namespace

void ffn_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const FfnNormAttrs& a, Tensor& y,
              ThreadPool& pool) {
  if (!a.fc1 || !a.fc2) invalid("layers missing", "two prepared linears");
  const auto& fc1 = *static_cast<const Linear*>(a.fc1.get());
  const auto& fc2 = *static_cast<const Linear*>(a.fc2.get());
  const int64_t c = fc1.in_features(), h = fc1.out_features();
  if (fc2.in_features() != h || fc2.out_features() != c)
    invalid("layers " + std::to_string(c) + " -> " + std::to_string(h) + " and " + std::to_string(fc2.in_features()) +
                " -> " + std::to_string(fc2.out_features()),
            "fc2 back from fc1's width to its input's");
  if (!is_f32_host(x) || x.dim() != 2 || x.size(1) != c)
    invalid("x is " + (x.defined() ? x.describe() : std::string("undefined")),
            "contiguous host f32 [M, " + std::to_string(c) + "]");
  if (!is_f32_host(gamma) || gamma.shape() != Shape{c} || !is_f32_host(beta) || beta.shape() != Shape{c})
    invalid("gamma " + gamma.describe() + ", beta " + beta.describe(), "f32 [" + std::to_string(c) + "]");
  if (!is_f32_host(y) || y.shape() != x.shape())
    invalid("y is " + (y.defined() ? y.describe() : std::string("undefined")), "contiguous host f32 " + x.describe());
  if (x.raw_data() < static_cast<const char*>(y.raw_data()) + y.nbytes() &&
      y.raw_data() < static_cast<const char*>(x.raw_data()) + x.nbytes())
    invalid("y overlaps x", "disjoint tensors");
  const int64_t rows = x.size(0);
  if (rows == 0) return;
  const bool bf16_hidden = a.hidden == DType::kBF16;
  const int lanes = pool.size();
  const int64_t row_bytes = h * (bf16_hidden ? 2 : 4);
  const int64_t share = ((rows + lanes - 1) / lanes + 15) / 16 * 16;
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / row_bytes / 16 * 16, 16, std::max<int64_t>(16, share));
  const int64_t chunks = (rows + chunk - 1) / chunk, tail = rows - (chunks - 1) * chunk;
  // fc1 reads the f32 rows of x (converted per chunk in bf16, as the linear op does).
  const Linear::RowRunner fc1_rows(fc1, /*bf16_in=*/false, chunk, tail, lanes, /*bf16_out=*/bf16_hidden);
  const Linear::RowRunner fc2_rows(fc2, /*bf16_in=*/bf16_hidden, chunk, tail, lanes);

  // Per participant: its hidden rows and fc1's bf16 copy of its x rows, on their own cache lines.
  // The calling thread's buffer, which only grows (replays allocate nothing).
  const int64_t hidden_bytes = (chunk * row_bytes + 127) / 128 * 128;
  const int64_t lane_bytes = hidden_bytes + (fc1_rows.conversion_bytes(chunk) + 127) / 128 * 128;
  thread_local std::vector<char> buffer;
  const auto need = static_cast<size_t>(lane_bytes * lanes + 128);
  if (buffer.size() < need) buffer.resize(need);
  char* base = buffer.data() + (128 - reinterpret_cast<uintptr_t>(buffer.data()) % 128) % 128;

  const float* xp = x.data<float>();
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  float* yp = y.data<float>();
  const int64_t grain = std::max<int64_t>(1, chunks / lanes);
  pool.parallel_for_indexed(chunks, grain, [&](int64_t c0, int64_t c1, int lane) {
    char* hidden = base + lane * lane_bytes;
    for (int64_t k = c0; k < c1; ++k) {
      const int64_t r0 = k * chunk, n = std::min(chunk, rows - r0);
      fc1_rows.run(xp + r0 * c, n, hidden, lane, hidden + hidden_bytes);
      fc2_rows.run(hidden, n, yp + r0 * c, lane);
      layer_norm_rows(xp, yp, g, b, a.eps, yp, c, r0, r0 + n);
    }
  });
}

}  // namespace bev::cpu
