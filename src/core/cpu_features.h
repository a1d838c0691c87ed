// What this CPU runs, the one answer our hand-written SIMD kernels dispatch on.
//
// The CPU's own flags (__builtin_cpu_supports), capped by the variable that caps oneDNN —
// ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA), read once — so that one setting makes
// the whole engine take the path a smaller CPU takes: `ONEDNN_MAX_CPU_ISA=AVX2` on an AVX-512
// machine runs every kernel as a Zen 3 would (the AVX2 tests in CI do this), and a kernel
// never picks an instruction set the CPU lacks. Tests lower the cap further for one scope
// (ScopedIsaCap) to run each dispatch choice the machine allows against the scalar reference.
#pragma once

#include <cstdint>
#include <string>

namespace bev::cpu_features {

// Ordered: each level includes the ones below it.
enum class Isa : uint8_t {
  kScalar,      // baseline x86-64 (SSE2)
  kAvx2,        // AVX2 + FMA
  kAvx512,      // AVX-512 F, BW, VL, DQ (oneDNN's avx512_core)
  kAvx512Bf16,  // + AVX512_BF16 (the CPU rounds f32 to bf16 and multiplies bf16 pairs)
  kAmx,         // + AMX tiles (oneDNN's avx512_core_amx; the OS must still grant the tile state)
};

const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512", "avx512_bf16", "amx"
// What the CPU reports, without any cap.
Isa cpu_isa();
// The cap ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA set (kAmx when unset or ALL), and the variable's
// text ("" when unset).
Isa env_cap();
std::string env_cap_text();
// min(cpu_isa(), env_cap(), the innermost ScopedIsaCap): what kernels may use now.
Isa max_isa();
inline bool has(Isa isa) { return max_isa() >= isa; }

// The CPU features a level needs that this CPU (or the cap) lacks, for error messages: e.g.
// "AVX512_BF16" or "AVX-512 (F, BW, VL, DQ) and AVX512_BF16"; "" when has(isa).
std::string lacking(Isa isa);

// Lowers max_isa() to at most `cap` while it lives (tests: each dispatch choice in turn). It
// affects every thread; kernels read the cap when they are called, so a test must not run
// kernels elsewhere while one is alive.
class ScopedIsaCap {
 public:
  explicit ScopedIsaCap(Isa cap);
  ~ScopedIsaCap();
  ScopedIsaCap(const ScopedIsaCap&) = delete;
  ScopedIsaCap& operator=(const ScopedIsaCap&) = delete;

 private:
  uint8_t previous_;
};

}  // namespace bev::cpu_features
