// The AVX2 quantized micro-kernels (compiled with -mavx2 -mfma -mf16c; run only after
// isa_usable("avx2")): INT8 W8A8 group-wise and FP8 e4m3 weight-only, quant.h's contract.
//
// INT8 W8A8 (Zen 3 has no VNNI). The product of int8 weights and int8 activations is formed with the
// vpmaddubsw "sign trick": per 32 weights of a W row, |w| once (vpabsb, shared by every token of the
// tile); per token sign(x, w) (vpsignb: x negated where w < 0, zero where w = 0), vpmaddubsw (|w| as
// u8 times that as s8, adjacent pairs summed to int16), vpmaddwd by ones (pairs of those to int32) and
// vpaddd: 4 ops per token and 32 multiply-adds. Exact: the activations are in [-127, 127] (the gather
// clamps), |w| <= 128, so a pair sum is at most 2 * 128 * 127 = 32512 < 2^15 and never saturates. The
// activations are packed as int8 (32 bytes a step per token). Until 2026-12-07 the tiles widened both
// sides to int16 (vpmovsxbw of 16 weights once per row, the token's int16 packed in the gather) and
// made 16 multiply-adds with one vpmaddwd + one vpaddd per token. Side by side (Zen 3, 2026-12-07, one
// process, the two forms built as two kernels and switched per call between the function pointers, 8
// rounds, two expert sets rotated, g = 128, 2 threads, read probe 31-37 GB/s; sign-trick / widen time,
// medians): int8 T = 1 Mixtral-8x7B 0.96x, Qwen3-30B-A3B 0.99x, DeepSeek-V3 0.99x; T = 2 0.95x / 1.00x;
// T = 4 0.97x / 0.94x; T = 8 Mixtral 0.75x. In alternating processes (4 rounds; the memory-bound T <= 2
// too noisy that way: each process's pages read at their own rate): T = 4 Mixtral / Qwen3 0.95 / 0.95x,
// T = 8 Qwen3 0.71x, T = 16 Mixtral 0.74x. (A first A/B with both forms behind a runtime switch inside
// the tile read T = 4 0.78x: the switch had slowed the widen form's code.) The decode tiles gain little
// because they wait on W's stream more than on the ALU; the blocked path (T > 4), which re-reads a W
// tile from L1 for each 4 tokens, gains what the step does. The int32 lanes hold other partial sums
// (4 adjacent weights a lane, where the widen form's lane held 2 + 2 sixteen apart), so the fp32 results
// differ from the old form's in the last bits; every AVX2 tile takes the same form (decode and blocked
// paths give the same bits). The register-only probe of this step is hinabench peak's
// avx2-int8-maddubs (kernels/probes/probes_avx2.cpp), the int8 rows' compute ceiling on AVX2.
// Tried beside it (same method, 6 rounds, time over this form): each group's R x TT int32 sums reduced
// across lanes with vphaddd into one vector of (row, token) sums, the scales then applied to that vector
// in registers (a third of the epilogue's ops at 2 x 4): T = 1 / 2 / 4 / 8 / 16 1.00-1.03 / 1.07 /
// 1.04-1.08 / 1.06 / 1.08x (vphaddd is slow here); the rows in the outer loop inside a group (no x kept in
// registers across rows, so no spill at 2 x 4): T = 4 0.98-1.00x, T = 8 1.02x. Neither made. With this
// step the decode blocking was re-tried (kAvx2Blocking below): 4 rows at M = 2 1.03 / 1.06 / 1.01x (Qwen3 /
// Mixtral / DeepSeek-V3 int8 T = 2), no next-tile prefetch at M = 3 / 4 0.98-1.01x: kept as it is.
//   Per group of g (32/64/128) along K: int32 accumulators from zero, then one fp32 multiply-add
//   acc += float(int32) * (s_w[row][group] * s_x[token][group]); the lanes are summed at the end.
//   The fp32 sums live in a small L1 array (a load and a store per row, token and group), not in
//   registers: AVX2 has 16, and R x TT int32 sums plus R x TT fp32 sums plus TT tokens spilled inside
//   the K loop from 2 rows x 3 tokens up. The K loop is unrolled twice (without it GCC copied each
//   int32 sum with a vmovdqa every step). Side by side (dev A/B, 5-7 interleaved rounds, 2 threads,
//   g = 128; measured with the int16 widen form of the step, before 2026-12-07) against the register
//   form: Mixtral-8x7B T = 1 / 2 / 3 / 4 / 8 1.03x / 1.04x / 1.16x / 1.23x / 0.96x, Qwen3-30B-A3B
//   1.01x / 1.00x / 1.10x / 1.16x / 0.98x. The same change to the FP8 tile: 1.00-1.04x (its 11
//   unpack ops and 4 FMAs per 32 weights bind first), not made.
//   Activations are quantized per token and group in the gather (amax, inv = 127/amax, round half
//   to even: the same steps as hinabench.quant.quantize_act); the SiLU(gate)*up intermediate is
//   kept in fp32 by gate_up's store and re-quantized per token and group by pack_act for down.
//
// FP8 e4m3 weight-only. No FP8 hardware: each 32-byte chunk of a W row is turned into fp16 bits with
// integer ops and into fp32 with F16C. e4m3 and fp16 have the same form (sign, exponent, mantissa,
// subnormals below the smallest exponent), fp16 with one more exponent bit and seven more mantissa
// bits: a byte placed at the top of a 16-bit lane (vpunpck{l,h}bw with zero), shifted arithmetically
// right by 1 and masked with 0xBF80 is exactly the e4m3 value times 2^-8, subnormals included; the
// 2^8 is folded into the block scale. vcvtph2ps turns fp16 subnormals into fp32 normals. Per 32
// weights: 1 load, 2 unpacks, 2 shifts, 2 ands, 2 lane extracts and 4 vcvtph2ps per row (shared by
// the tile's tokens), 4 FMAs per token; the tokens are plain fp32 in order (the four vectors are
// weights 0-7, 8-15, 16-23, 24-31 of the chunk).
// Per 128-element K block: fp32 block accumulators, then acc += block * (scale_inv * 2^8).
// This is the "unpack once, reuse across the block's tokens" of SGLang's FP8 path done in registers
// (a W chunk is unpacked once per tile of up to 4 tokens), not through an L1/L2 bf16 buffer.
// Until 2026-12-03 the chunk went straight to fp32 bits (byte at bits 24..31 of a 32-bit lane,
// arithmetic shift right by 4, mask 0x87F00000: the value times 2^-120; 11 integer ops per 32). That
// made a subnormal e4m3 (exponent 0, mantissa 1..7) an fp32 denormal, and on Intel cores every FMA
// reading one takes a microcode assist (DAZ is off, as it must be for exact results). Measured on a
// Xeon (family 6 model 207, 2 threads, the problem's codes with a seeded fraction f replaced by
// subnormals of the same sign): Mixtral-8x7B T = 1 13.1 / 13.5 / 20.4 ms at f = 0 / 1e-4 / 1e-3, T = 4
// 26.6 / 29.5 at 0 / 1e-4; Qwen3-30B-A3B T = 4 3.2 / 3.6 / 6.6 / 36 ms at 0 / 1e-4 / 1e-3 / 1e-2.
// hinabench.quant's 128x128 quantization of Gaussian weights gives f ~1e-4, of Student-t (nu = 3, 4)
// weights 5e-4..1e-3. Nor were subnormal codes the only source: with the weights 2^-120 low, a small
// code times a small activation is below fp32's normal range as well, and weights and activations
// spread over many binades (uniform, Gaussian) took assists with no subnormal code at all (AMX Xeon,
// same process, weights rotated past the L3, fp16 step / bit move: uniform weights and activations,
// Qwen3-30B-A3B T = 4 3.29 / 5.87 ms, the bit move 3.54 with FTZ/DAZ set; Gaussian weights, subnormal
// codes cleared, Qwen3 T = 1 / 2 / 4 0.95 / 0.77 / 0.69x the time, Mixtral-8x7B T = 1 / 4 1.00 / 0.76x;
// 1e-3 of the codes subnormal, Qwen3 T = 1 / 4 0.75 / 0.40x). On the problems' own fill (two binades,
// kernels/fill.cpp), where neither form meets an assist, the fp16 step costs 1.08-1.10x at T = 1 (its
// four vcvtph2ps are two uops each; from 16-byte halves with 128-bit unpacks, or with 16-bit shifts
// and no unpacks, the register loop was no faster) and 0.96-1.00x from T = 2. Zen 3: not measured.
// What bounds FP8 against INT8 on Zen 3 (2026-12-07, one core, a C++ loop over these tiles with W in L1,
// TSC cycles per 64 bytes of W): T = 1 (4 rows) FP8 12.4 against INT8 3.2 (side by side); 2 x 2 15.4 /
// 5.8, 2 x 4 23.5 / 11.6-15.2 (minutes apart; the host's rates moved by up to 2x within the hour).
// Instruction rates measured there (TSC cycles an instruction, 8 independent chains): vcvtph2ps ymm
// 0.76 (one a core cycle), vextracti128 0.76, vpmovsxbd 0.93, vpunpck*, vpsra*, vpshufb, vcvtdq2ps
// 0.38, vpand 0.21, vpmaddwd and vfmadd 0.39-0.40. So at T = 1 the four vcvtph2ps (and two extracts)
// of 32 weights take longer than INT8's whole step, and from T = 2 INT8's vpmaddwd makes 16
// multiply-adds an instruction where the FP8 tile's fp32 FMA makes 8: FP8 >= 0.9x INT8 (issue 13's
// target) is out of reach with AVX2's instructions wherever INT8 runs at the memory rate or at its own
// compute rate. Other e4m3 steps in the same loop (tiles 4 x 1, 2 x 1, 2 x 2,
// 2 x 4), their time / this one's: 8 bytes per vpmovsxbw (+ shift, and; no extracts) 1.01-1.04x; 16-byte
// halves unpacked in 128 bits 1.02-1.04x; two FMA chains per accumulator in a block 0.98-0.99x; straight
// to fp32 bits (the pre-2026-12-03 form, denormal results, so not taken) 0.82-1.00x.
//
// Tiles: R W rows x TT tokens, rows in the outer loop and the tokens' tiles inside, so a task's
// W rows stream from memory once (R rows' slice stays in L1/L2 across the token tiles); the decode
// blocking (rows per tile, the next tile's L2 prefetch, gate/up interleave) is kAvx2Blocking below.
#include <immintrin.h>

#include "quant_glue.h"

#ifndef HINA_QUANT_DEFAULT_PREFETCH
#define HINA_QUANT_DEFAULT_PREFETCH 0
#endif

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

constexpr int kDefaultPrefetch = HINA_QUANT_DEFAULT_PREFETCH;

// Software prefetch distance along a W row, bytes (0: none): HINA_QUANT_PREFETCH, read once. Each
// group (int8) / block (fp8) start prefetches its bytes `distance` ahead in every row of the tile.
int prefetch_distance() {
  static const int d = [] {
    const char* e = std::getenv("HINA_QUANT_PREFETCH");
    return e ? std::atoi(e) : kDefaultPrefetch;
  }();
  return d;
}
inline void prefetch_rows(const int8_t* const* w, int R, int k, int bytes, int dist) {
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(w[r] + k + dist + b), _MM_HINT_T0);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ================================ INT8 W8A8: the tile ============================================
template <int R, int TT, int PF>
inline void i8_tile(const int8_t* const* w, const float* const* sw, const int8_t* const* x,
                    const float* const* sx, int kb0, int kb1, int group, float* c, int ldc,
                    const int8_t* const* nxt) {
  // The fp32 sums zeroed with vector stores: a scalar loop became rep stosq, and the vector loads of
  // the first group's update then waited on the failed store forwarding (~8% of the down projection's
  // samples at Qwen3-30B-A3B T = 2).
  alignas(32) float accm[R * TT * 8];
  #pragma GCC unroll 32
  for (int i = 0; i < R * TT; ++i) _mm256_store_ps(accm + 8 * i, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1);
  const int pf = prefetch_distance();
  for (int k0 = kb0, gi = kb0 / group; k0 < kb1; k0 += group, ++gi) {
    if (pf) prefetch_rows(w, R, k0, group, pf);
    if constexpr (PF == 2) prefetch_l2_rows<R>(nxt, k0 - kb0, group);
    __m256i acc[R][TT];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int k = k0; k < k0 + group; k += 32) {
      __m256i xv[TT];
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t] + k));
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        const __m256i aw = _mm256_abs_epi8(wv);
        #pragma GCC unroll 8
        for (int t = 0; t < TT; ++t)
          acc[r][t] = _mm256_add_epi32(
              acc[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv)), ones));
      }
    }
    // acc += float(int32) * (s_w * s_x): the scale product in vector form (the same IEEE product as the
    // scalar one it replaced, one op fewer per row and token).
    __m256 sxv[TT];
    #pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) sxv[t] = _mm256_broadcast_ss(sx[t] + gi);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 swv = _mm256_broadcast_ss(sw[r] + gi);
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        float* a = accm + (r * TT + t) * 8;
        _mm256_store_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][t]), _mm256_mul_ps(swv, sxv[t]), _mm256_load_ps(a)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) c[r * ldc + t] += hsum(_mm256_load_ps(accm + (r * TT + t) * 8));
}

// ================================ FP8 e4m3: the tile =============================================
struct F8W { __m256 v[4]; };
inline F8W f8_load(const int8_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256(), mask = _mm256_set1_epi16(int16_t(0xBF80));
  // in-lane unpacks: lo holds bytes 0-7 | 16-23, hi bytes 8-15 | 24-31, each at the top of a 16-bit lane
  const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, b), 1), mask);
  const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, b), 1), mask);
  F8W w;
  w.v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(lo));
  w.v[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(hi));
  w.v[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1));
  w.v[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1));
  return w;
}

// c[r * ldc + t] = sum_blocks s[r][blk] * sum_{k in blk} W_r[k] * X_t[k]   (s already x 2^8)
template <int R, int TT, int PF>
inline void f8_tile(const int8_t* const* w, const float* const* s, const float* const* x, int kb0,
                    int kb1, float* c, int ldc, const int8_t* const* nxt) {
  __m256 acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_ps();
  const int pf = prefetch_distance();
  for (int k0 = kb0, bi = kb0 / 128; k0 < kb1; k0 += 128, ++bi) {
    const int k1 = k0 + 128 < kb1 ? k0 + 128 : kb1;
    if (pf) prefetch_rows(w, R, k0, k1 - k0, pf);
    if constexpr (PF == 2) prefetch_l2_rows<R>(nxt, k0 - kb0, k1 - k0);
    __m256 blk[R][TT];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) blk[r][t] = _mm256_setzero_ps();
    for (int k = k0; k < k1; k += 32) {
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const F8W wv = f8_load(w[r] + k);
        #pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) {
          const float* xp = x[t] + k;
          __m256 a = blk[r][t];
          a = _mm256_fmadd_ps(wv.v[0], _mm256_loadu_ps(xp), a);
          a = _mm256_fmadd_ps(wv.v[1], _mm256_loadu_ps(xp + 8), a);
          a = _mm256_fmadd_ps(wv.v[2], _mm256_loadu_ps(xp + 16), a);
          a = _mm256_fmadd_ps(wv.v[3], _mm256_loadu_ps(xp + 24), a);
          blk[r][t] = a;
        }
      }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 sv = _mm256_set1_ps(s[r][bi]);
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_fmadd_ps(blk[r][t], sv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) c[r * ldc + t] += hsum(acc[r][t]);
}

// ================================ the kernel structs (quant_glue.h) ==============================
// The decode blocking (quant_glue.h's QBlocking), chosen side by side in one process (dev A/B, 5
// interleaved rounds, each round's efficiency over its own read probe; Mixtral-8x7B and Qwen3-30B-A3B
// shapes, g = 128, 2 threads) against the first kernel's {rows 8 at M = 1, else 2; no prefetch; gate
// then up}:
//   kept:    gate and up rows interleaved, 4 rows at M = 1, 2 rows from M = 2, each tile prefetching
//            the next one into L2 (at M = 1 no longer: below): int8 Mixtral T = 1 / 2 / 3 / 4 1.14x /
//            1.30x / 1.39x / 1.34x (efficiency 0.88 / 0.84 / 0.78 / 0.67), Qwen3-30B-A3B 1.37x / 1.59x /
//            1.70x; fp8 Mixtral
//            1.12x / 1.42x / 1.36x (0.87 / 0.71 / 0.55); T = 8 (no decode tiles) unchanged;
//   dropped: interleave alone (8 rows, no prefetch): 1.03x / 1.28x / 1.19x at T = 1 / 2 / 4;
//            8 rows with the prefetch at M = 1: 0.93x; 2 rows with it: 0.95x of the kept one;
//            4 rows with it at M = 2: 0.82-0.92x; no prefetch at M = 2: 0.92x; 1 row at M = 3, 4:
//            0.87-0.91x; the kept blocking without the interleave: 0.95-0.99x.
// Spread (QBlocking::spread: a tile's rows a task's n / R rows apart, each its own stream), measured on
// Zen 3 on 2026-12-07 (one process, the two blockings alternated, 8-10 rounds, two expert sets rotated,
// g = 128, 2 threads; new / old time, median of each): int8 T = 1 Mixtral-8x7B 0.92 / 0.91 / 0.95x (three
// runs), Qwen3-30B-A3B 0.74 / 0.84x, DeepSeek-V3 0.90x, Qwen2-57B-A14B 0.92x; fp8 T = 1 Mixtral 0.98x,
// Qwen3 0.96 / 0.95x; from M = 2 no gain then (int8 T = 2 Mixtral 1.03x, Qwen3 0.93x; T = 4 1.09x / 0.99x,
// within the MADs of a slow stretch, with 64-row tasks): taken at M = 1 only (from M = 2 see below). 4
// spread rows at M = 2 and 4 (the AVX-512 VNNI kernel's choice) were slower: int8 T = 2 1.05x / 1.00x,
// T = 4 1.15x / 1.13x (Mixtral / Qwen3, 8 rounds).
// At M = 1 again later that day (int8 T = 1, Mixtral / Qwen3, 8 rounds, a slow stretch: read probe ~32 GB/s),
// against this blocking: spread 4 rows without the next tile's L2 prefetch 0.99 / 0.99x (within the MADs);
// 8 spread rows without it 0.99 / 1.12x, with it 1.12 / 1.30x; 2 spread rows with it 1.04 / 1.10x.
// From M = 2, spread too (2026-12-07, later; one process, the down projection's tiles switched by a
// temporary switch, 6-8 rounds, two expert sets rotated, g = 128, 2 threads, a slow stretch: read probe
// 31-35 GB/s; new / old time, same bits). With 2 rows a tile gate_up's tiles are unchanged (a gate row
// and its up row, already two streams); the down projection's two rows become two streams half a task
// apart instead of one run of adjacent rows, which for short rows (Qwen3-30B-A3B's 768 bytes: a tile of
// 1.5 KiB) kept too few lines in flight (the tasks are now byte-sized: kAvx2TaskBytes below). int8
// T = 2: Qwen3-30B-A3B 0.87x (1.29 against 1.49 ms), DeepSeek-V3 0.85x (10.05 / 11.90), Qwen3-235B-A22B
// 0.88x, Qwen2-57B-A14B 0.92x, Mixtral-8x7B 0.98x; T = 3 Qwen3 / DeepSeek 0.97 / 0.95x; T = 4 Qwen3
// 0.88x, DeepSeek 0.88x, Mixtral 0.90x; fp8 T = 2 Qwen3 0.99x (compute-bound). Down tiles tried beside
// it at M = 2 (time over the old): 4 spread rows with the prefetch 0.86x (at T = 3 / 4 1.01 / 1.00x: 12
// and 16 accumulators), 4 spread rows without it 0.86x (T = 4 0.98x), 2 spread rows without it 0.90x, 4
// adjacent rows with it 1.04x.
// At M = 1 the 4 spread rows no longer prefetch the next tile into L2 (2026-12-07, later still; same method,
// 6-8 rounds, without / with, in fast and slow stretches: read probe 34-48 GB/s): int8 T = 1 Mixtral-8x7B
// 0.89 / 0.99x (a fast, then a slow stretch; 7.47 against 8.44 ms at 48 GB/s), Qwen3-30B-A3B 0.94 / 0.96x,
// DeepSeek-V3 0.91x, Qwen3-235B-A22B 0.94x, Qwen2-57B-A14B 0.93x; fp8 T = 1 Qwen3 / Mixtral 0.97 / 0.98x.
// The slow stretch above had read them equal (0.99 / 0.99x). 8 spread rows in the fast stretch: without
// the prefetch Qwen3 / Mixtral 1.06 / 0.99x, with it (Qwen3) 1.26x. At M = 2 the prefetch still pays
// (without it: Mixtral / Qwen3 / DeepSeek-V3 int8 T = 2 1.03 / 1.03 / 1.09x the time, probe 36-38 GB/s).
constexpr QBlocking kAvx2Blocking{/*rows=*/{2, 4, 2, 2, 2}, /*prefetch=*/{0, 0, 2, 2, 2}, /*interleave=*/true,
                                  /*spread=*/{false, true, true, true, true}};

// Task size (QuantMicroKernel::task_bytes): a task covers at least 384 KiB of W, not only 64 rows, so short
// rows make longer streams (rows per task: Qwen3-30B-A3B down 512, gate/up 96; Qwen3-235B-A22B down 256;
// DeepSeek-V3 down 192; Qwen2-57B-A14B down 128; Mixtral and the gate/up of the others stay 64). Zen 3,
// 2026-12-07, one process, the task rows alternated by a temporary switch, 8 rounds, two expert sets
// rotated, g = 128, 2 threads, new / old time (same bits): int8 T = 1 Qwen3-30B-A3B 0.91x (down 256 / 512
// rows alone: 0.93-0.95x / 0.90x), Qwen3-235B-A22B 0.94x, DeepSeek-V3 1.00x, Qwen2-57B-A14B 1.00x; T = 2
// Qwen3 0.94x, Qwen3-235B 0.97x; T = 4 Qwen3 0.97x; fp8 T = 1 / 2 Qwen3 0.93 / 0.99x; from M = 5 (the
// blocked path, which takes the same tasks) int8 / fp8 T = 8 1.01 / 1.00x, T = 16 0.98 / 0.98x (6 rounds); a
// third T = 1 run 0.92x. The BF16 kernel's tasks (another driver, K-split pieces) went the other way with
// 256 / 512 down rows: Qwen3 T = 1 / 2 1.05-1.09x, not made. A deeper software prefetch for short rows
// instead (the tile 4 / 8 KiB ahead rather than the next one): int8 Qwen3 T = 1 1.03x, T = 2 1.01-1.05x, not
// made. At M = 2 (same method, in a slow stretch) the next tile prefetched into L1 instead of L2:
// Qwen3 / Mixtral 1.06x / 1.01x; with a second L2 prefetch 4 KiB further: 1.04x / 1.03x.
constexpr int kAvx2TaskBytes = 384 * 1024;

struct Int8Kn {
  static constexpr Dtype dtype = Dtype::int8;
  static constexpr QBlocking kBlocking = kAvx2Blocking;
  template <int R, int TT, int PF>
  static void tile(const int8_t* const* w, const float* const* sw, const void* I, int M, int K, int group,
                   int kb0, int kb1, int t0, float* c, int ldc, const int8_t* const* nxt) {
    const int8_t* x[TT];
    const float* sx[TT];
    const int8_t* q = static_cast<const int8_t*>(I);
    const float* s = i8_s<int8_t>(I, M, K);
    for (int t = 0; t < TT; ++t) {
      x[t] = q + int64_t(t0 + t) * K;
      sx[t] = s + int64_t(t0 + t) * (K / group);
    }
    i8_tile<R, TT, PF>(w, sw, x, sx, kb0, kb1, group, c, ldc, nxt);
  }
  // the scales of row (n0 + j): int8 one row of K/group
  static const float* scale_row(const float* s, int64_t lds, int row, int) { return s + int64_t(row) * lds; }
};

struct Fp8Kn {
  static constexpr Dtype dtype = Dtype::fp8;
  static constexpr QBlocking kBlocking = kAvx2Blocking;
  template <int R, int TT, int PF>
  static void tile(const int8_t* const* w, const float* const* sw, const void* I, int, int K, int,
                   int kb0, int kb1, int t0, float* c, int ldc, const int8_t* const* nxt) {
    const float* x[TT];
    for (int t = 0; t < TT; ++t) x[t] = static_cast<const float*>(I) + int64_t(t0 + t) * K;
    f8_tile<R, TT, PF>(w, sw, x, kb0, kb1, c, ldc, nxt);
  }
  static const float* scale_row(const float* s, int64_t lds, int row, int) { return s + int64_t(row / 128) * lds; }
};

}  // namespace

const QuantMicroKernel quant_microkernel_avx2_int8{
    "avx2", Dtype::int8, "avx2", /*task_rows=*/64, i8_packed_bytes<int8_t>,
    i8_pack_tokens<int8_t, 0>, i8_pack_act<int8_t, 0>,
    q_gate_up<Int8Kn>, q_down<Int8Kn>, /*task_rows_now=*/nullptr,
    /*task_bytes=*/kAvx2TaskBytes};
const QuantMicroKernel quant_microkernel_avx2_fp8{
    "avx2", Dtype::fp8, "avx2", /*task_rows=*/64, f8_packed_bytes, f8_pack_tokens, f8_pack_act,
    q_gate_up<Fp8Kn>, q_down<Fp8Kn>, /*task_rows_now=*/nullptr,
    /*task_bytes=*/kAvx2TaskBytes};

}  // namespace hina
