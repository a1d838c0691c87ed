// What every AMX kernel of ours shares: the tile configuration, the permission to use tiles, and
// the compiler barrier that orders vector stores before tile loads.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace bev::cpu::amx {

// Palette 1, tiles 0-7 each 16 rows of 64 bytes. In static storage: ldtilecfg reads all 64 bytes,
// and GCC's _tile_loadconfig tells the compiler of only the first 8.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
inline const TileConfig kFullTiles{};

// GCC's tile loads are asm statements that name no memory (its tile stores clobber it): a compiler
// barrier sits between the code that writes what tiles load and the loads, and, to say so where
// it is read, after the stores that vector code reads.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// Linux lends a process AMX's tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); granted once, it holds for every thread. oneDNN asks for itself as well.
inline bool tile_state_granted() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

}  // namespace bev::cpu::amx
