// The AMX-INT8 W8A8 micro-kernel (quant.h's contract): `tdpbssd` on weights in their general layout,
// as the BF16 AMX kernel (microkernel_amx.cpp) does with `tdpbf16ps`.
//
//   A = W: 16 W rows (rs rows apart, see amx_mm) x kstep int8 along K, loaded straight from the
//       framework's tensor (stride = rs x the row stride; kstep = min(group, 64) bytes, so a tile
//       never spans two groups);
//   B = the tokens' int8, packed by the gather (transformation 1) in the VNNI-4 layout: per group of
//       16 tokens, row k/4 = [x[t][k .. k+3] for t = 0..15] (64 bytes); a B tile is kstep/4 rows;
//   C = int32 [16 rows][tokens]: per group of g along K a fresh C (tilezero), the group's kstep
//       steps of tdpbssd, four groups in flight in tmm4..7, then the four C stored to L1 and added
//       with AVX-512 into sixteen fp32 vectors (one per row, 16 tokens) scaled by s_w[row][group] *
//       s_x[tokens][group] (the packed scales are [token group][group][16 tokens] for that).
// The SiLU(gate)*up intermediate is stored in fp32 and re-quantized per token and group by pack_act
// into the same VNNI-4 layout for the down projection (quant_glue.h's stores).
// History (2026-12-01, 2 vCPUs of a Xeon with AMX, 2 threads, weights from DRAM):
// - First written for correctness on the tile emulator: one C tile chained through every group, and
//   the scale step in scalar C++ per group. 0.62-0.69 of the roofline on Mixtral at T <= 8, 0.27-0.40
//   on Qwen3-30B-A3B; perf put ~70% of the samples on the W tile loads.
// - Tried then and not kept: two A tiles per B tile (32 rows a step), the scale step vectorized and the
//   next 32 rows prefetched into L2, together: Qwen3 T = 1 / 4 / 16 2.82 / 3.15 / 3.71 ms against
//   2.86 / 3.47 / 4.29, but Mixtral T = 1 / 16 29.7 / 33.4 against 15.1 / 19.5 (the prefetches stalled
//   on full fill buffers), 19.3 / 22.3 without the prefetch.
// - Now (each step measured alone, Qwen3-30B-A3B T = 8, all 8 experts, median of 300 calls): four
//   groups in flight with the vectorized scale step 3.78 -> 2.79 ms; the token quantization
//   vectorized (quant_glue.h) 2.53; the rows of a tile spread over pages (kRowSpread) and 256-row
//   tasks 2.01. A copy of the tile's 16 rows into a contiguous buffer first (read as one stream),
//   L2 or L1 prefetches of the next tile's rows (in their memory order, or at the same offsets) and
//   of the same rows 512 / 1024 bytes ahead were all slower (2.5-4.6 ms at their stages).
// Kept instead: with few tokens (M <= 4 then, 8 now: below) an expert's gate/up and down run on the
// AVX-512 VNNI kernel (quant_avx512.cpp, vpdpbusd on the same int8 rows; every AMX CPU has it), as
// SGLang's and kt-kernel's INT8 MoE use AVX-512 for few tokens and AMX for many: Qwen3 T = 1 / 2 / 4
// 1.81 / 1.92 / 2.11 ms against the tiles' 2.82 / 3.15 / 3.11, Mixtral 12.7 / 13.9 / 14.6 against
// 15.1 / 15.4 / 16.6. The dispatch is by the expert's M, the same in the pack and the tiles' calls, so one call
// mixes both for experts of different M. The emulated build runs the tiles for every M (so the tests
// cover their logic at small M too).
//
// Built twice from this one source: for real (-mamx-int8 ..., `_C`, isa "amx") and against
// emu/tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated").
#include "isa/amx/tiles.h"

#include <cmath>
#include <cstring>

#include "common.h"      // cpu_features (cpu.cpp)
#if !defined(HINA_EMU_AMX)
#include "isa/avx512/f8_vbmi.h"   // tiles.h brought <immintrin.h>
#endif
#include "quant_glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

constexpr int kTok = 16;  // tokens per B tile

// Packed operand: [token group][K/4][16 tokens][4 bytes] int8, then the fp32 scales as
// [token group][K / group][16 tokens] (a group's scales of 16 tokens are one vector for the scale step).
size_t amx_packed_bytes(int M, int K, int group) {
  const size_t groups = (size_t(M) + kTok - 1) / kTok;
  return a64(groups * size_t(K) * kTok) + groups * kTok * (K / group) * sizeof(float);
}
inline float* amx_scales(const void* p, int M, int K) {
  const size_t groups = (size_t(M) + kTok - 1) / kTok;
  return reinterpret_cast<float*>(const_cast<char*>(static_cast<const char*>(p)) + a64(groups * size_t(K) * kTok));
}

thread_local ThreadScratch<int8_t> tl_q{nullptr, 0};  // one token's int8 row before it is scattered into the layout
thread_local ThreadScratch<float> tl_qs{nullptr, 0};  // and its scales

// Token m's K values v quantized per group (quant_glue.h's quantize_row) and written in VNNI-4 order.
inline void put_token(const float* v, int m, int K, int group, void* out, int M) {
  int8_t* qrow = tl_q.get(size_t(K));
  const int G = K / group;
  float* qs = tl_qs.get(size_t(G));
  quantize_row<int8_t, 0>(v, K, group, qrow, qs);
  float* sg = amx_scales(out, M, K) + size_t(m / kTok) * G * kTok + m % kTok;
  for (int gi = 0; gi < G; ++gi) sg[size_t(gi) * kTok] = qs[gi];
  int8_t* g = static_cast<int8_t*>(out) + size_t(m / kTok) * K * kTok;
  for (int k = 0; k < K; k += 4) std::memcpy(g + (size_t(k) / 4 * kTok + m % kTok) * 4, qrow + k, 4);
}

// Tokens past M (to the next 16) stay zero, scales too.
void clear_packed(int M, int K, int group, void* I) { std::memset(I, 0, amx_packed_bytes(M, K, group)); }

void amx_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  clear_packed(M, K, group, I);
  float* v = tl_row.get(size_t(K));
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) v[k] = bf16_to_f32(src[k]);
    put_token(v, m, K, group, I, M);
  }
}

void amx_pack_act(const float* act, int M, int K, int group, void* out) {
  clear_packed(M, K, group, out);
  for (int m = 0; m < M; ++m) put_token(act + int64_t(m) * K, m, K, group, out, M);
}

// Tiles: tmm0/tmm1 B (the tokens' kstep slice, two in turn), tmm2/tmm3 A (16 W rows, in turn), tmm4..7
// C: four groups in flight, so that the tdpbssd chains, the stores and the scale step of one group
// overlap the next group's (one C tile for every group, as first written, chained all of them).
constexpr int kFlight = 4;

void configure(int kstep, int mt) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int b = 0; b < 2; ++b) { cfg.rows[b] = uint8_t(kstep / 4); cfg.colsb[b] = uint16_t(4 * mt); }
  for (int a = 2; a < 4; ++a) { cfg.rows[a] = 16; cfg.colsb[a] = uint16_t(kstep); }
  for (int c = 4; c < 4 + kFlight; ++c) { cfg.rows[c] = 16; cfg.colsb[c] = uint16_t(4 * mt); }
  _tile_loadconfig(&cfg);
}

// The fp32 sums of 16 rows x 16 tokens, across the groups: sixteen vectors on AVX-512, plain floats on
// the emulator. add(C, sw, sx): sums[r][t] += C[r][t] * sw[r] * sx[t] for one group's int32 tile C.
#if defined(HINA_EMU_AMX)
struct Sums16 {
  float v[16][kTok];
  Sums16() { for (auto& r : v) for (float& x : r) x = 0.f; }
  void add(const int32_t* C, const float* const* sw, int gi, const float* sx) {
    for (int r = 0; r < 16; ++r)
      for (int t = 0; t < kTok; ++t) v[r][t] += float(C[r * kTok + t]) * (sw[r][gi] * sx[t]);
  }
  void store(float* c, int64_t ldc, int mt) const {
    for (int r = 0; r < 16; ++r) for (int t = 0; t < mt; ++t) c[r * ldc + t] = v[r][t];
  }
};
#else
struct Sums16 {
  __m512 v[16];
  Sums16() { for (__m512& x : v) x = _mm512_setzero_ps(); }
  void add(const int32_t* C, const float* const* sw, int gi, const float* sx) {
    const __m512 vx = _mm512_loadu_ps(sx);
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      v[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C + r * kTok)),
                             _mm512_mul_ps(_mm512_set1_ps(sw[r][gi]), vx), v[r]);
  }
  void store(float* c, int64_t ldc, int mt) const {
    const __mmask16 m = __mmask16((1u << mt) - 1u);
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) _mm512_mask_storeu_ps(c + r * ldc, m, v[r]);
  }
};
#endif

// The tile instructions by tile numbers known only at run time (they take immediates).
inline void zero_c(int j) {
  switch (j) { case 0: _tile_zero(4); break; case 1: _tile_zero(5); break;
               case 2: _tile_zero(6); break; default: _tile_zero(7); break; }
}
inline void store_c(int j, int32_t* C) {
  switch (j) { case 0: _tile_stored(4, C, kTok * 4); break; case 1: _tile_stored(5, C, kTok * 4); break;
               case 2: _tile_stored(6, C, kTok * 4); break; default: _tile_stored(7, C, kTok * 4); break; }
}
// C tile 4 + j += A x B, the operands of buffer p (tmm2 x tmm0 or tmm3 x tmm1)
inline void dp(int j, int p) {
  switch (j * 2 + p) {
    case 0: _tile_dpbssd(4, 2, 0); break;  case 1: _tile_dpbssd(4, 3, 1); break;
    case 2: _tile_dpbssd(5, 2, 0); break;  case 3: _tile_dpbssd(5, 3, 1); break;
    case 4: _tile_dpbssd(6, 2, 0); break;  case 5: _tile_dpbssd(6, 3, 1); break;
    case 6: _tile_dpbssd(7, 2, 0); break;  default: _tile_dpbssd(7, 3, 1); break;
  }
}

// c[j * M + m] for rows j < n (row 0 at w0 + n0 * ldw; n a multiple of 16) x all M tokens.
// Per A tile of 16 rows, K in steps of kstep (a group is group / kstep steps); kFlight groups at a time,
// one C tile each, their scale steps after the batch's four stores. Step i's operands go to buffer
// i & 1, loaded before step i - 1's tdpbssd (and a batch's first before the previous batch's stores;
// this ordering measured the same as loading each step's operands right before its tdpbssd).
// The 16 rows of an A tile are rs rows apart (kRowSpread, fewer where n has no room): rows r0, r0 + rs,
// ..., so each tile row streams from its own pages; the rs tiles of a block of 16 * rs rows follow one
// another (row r0 + 1's stream continues row r0's). Qwen3-30B-A3B T = 8 (2 threads, DRAM; 2026-12-01):
// adjacent rows 2.46 ms, rs = 2 / 4 2.31 / 2.21 (64-row tasks), rs = 8 / 16 2.01 / 2.01 (256-row tasks);
// Mixtral's longer rows 65.0 -> 62.6 ms (T = 8 over all 8 experts).
constexpr int kRowSpread = 8;
// Each K step also prefetches its A tile's 16 rows kQ8Ahead bytes further into L1 (the hardware's L1
// prefetchers do not follow 16 row streams read 64 bytes at a time; the FP8 few-token tiles' finding,
// f8f_convert). 2026-12-06, the AMX Xeon family 6 model 207, 2 threads, weights rotated past the L3
// (~0.7 GB) or one copy re-read ("L3"), each build in its own process, 3 alternated processes of 5
// rounds, medians, against no prefetch: Mixtral-8x7B T = 16 128 / 256 / 384 / 512 bytes ahead 0.88 /
// 0.85-0.87 / 0.91 / 0.86x the time, T = 32 0.97 / 0.90x (128 / 256); Qwen3-30B-A3B from DRAM T = 16 0.96
// / 0.94 / 0.99x (256 / 384 / 512), T = 32 0.93x (256), from the L3 1.00-1.04x (256).
constexpr int kQ8Ahead = 256;
// Tried and not kept (2026-12-06, same machine and method as kQ8Ahead's): two A tiles (rows r0 + rs i
// and r0 + 1 + rs i) over each B tile, two groups in flight (four C tiles), so half the B loads per W
// byte -- a scratch build that skipped every second B load (wrong sums) had read 0.89-0.93x the time at
// Mixtral-8x7B T = 16: Mixtral T = 16 0.99x (DRAM), Qwen3-30B-A3B T = 16 / 32 1.14 / 1.15x. Bit-identical.


void amx_mm(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I, int M,
            int K, int group, float* c) {
  const int kstep = group < 64 ? group : 64;
  const int G = K / group, spg = group / kstep, steps = K / kstep;
  const int8_t* q = static_cast<const int8_t*>(I);
  const float* sx_all = amx_scales(I, M, K);
  alignas(64) int32_t C[kFlight][16 * kTok];
  const float* sw[16];
  for (int t0 = 0; t0 < M; t0 += kTok) {
    const int mt = M - t0 < kTok ? M - t0 : kTok;
    configure(kstep, mt);
    const int8_t* B = q + size_t(t0 / kTok) * K * kTok;
    const float* sx = sx_all + size_t(t0 / kTok) * G * kTok;
    int rs = kRowSpread;
    while (rs > 1 && n % (16 * rs)) rs /= 2;
    for (int blk = 0; blk < n; blk += 16 * rs)
    for (int jj = 0; jj < rs; ++jj) {
      const int r0 = blk + jj;
      const int8_t* w = w0 + int64_t(n0 + r0) * ldw;
      const long lda = long(ldw) * rs;
      auto load = [&](int i) {
        const int k = i * kstep;
        if constexpr (kQ8Ahead > 0)
          for (int r = 0; r < 16; ++r) __builtin_prefetch(w + r * lda + k + kQ8Ahead, 0, 3);
        if (i & 1) { _tile_loadd(1, B + size_t(k) * kTok, kTok * 4); _tile_loadd(3, w + k, lda); }
        else       { _tile_loadd(0, B + size_t(k) * kTok, kTok * 4); _tile_loadd(2, w + k, lda); }
      };
      for (int r = 0; r < 16; ++r) sw[r] = s0 + int64_t(n0 + r0 + r * rs) * lds;
      Sums16 sums;
      load(0);
      for (int gb = 0; gb < G; gb += kFlight) {
        const int nb = G - gb < kFlight ? G - gb : kFlight;
        const int i0 = gb * spg, i1 = (gb + nb) * spg;
        for (int j = 0; j < nb; ++j) zero_c(j);
        for (int i = i0; i < i1; ++i) {
          if (i + 1 < i1) load(i + 1);
          dp((i - i0) / spg, i & 1);
        }
        if (i1 < steps) load(i1);
        for (int j = 0; j < nb; ++j) store_c(j, C[j]);
        for (int j = 0; j < nb; ++j) sums.add(C[j], sw, gb + j, sx + size_t(gb + j) * kTok);
      }
      sums.store(c + int64_t(r0) * M + t0, int64_t(M) * rs, mt);
    }
  }
  _tile_release();
}

void amx_gate_up(const QGateUpTask& t) {
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  amx_mm(t.w_gate, t.ldw_gate, t.s_gate, t.lds_gate, t.n0, t.n, t.I, t.M, t.K, t.group, c);
  amx_mm(t.w_up, t.ldw_up, t.s_up, t.lds_up, t.n0, t.n, t.I, t.M, t.K, t.group, c + int64_t(t.n) * t.M);
  store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M, t.M);
}

void amx_down(const QDownTask& t) {
  float* c = tl_c.get(size_t(t.n) * t.M);
  amx_mm(t.w, t.ldw, t.s, t.lds, t.n0, t.n, t.act, t.M, t.K, t.group, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c);
}

// ================================ FP8 (weight-only) on AMX-BF16 ====================================
// SGLang's recipe for FP8 on CPUs without FP8 arithmetic, on weights in the framework's layout: per
// step of 32 W rows, the rows' fp8 bytes (all of K) are unpacked once, times their 128x128 block
// scales, to bf16 in a transient L2-resident block (32 x K bf16: 256 KiB at K = 4096, 896 KiB at
// 14336), and every token group's tiles (tdpbf16ps, the BF16 kernel's 2 A x 2 B tiles) read that
// block: W is converted once per call, not once per token group. Nothing persistent is repacked.
// The tokens are bf16 VNNI pairs (the BF16 kernel's B layout); the SiLU(gate)*up intermediate is
// rounded to bf16 for the down projection, as the BF16 kernels do.
// With M <= 4 tokens an expert runs on the AVX-512 FP8 kernel (quant_avx512.cpp; M = 2-4 now on the
// converted tiles below, f8_few) instead: there the
// unpack pass would cost as much as the dot products it feeds (the tiles at T = 2 / 4 for Qwen3-30B-A3B:
// 3.5 / 3.5 ms against 2.1 / 3.0; 2026-12-01). The AVX2 FP8 kernel, which ran them before, measured
// the same speed with its rows spread (1.61 / 2.16 / 2.96 ms at T = 1 / 2 / 4, against 1.66 / 2.10 /
// 3.00) and 2.27 / - / 3.12 as it is. The emulated build runs the tiles for every M.
// Measured (2026-12-01, 2 vCPUs of a Sapphire Rapids, side by side, median ms): Mixtral-8x7B T = 8 / 16
// 26.6 / 27.8 against the AVX2 FP8 kernel's 62.3 / 107 and vLLM-CPU's FP8 (SGLang's kernel) 22.8 /
// 24.5; Qwen3-30B-A3B 3.55 / 3.87 against 6.50 / 11.4 and 2.84 / 3.20. perf: the unpack pass is most of
// the time (its fp8 loads: one stream per thread), the tiles on the L2-resident block little; first
// written with a scalar unpack, 75.8 ms at Mixtral T = 8.
constexpr int kF8Kr = 32;   // bf16 along K per tile row (64 bytes)

// The tokens: the BF16 AMX kernel's own B layout and gather (microkernel_amx.cpp), one 1 KiB tile image
// per (16 tokens, 32 K): [group][K/32][16 pairs][16 tokens][2 bf16].
size_t amxf8_packed_bytes(int M, int K, int) { return microkernel_amx_bf16.packed_bytes(M, K); }
void amxf8_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int, void* I) {
  microkernel_amx_bf16.pack_tokens(x, ldx, rows, M, K, I);
}

// (bf16_b_pair_index, tiles.h: the 32-bit pair of token m in that layout)

void amxf8_pack_act(const float* act, int M, int K, int, void* out) {
  bf16_t* dst = static_cast<bf16_t*>(out);
  std::memset(out, 0, amxf8_packed_bytes(M, K, 0));
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k)
      dst[2 * bf16_b_pair_index(m, k / 2, K / kF8Kr) + (k & 1)] = f32_to_bf16(act[int64_t(m) * K + k]);
}

thread_local ThreadScratch<bf16_t> tl_wblk{nullptr, 0};   // the unpacked 32 x K bf16 W block

// The unpack reads W as one sequential stream per thread and is bound by the loads in flight: an L2
// prefetch 4 KiB ahead (Mixtral T = 8, 2 threads: 44.0 ms without, 31.1 / 28.4 / 27.3 / 27.5 ms at
// 1 / 2 / 4 / 8 KiB into L2, 28.5 at 2 KiB into L1; 2026-12-01).
constexpr int kF8UnpackPrefetch = 4096;

#if !defined(HINA_EMU_AMX)
// 64 e4m3 bytes -> bf16 of (value x sc), rounded to nearest even, by the byte tables (f8_vbmi.h): the
// high and low bytes of each value's bf16 looked up (vpermt2b: AVX512_VBMI, which every AMX CPU has;
// this file's flags leave it out, so this function alone is compiled for it), placed as fp32 (a
// zero-masked vpermt2b per 16), scaled, rounded. The bf16 lookup is exact, so the result is the bit
// move's below (e4m3 -> fp32 exactly, times sc, rounded once). Measured (2026-12-01, Qwen3-30B-A3B
// shapes, T = 8 / 16 from DRAM, the two builds alternated twice): 4.07-4.16 / 4.36-4.49 ms with the bit
// move, 3.88-4.04 / 4.13-4.18 with the tables: the unpack is bound by its stream more than its ALU work.
// With it the tiles at M = 2 / 4 are still slower than the AVX-512 FP8 kernel (3.9-4.0 / 3.8 ms against
// 2.1-2.3 / 3.1-3.2), so the split at M <= 4 stays.
HINA_VBMI inline void cvt64_lut(const uint8_t* src, const F8Tables& tab, __m512 vsc, bf16_t* d) {
  __m512i h, l;
  f8_bytes(_mm512_loadu_si512(src), tab, h, l);
  constexpr __mmask64 hi_half = 0xCCCCCCCCCCCCCCCCull;   // bytes 2, 3 of every dword
  __m512 f[4];
  for (int q = 0; q < 4; ++q)
    f[q] = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(hi_half, l,
                                                                            _mm512_load_si512(kF8Lut.f32[q]), h)), vsc);
  _mm512_storeu_si512(d, (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]));
  _mm512_storeu_si512(d + 32, (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]));
}
#endif

// rows [r0, r0 + rows) of an fp8 matrix (row stride ldw bytes, block scales s, row stride lds) to bf16,
// dst [rows][K]: e4m3 -> fp32 by moving its bits into place and scaling by 2^120 (subnormals too),
// times the block's scale, rounded to nearest even (64 at a time by the tables above, where the CPU
// has AVX512_VBMI).
constexpr float kTwo120 = 1.329227995784916e36f;  // 2^120: the bit move's factor
inline float f8_bit_move(uint32_t b) {   // e4m3 byte b as fp32 times 2^-120, exactly (subnormals too)
  const uint32_t bits = ((b & 0x80u) << 24) | ((b & 0x7Fu) << 20);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
void unpack_rows(const int8_t* w, int64_t ldw, const float* s, int64_t lds, int r0, int rows, int K, bf16_t* dst) {
#if !defined(HINA_EMU_AMX)
  static const bool vbmi = cpu_features().avx512_vbmi;
  const F8Tables tab;
#endif
  for (int r = 0; r < rows; ++r) {
    const uint8_t* src = reinterpret_cast<const uint8_t*>(w + int64_t(r0 + r) * ldw);
    const float* srow = s + int64_t((r0 + r) / 128) * lds;
    bf16_t* d = dst + int64_t(r) * K;
    for (int k0 = 0; k0 < K; k0 += 128) {
      const float sc = srow[k0 / 128] * kTwo120;
      const int k1 = K - k0 < 128 ? K : k0 + 128;
      int k = k0;
#if !defined(HINA_EMU_AMX)
      // 16 bytes at a time: widen, move the bits, scale, round to bf16 (vcvtneps2bf16, nearest even)
      const __m512 vsc = _mm512_set1_ps(sc);
      const __m512i sign = _mm512_set1_epi32(0x80), mag = _mm512_set1_epi32(0x7F);
      auto cvt16 = [&](int kk) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kk)));
        const __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(b, sign), 24),
                                             _mm512_slli_epi32(_mm512_and_si512(b, mag), 20));
        const __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(bits), vsc);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + kk), (__m256i)_mm512_cvtneps_pbh(f));
      };
      if (vbmi) {
        const __m512 vs = _mm512_set1_ps(srow[k0 / 128]);   // the table's values are e4m3's own: no 2^120
        for (; k + 64 <= k1; k += 64) {   // a line per step, the stream prefetched ahead
          __builtin_prefetch(src + k + kF8UnpackPrefetch, 0, 2);
          cvt64_lut(src + k, tab, vs, d + k);
        }
      }
      for (; k + 64 <= k1; k += 64) {
        __builtin_prefetch(src + k + kF8UnpackPrefetch, 0, 2);
        cvt16(k); cvt16(k + 16); cvt16(k + 32); cvt16(k + 48);
      }
      for (; k + 16 <= k1; k += 16) cvt16(k);
#endif
      for (; k < k1; ++k) d[k] = f32_to_bf16(f8_bit_move(src[k]) * sc);
    }
  }
}

struct F8Shape { int mt0, mt1, a0, a1; };

void f8_configure(F8Shape s) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int rows, int colsb) { cfg.rows[t] = uint8_t(rows); cfg.colsb[t] = uint16_t(colsb); };
  set(0, 16, 4 * s.mt0);                           // tmm0: tokens m0 .. m0+mt0       (B)
  if (s.mt1) set(1, 16, 4 * s.mt1);                // tmm1: the next 16 tokens
  set(2, s.a0, 64);                                // tmm2: W block rows 0..16        (A)
  if (s.a1) set(3, s.a1, 64);                      // tmm3: rows 16..32
  set(4, s.a0, 4 * s.mt0);                         // tmm4 = tmm2 x tmm0
  if (s.mt1) set(5, s.a0, 4 * s.mt1);              // tmm5 = tmm2 x tmm1
  if (s.a1) set(6, s.a1, 4 * s.mt0);               // tmm6 = tmm3 x tmm0
  if (s.a1 && s.mt1) set(7, s.a1, 4 * s.mt1);      // tmm7 = tmm3 x tmm1
  _tile_loadconfig(&cfg);
}

// c[j * M + m] for rows j < n of the fp8 matrix (row 0 at w0 + n0 * ldw) x all M tokens.
void amxf8_mm(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I, int M,
              int K, float* c) {
  const int KB = K / kF8Kr;
  const uint8_t* q = static_cast<const uint8_t*>(I);
  bf16_t* wb = tl_wblk.get(size_t(32) * K);
  const long wstride = long(K) * long(sizeof(bf16_t));
  alignas(64) float C[32 * 32];
  F8Shape cur{-1, -1, -1, -1};
  for (int r0 = 0; r0 < n; r0 += 32) {
    const int rows = n - r0 < 32 ? n - r0 : 32;
    unpack_rows(w0, ldw, s0, lds, n0 + r0, rows, K, wb);
    for (int m0 = 0; m0 < M; m0 += 32) {
      const int mt = M - m0 < 32 ? M - m0 : 32;
      const F8Shape sh{mt < 16 ? mt : 16, mt > 16 ? mt - 16 : 0, rows < 16 ? rows : 16, rows > 16 ? rows - 16 : 0};
      if (sh.mt0 != cur.mt0 || sh.mt1 != cur.mt1 || sh.a0 != cur.a0 || sh.a1 != cur.a1) {
        f8_configure(sh);
        cur = sh;
      }
      const uint8_t* B0 = q + size_t(m0 / kTok) * KB * 1024;
      const uint8_t* B1 = B0 + size_t(KB) * 1024;
      _tile_zero(4);
      if (sh.a1) _tile_zero(6);
      if (sh.mt1) { _tile_zero(5); if (sh.a1) _tile_zero(7); }
      for (int kb = 0; kb < KB; ++kb) {
        _tile_loadd(0, B0 + size_t(kb) * 1024, 64);
        if (sh.mt1) _tile_loadd(1, B1 + size_t(kb) * 1024, 64);
        const bf16_t* wk = wb + size_t(kb) * kF8Kr;
        _tile_loadd(2, wk, wstride);
        if (sh.a1) _tile_loadd(3, wk + 16 * int64_t(K), wstride);
        _tile_dpbf16ps(4, 2, 0);
        if (sh.a1) _tile_dpbf16ps(6, 3, 0);
        if (sh.mt1) {
          _tile_dpbf16ps(5, 2, 1);
          if (sh.a1) _tile_dpbf16ps(7, 3, 1);
        }
      }
      _tile_stored(4, C, 32 * 4);
      if (sh.a1) _tile_stored(6, C + 16 * 32, 32 * 4);
      if (sh.mt1) {
        _tile_stored(5, C + 16, 32 * 4);
        if (sh.a1) _tile_stored(7, C + 16 * 32 + 16, 32 * 4);
      }
      for (int r = 0; r < rows; ++r)
        for (int m = 0; m < mt; ++m) c[int64_t(r0 + r) * M + m0 + m] = C[r * 32 + m];
    }
  }
  _tile_release();
}

// The tasks around an FP8 product (amxf8_mm, or amxf8f_mm below): gate and up, then SiLU(gate) * up
// stored; or down, stored.
using F8Mm = void (*)(const int8_t*, int64_t, const float*, int64_t, int, int, const void*, int, int, float*);
template <F8Mm Mm>
void f8_gate_up(const QGateUpTask& t) {
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  Mm(t.w_gate, t.ldw_gate, t.s_gate, t.lds_gate, t.n0, t.n, t.I, t.M, t.K, c);
  Mm(t.w_up, t.ldw_up, t.s_up, t.lds_up, t.n0, t.n, t.I, t.M, t.K, c + int64_t(t.n) * t.M);
  store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M, t.M);
}
template <F8Mm Mm>
void f8_down(const QDownTask& t) {
  float* c = tl_c.get(size_t(t.n) * t.M);
  Mm(t.w, t.ldw, t.s, t.lds, t.n0, t.n, t.act, t.M, t.K, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c);
}
constexpr auto amxf8_gate_up = f8_gate_up<amxf8_mm>;
constexpr auto amxf8_down = f8_down<amxf8_mm>;

// ---- FP8 with few tokens on the tiles: each W tile converted as it is loaded ------------------------
// With M <= 4 tokens the unpack pass above costs as much as the products it feeds (it scales and rounds
// every weight, six byte permutes per 64). Here the conversion is exact and cheap, and nothing waits in
// L2: per 64 weights of each of a tile's 16 rows, the e4m3 bytes looked up as bf16 (f8_bytes: two
// vpermt2b; every e4m3 value is a bf16 normal) and put together by one vpunpcklbw and one vpunpckhbw,
// which keep 128-bit lanes: the low words hold weights 16L + e (lane L, e < 8), the high ones 16L + 8 + e,
// and each becomes one row of an A tile image in L1 (16 rows x 64 bytes). The tokens are packed in that
// order instead (transformation 1 moves I, not W: f8f_elem), bf16 VNNI pairs, M columns of B. The block
// scale is applied per 128 of K to the fp32 tiles of the block's products (per row where a tile crosses
// a 128-row block). Each step prefetches the same 64 bytes of the next tile's rows into L2 (the BF16
// decode tiles' rule: glue.h). Nothing persistent is repacked.
// Measured (2026-12-04, the AMX Xeon, 2 threads, same-experts routing, weights rotated past the L3, the
// builds' modules swapped in one process, 3-5 alternated rounds, median ms), against the AVX-512 FP8
// kernel that ran these experts before: Qwen3-30B-A3B M = 1 / 2 / 3 / 4 1.98 / 1.82 / 2.01 / 1.99 against
// 1.47 / 1.56 / 2.16 / 2.40, Mixtral-8x7B M = 2 / 3 / 4 13.7 / 14.6 / 13.4 against 12.9 / 18.3 / 20.1: the
// tiles' time is flat in M, the vector kernel's grows with it, so M = 3 and 4 take the tiles. Their first
// form (no prefetch, one accumulator tile, the images stored and loaded in the same step, the scale
// applied per row in scalar code) took 3.7-4.2 ms at every M; the next tile's prefetch into L1 instead
// of L2 2.08 against 1.99 (M = 4). Tried and not kept: the tokens times each 128-row block's scales,
// rounded to bf16, so that a tile accumulates over all of K with no per-block step (Qwen3-30B-A3B M = 3 /
// 4 2.22 / 2.31 ms, rel_err 3.6e-3 against 2.3e-3: the scaling pass per block of rows costs more than
// the epilogues it saves).
// Where it stands against INT8 (2026-12-04, same Xeon, Qwen3-30B-A3B T = 3, 2 threads): 2.07-2.13 ms with
// the weights from DRAM against INT8's 1.52-1.54, 1.45 ms with one group of experts held in the L3
// against INT8's 0.96. A standalone loop of this step (one thread, W and the images in L1, M = 4)
// takes 29 ns per 16 x 64 weights for the conversion alone, 11 for the tiles alone, 45 for both as
// here and 35 with the images converted two steps ahead (four buffers): the conversion's permutes are
// a floor of ~28 ps a weight, where INT8's whole call costs ~25 from the L3. In the kernel the images
// two steps ahead (three buffers) measured 0.98-0.99x the time from DRAM and 1.00-1.03x from the L3,
// and not kept: the time is the stream's plus the conversion's, as for the other kernels here.
// Since 2026-12-06 the conversion is by shifts where a row's 64 bytes are all normals (f8f_convert,
// below) and each row's line two steps ahead is prefetched into L1, and M = 2 takes the tiles too:
// Qwen3-30B-A3B M = 2 / 3 / 4 0.96 / 0.86 / 0.87x the time from DRAM, Mixtral-8x7B 0.97 / 0.94 / 1.01x
// (see f8f_convert for the method and the steps).
constexpr int kF8FewMaxM = 4;
#if defined(HINA_EMU_AMX)
constexpr int kF8FewMinM = 1;   // the emulated build takes the tiles for every M <= 4: the same tests run them
#else
constexpr int kF8FewMinM = 2;
#endif
inline bool f8_few(int M, int K) { return M >= kF8FewMinM && M <= kF8FewMaxM && K % 64 == 0; }
// The images hold the weights times 2^-kF8fDown and the tokens arrive times 2^kF8fUp, so that a normal
// e4m3 byte becomes its image word by shifts, a mask and one add, no table (below); the block scale
// takes the 2^(kF8fDown - kF8fUp) back. Every e4m3 value times 2^-117 is a bf16 normal (the smallest
// subnormal, 2^-9, lands on 2^-126), which the tile unit reads (it treats subnormal inputs as zero);
// a product of the two is the true one times 2^-61, an fp32 normal down to |w x| = 2^-65. A token
// overflows only past 2^72.
constexpr int kF8fDown = 117, kF8fUp = 56;
constexpr float kF8fUnscale = float(1ull << (kF8fDown - kF8fUp));   // 2^61: the block scale's factor
// K element of pair p (its first; the second is 2 further) in chunk c of 32: chunk 2b + t of 64-block b
// holds the weights 64b + 2j + t in its word j (image t: the even bytes of the 64, then the odd ones)
inline int64_t f8f_elem(int c, int p) { return 64 * int64_t(c >> 1) + 4 * p + (c & 1); }
size_t amxf8f_packed_bytes(int M, int K, int) { return size_t(K) * M * sizeof(bf16_t); }
// d in that layout from at(m, e): token m's element e as fp32 (times 2^kF8fUp here, rounded to bf16)
template <class At>
void f8f_pack(int M, int K, bf16_t* d, At at) {
  constexpr float up = float(1ull << kF8fUp);
  for (int c = 0; c < K / 32; ++c)
    for (int p = 0; p < 16; ++p)
      for (int m = 0; m < M; ++m) {
        const int64_t e = f8f_elem(c, p);
        bf16_t* o = d + ((int64_t(c) * 16 + p) * M + m) * 2;
        o[0] = f32_to_bf16(at(m, e) * up);
        o[1] = f32_to_bf16(at(m, e + 2) * up);
      }
}
void amxf8f_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int, void* I) {
  f8f_pack(M, K, static_cast<bf16_t*>(I), [&](int m, int64_t e) { return bf16_to_f32(x[int64_t(rows[m]) * ldx + e]); });
}
void amxf8f_pack_act(const float* act, int M, int K, int, void* out) {
  f8f_pack(M, K, static_cast<bf16_t*>(out), [&](int m, int64_t e) { return act[int64_t(m) * K + e]; });
}

// rows [0, rows) of a tile, 64 weights each from src[r] + k, into the two A images (see above)
inline void f8f_convert_scalar(const uint8_t* const* src, int rows, int64_t k, bf16_t* img0, bf16_t* img1) {
  const float down = std::ldexp(1.0f, -kF8fDown);
  auto bf = [&](uint8_t b) { return f32_to_bf16(f8_bit_move(b) * kTwo120 * down); };   // exact
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 32; ++j) {
      img0[r * 32 + j] = bf(src[r][k + 2 * j]);
      img1[r * 32 + j] = bf(src[r][k + 2 * j + 1]);
    }
}
#if !defined(HINA_EMU_AMX)
alignas(64) constexpr F8Lut kF8LutDown = make_f8_lut(kF8fDown);
constexpr int kF8fAheadL1 = 128;   // the rows' line two steps ahead, into L1 (see f8f_convert)
// A row's 64 bytes b, read as 32 words: byte 2j (the low one) of word j becomes word j of image 0 as
// (b << 8) >> 4 (arithmetic: the sign fills bits 11..15), masked to the sign and the 7 bits of exponent
// and mantissa now at bf16's bits 4..10 (the e4m3 exponent field is bf16's low 4), plus 3 in the
// exponent: the value times 2^-117. The high byte 2j + 1 likewise by b >> 4. Right for every byte
// whose exponent field is not 0; a row with one that is (a zero or a subnormal) takes the tables of
// the values times 2^-117 (f8_bytes), put into the same order. NaN (0x7F, 0xFF) reads as 480: e4m3fn
// weights hold no NaN (quantize_fp8 clamps; a checkpoint with one is corrupt).
// Measured (2026-12-06, the AMX Xeon family 6 model 207, 2 threads, every token on the same top-k
// experts, weights rotated past the L3 (~0.7 GB) or one copy re-read ("L3"); each build in its own
// process, 3-4 alternated processes of 5 rounds, medians; the same modules loaded side by side in one
// process turned out to be one module: Python keeps the first extension of a name), against the tables
// with no L1 prefetch and M = 2 on the AVX-512 FP8 kernel:
//   - the shifts alone: Qwen3-30B-A3B M = 3 / 4 0.93-1.17x the time (within the runs' spread); the L1
//     prefetch alone, with the tables (put into this order by two blends): 1.01-1.08x; both: 0.73-0.91x.
//     perf had put the step's samples on the first use of each row's load (the rows come from L2 at
//     best: the next tile's prefetch), and the prefetch alone leaves port 5 (the tables' permutes and
//     unpacks) the bound;
//   - the L1 distance: 64 bytes 0.86-0.94x, 128 0.73-0.91x, 192 0.79-1.02x, 256 0.77-0.98x, 512
//     0.96-1.04x (T = 3, 4, both residencies);
//   - M = 2 on the tiles (with both): Qwen3-30B-A3B 0.95x from DRAM, 0.80x from the L3, Mixtral-8x7B
//     0.97x; M = 1 stays on the vector kernel (the tiles 1.12x the time from DRAM);
//   - the images converted two steps ahead (three or four buffers) instead of one: 1.00-1.21x, not kept;
//     nor an L1 prefetch of the INT8 decode tiles' rows (quant_avx512.cpp's vnni_tile / vnni_tilep, 128
//     or 256 bytes ahead: Qwen3-30B-A3B T = 1 / 2 / 4 0.98-1.09x).
//   As built: Qwen3-30B-A3B T = 1 / 2 / 3 / 4 1.41 / 1.61 / 1.65 / 1.68 ms from DRAM against 1.41 /
//   1.67 / 1.92 / 1.93 before (INT8 in the next run 1.42 / 1.41 / 1.45 / 1.48), Mixtral-8x7B 13.0 /
//   13.1 / 13.4 / 14.0 against 12.4 / 13.5 / 14.2 / 13.8 (T = 1: the same code; the runs' spread).
HINA_VBMI inline void f8f_convert(const uint8_t* const* src, int rows, int64_t k, const F8Tables& tab, bf16_t* img0,
                                  bf16_t* img1, const uint8_t* const* nxt, int nrows) {
  const __m512i expo = _mm512_set1_epi8(0x78);
  const __m512i keep = _mm512_set1_epi16(int16_t(0x87F0));
  static_assert(kF8fDown <= 120, "the shifts' values are 2^-120 of the weights: only a rise fits an add");
  const __m512i bias = _mm512_set1_epi16(int16_t((120 - kF8fDown) << 7));
  for (int r = 0; r < rows; ++r) {
    if (r < nrows) _mm_prefetch(reinterpret_cast<const char*>(nxt[r] + k), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(src[r] + k + kF8fAheadL1), _MM_HINT_T0);
    const __m512i b = _mm512_loadu_si512(src[r] + k);
    __m512i e, o;
    if (__builtin_expect(_mm512_testn_epi8_mask(b, expo) == 0, 1)) {
      e = _mm512_add_epi16(_mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(b, 8), 4), keep), bias);
      o = _mm512_add_epi16(_mm512_and_si512(_mm512_srai_epi16(b, 4), keep), bias);
    } else {
      __m512i h, l;
      f8_bytes(b, tab, h, l);
      constexpr __mmask64 odd = 0xAAAAAAAAAAAAAAAAull;
      e = _mm512_mask_blend_epi8(odd, l, _mm512_slli_epi16(h, 8));
      o = _mm512_mask_blend_epi8(odd, _mm512_srli_epi16(l, 8), h);
    }
    _mm512_store_si512(img0 + r * 32, e);
    _mm512_store_si512(img1 + r * 32, o);
  }
}
#endif

// c[j * M + m] for rows j < n of the fp8 matrix (row 0 at w0 + n0 * ldw) x all M (<= 4) tokens.
// Software-pipelined: the next 64 weights of the tile's rows are converted into the other pair of
// images while the tile unit works on this pair (a tile load waits for the vector stores it reads to
// reach L1). The two products of a step accumulate in one tile: they were two (no chain between them),
// whose two stores and sums per 128 of K cost more than the chain (2026-12-06, the AMX Xeon model 207,
// each build in its own process, 3-4 alternated processes: one tile 0.95-0.98x the time at Qwen3-30B-A3B
// T = 2 / 4 from DRAM and the L3, 0.96-0.98x at Mixtral-8x7B).
void amxf8f_mm(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I, int M,
               int K, float* c) {
  const bf16_t* X = static_cast<const bf16_t*>(I);
#if !defined(HINA_EMU_AMX)
  static const bool vbmi = cpu_features().avx512_vbmi;
  const F8Tables tab(kF8LutDown);
#endif
  alignas(64) bf16_t img[2][2][16 * 32];
  alignas(64) float C[16 * 16];
  alignas(64) float acc[16 * 16];
  const uint8_t* src[16];
  const uint8_t* nxt[16];   // the next tile's rows: the same 64 bytes of each prefetched as this tile converts
  int nrows = 0;
  const int64_t chunk = int64_t(16) * M * 2;   // bf16 of one token chunk image
  auto convert = [&](int rows, int64_t k, bf16_t* i0, bf16_t* i1) {
#if !defined(HINA_EMU_AMX)
    if (vbmi) return f8f_convert(src, rows, k, tab, i0, i1, nxt, nrows);
#endif
    f8f_convert_scalar(src, rows, k, i0, i1);
  };
  int cfg_rows = -1;
  for (int r0 = 0; r0 < n; r0 += 16) {
    const int rows = n - r0 < 16 ? n - r0 : 16;
    if (rows != cfg_rows) {
      TileConfig cfg{};
      cfg.palette_id = 1;
      auto set = [&](int t, int r, int colsb) { cfg.rows[t] = uint8_t(r); cfg.colsb[t] = uint16_t(colsb); };
      set(0, rows, 64);          // tmm0, tmm1: the two A images (W rows)
      set(1, rows, 64);
      set(2, 16, 4 * M);         // tmm2, tmm3: the token chunks (B)
      set(3, 16, 4 * M);
      set(4, rows, 4 * M);       // tmm4: a 128-block's products
      _tile_loadconfig(&cfg);
      cfg_rows = rows;
    }
    for (int r = 0; r < rows; ++r) src[r] = reinterpret_cast<const uint8_t*>(w0 + int64_t(n0 + r0 + r) * ldw);
    nrows = n - r0 - 16 < 16 ? (n - r0 - 16 > 0 ? n - r0 - 16 : 0) : 16;
    for (int r = 0; r < nrows; ++r) nxt[r] = src[0] + int64_t(16 + r) * ldw;
    std::memset(acc, 0, sizeof(acc));
    // one scale for the tile's rows when they lie in one 128-row block (always, for tasks that start at
    // a multiple of 16): the epilogue is then four vector FMAs
    const bool one_block = (n0 + r0) / 128 == (n0 + r0 + rows - 1) / 128;
    int cur = 0;
    convert(rows, 0, img[0][0], img[0][1]);
    for (int64_t k0 = 0; k0 < K; k0 += 128) {
      _tile_zero(4);
      const int64_t k1 = K - k0 < 128 ? K : k0 + 128;
      for (int64_t k = k0; k < k1; k += 64) {
        _tile_loadd(0, img[cur][0], 64);
        _tile_loadd(2, X + (k / 32) * chunk, 4 * M);
        _tile_dpbf16ps(4, 0, 2);
        _tile_loadd(1, img[cur][1], 64);
        _tile_loadd(3, X + (k / 32 + 1) * chunk, 4 * M);
        _tile_dpbf16ps(4, 1, 3);
        if (k + 64 < K) convert(rows, k + 64, img[cur ^ 1][0], img[cur ^ 1][1]);
        cur ^= 1;
      }
      _tile_stored(4, C, 4 * M);   // rows x M fp32, dense
      const int64_t sb = k0 / 128;
      if (one_block) {
        const float sc = s0[int64_t((n0 + r0) / 128) * lds + sb] * kF8fUnscale;
        for (int i = 0; i < rows * M; ++i) acc[i] += sc * C[i];
      } else {
        for (int r = 0; r < rows; ++r) {
          const float sc = s0[int64_t((n0 + r0 + r) / 128) * lds + sb] * kF8fUnscale;
          for (int m = 0; m < M; ++m) acc[r * M + m] += sc * C[r * M + m];
        }
      }
    }
    std::memcpy(c + int64_t(r0) * M, acc, size_t(rows) * M * sizeof(float));
  }
  _tile_release();
}

constexpr auto amxf8f_gate_up = f8_gate_up<amxf8f_mm>;
constexpr auto amxf8f_down = f8_down<amxf8f_mm>;

// FP8 by (M, K): few tokens on the converted tiles above (K a multiple of 64), else the W-block tiles
template <const QuantMicroKernel& Few, const QuantMicroKernel& Many>
struct Fp8Split {
  static const QuantMicroKernel& of(int M, int K) { return f8_few(M, K) ? Few : Many; }
  static size_t packed_bytes(int M, int K, int g) { return of(M, K).packed_bytes(M, K, g); }
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int g, void* I) {
    of(M, K).pack_tokens(x, ldx, rows, M, K, g, I);
  }
  static void pack_act(const float* act, int M, int K, int g, void* out) { of(M, K).pack_act(act, M, K, g, out); }
  static void gate_up(const QGateUpTask& t) { of(t.M, t.K).gate_up(t); }
  static void down(const QDownTask& t) { of(t.M, t.K).down(t); }
};

}  // namespace

// The tiles alone (the emulated build's entries), and the real build's: experts with few tokens on a
// vector kernel of the same dtype (see the INT8 header and the FP8 section), the rest on the tiles.
// The split is by the expert's M, the same in its pack and its tile calls.
#if defined(HINA_EMU_AMX)
const QuantMicroKernel quant_microkernel_amx_int8{
    "amx-emulated", Dtype::int8, nullptr, /*task_rows=*/64, amx_packed_bytes, amx_pack_tokens, amx_pack_act,
    amx_gate_up, amx_down};
namespace {
const QuantMicroKernel amx_fp8_few{
    "amx-emulated", Dtype::fp8, nullptr, 64, amxf8f_packed_bytes, amxf8f_pack_tokens, amxf8f_pack_act, amxf8f_gate_up,
    amxf8f_down};
const QuantMicroKernel amx_fp8_tiles{
    "amx-emulated", Dtype::fp8, nullptr, 64, amxf8_packed_bytes, amxf8_pack_tokens, amxf8_pack_act, amxf8_gate_up,
    amxf8_down};
using Fp8 = Fp8Split<amx_fp8_few, amx_fp8_tiles>;
}  // namespace
const QuantMicroKernel quant_microkernel_amx_fp8{
    "amx-emulated", Dtype::fp8, nullptr, /*task_rows=*/64, Fp8::packed_bytes, Fp8::pack_tokens, Fp8::pack_act,
    Fp8::gate_up, Fp8::down};
#else
namespace {
const QuantMicroKernel amx_int8_tiles{
    "amx", Dtype::int8, "amx", 64, amx_packed_bytes, amx_pack_tokens, amx_pack_act, amx_gate_up, amx_down};
const QuantMicroKernel amx_fp8_tiles{
    "amx", Dtype::fp8, "amx", 64, amxf8_packed_bytes, amxf8_pack_tokens, amxf8_pack_act, amxf8_gate_up, amxf8_down};

template <const QuantMicroKernel& Few, const QuantMicroKernel& Many, int kFewMaxM>
struct ByTokens {
  static const QuantMicroKernel& of(int M) { return M <= kFewMaxM ? Few : Many; }
  static size_t packed_bytes(int M, int K, int g) { return of(M).packed_bytes(M, K, g); }
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int g, void* I) {
    of(M).pack_tokens(x, ldx, rows, M, K, g, I);
  }
  static void pack_act(const float* act, int M, int K, int g, void* out) { of(M).pack_act(act, M, K, g, out); }
  static void gate_up(const QGateUpTask& t) { of(t.M).gate_up(t); }
  static void down(const QDownTask& t) { of(t.M).down(t); }
  static constexpr QuantMicroKernel entry(Dtype dtype) {
    return {"amx", dtype, "amx", /*task_rows=*/256, packed_bytes, pack_tokens, pack_act, gate_up, down};
  }
};
// INT8: M <= 8 on the AVX-512 VNNI kernel; FP8: M = 1 on the AVX-512 FP8 kernel (quant_avx512.cpp), M = 2-4
// on the converted tiles (f8_few, above; M = 2 since 2026-12-06), the W-block tiles from 5. FP8's W-block
// tiles from M = 2 instead (2026-12-02, Qwen3-30B-A3B shapes, all 8 experts, from DRAM, builds alternated
// twice): T = 2 3.86-3.91 ms against 2.19-2.23, T = 4 3.78-3.80 against 3.11.
// INT8's split was at M <= 4 until the VNNI kernel gained its 8-token tiles' pair packing and prefetch;
// then (2026-12-03, AMX Xeon, isa "amx" against "avx512" in one process, every token on the same top-k
// experts, weights rotated past the L3, 5-7 alternated rounds, median ms) the VNNI kernel took
// Mixtral-8x7B M = 5 / 6 / 8 15.35 / 15.59 / 15.50 against the tiles' 15.96 / 16.02 / 16.25, Qwen3-30B-A3B
// M = 6 / 7 / 8 1.96 / 2.00 / 1.99 against 1.99 / 2.00 / 2.04; from M = 10 the tiles win (Qwen3 M = 10 / 12
// 2.07 / 2.11 against 2.42 / 2.65, Mixtral M = 12 16.69 against 19.72).
// Tried again and not kept (2026-12-06, the AMX Xeon family 6 model 207, 2 threads, each build in its own
// process, 3 alternated processes of 5 rounds, weights rotated past the L3 or one copy re-read; a noisy
// day: the base build's processes read up to 20% apart): the tiles (as they are now, with the L1
// prefetch) for every M, Qwen3-30B-A3B T = 1 / 2 / 4 1.01 / 1.04 / 1.00x the VNNI kernel's time from
// DRAM and 1.18 / 1.20 / 1.11x from the L3; with the few-token B tiles packed dense (stride 4 M bytes:
// one line a step, not 16; perf had put a fifth of the tiles' samples after the B loads) 1.17 / 1.04 /
// 1.04x and 1.11 / 1.07 / 1.11x; with an epilogue for M <= 4 over dense C stores (one gather of the 16
// rows' scales a group, M vectors) no better: T = 1 0.99 / 1.18x, T = 2 / 4 1.22-1.77x (cause not
// pinned down; the C tiles' rows then 4 M bytes apart, several rows a line).
using Int8ByTokens = ByTokens<quant_microkernel_avx512_int8, amx_int8_tiles, 8>;
using Fp8ByTokens = ByTokens<quant_microkernel_avx512_fp8, amx_fp8_tiles, 4>;
const QuantMicroKernel amx_fp8_vec_or_tiles = Fp8ByTokens::entry(Dtype::fp8);
const QuantMicroKernel amx_fp8_few{
    "amx", Dtype::fp8, "amx", 256, amxf8f_packed_bytes, amxf8f_pack_tokens, amxf8f_pack_act, amxf8f_gate_up,
    amxf8f_down};
using Fp8 = Fp8Split<amx_fp8_few, amx_fp8_vec_or_tiles>;
}  // namespace
const QuantMicroKernel quant_microkernel_amx_int8 = Int8ByTokens::entry(Dtype::int8);
const QuantMicroKernel quant_microkernel_amx_fp8{
    "amx", Dtype::fp8, "amx", /*task_rows=*/256, Fp8::packed_bytes, Fp8::pack_tokens, Fp8::pack_act, Fp8::gate_up,
    Fp8::down};
#endif

}  // namespace hina
