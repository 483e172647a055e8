// A software AMX tile unit: the AMX intrinsics (`_tile_loadconfig`, `_tile_loadd`,
// `_tile_stream_loadd`, `_tile_stored`, `_tile_zero`, `_tile_release`, `_tile_dpbf16ps`,
// `_tile_dpbssd`/`_tile_dpbsud`/`_tile_dpbusd`/`_tile_dpbuud`) in portable C++, with the semantics
// of the Intel SDM (Vol. 2, "Intel AMX" instructions; palette 1). For tests only: the AMX
// micro-kernel source (isa/amx/microkernel_amx.cpp) is compiled against this header instead of
// <immintrin.h> (module `_C_amx_emu`, isa "amx-emulated"), so its logic runs on any CPU.
//
// What is modelled
//   * State: 8 tiles x 16 rows x 64 bytes and the tile configuration, per thread (each core has
//     its own tile registers). Using a tile before a valid LDTILECFG faults.
//   * LDTILECFG (palette 1): palette_id 0 releases (INIT state); a palette other than 0/1, a
//     nonzero reserved byte (bytes 2..15), a tile 0..7 with rows > 16 or colsb > 64, or a nonzero
//     rows/colsb for tiles 8..15 is #GP. A successful load zeroes all tile data; start_row is kept
//     at 0 (we never model restarts).
//   * TILELOADD/TILELOADDT1 (the same data movement; T1 is a cache hint): row r < rows reads colsb
//     bytes from base + r*stride; bytes past colsb and rows past `rows` are zeroed.
//     TILESTORED writes rows x colsb bytes. TILEZERO zeroes the whole tile. A tile whose rows or
//     colsb is 0 is unconfigured: using it is #UD.
//   * TDPBF16PS dst, a, b (#UD unless dst, a, b are distinct, all colsb multiples of 4,
//     dst.rows == a.rows, dst.colsb == b.colsb, a.colsb / 4 == b.rows):
//         for m < dst.rows, k < a.colsb/4, n < dst.colsb/4, in this order:
//           dst[m][n] = fma(a[m].bf16[2k],   b[k].bf16[2n],   dst[m][n])
//           dst[m][n] = fma(a[m].bf16[2k+1], b[k].bf16[2n+1], dst[m][n])
//     i.e. the SDM pseudo-code's "FP32 FMA with DAZ = FTZ = 1, RNE, MXCSR not consulted": bf16
//     inputs and the accumulator are read with denormals as zero, each step is one fused
//     multiply-add rounded to nearest even (a bf16 x bf16 product is exact in fp32 anyway:
//     8 x 8 significand bits), and a denormal result is flushed to zero (sign kept). Columns
//     past dst.colsb and rows past dst.rows are zeroed. (Real hardware may sum a pair before
//     accumulating; the SDM pseudo-code is sequential and that is what is emulated. Kernels must
//     not depend on the difference.)
//   * TDPB[SU][SU]D dst, a, b: int8 dot products of 4 bytes into int32, wrap-around (no
//     saturation): dst[m][n] += sum_{i<4} a[m].x8[4k+i] * b[k].x8[4n+i], signedness per the
//     mnemonic (first letter: a, second: b). Same shape checks as TDPBF16PS.
// Faults throw hina::tile_emu::Fault (a std::runtime_error saying which #GP/#UD and why); the
// driver turns it into a Python RuntimeError.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hina {
namespace tile_emu {

constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct alignas(64) Config {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(Config) == 64, "the tile configuration is 64 bytes");

struct State {
  bool configured = false;
  Config cfg{};
  alignas(64) uint8_t tile[kTiles][kMaxRows][kMaxColsb];
};

inline State& state() {
  thread_local State s{};
  return s;
}

[[noreturn]] inline void fault(const std::string& what) {
  throw Fault("AMX tile emulator: " + what);
}

inline void release() {
  State& s = state();
  s.configured = false;
  std::memset(&s.cfg, 0, sizeof(s.cfg));
  std::memset(s.tile, 0, sizeof(s.tile));
}

inline void loadconfig(const void* mem) {
  Config c;
  std::memcpy(&c, mem, sizeof(c));
  if (c.palette_id == 0) { release(); return; }
  if (c.palette_id != 1) fault("#GP: LDTILECFG palette_id " + std::to_string(c.palette_id) + " (only palette 1)");
  for (uint8_t r : c.reserved)
    if (r) fault("#GP: LDTILECFG reserved bytes 2..15 must be zero");
  for (int t = 0; t < 16; ++t) {
    if (t < kTiles) {
      if (c.rows[t] > kMaxRows) fault("#GP: tile " + std::to_string(t) + " rows " + std::to_string(c.rows[t]) + " > 16");
      if (c.colsb[t] > kMaxColsb) fault("#GP: tile " + std::to_string(t) + " colsb " + std::to_string(c.colsb[t]) + " > 64");
    } else if (c.rows[t] || c.colsb[t]) {
      fault("#GP: tile " + std::to_string(t) + " does not exist in palette 1 (rows/colsb must be 0)");
    }
  }
  State& s = state();
  c.start_row = 0;
  s.cfg = c;
  s.configured = true;
  std::memset(s.tile, 0, sizeof(s.tile));
}

inline void storeconfig(void* mem) {
  const State& s = state();
  Config c{};
  if (s.configured) c = s.cfg;
  std::memcpy(mem, &c, sizeof(c));
}

inline void check_tile(int t, const char* insn) {
  const State& s = state();
  if (!s.configured) fault(std::string("#UD: ") + insn + " before LDTILECFG");
  if (t < 0 || t >= kTiles) fault(std::string("#UD: ") + insn + " on tmm" + std::to_string(t));
  if (s.cfg.rows[t] == 0 || s.cfg.colsb[t] == 0)
    fault(std::string("#UD: ") + insn + " on unconfigured tmm" + std::to_string(t));
}

inline void loadd(int t, const void* base, long stride, const char* insn = "TILELOADD") {
  check_tile(t, insn);
  State& s = state();
  const int rows = s.cfg.rows[t], colsb = s.cfg.colsb[t];
  std::memset(s.tile[t], 0, sizeof(s.tile[t]));
  for (int r = 0; r < rows; ++r)
    std::memcpy(s.tile[t][r], static_cast<const uint8_t*>(base) + r * stride, colsb);
}

inline void stream_loadd(int t, const void* base, long stride) { loadd(t, base, stride, "TILELOADDT1"); }

inline void stored(int t, void* base, long stride) {
  check_tile(t, "TILESTORED");
  const State& s = state();
  for (int r = 0; r < s.cfg.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.tile[t][r], s.cfg.colsb[t]);
}

inline void zero(int t) {
  check_tile(t, "TILEZERO");
  std::memset(state().tile[t], 0, sizeof(state().tile[t]));
}

// The shape rules shared by TDPBF16PS and the int8 TDPB*D forms.
inline void check_dp(int dst, int a, int b, const char* insn) {
  check_tile(dst, insn);
  check_tile(a, insn);
  check_tile(b, insn);
  const std::string i(insn);
  if (dst == a || dst == b || a == b) fault("#UD: " + i + " needs three distinct tiles");
  const Config& c = state().cfg;
  if (c.colsb[dst] % 4 || c.colsb[a] % 4 || c.colsb[b] % 4) fault("#UD: " + i + " colsb must be multiples of 4");
  if (c.rows[dst] != c.rows[a]) fault("#UD: " + i + " dst.rows != src1.rows");
  if (c.colsb[dst] != c.colsb[b]) fault("#UD: " + i + " dst.colsb != src2.colsb");
  if (c.colsb[a] / 4 != c.rows[b]) fault("#UD: " + i + " src1.colsb / 4 != src2.rows");
}

inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// DAZ for fp32 (and bf16 widened to fp32): a denormal reads as a zero of the same sign.
inline float daz(float f) { uint32_t u = f32_bits(f); return (u & 0x7f800000u) ? f : bits_f32(u & 0x80000000u); }
inline float ftz(float f) { return daz(f); }  // same test on the result
inline float bf16_daz(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return daz(bits_f32(uint32_t(h) << 16));
}

inline void dpbf16ps(int dst, int a, int b) {
  check_dp(dst, a, b, "TDPBF16PS");
  State& s = state();
  const Config& c = s.cfg;
  const int M = c.rows[dst], N = c.colsb[dst] / 4, K = c.colsb[a] / 4;
  float out[kMaxRows][16] = {};
  for (int m = 0; m < M; ++m) {
    float tmp[16];
    std::memcpy(tmp, s.tile[dst][m], sizeof(tmp));
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n)
        for (int e = 0; e < 2; ++e) {
          const float x = bf16_daz(&s.tile[a][m][4 * k + 2 * e]);
          const float y = bf16_daz(&s.tile[b][k][4 * n + 2 * e]);
          tmp[n] = ftz(std::fma(x, y, daz(tmp[n])));
        }
    for (int n = 0; n < N; ++n) out[m][n] = tmp[n];
  }
  std::memset(s.tile[dst], 0, sizeof(s.tile[dst]));
  for (int m = 0; m < M; ++m) std::memcpy(s.tile[dst][m], out[m], 4 * N);
}

template <bool ASigned, bool BSigned>
inline void dpb_int8(int dst, int a, int b, const char* insn) {
  check_dp(dst, a, b, insn);
  State& s = state();
  const Config& c = s.cfg;
  const int M = c.rows[dst], N = c.colsb[dst] / 4, K = c.colsb[a] / 4;
  int32_t out[kMaxRows][16] = {};
  for (int m = 0; m < M; ++m) {
    uint32_t tmp[16];  // unsigned: wrap-around arithmetic without UB
    std::memcpy(tmp, s.tile[dst][m], sizeof(tmp));
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) {
        uint32_t sum = 0;
        for (int i = 0; i < 4; ++i) {
          const uint8_t xa = s.tile[a][m][4 * k + i], xb = s.tile[b][k][4 * n + i];
          const int32_t va = ASigned ? int32_t(int8_t(xa)) : int32_t(xa);
          const int32_t vb = BSigned ? int32_t(int8_t(xb)) : int32_t(xb);
          sum += uint32_t(va * vb);
        }
        tmp[n] += sum;
      }
    std::memcpy(out[m], tmp, 4 * N);
  }
  std::memset(s.tile[dst], 0, sizeof(s.tile[dst]));
  for (int m = 0; m < M; ++m) std::memcpy(s.tile[dst][m], out[m], 4 * N);
}

}  // namespace tile_emu
}  // namespace hina

// The intrinsic names the AMX kernel uses, mapped onto the emulator.
#undef _tile_loadconfig
#undef _tile_storeconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbssd
#undef _tile_dpbsud
#undef _tile_dpbusd
#undef _tile_dpbuud
#define _tile_loadconfig(cfg) ::hina::tile_emu::loadconfig(cfg)
#define _tile_storeconfig(cfg) ::hina::tile_emu::storeconfig(cfg)
#define _tile_release() ::hina::tile_emu::release()
#define _tile_loadd(t, base, stride) ::hina::tile_emu::loadd(t, base, long(stride))
#define _tile_stream_loadd(t, base, stride) ::hina::tile_emu::stream_loadd(t, base, long(stride))
#define _tile_stored(t, base, stride) ::hina::tile_emu::stored(t, base, long(stride))
#define _tile_zero(t) ::hina::tile_emu::zero(t)
#define _tile_dpbf16ps(d, a, b) ::hina::tile_emu::dpbf16ps(d, a, b)
#define _tile_dpbssd(d, a, b) ::hina::tile_emu::dpb_int8<true, true>(d, a, b, "TDPBSSD")
#define _tile_dpbsud(d, a, b) ::hina::tile_emu::dpb_int8<true, false>(d, a, b, "TDPBSUD")
#define _tile_dpbusd(d, a, b) ::hina::tile_emu::dpb_int8<false, true>(d, a, b, "TDPBUSD")
#define _tile_dpbuud(d, a, b) ::hina::tile_emu::dpb_int8<false, false>(d, a, b, "TDPBUUD")
