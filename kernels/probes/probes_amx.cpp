// AMX BF16 peak loop (compiled with -mamx-*; called only when cpuid says AMX and the OS granted
// XTILEDATA to this process).
#include "isa/amx/tiles.h"  // <immintrin.h> with a _tile_loadconfig GCC 12 cannot drop stores around

#include <cstring>

#include "common.h"

namespace hina {

// tdpbf16ps on full 16x16 fp32 tiles: 16 x 16 x 32 products x 2 = 16384 FLOP per instruction.
double tdpbf16_amx(int64_t iters) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local uint16_t buf[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) buf[i] = 0x3f80;
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) static thread_local float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile float sink = out[0];
  (void)sink;
  return double(iters) * 4 * 16384;
}

}  // namespace hina
