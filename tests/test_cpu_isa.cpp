// The CPU's instruction sets as the kernels see them (core/cpu_features.h): a cap lowers what
// they choose and never raises it, no kernel chooses an instruction set above the cap, and each
// dispatch choice this machine allows gives a plain reference's results (RowGemm: the same bits
// at every level, since each level runs one FMA chain per element in the same order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/direct1x1.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/msda.h"
#include "backend/cpu/onednn.h"
#include "backend/cpu/row_gemm.h"
#include "backend/cpu/vec_avx512.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "kernel_test_util.h"

namespace bev::cpu {
namespace {

using cpu_features::Isa;
using kernel_test::random_tensor;

std::vector<Isa> levels_here() {
  std::vector<Isa> v;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx})
    if (cpu_features::has(i)) v.push_back(i);
  return v;
}

TEST(CpuIsa, ACapLowersWhatKernelsChooseAndNeverRaisesIt) {
  const Isa top = cpu_features::max_isa();
  EXPECT_LE(top, cpu_features::cpu_isa());
  EXPECT_LE(top, cpu_features::env_cap());
  std::printf("[ isa      ] cpu %s, ONEDNN_MAX_CPU_ISA '%s', kernels up to %s\n", cpu_features::isa_name(cpu_features::cpu_isa()),
              cpu_features::env_cap_text().c_str(), cpu_features::isa_name(top));
  for (Isa cap : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const cpu_features::ScopedIsaCap scoped(cap);
    const Isa now = cpu_features::max_isa();
    EXPECT_EQ(now, std::min(cap, top));
    {
      const cpu_features::ScopedIsaCap higher(Isa::kAmx);  // nested: cannot raise
      EXPECT_EQ(cpu_features::max_isa(), now);
    }
    // What each hand-written kernel would choose under this cap.
    EXPECT_EQ(avx512::has_f(), now >= Isa::kAvx512);
    EXPECT_EQ(avx512::has_bw(), now >= Isa::kAvx512);
    EXPECT_EQ(avx512::has_bf16(), now >= Isa::kAvx512Bf16);
    EXPECT_EQ(msda_isa_supported(MsdaIsa::kAvx512), now >= Isa::kAvx512);
    EXPECT_EQ(msda_isa_supported(MsdaIsa::kAvx2), now >= Isa::kAvx2);
    EXPECT_EQ(msda_best_isa(), now >= Isa::kAvx512 ? MsdaIsa::kAvx512 : now >= Isa::kAvx2 ? MsdaIsa::kAvx2 : MsdaIsa::kScalar);
    if (now < Isa::kAmx) {
      EXPECT_FALSE(isa_has_amx());
    }
    Conv2dAttrs a;
    EXPECT_EQ(Direct1x1::supports(a, 64, 64, 1, 1, Precision::kF32), now >= Isa::kAvx512);
    EXPECT_EQ(row_gemm_needed(), now < Isa::kAvx512);
    EXPECT_STREQ(RowGemm::impl_name(), now >= Isa::kAvx2 ? "row_gemm:avx2" : "row_gemm:scalar");
    if (now < Isa::kAvx512) {
      EXPECT_NE(cpu_features::lacking(Isa::kAvx512), "");
    }
  }
  EXPECT_EQ(cpu_features::max_isa(), top);  // the caps are gone with their scopes
}

TEST(CpuIsa, PrecisionsAreRefusedNamingWhatTheCpuLacks) {
  EXPECT_EQ(precision_lacks(Precision::kF32), "");
  EXPECT_EQ(precision_lacks(Precision::kBF16).empty(), cpu_features::has(Isa::kAvx512));
  EXPECT_EQ(precision_lacks(Precision::kInt8).empty(), has_int8_dot());
  const std::string runs = precisions_that_run();
  EXPECT_EQ(runs.find("bf16") != std::string::npos, precision_lacks(Precision::kBF16).empty()) << runs;
  for (Precision p : {Precision::kBF16, Precision::kInt8}) {
    if (precision_lacks(p).empty()) {
      EXPECT_NO_THROW(require_precision(p));
      continue;
    }
    try {
      require_precision(p);
      ADD_FAILURE() << precision_name(p) << " was not refused";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(what.find(precision_name(p)), std::string::npos) << what;
      EXPECT_NE(what.find("lacks"), std::string::npos) << what;
      // The hint names only what runs here.
      const std::string hint = what.substr(what.find("Hint:"));
      EXPECT_EQ(hint.find(precision_name(p)), std::string::npos) << what;
      EXPECT_NE(hint.find("f32"), std::string::npos) << what;
    }
  }
}

// RowGemm at every level this machine allows against a double reference, awkward sizes (rows
// not a multiple of 6, columns not of 16, K of 1 and K past its 256-deep blocks), and the same
// bits at every level.
TEST(RowGemm, EveryLevelMatchesTheReferenceWithTheSameBits) {
  struct S {
    int64_t rows, k, out;
    bool relu, bias;
  };
  for (const S s : {S{1, 1, 1, false, true}, S{7, 33, 17, true, true}, S{13, 256, 40, false, false},
                    S{97, 64, 16, true, true}, S{200, 5, 129, false, true},
                    S{9, 600, 33, true, true}}) {  // K over two blocks and a part
    const Tensor w = random_tensor({s.out, s.k}, 3, -0.5f, 0.5f), b = random_tensor({s.out}, 4);
    const Tensor x = random_tensor({s.rows, s.k}, 5);
    // Poison one product with NaN: it must stay in its own element (and survive the ReLU).
    Tensor xn = Tensor::empty(x.shape(), DType::kF32);  // a copy: contiguous() would share x's storage
    std::memcpy(xn.raw_data(), x.raw_data(), x.nbytes());
    xn.data<float>()[0] = std::nanf("");
    std::vector<Tensor> got;
    for (Isa level : levels_here()) {
      if (level > Isa::kAvx2) continue;  // RowGemm's choices: scalar, AVX2
      const cpu_features::ScopedIsaCap cap(level);
      const RowGemm g(w.data<float>(), s.out, s.k, s.bias ? b.data<float>() : nullptr, s.relu);
      Tensor y = Tensor::empty({s.rows, s.out}, DType::kF32);
      ThreadPool pool(2);
      g.run(x.data<float>(), s.rows, y.data<float>(), &pool);
      for (int64_t i = 0; i < s.rows; ++i)
        for (int64_t j = 0; j < s.out; ++j) {
          double acc = 0, mag = 0;
          for (int64_t t = 0; t < s.k; ++t) {
            acc += double(x.data<float>()[i * s.k + t]) * w.data<float>()[j * s.k + t];
            mag += std::fabs(double(x.data<float>()[i * s.k + t]) * w.data<float>()[j * s.k + t]);
          }
          if (s.bias) acc += b.data<float>()[j], mag += std::fabs(b.data<float>()[j]);
          if (s.relu) acc = std::max(acc, 0.0);
          EXPECT_LE(std::fabs(y.data<float>()[i * s.out + j] - acc), (s.k + 2) * std::ldexp(1.0, -24) * std::max(mag, 1e-30))
              << cpu_features::isa_name(level) << " " << i << "," << j;
        }
      Tensor yn = Tensor::empty({s.rows, s.out}, DType::kF32);
      g.run_rows(xn.data<float>(), s.rows, yn.data<float>());
      for (int64_t j = 0; j < s.out; ++j) EXPECT_TRUE(std::isnan(yn.data<float>()[j])) << j;
      for (int64_t i = 1; i < s.rows; ++i)
        for (int64_t j = 0; j < s.out; ++j) EXPECT_FALSE(std::isnan(yn.data<float>()[i * s.out + j]));
      got.push_back(y);
    }
    for (size_t l = 1; l < got.size(); ++l)
      EXPECT_EQ(0, std::memcmp(got[0].raw_data(), got[l].raw_data(), got[0].nbytes())) << "level " << l << " of " << s.rows;
  }
}

// The row kernels (layer norm, softmax, softmax's numerators, f32 -> bf16, the non-finite
// count) at every level this machine allows, forced by the cap, against plain references: the
// AVX-512 forms only where the cap allows them, the scalar forms everywhere.
TEST(CpuIsa, EveryLevelOfTheRowKernelsMatchesItsReference) {
  for (Isa level : levels_here()) {
    const cpu_features::ScopedIsaCap cap(level);
    const std::string at = cpu_features::isa_name(level);
    for (const int64_t c : {1, 2, 4, 5, 8, 13, 16, 33, 256}) {
      const int64_t rows = 7;
      const Tensor x = random_tensor({rows, c}, 40 + static_cast<uint32_t>(c), -4.0f, 4.0f);
      const Tensor g = random_tensor({c}, 41), b = random_tensor({c}, 42);
      std::vector<float> y(static_cast<size_t>(rows * c)), sm(y.size()), num(y.size());
      std::vector<float> sums(static_cast<size_t>(rows));
      layer_norm_rows(x.data<float>(), nullptr, g.data<float>(), b.data<float>(), 1e-5f, y.data(), c, 0, rows);
      softmax_rows(x.data<float>(), sm.data(), c, 0, rows);
      std::memcpy(num.data(), x.data<float>(), x.nbytes());
      softmax_numerators(num.data(), nullptr, sums.data(), c, 0, rows);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.data<float>() + r * c;
        double mean = 0, var = 0, mx = -1e30, den = 0;
        for (int64_t j = 0; j < c; ++j) mean += xr[j], mx = std::max<double>(mx, xr[j]);
        mean /= double(c);
        for (int64_t j = 0; j < c; ++j) var += (xr[j] - mean) * (xr[j] - mean), den += std::exp(xr[j] - mx);
        var /= double(c);
        EXPECT_NEAR(sums[size_t(r)], den, 1e-5 * den) << at << " c " << c;
        for (int64_t j = 0; j < c; ++j) {
          const size_t e = static_cast<size_t>(r * c + j);
          const double ln = (xr[j] - mean) / std::sqrt(var + 1e-5) * g.data<float>()[j] + b.data<float>()[j];
          EXPECT_NEAR(y[e], ln, 2e-5 * (1 + std::fabs(ln))) << at << " layer norm c " << c;
          EXPECT_NEAR(sm[e], std::exp(xr[j] - mx) / den, 2e-6) << at << " softmax c " << c;
          EXPECT_NEAR(num[e], std::exp(xr[j] - mx), 2e-6 * std::exp(xr[j] - mx) + 1e-30) << at << " numerators c " << c;
        }
      }
    }
    // f32 -> bf16 (round to nearest even; NaN stays NaN): the same bits as the scalar rounding.
    Tensor f = random_tensor({1037}, 43, -3e5f, 3e5f);
    f.data<float>()[5] = std::nanf("");
    f.data<float>()[6] = 1.0f + std::ldexp(1.0f, -8);  // a tie
    std::vector<uint16_t> got(1037);
    float_to_bf16_n(f.data<float>(), got.data(), got.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], float_to_bf16(f.data<float>()[i])) << at << " " << i;
    // Non-finite values counted per part, f32.
    Tensor v = random_tensor({3, 1001}, 44);
    for (int64_t i = 0; i < 3003; i += 97) v.data<float>()[i] = i % 2 ? INFINITY : std::nanf("");
    Tensor n = Tensor::empty({3}, DType::kI64);
    count_nonfinite(v, n);
    for (int64_t part = 0; part < 3; ++part) {
      int64_t want = 0;
      for (int64_t i = part * 1001; i < (part + 1) * 1001; ++i) want += !std::isfinite(v.data<float>()[i]);
      EXPECT_EQ(n.data<int64_t>()[part], want) << at << " part " << part;
    }
  }
}

}  // namespace
}  // namespace bev::cpu
