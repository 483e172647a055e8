// AMX BF16 and INT8 peak loops (compiled with -mamx-*; called only when cpuid says AMX and the OS granted
// XTILEDATA to this process).
#include "isa/amx/tiles.h"  // <immintrin.h> with a _tile_loadconfig GCC 12 cannot drop stores around

#include <cstring>

#include "common.h"

namespace hina {

namespace {

// Four independent C tiles (tmm0..3) over two A and two B tiles, each `op` a full 16 x 16 x K step:
// four chains to cover the instruction's latency, operands in tiles (no memory in the loop).
template <class Op>
void tile_peak_loop(const void* operand, int64_t iters, Op op) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) op();
  alignas(64) static thread_local int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile int32_t sink = out[0];
  (void)sink;
}

// The loop's four steps: each C tile (tmm0..3) from its own pair of A (tmm4, 5) and B (tmm6, 7).
// A macro: the tile numbers of _tile_dp* must be compile-time constants.
#define HINA_FOUR_TILE_STEPS(insn) \
  do {                             \
    insn(0, 4, 6);                 \
    insn(1, 4, 7);                 \
    insn(2, 5, 6);                 \
    insn(3, 5, 7);                 \
  } while (0)

}  // namespace

// tdpbf16ps on full 16x16 fp32 tiles: 16 x 16 x 32 products x 2 = 16384 FLOP per instruction.
double tdpbf16_amx(int64_t iters) {
  alignas(64) static thread_local uint16_t buf[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) buf[i] = 0x3f80;
  tile_peak_loop(buf, iters, [] { HINA_FOUR_TILE_STEPS(_tile_dpbf16ps); });
  return double(iters) * 4 * 16384;
}

// tdpbssd (s8 x s8 -> s32, the INT8 kernel's instruction) on full 16x16 int32 tiles: 16 x 16 x 64
// products x 2 = 32768 integer ops per instruction, twice tdpbf16ps's.
double tdpbssd_amx(int64_t iters) {
  alignas(64) static thread_local int8_t buf[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) buf[i] = int8_t(1 + (i & 3));
  tile_peak_loop(buf, iters, [] { HINA_FOUR_TILE_STEPS(_tile_dpbssd); });
  return double(iters) * 4 * 32768;
}

}  // namespace hina
