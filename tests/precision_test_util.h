// Tests in the precisions this CPU runs. A precision the CPU lacks (bf16 below AVX-512, int8
// without VNNI or AMX: backend/cpu/onednn.h, precision_lacks) is skipped with what it lacks, and
// the rest of the test still runs in the others: an AVX2 machine checks f32 where an AVX-512 one
// checks f32 and bf16.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/cpu/onednn.h"

// In a test body: skips the test where precision p does not run, saying what the CPU lacks.
#define BEV_SKIP_UNLESS_RUNS(p)                                                                            \
  do {                                                                                                     \
    if (const std::string bev_lacks_ = ::bev::cpu::precision_lacks(p); !bev_lacks_.empty())                \
      GTEST_SKIP() << ::bev::precision_name(p) << " does not run on this CPU: it lacks " << bev_lacks_; \
  } while (0)

namespace bev::precision_test {

// Whether precision p runs on this CPU (for a test that checks f32 and then, where it can, bf16).
inline bool runs_here(Precision p) { return cpu::precision_lacks(p).empty(); }

// The precisions of `ps` that run here; each left out is said on stdout (the test still passes
// on the others, and says which it did not check).
inline std::vector<Precision> precisions_here(std::initializer_list<Precision> ps) {
  std::vector<Precision> run;
  for (Precision p : ps) {
    const std::string lacks = cpu::precision_lacks(p);
    if (lacks.empty()) {
      run.push_back(p);
    } else {
      std::printf("[ not run  ] %s: this CPU lacks %s\n", precision_name(p), lacks.c_str());
    }
  }
  return run;
}

}  // namespace bev::precision_test
