// The AVX-512 BF16 attention micro-kernel (`vdpbf16ps`), for CPUs without AMX (Zen 4/5, Cooper Lake).
//
// Built twice from this one source, like microkernel_avx512.cpp: for real (-mavx512bf16 ..., `_C`, isa
// "avx512") and against SIMDe's portable AVX-512 (HINA_EMU_AVX512, `_C_avx512_emu`, isa
// "avx512-emulated"), so its logic runs in the same tests on CPUs without AVX-512.
//
// Along d, query rows and K rows are both contiguous bf16, so the scores need no transform of K at all:
//     acc_lane[i] += Q[2i] * K[2i] + Q[2i+1] * K[2i+1]          (vdpbf16ps, 32 elements per zmm)
// Transformation 1 is a plain copy of the bf16 query rows (exact: the scale is applied to the fp32
// scores, never rounded into Q); the scale sits in the packed buffer's first 64 bytes.
// P x V needs pairs along the keys: the V tile is converted on demand -- 32 columns of V_j and V_j+1
// interleaved into (V_j[c], V_j+1[c]) pairs by one vpunpcklwd and one vpunpckhwd, which work within
// 128-bit lanes, so O keeps each 32-column block in their order and unpack_o restores it (the I side
// moves, as in the FP8 kernel) -- and the probabilities are rounded to bf16 pairs (P_j, P_j+1), as
// every bf16 kernel rounds them. O stays fp32. The unpacks replaced a vinserti64x4 and a vpermw per 16
// columns (half the shuffles; bit-identical; Zen 4, 2026-12-03, same process: 0.96-0.99x the time at
// Qwen3-30B-A3B and Mixtral-8x7B, l = 1024 / 4096 / 16384, paged and contiguous).
// Tiles: scores 4 rows x 4 keys (16 zmm accumulators, their 16 sums at once: vec512::hsum16x16);
// P x V 4 rows x 64 columns (16 zmm). The scores' sums one at a time (_mm512_reduce_add_ps) cost
// more than their dot products (d = 128: 4 vdpbf16ps per sum); 16 at once, on Zen 4 (2026-12-02,
// contiguous cache, against hina:avx2 in the same run, before -> after) Qwen3-30B-A3B l = 16384
// 0.98 -> 0.80x of hina:avx2's time (3.09 ms), Mixtral-8x7B l = 4096 / 16384 0.97 / 0.90 -> 0.78 / 0.76x.
// An unmasked chunk of 32 keys runs as one fused step (`step`, below) instead of the three calls: the
// same bits, about two thirds of the instructions' time, and the next step's lines prefetched a few
// at a time between its tiles.
#if defined(HINA_EMU_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include "emu/simde_masked.h"
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "isa/avx512/attention_vec512.h"
#include "isa/avx512/dpbf16.h"
#include "microkernel.h"   // avx512_blocking_zen5
#include "ops/attention.h"
#include "ops/attention_prefetch.h"   // LinePrefetch

namespace hina {
namespace {

using vec512::exp2_ps;
using vec512::first_lanes;
using vec512::hsum16;
using vec512::hsum16x16;
using vec512::softmax_step;

constexpr int kQOffset = 16;   // floats before the packed bf16 rows (the scale, then padding)

inline __m512i load_row32(const bf16_t* p, bool half) {
  if (half) {   // the last 16 elements of a head_dim that is an odd multiple of 16: zero-extended
    __m256i lo;
    std::memcpy(&lo, p, 32);
    return _mm512_inserti64x4(_mm512_setzero_si512(), lo, 0);
  }
  __m512i v;
  std::memcpy(&v, p, 64);
  return v;
}
inline __m512bh as_bh(__m512i v) {
  __m512bh b;
  std::memcpy(&b, &v, 64);
  return b;
}

void pack_q(const bf16_t* const* rows, int nrows, int d, float scale, float* qp) {
  qp[0] = scale;
  bf16_t* q = reinterpret_cast<bf16_t*>(qp + kQOffset);
  for (int r = 0; r < nrows; ++r) std::memcpy(q + int64_t(r) * d, rows[r], size_t(d) * sizeof(bf16_t));
  // zero rows up to a multiple of 4, which the fused step computes and drops (within the buffer's
  // headroom of 16 rows: ops/attention.cpp, q_stride)
  std::memset(q + int64_t(nrows) * d, 0, size_t((-nrows & 3) * d) * sizeof(bf16_t));
}

template <int R, int KJ>
inline void scores_tile(const bf16_t* q, int d, const bf16_t* const* keys, float* S, int lds, float scale) {
  __m512 acc[R * KJ];
  for (int i = 0; i < R * KJ; ++i) acc[i] = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 32) {
    const bool half = d - c < 32;
    __m512bh k[KJ];
    for (int jj = 0; jj < KJ; ++jj) k[jj] = as_bh(load_row32(keys[jj] + c, half));
    for (int r = 0; r < R; ++r) {
      const __m512bh qr = as_bh(load_row32(q + int64_t(r) * d + c, half));
      for (int jj = 0; jj < KJ; ++jj) acc[r * KJ + jj] = dpbf16(acc[r * KJ + jj], qr, k[jj]);
    }
  }
  if constexpr (R * KJ == 16) {  // the 16 sums at once (the same bits as one at a time), row r's 4 keys
                                 // in lanes 4r .. 4r + 3: one 128-bit store per row (against 16 scalar
                                 // copies through a buffer, Zen 4, 2026-12-02, batch-1 decode, two copies
                                 // of each build alternated: 0.93-0.99x the time)
    const __m512 s = _mm512_mul_ps(hsum16x16(acc), _mm512_set1_ps(scale));
    _mm_storeu_ps(S, _mm512_castps512_ps128(s));
    _mm_storeu_ps(S + lds, _mm512_extractf32x4_ps(s, 1));
    _mm_storeu_ps(S + 2 * int64_t(lds), _mm512_extractf32x4_ps(s, 2));
    _mm_storeu_ps(S + 3 * int64_t(lds), _mm512_extractf32x4_ps(s, 3));
  } else {
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < KJ; ++jj) S[int64_t(r) * lds + jj] = hsum16(acc[r * KJ + jj]) * scale;
  }
}

template <int R>
inline void scores_rows(const bf16_t* q, int d, const bf16_t* const* keys, int nkeys, float* S, int lds, float scale) {
  int j = 0;
  for (; j + 4 <= nkeys; j += 4) scores_tile<R, 4>(q, d, keys + j, S + j, lds, scale);
  for (; j < nkeys; ++j) scores_tile<R, 1>(q, d, keys + j, S + j, lds, scale);
}

void scores(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  const float scale = qp[0];
  const bf16_t* q = reinterpret_cast<const bf16_t*>(qp + kQOffset);
  for (int r0 = 0; r0 < nrows; r0 += 4) {
    const bf16_t* qr = q + int64_t(r0) * d;
    float* s = S + int64_t(r0) * lds;
    switch (nrows - r0 >= 4 ? 4 : nrows - r0) {
      case 4: scores_rows<4>(qr, d, keys, nkeys, s, lds, scale); break;
      case 3: scores_rows<3>(qr, d, keys, nkeys, s, lds, scale); break;
      case 2: scores_rows<2>(qr, d, keys, nkeys, s, lds, scale); break;
      default: scores_rows<1>(qr, d, keys, nkeys, s, lds, scale); break;
    }
  }
}

// 16 columns of V_j (low half) and V_j+1 (high half) -> 16 (V_j[c], V_j+1[c]) bf16 pairs
inline __m512bh v_pairs(const bf16_t* vj, const bf16_t* vj1, int c) {
  __m256i a, b;
  std::memcpy(&a, vj + c, 32);
  if (vj1) std::memcpy(&b, vj1 + c, 32);
  else b = _mm256_setzero_si256();
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return as_bh(_mm512_permutexvar_epi16(idx, z));
}

// O[R rows][16 columns at c, natural order] += sum over key pairs of (P_j, P_j+1) . (V_j, V_j+1): the
// last 16 columns of a head_dim that is an odd multiple of 16 (the 32-column blocks: pv_tile32)
template <int R>
inline void pv_tile16(const uint32_t* pp, int npairs, const bf16_t* const* vals, int nkeys, int d, int c, float* O) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_loadu_ps(O + int64_t(r) * d + c);
  for (int jp = 0; jp < npairs; ++jp) {
    const int j = 2 * jp;
    const __m512bh v = v_pairs(vals[j], j + 1 < nkeys ? vals[j + 1] : nullptr, c);
    for (int r = 0; r < R; ++r) acc[r] = dpbf16(acc[r], as_bh(_mm512_set1_epi32(int(pp[r * npairs + jp]))), v);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(O + int64_t(r) * d + c, acc[r]);
}

// 32 columns of V_j and V_j+1 -> (V_j[c], V_j+1[c]) bf16 pairs by one vpunpcklwd and one vpunpckhwd,
// which interleave within 128-bit lanes: lo holds columns 8L + 0..3 of lane L (L = 0..3), hi columns
// 8L + 4..7, so O keeps each 32-column block in that order (kOPerm; unpack_o puts it back). A missing
// V_j+1 is 0.
inline void v_unpack(const bf16_t* vj, const bf16_t* vj1, int c, __m512bh& lo, __m512bh& hi) {
  __m512i a, b;
  std::memcpy(&a, vj + c, 64);
  if (vj1) std::memcpy(&b, vj1 + c, 64);
  else b = _mm512_setzero_si512();
  lo = as_bh(_mm512_unpacklo_epi16(a, b));
  hi = as_bh(_mm512_unpackhi_epi16(a, b));
}

// O[R rows][NB blocks of 32 columns at c, in the unpacks' order] += sum over key pairs
template <int R, int NB>
inline void pv_tile32(const uint32_t* pp, int npairs, const bf16_t* const* vals, int nkeys, int d, int c, float* O) {
  __m512 acc[R][2 * NB];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < 2 * NB; ++n) acc[r][n] = _mm512_loadu_ps(O + int64_t(r) * d + c + 16 * n);
  for (int jp = 0; jp < npairs; ++jp) {
    const int j = 2 * jp;
    __m512bh v[2 * NB];
    for (int n = 0; n < NB; ++n) v_unpack(vals[j], j + 1 < nkeys ? vals[j + 1] : nullptr, c + 32 * n, v[2 * n], v[2 * n + 1]);
    for (int r = 0; r < R; ++r) {
      const __m512bh p = as_bh(_mm512_set1_epi32(int(pp[r * npairs + jp])));
      for (int n = 0; n < 2 * NB; ++n) acc[r][n] = dpbf16(acc[r][n], p, v[n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < 2 * NB; ++n) _mm512_storeu_ps(O + int64_t(r) * d + c + 16 * n, acc[r][n]);
}

template <int R>
inline void pv_rows(const uint32_t* pp, int npairs, const bf16_t* const* vals, int nkeys, int d, float* O) {
  int c = 0;
  for (; c + 64 <= d; c += 64) pv_tile32<R, 2>(pp, npairs, vals, nkeys, d, c, O);
  if (d - c >= 32) pv_tile32<R, 1>(pp, npairs, vals, nkeys, d, c, O), c += 32;
  if (d - c == 16) pv_tile16<R>(pp, npairs, vals, nkeys, d, c, O);
}

// 32 floats (a: the first 16, b: the next) -> 32 bf16 in order: vec512::bf16_16 on each, the low
// halves gathered by one vpermt2w
inline __m512i bf16x32(__m512 a, __m512 b) {
  const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
                                        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutex2var_epi16(vec512::bf16_16(a), even, vec512::bf16_16(b));
}

void pv(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  const int npairs = (nkeys + 1) / 2;
  uint32_t pp[4 * 256];   // 4 rows x up to 256 key pairs (chunk_keys <= 512)
  for (int r0 = 0; r0 < nrows; r0 += 4) {
    const int R = nrows - r0 >= 4 ? 4 : nrows - r0;
    // the probabilities as bf16 pairs (P_j, P_j+1), 32 keys at a time (a missing P_j+1 is 0), the same
    // bits as the scalar form (two f32_to_bf16 per pair) it replaces: against it, the builds' modules
    // side by side (Zen 4, 2026-12-02, batch-1 decode, KV from DRAM, 5 rounds) Qwen3-30B-A3B and
    // Mixtral-8x7B, l = 1024 / 4096 / 16384, paged 0.95-0.97x the time, contiguous 0.89-0.96x (a first
    // form, the halves packed by vpmovdw, which SIMDe lacks); this form in a second, noisier run
    // 0.76-1.04x (10 of 12 points 0.84-0.98x), the first form 0.89-0.99x beside it
    for (int r = 0; r < R; ++r)
      for (int j0 = 0; j0 < nkeys; j0 += 32) {
        const float* p = P + int64_t(r0 + r) * lds + j0;
        const int n = nkeys - j0 < 32 ? nkeys - j0 : 32;
        const __m512i b = bf16x32(_mm512_maskz_loadu_ps(first_lanes(n), p),
                                  _mm512_maskz_loadu_ps(first_lanes(n - 16), p + 16));
        _mm512_mask_storeu_epi32(pp + r * npairs + j0 / 2, first_lanes((n + 1) / 2), b);
      }
    float* o = O + int64_t(r0) * d;
    switch (R) {
      case 4: pv_rows<4>(pp, npairs, vals, nkeys, d, o); break;
      case 3: pv_rows<3>(pp, npairs, vals, nkeys, d, o); break;
      case 2: pv_rows<2>(pp, npairs, vals, nkeys, d, o); break;
      default: pv_rows<1>(pp, npairs, vals, nkeys, d, o); break;
    }
  }
}

// O's 32-column blocks (v_unpack's order) back to natural order: natural column n of a block is
// lane kOPerm[n] of the pair (lo, hi) = (O[0..15], O[16..31]); a last block of 16 is natural already.
alignas(64) constexpr int32_t kOPerm[32] = {0,  1,  2,  3,  16, 17, 18, 19, 4,  5,  6,  7,  20, 21, 22, 23,
                                            8,  9,  10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

void unpack_o(const float* O, int d, float scale, float* out) {
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i i0 = _mm512_load_si512(kOPerm), i1 = _mm512_load_si512(kOPerm + 16);
  int i = 0;
  for (; i + 32 <= d; i += 32) {
    const __m512 lo = _mm512_loadu_ps(O + i), hi = _mm512_loadu_ps(O + i + 16);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i0, hi), s));
    _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, i1, hi), s));
  }
  if (i < d) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(O + i), s));
}

// ---- the fused step (AttnMicroKernel::step): one unmasked chunk of 32 keys, up to 128 rows (a count
// that is not a multiple of 4, up to 32, padded with zero queries), d a multiple of 32. Per group of 4 rows, the 8
// score tiles stay in registers (lanes 4r + jj: row r, key 4i + jj of tile i) and the online softmax
// runs on them as vectors: the row maxima and sums within each 4-lane group (the sums in hsum16's
// order over P_k + P_k+16, alpha by exp2_ps and l by one fma, as softmax_step computes them: the same
// bits), the probabilities packed to bf16 pairs in the order P x V broadcasts them, alpha kept for P x V
// to rescale O as it loads it (x 1 is exact). P x V then takes 8 rows x 32 columns a tile (V unpacked
// once for 8 rows), or 4 x 64. The next step's lines are prefetched a slot at a time (a score tile's
// 32 columns, a P x V key pair), never in a burst. On Zen 5 (2026-12-05), one KV head's 512 keys in
// L2, cycles per chunk against the three calls: Qwen3-30B-A3B's 8 rows ~1740 against ~2350,
// Mixtral-8x7B's 4 ~1020 against ~1330. Batch-1 decode from DRAM, 2 threads, against the three calls
// with their prefetch pieces (the build before, side by side in one process, 5 rounds, every round
// within 3% of its median, the same output bits): contiguous l = 1024 / 4096 / 16384 Qwen3-30B-A3B
// 0.96 / 0.89 / 0.88x the time, Mixtral-8x7B 0.95 / 0.96 / 0.93x; paged (block size 32) Qwen3 0.99 /
// 0.96 / 0.99x, Mixtral 1.02 / 0.94 / 0.96x (a first run's 0.76-0.79x for Mixtral contiguous had the
// old build at 1.5x its usual time: not the step's). From L2 the step is ~1.4x faster;
// from DRAM the paged cache's reads stay the limit: only reading its lines in the kernel's order, with
// the same prefetches, and no arithmetic, reaches 42-52 GB/s there against 74-76 contiguous (the read
// probe: ~80). Tried and not kept: the prefetches in 4 or 16 pieces between the tiles (8: 0.93 and
// 0.96x of 4, 16 no better), the chunk after next's lines too, into L1 or L2 (1.3-1.6x the time), the
// slots once per 8 keys of P x V instead of per key pair (1.08-1.18x), a slot counter without the
// division (0.99-1.04x; and 1.13-1.27x where its loop was not inlined: a call in the tiles spills
// every accumulator), the scores' sums in-lane first (no faster). Since 2026-12-07 LinePrefetch
// (ops/attention_prefetch.h, shared with the AVX2 step) keeps the same schedule and order without a
// division per slot, for the AVX2 step's sake (not measured on Zen 4/5).
template <typename Tick>
inline __m512 scores_vec44(const bf16_t* q, int d, const bf16_t* const* keys, float scale, Tick& tick) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 32) {
    tick.tick();
    __m512bh k[4];
    for (int jj = 0; jj < 4; ++jj) k[jj] = as_bh(load_row32(keys[jj] + c, false));
    for (int r = 0; r < 4; ++r) {
      const __m512bh qr = as_bh(load_row32(q + int64_t(r) * d + c, false));
      for (int jj = 0; jj < 4; ++jj) acc[r * 4 + jj] = dpbf16(acc[r * 4 + jj], qr, k[jj]);
    }
  }
  return _mm512_mul_ps(hsum16x16(acc), _mm512_set1_ps(scale));   // scores_tile<4, 4>'s bits
}

inline __m512 spread4(__m128 v) {   // lanes 4r .. 4r + 3 <- v[r]
  return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_castps128_ps512(v));
}
inline __m128 firsts4(__m512 v) {   // lanes 0, 4, 8, 12
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

constexpr int kStepKeys = 32, kStepRows = 128, kPadRows = 32;

// O[R rows at r0][N blocks of 32 columns at c] = O * alpha + P x V over the chunk's 16 key pairs; pp:
// per group of 4 rows 64 pairs, block b (keys 8b .. 8b + 7) as [4 rows][4 pairs]
template <int R, int N>
inline void step_pv_tile(const uint32_t* pp, const float* alpha, const bf16_t* const* vals, int d, int r0, int c, float* O,
                         LinePrefetch& tick) {
  __m512 acc[R][2 * N];
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r0 + r]);
    for (int n = 0; n < 2 * N; ++n) acc[r][n] = _mm512_mul_ps(_mm512_loadu_ps(O + int64_t(r0 + r) * d + c + 16 * n), a);
  }
  for (int b = 0; b < kStepKeys / 8; ++b) {
    #pragma GCC unroll 1
    for (int e = 0; e < 4; ++e) {
      tick.tick();
      const int jp = 4 * b + e;
      __m512bh v[2 * N];
      for (int n = 0; n < N; ++n) v_unpack(vals[2 * jp], vals[2 * jp + 1], c + 32 * n, v[2 * n], v[2 * n + 1]);
      for (int r = 0; r < R; ++r) {
        const int rr = r0 + r;
        const __m512bh p = as_bh(_mm512_set1_epi32(int(pp[(rr / 4) * 64 + b * 16 + (rr % 4) * 4 + e])));
        for (int n = 0; n < 2 * N; ++n) acc[r][n] = dpbf16(acc[r][n], p, v[n]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < 2 * N; ++n) _mm512_storeu_ps(O + int64_t(r0 + r) * d + c + 16 * n, acc[r][n]);
}

bool step(const float* qp, int nrows, int d, const bf16_t* const* keys, const bf16_t* const* vals, int nkeys, float* m,
          float* l, float* O, const AttnPrefetch* pf) {
  if (nkeys != kStepKeys || nrows > kStepRows || d % 32 || d > kAttnHeadDimMax) return false;
  if (nrows % 4 && nrows > kPadRows) return false;
  if (nrows % 4) {   // rows up to a multiple of 4 (pack_q zeroed their queries), their state here (G = 7:
                     // Qwen2-57B-A14B), the real rows' copied in and out: the same bits as without them
    const int r4 = (nrows + 3) & ~3;
    alignas(64) float o4[kPadRows * kAttnHeadDimMax];
    float m4[kPadRows], l4[kPadRows];
    std::memcpy(o4, O, sizeof(float) * size_t(nrows) * d);
    std::memset(o4 + int64_t(nrows) * d, 0, sizeof(float) * size_t(r4 - nrows) * d);
    for (int r = 0; r < r4; ++r) m4[r] = r < nrows ? m[r] : 0.f, l4[r] = r < nrows ? l[r] : 0.f;
    step(qp, r4, d, keys, vals, nkeys, m4, l4, o4, pf);
    std::memcpy(O, o4, sizeof(float) * size_t(nrows) * d);
    std::memcpy(m, m4, sizeof(float) * nrows);
    std::memcpy(l, l4, sizeof(float) * nrows);
    return true;
  }
  const float scale = qp[0];
  const bf16_t* q = reinterpret_cast<const bf16_t*>(qp + kQOffset);
  alignas(64) uint32_t pp[kStepRows / 4 * 64];
  alignas(64) float alpha[kStepRows];
  const int groups = nrows / 4;
  const bool by8 = nrows % 8 == 0;   // P x V tiles of 8 rows x 32 columns, else 4 x 64 (and 4 x 32)
  const int pv_tiles = by8 ? nrows / 8 * (d / 32) : groups * ((d + 32) / 64);
  LinePrefetch tick(pf, groups * 8 * (d / 32) + pv_tiles * (kStepKeys / 2));   // a slot per score c-step, per P x V pair
  // word w of the pair vector of P_2b (words 0..31, bf16 in each lane's low half) and P_2b+1 (32..63):
  // row r's 4 pairs (keys 8b + 2e, 8b + 2e + 1) at dwords 4r + e
  alignas(64) static constexpr int16_t kPairIdx[32] = {0,  2,  4,  6,  32, 34, 36, 38, 8,  10, 12, 14, 40, 42, 44, 46,
                                                       16, 18, 20, 22, 48, 50, 52, 54, 24, 26, 28, 30, 56, 58, 60, 62};
  const __m512i pidx = _mm512_load_si512(kPairIdx);
  for (int g = 0; g < groups; ++g) {
    __m512 T[8];
    for (int i = 0; i < 8; ++i) T[i] = scores_vec44(q + int64_t(4 * g) * d, d, keys + 4 * i, scale, tick);
    __m512 M = _mm512_max_ps(_mm512_max_ps(_mm512_max_ps(T[0], T[1]), _mm512_max_ps(T[2], T[3])),
                             _mm512_max_ps(_mm512_max_ps(T[4], T[5]), _mm512_max_ps(T[6], T[7])));
    M = _mm512_max_ps(M, _mm512_shuffle_ps(M, M, 0xB1));
    M = _mm512_max_ps(M, _mm512_shuffle_ps(M, M, 0x4E));
    const __m512 mo = spread4(_mm_loadu_ps(m + 4 * g));
    const __m512 mn = _mm512_max_ps(mo, M);
    const __m512 a = exp2_ps(_mm512_sub_ps(mo, mn));   // mo = -inf: 0
    __m512 P[8];
    for (int i = 0; i < 8; ++i) P[i] = exp2_ps(_mm512_sub_ps(T[i], mn));
    // hsum16's levels over the lanes (P_k + P_k+16) of softmax_step's sum: [k] + [k + 8], [k] + [k + 4]
    // across the tiles, then [k] + [k + 2], [k] + [k + 1] within the 4-lane groups
    const __m512 u0 = _mm512_add_ps(P[0], P[4]), u1 = _mm512_add_ps(P[1], P[5]), u2 = _mm512_add_ps(P[2], P[6]),
                 u3 = _mm512_add_ps(P[3], P[7]);
    __m512 y = _mm512_add_ps(_mm512_add_ps(u0, u2), _mm512_add_ps(u1, u3));
    y = _mm512_add_ps(y, _mm512_shuffle_ps(y, y, 0x4E));
    y = _mm512_add_ps(y, _mm512_shuffle_ps(y, y, 0xB1));
    _mm_storeu_ps(l + 4 * g, firsts4(_mm512_fmadd_ps(spread4(_mm_loadu_ps(l + 4 * g)), a, y)));
    _mm_storeu_ps(m + 4 * g, firsts4(mn));
    _mm_storeu_ps(alpha + 4 * g, firsts4(a));
    for (int b = 0; b < 4; ++b)
      _mm512_store_si512(pp + g * 64 + b * 16,
                         _mm512_permutex2var_epi16(vec512::bf16_16(P[2 * b]), pidx, vec512::bf16_16(P[2 * b + 1])));
  }
  if (by8) {
    for (int r0 = 0; r0 < nrows; r0 += 8)
      for (int c = 0; c < d; c += 32) step_pv_tile<8, 1>(pp, alpha, vals, d, r0, c, O, tick);
  } else {
    for (int r0 = 0; r0 < nrows; r0 += 4) {
      int c = 0;
      for (; c + 64 <= d; c += 64) step_pv_tile<4, 2>(pp, alpha, vals, d, r0, c, O, tick);
      if (c < d) step_pv_tile<4, 1>(pp, alpha, vals, d, r0, c, O, tick);
    }
  }
  tick.finish();
  return true;
}

// The blocking, per CPU. The default was measured on Zen 4 (ops/attention.cpp, run_task). Zen 5's
// (AMD family >= 26, or HINA_AVX512_BLOCKING=zen5: the FFN kernel's switch, microkernel.h) prefetches
// into L1 (48 KiB there). On Zen 5 (2026-12-05, 2 threads, batch-1 decode, l = 4096, KV from DRAM,
// the builds side by side in one process, 5 rounds; Qwen3-30B-A3B and Mixtral-8x7B), against the
// default: into L1 0.84 / 0.85x the time (contiguous), 0.85 / 0.90x (paged). With the three calls, the
// next step's rows in reading order (prefetch_order 1) were 0.82 / 0.81x of the next chunk's records
// (order 0) on the paged cache; with the fused step (later the same day, which prefetches per line)
// order 0 is the faster: paged l = 4096 / 16384 0.98 / 0.91x (Qwen3), 0.93 / 0.76x (Mixtral), so
// it is order 0 now (a head-major cache is the same either way), and a task's first chunk also gets
// the next head's rows (paged l = 1024: 0.94 / 0.96x of the three calls, against 1.09 / 1.11x
// without). Tried there and not kept: into L2 two chunks ahead (1.15-1.24x of into L1 one ahead),
// into L1 two ahead (1.02-1.09x; paged 1.02-1.06x), 8 pieces (1.06-1.08x contiguous, 0.93x / 1.08x
// paged), 2 and 1 pieces (1.05-1.56x, into L2), no prefetch (1.2-1.8x), chunks of 64 and 128 keys
// (1.1-1.4x, into L2), a task per head of the paged cache (1.01-1.10x); with the fused step, into L2
// (prefetcht1: 1.02-1.31x), in a first form of it (the driver's prefetch pieces called back between
// its tiles) the cheaper address walk (a key_at per block, not per key: paged 1.04-1.12x, the pieces'
// bursts came faster), a 2 MiB-page cache (no faster).
// Zen 5's tasks take 128 query rows (extend: 16 tokens of Qwen3-30B-A3B's 8 heads a KV head, 32 of
// Mixtral-8x7B's 4), the fused step all of them at once, so each task streams the prefix's K and V for
// 4x the rows: extend 128 / 512 new tokens over a 4096 prefix, against 32 rows (the same day, side by
// side in one process, 3 rounds), Qwen3 paged 0.86-0.89 / 0.91x the time, contiguous 0.88x, Mixtral
// paged 0.92-0.96x, contiguous 0.96x; 256 rows no better (0.86-0.94x). Decode's rows are one token's.
// The default blocking takes 128 too (not measured on Zen 4; the same fused step and the same passes
// over the prefix saved), so the two still give the same bits (their tasks, and so their KV splits, alike).
constexpr AttnBlocking kBlocking{/*chunk_keys=*/32, /*block_rows=*/128, /*stage_strided=*/false, /*prefetch_l2=*/true,
                                 /*prefetch_steps=*/4, /*prefetch_order=*/0};
constexpr AttnBlocking kBlockingZen5{/*chunk_keys=*/32, /*block_rows=*/128, /*stage_strided=*/false, /*prefetch_l2=*/false,
                                     /*prefetch_steps=*/4, /*prefetch_order=*/0};
const AttnBlocking* blocking_now() { return avx512_blocking_zen5() ? &kBlockingZen5 : &kBlocking; }

}  // namespace

const AttnMicroKernel HINA_AVX512_ENTRY(attn_microkernel_avx512){
    HINA_AVX512_ISA, HINA_AVX512_CPU_ISA(""), kBlocking, blocking_now, pack_q, scores, softmax_step, pv, unpack_o, step};

}  // namespace hina
