#include "core/cpu_features.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

namespace bev::cpu_features {
namespace {

Isa detect() {
  __builtin_cpu_init();  // a caller may run during static initialization, before libgcc's own
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return Isa::kScalar;
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
    return Isa::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return Isa::kAvx512;
  // GCC 12's __builtin_cpu_supports has no AMX names: CPUID leaf 7, EDX bits 22 (AMX-BF16) and
  // 24 (AMX-TILE). The OS permission is the AMX kernels' own check (amx_tiles.h).
  unsigned a = 7, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  return (d >> 22 & 1u) && (d >> 24 & 1u) ? Isa::kAmx : Isa::kAvx512Bf16;
}

std::string read_env() {
  for (const char* name : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {  // oneDNN's own order
    if (const char* v = std::getenv(name)) return v;
  }
  return "";
}

// oneDNN 2.6's names (cpu_isa_traits.hpp); an unknown name caps nothing, as in oneDNN.
Isa parse(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (s == "SSE41" || s == "AVX") return Isa::kScalar;
  // AVX512_MIC lacks BW/VL/DQ: our AVX-512 kernels need them.
  if (s == "AVX2" || s == "AVX2_VNNI" || s == "AVX512_MIC" || s == "AVX512_MIC_4OPS") return Isa::kAvx2;
  if (s == "AVX512_CORE" || s == "AVX512_CORE_VNNI") return Isa::kAvx512;
  if (s == "AVX512_CORE_BF16") return Isa::kAvx512Bf16;
  return Isa::kAmx;
}

std::atomic<uint8_t> g_scoped_cap{static_cast<uint8_t>(Isa::kAmx)};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

Isa cpu_isa() {
  static const Isa isa = detect();
  return isa;
}

std::string env_cap_text() {
  static const std::string text = read_env();
  return text;
}

Isa env_cap() {
  static const Isa cap = parse(env_cap_text());
  return cap;
}

Isa max_isa() {
  static const Isa fixed = std::min(cpu_isa(), env_cap());
  return std::min(fixed, static_cast<Isa>(g_scoped_cap.load(std::memory_order_relaxed)));
}

std::string lacking(Isa isa) {
  if (has(isa)) return "";
  static const char* const kNeeds[] = {"", "AVX2 and FMA", "AVX-512 (F, BW, VL, DQ)", "AVX512_BF16", "AMX"};
  std::string s;
  for (int level = static_cast<int>(max_isa()) + 1; level <= static_cast<int>(isa); ++level) {
    s += (s.empty() ? "" : " and ") + std::string(kNeeds[level]);
  }
  if (env_cap() < cpu_isa() && env_cap() < isa) s += " (capped by ONEDNN_MAX_CPU_ISA=" + env_cap_text() + ")";
  return s;
}

ScopedIsaCap::ScopedIsaCap(Isa cap)
    : previous_(g_scoped_cap.exchange(std::min(static_cast<uint8_t>(cap), g_scoped_cap.load()))) {}

ScopedIsaCap::~ScopedIsaCap() { g_scoped_cap.store(previous_); }

}  // namespace bev::cpu_features
