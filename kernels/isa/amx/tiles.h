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
