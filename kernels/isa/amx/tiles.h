// The AMX intrinsics for the kernels that use tiles: the software tile unit in the emulated build
// (emu/tile_emulator.h), <immintrin.h> otherwise, with `_tile_loadconfig` replaced.
//
// GCC 12's `_tile_loadconfig` (amxtileintrin.h) gives LDTILECFG an 8-byte memory operand,
// `"m"(*(const void**)cfg)`: the compiler is told the instruction reads the palette byte and the
// reserved bytes only, and at -O3 it dropped the stores to the configuration's `rows` and `colsb` as
// dead. LDTILECFG then loaded palette 1 with every tile unconfigured, and the first tile instruction
// was #UD (SIGILL in `tilezero`). Found on the first real AMX machine this project ran on
// (2026-12-01); the emulated build could not show it: its LDTILECFG is a call that reads the whole
// structure. The replacement names all 64 bytes as the operand.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(HINA_EMU_AMX)
#include "emu/tile_emulator.h"
#else
#include <immintrin.h>

namespace hina {
struct TileConfigBytes {
  unsigned char bytes[64];
};
inline void tile_loadconfig_64(const void* cfg) {
  __asm__ volatile("ldtilecfg %0" ::"m"(*static_cast<const TileConfigBytes*>(cfg)));
}
}  // namespace hina

#undef _tile_loadconfig
#define _tile_loadconfig(cfg) ::hina::tile_loadconfig_64(cfg)
#endif

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE
// LDTILECFG's 64-byte operand (palette 1), for every AMX kernel: rows[t] and colsb[t] of tile t.
struct alignas(64) TileConfig {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

// The bf16 B-tile image of M rows (tokens, query rows) by K: groups of 16 rows, each KB blocks of 32
// along K, each 16 32-bit pairs (k = 2 pair, 2 pair + 1) x 16 rows, so that one block is one 1 KiB B
// tile. The index, in pairs, of row m's pair `pair`.
inline size_t bf16_b_pair_index(int m, int pair, int KB) {
  const int g = m / 16, mi = m % 16, kb = pair / 16, kp = pair % 16;
  return ((size_t(g) * KB + kb) * 16 + kp) * 16 + mi;
}
}  // namespace
}  // namespace hina
