// The AVX2 attention micro-kernel (compiled with -mavx2 -mfma -mf16c; run only after isa_usable("avx2")).
//
// Layout: the FFN kernel's "split-16" fp32 (microkernel_avx2.cpp). 16 bf16 of a K or V row load as one
// __m256i; the 8 even elements are v << 16 and the 8 odd ones v & 0xFFFF0000 (2 integer ops). The
// query block is packed once per task into the matching split-16 fp32 layout, scaled by
// sm_scale * log2(e) (transformation 1: the small operand, never K or V); the output accumulators O
// are split-16 too and are interleaved back to natural order only in unpack_o.
//
// scores: R query rows x KJ keys of dot-product accumulators (R * KJ <= 8 chains, each 2 FMAs per
//   16 elements of d), one K load + 2 conversion ops reused by all R rows; 8 accumulators reduce with
//   a transposing hadd tree (9 ops for 8 sums). The group G is the small M operand: G = 8 (Qwen3-30B)
//   runs 8 x 1 tiles, G = 4 (Mixtral) 4 x 2, G = 16 two 8 x 1 passes.
// Measured (one Zen 3 core, d = 128, K/V L2-resident, per key and KV head, G = 8): scores ~42 ns,
//   softmax ~9 ns, P x V ~28-36 ns, about 55-65% of the FMA peak: the 2-FMA chain per accumulator and
//   one Q load per FMA (the 1-thread FMA peak read 91 GFLOP/s in the same minute: scores ~56% and P x V
//   ~62% of it). Tried: 4 x 2 score tiles (~6% slower for G = 8); 4 x 1 tiles with even and odd halves
//   in separate accumulators (half the dependency chain: no faster, 39-41 vs 40-43 ns: the chain is
//   not the limit); an accumulator array zeroed by a loop GCC turned into `rep stos` on the stack
//   (scores 54 ns: hence the unroll pragma).
// pv: O[4 rows][16 columns] (8 ymm accumulators, loaded from and stored to the L1-resident O once per
//   chunk of keys), each V load converted once and used by 4 rows (broadcast probabilities).
// softmax_step: a vector exp2 (round to nearest, degree-6 polynomial on [-1/2, 1/2], rel. error
//   ~1e-7; inputs below -126 give exactly 0, so masked keys (-inf) vanish).
// step: an unmasked chunk of 32 keys fused (below): the same tiles and the same bits as the three
//   calls, the online softmax on the tiles' sum vectors, and the next chunk's lines prefetched between
//   its tiles (ops/attention_prefetch.h) instead of in the driver's four pieces. Zen 3, 2026-12-07, 2
//   threads, batch-1 decode, KV rotated past the L3, side by side in one process (the step switched
//   per block of calls, 8 rounds, the same output bits), the step's time over the three calls':
//   Mixtral-8x7B paged l = 1024 / 4096 / 16384 0.74 / 0.70 / 0.65x (16.4 / 17.8 / 18.3 GB/s),
//   contiguous l = 16384 0.77x (20.2 GB/s); Qwen3-30B-A3B paged 0.83 / 0.82 / 0.72x, contiguous
//   l = 4096 0.83x. With the KV in the L3 (one cache, l = 1024) the step is 1.2x slower for
//   Mixtral-8x7B's paged cache (its prefetches then only cost: without them it is the faster), 1.0x for
//   Qwen3; the harness streams the KV from DRAM, as a decode step does.
//   In one core's L2 (1 thread, one KV head's 512 keys), per key: the step 81 TSC cycles for G = 4 (the
//   three calls 80), 135 for G = 8 (144): scores ~35-40 (4 x 2 tiles; 24.5 is the FMA peak), P x V ~32,
//   softmax ~6. Read with no arithmetic (only the loads and prefetches of the step, a scratch build),
//   the same streams reach 25 GB/s on Mixtral-8x7B's paged cache and 33-34 on its contiguous one and on
//   Qwen3's paged one (the read probe: 28-29), so it is the arithmetic's overlap with the stream that is
//   short of the roofline, and the paged Mixtral cache's own pattern caps it near 0.85.
// Buffers: the driver keeps the packed queries, O and S 64-byte aligned (ops/attention.cpp): with a
//   std::vector's 16-byte alignment a quarter of the packed-query loads straddled two lines, and the
//   scores of the three calls took 1.3x (G = 4) the time in one core's L2; aligned, 2 threads, in one
//   process, 0.88-0.95x the time of the misaligned buffers (a scratch switch, the same bits).
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "ops/attention.h"
#include "ops/attention_prefetch.h"   // LinePrefetch

namespace hina {
namespace {

inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 odd_f32(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xFFFF0000u))));
}
inline __m256i load16(const bf16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// 8 vectors -> one vector of their 8 horizontal sums, in order. (By value: an accumulator array whose
// address escapes is kept on the stack and zeroed with `rep stos` on every call: ~2x slower tiles.)
inline __m256 hsum8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6, __m256 v7) {
  const __m256 t0 = _mm256_hadd_ps(v0, v1), t1 = _mm256_hadd_ps(v2, v3);
  const __m256 t2 = _mm256_hadd_ps(v4, v5), t3 = _mm256_hadd_ps(v6, v7);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_NGE_UQ);  // x < -126, or NaN: 0
  x = _mm256_max_ps(x, lo);
  const __m256 xi = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, xi);
  __m256 p = _mm256_set1_ps(1.540353039e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333355815e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129108e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265070e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471806e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(xi), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

void pack_q(const bf16_t* const* rows, int nrows, int d, float scale, float* qp) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int r = 0; r < nrows; ++r)
    for (int c = 0; c < d; c += 16) {
      const __m256i v = load16(rows[r] + c);
      _mm256_storeu_ps(qp + int64_t(r) * d + c, _mm256_mul_ps(even_f32(v), s));
      _mm256_storeu_ps(qp + int64_t(r) * d + c + 8, _mm256_mul_ps(odd_f32(v), s));
    }
}

// R rows x KJ keys of dot products along d (each accumulator 2 FMAs per 16 elements: even, then odd)
template <int R, int KJ>
struct TileAcc { __m256 v[R * KJ]; };
template <int R, int KJ>
__attribute__((always_inline)) inline TileAcc<R, KJ> tile_dots(const float* qp, int d, const bf16_t* const* keys) {
  TileAcc<R, KJ> a;
#pragma GCC unroll 16   // else GCC turns this loop into a memset and keeps the accumulators on the stack
  for (int i = 0; i < R * KJ; ++i) a.v[i] = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 16) {
    __m256 ke[KJ], ko[KJ];
    for (int jj = 0; jj < KJ; ++jj) {
      const __m256i v = load16(keys[jj] + c);
      ke[jj] = even_f32(v);
      ko[jj] = odd_f32(v);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 qe = _mm256_loadu_ps(qp + int64_t(r) * d + c);
      const __m256 qo = _mm256_loadu_ps(qp + int64_t(r) * d + c + 8);
      for (int jj = 0; jj < KJ; ++jj) {
        a.v[r * KJ + jj] = _mm256_fmadd_ps(ke[jj], qe, a.v[r * KJ + jj]);
        a.v[r * KJ + jj] = _mm256_fmadd_ps(ko[jj], qo, a.v[r * KJ + jj]);
      }
    }
  }
  return a;
}

// R rows x KJ keys: S[r * lds + jj] = qp_r . K_jj
template <int R, int KJ>
inline void scores_tile(const float* qp, int d, const bf16_t* const* keys, float* S, int lds) {
  const TileAcc<R, KJ> t = tile_dots<R, KJ>(qp, d, keys);
  const __m256* acc = t.v;
  if constexpr (R * KJ == 8) {
    alignas(32) float out[8];
    _mm256_store_ps(out, hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < KJ; ++jj) S[int64_t(r) * lds + jj] = out[r * KJ + jj];
  } else {
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < KJ; ++jj) S[int64_t(r) * lds + jj] = hsum(acc[r * KJ + jj]);
  }
}

template <int R, int KJ>
inline void scores_rows(const float* qp, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  int j = 0;
  for (; j + KJ <= nkeys; j += KJ) scores_tile<R, KJ>(qp, d, keys + j, S + j, lds);
  for (; j < nkeys; ++j) scores_tile<R, 1>(qp, d, keys + j, S + j, lds);
}

void scores(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  // Passes of 8 rows x 1 key (8 chains); 4 rows x 2 keys measured ~6% slower for G = 8 (42 vs 44 ns
  // per key and KV head, d = 128, one Zen 3 core, L2-resident). A remainder of 5-7 rows runs R x 1,
  // 3-4 rows R x 2, 1-2 rows R x 4 (8 chains where the rows allow).
  for (int r0 = 0; r0 < nrows;) {
    const float* q = qp + int64_t(r0) * d;
    float* s = S + int64_t(r0) * lds;
    const int left = nrows - r0;
    const int step = left >= 8 ? 8 : left;
    r0 += step;
    switch (step) {
      case 8: scores_rows<8, 1>(q, d, keys, nkeys, s, lds); break;
      case 7: scores_rows<7, 1>(q, d, keys, nkeys, s, lds); break;
      case 6: scores_rows<6, 1>(q, d, keys, nkeys, s, lds); break;
      case 5: scores_rows<5, 1>(q, d, keys, nkeys, s, lds); break;
      case 4: scores_rows<4, 2>(q, d, keys, nkeys, s, lds); break;
      case 3: scores_rows<3, 2>(q, d, keys, nkeys, s, lds); break;
      case 2: scores_rows<2, 4>(q, d, keys, nkeys, s, lds); break;
      default: scores_rows<1, 4>(q, d, keys, nkeys, s, lds); break;
    }
  }
}

void softmax_step(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int n8 = (nkeys + 7) & ~7;   // <= lds (chunk_keys is a multiple of 8)
  for (int r = 0; r < nrows; ++r) {
    float* s = S + int64_t(r) * lds;
    for (int j = nkeys; j < n8; ++j) s[j] = ninf;
    __m256 vmax = _mm256_set1_ps(m[r]);
    for (int j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
    const float mx = hmax(vmax);
    if (mx == ninf) {
      for (int j = 0; j < n8; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
      continue;
    }
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < n8; j += 8) {
      const __m256 p = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
      _mm256_storeu_ps(s + j, p);
      sum = _mm256_add_ps(sum, p);
    }
    // alpha by the vector exp2 and l by one fma, as the fused step computes them for several rows at
    // once (m = -inf: exp2 of -inf is 0)
    const float alpha = _mm_cvtss_f32(_mm256_castps256_ps128(exp2_ps(_mm256_set1_ps(m[r] - mx))));
    l[r] = std::fma(l[r], alpha, hsum(sum));
    m[r] = mx;
    if (alpha != 1.f) {
      const __m256 a = _mm256_set1_ps(alpha);
      float* o = O + int64_t(r) * d;
      for (int i = 0; i < d; i += 8) _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_loadu_ps(o + i), a));
    }
  }
}

// O[R rows][16 columns at c] = O * alpha[r] (alpha nullptr: O as it is) + sum_j P(r, j) V_j[c .. c+16),
// P(r, j) at p_at(r, j): the three calls' row-major S, or the fused step's tile layout
template <int R, class PAt>
__attribute__((always_inline)) inline void pv_acc(PAt p_at, const float* alpha, const bf16_t* const* vals, int nkeys,
                                                  int d, int c, float* O) {
  __m256 ae[R], ao[R];
  for (int r = 0; r < R; ++r) {
    ae[r] = _mm256_loadu_ps(O + int64_t(r) * d + c);
    ao[r] = _mm256_loadu_ps(O + int64_t(r) * d + c + 8);
    if (alpha) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
      ae[r] = _mm256_mul_ps(ae[r], a);
      ao[r] = _mm256_mul_ps(ao[r], a);
    }
  }
  for (int j = 0; j < nkeys; ++j) {
    const __m256i v = load16(vals[j] + c);
    const __m256 ve = even_f32(v), vo = odd_f32(v);
    for (int r = 0; r < R; ++r) {
      const __m256 p = _mm256_broadcast_ss(p_at(r, j));
      ae[r] = _mm256_fmadd_ps(p, ve, ae[r]);
      ao[r] = _mm256_fmadd_ps(p, vo, ao[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(O + int64_t(r) * d + c, ae[r]);
    _mm256_storeu_ps(O + int64_t(r) * d + c + 8, ao[r]);
  }
}

// O[R rows][16 columns at c] += sum_j P[r][j] V_j[c .. c+16)
template <int R>
inline void pv_tile(const float* P, int lds, const bf16_t* const* vals, int nkeys, int d, int c, float* O) {
  pv_acc<R>([&](int r, int j) { return P + int64_t(r) * lds + j; }, nullptr, vals, nkeys, d, c, O);
}

void pv(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  for (int r0 = 0; r0 < nrows; r0 += 4) {
    const float* p = P + int64_t(r0) * lds;
    float* o = O + int64_t(r0) * d;
    const int R = nrows - r0 >= 4 ? 4 : nrows - r0;
    for (int c = 0; c < d; c += 16) {
      switch (R) {
        case 4: pv_tile<4>(p, lds, vals, nkeys, d, c, o); break;
        case 3: pv_tile<3>(p, lds, vals, nkeys, d, c, o); break;
        case 2: pv_tile<2>(p, lds, vals, nkeys, d, c, o); break;
        default: pv_tile<1>(p, lds, vals, nkeys, d, c, o); break;
      }
    }
  }
}

void unpack_o(const float* O, int d, float scale, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int c = 0; c < d; c += 16) {
    const __m256 e = _mm256_loadu_ps(O + c), o = _mm256_loadu_ps(O + c + 8);
    const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
    _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_permute2f128_ps(lo, hi, 0x20), s));
    _mm256_storeu_ps(out + c + 8, _mm256_mul_ps(_mm256_permute2f128_ps(lo, hi, 0x31), s));
  }
}

// ---- the fused step (AttnMicroKernel::step): one unmasked chunk of 32 keys, rows in groups of 8 (8 x 1
// score tiles) and then 4 (4 x 2), as scores() takes them, d a multiple of 16; the same bits as the three
// calls. Per group the tiles' sums stay in a vector each (lane r: row r of key j for 8 rows; lane 2r + k:
// row r of key 2i + k for 4 rows) and the online softmax runs on them as vectors, its sums in
// softmax_step's order (per row: keys j, j + 8, j + 16, j + 24 first, then the hsum tree); the
// probabilities stay in that layout for P x V, which rescales O by alpha as it loads it (x 1 is exact).
// The next step's lines are prefetched a slot at a time: every second score tile, every P x V tile.
// Against a slot at every score tile and every 8 keys of P x V (Zen 3, one core, a C++ loop over the
// chunks of 2^18 keys from DRAM, head-major, builds alternated 4-5 times): G = 4 111 against 124 TSC
// cycles a key, G = 8 160 against 181, with the KV in L2 95 against 111 (without prefetches: 87); a
// slot every 16 keys of P x V 113 / 167, none in P x V 121; each slot's bookkeeping (and branches)
// costs about as much as its prefetches.
constexpr int kStepKeys = 32;

inline __m256 swap_pairs(__m256 v) { return _mm256_permute_ps(v, 0xB1); }   // lanes 2r <-> 2r + 1

// m, l of rows r0 .. r0 + R - 1 in the tiles' lanes (R = 8: lane r; R = 4: lanes 2r and 2r + 1)
template <int R>
inline __m256 row_lanes(const float* x) {
  if constexpr (R == 8) return _mm256_loadu_ps(x);
  else return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(x)), _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
}
template <int R>
inline void store_rows(float* x, __m256 v) {
  if constexpr (R == 8) _mm256_storeu_ps(x, v);
  else _mm_storeu_ps(x, _mm256_castps256_ps128(_mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0))));
}

// R rows (8 or 4) of one chunk: scores into P (kStepKeys / (8 / R) vectors), softmax on them, alpha out
template <int R>
inline void step_scores_softmax(const float* qp, int d, const bf16_t* const* keys, float* m, float* l, __m256* P,
                                float* alpha, LinePrefetch& tick) {
  constexpr int KJ = 8 / R, NT = kStepKeys / KJ;   // keys a tile, tiles a chunk
  for (int i = 0; i < NT; ++i) {
    if (i % 2 == 0) tick.tick();
    const TileAcc<R, KJ> t = tile_dots<R, KJ>(qp, d, keys + i * KJ);   // scores_tile<R, KJ>'s sums
    P[i] = hsum8(t.v[0], t.v[1], t.v[2], t.v[3], t.v[4], t.v[5], t.v[6], t.v[7]);
  }
  __m256 M = P[0];
  for (int i = 1; i < NT; ++i) M = _mm256_max_ps(M, P[i]);
  if constexpr (R == 4) M = _mm256_max_ps(M, swap_pairs(M));
  const __m256 mo = row_lanes<R>(m);
  const __m256 mn = _mm256_max_ps(mo, M);
  const __m256 a = exp2_ps(_mm256_sub_ps(mo, mn));
  for (int i = 0; i < NT; ++i) P[i] = exp2_ps(_mm256_sub_ps(P[i], mn));
  // softmax_step's sum of row r: lane e of keys e, e + 8, e + 16, e + 24 in turn (s_e), then
  // (s_e + s_e+4) for e < 4, then (q0 + q2) + (q1 + q3)
  __m256 y;
  if constexpr (R == 8) {   // key j in tile j
    __m256 u[8];
    for (int e = 0; e < 8; ++e) u[e] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(P[e], P[e + 8]), P[e + 16]), P[e + 24]);
    const __m256 q0 = _mm256_add_ps(u[0], u[4]), q1 = _mm256_add_ps(u[1], u[5]), q2 = _mm256_add_ps(u[2], u[6]),
                 q3 = _mm256_add_ps(u[3], u[7]);
    y = _mm256_add_ps(_mm256_add_ps(q0, q2), _mm256_add_ps(q1, q3));
  } else {                  // key 2i + k in tile i, lane 2r + k: s_2i+k of row r in lane 2r + k of u[i]
    __m256 u[4];
    for (int i = 0; i < 4; ++i) u[i] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(P[i], P[i + 4]), P[i + 8]), P[i + 12]);
    const __m256 w = _mm256_add_ps(_mm256_add_ps(u[0], u[2]), _mm256_add_ps(u[1], u[3]));   // q_k + q_2+k in lane 2r + k
    y = _mm256_add_ps(w, swap_pairs(w));
  }
  store_rows<R>(l, _mm256_fmadd_ps(row_lanes<R>(l), a, y));
  store_rows<R>(m, mn);
  store_rows<R>(alpha, a);
}

// O[4 rows at r0][16 columns at c] = O * alpha + the chunk's P x V (pv_tile<4>'s FMAs, in its order);
// P as step_scores_softmax leaves it for R rows a group, row r0 of the group at lane offset lr
template <int R>
inline void step_pv_tile(const float* P, int lr, const float* alpha, const bf16_t* const* vals, int d, int c, float* O,
                         LinePrefetch& tick) {
  tick.tick();
  // row lr + r of key j: R = 8 in vector j, lane lr + r; R = 4 in vector j / 2, lane 2r + j % 2
  pv_acc<4>([&](int r, int j) { return R == 8 ? P + 8 * j + lr + r : P + 8 * (j / 2) + 2 * r + j % 2; }, alpha, vals,
            kStepKeys, d, c, O);
}

template <int R>
inline void step_group(const float* qp, int d, const bf16_t* const* keys, const bf16_t* const* vals, float* m, float* l,
                       float* O, LinePrefetch& tick) {
  alignas(32) __m256 P[kStepKeys];
  alignas(32) float alpha[8];
  step_scores_softmax<R>(qp, d, keys, m, l, P, alpha, tick);
  const float* pf = reinterpret_cast<const float*>(P);
  for (int r0 = 0; r0 < R; r0 += 4)
    for (int c = 0; c < d; c += 16) step_pv_tile<R>(pf, r0, alpha + r0, vals, d, c, O + int64_t(r0) * d, tick);
}

bool step(const float* qp, int nrows, int d, const bf16_t* const* keys, const bf16_t* const* vals, int nkeys, float* m,
          float* l, float* O, const AttnPrefetch* pf) {
  if (nkeys != kStepKeys || nrows % 4 || d % 16) return false;
  const int g8 = nrows / 8, g4 = nrows % 8 / 4;
  // a slot every second score tile and every P x V tile (4 rows x 16 columns x 32 keys)
  LinePrefetch tick(pf, g8 * (kStepKeys / 2 + 2 * (d / 16)) + g4 * (kStepKeys / 4 + d / 16));
  for (int g = 0; g < g8; ++g)
    step_group<8>(qp + int64_t(8 * g) * d, d, keys, vals, m + 8 * g, l + 8 * g, O + int64_t(8 * g) * d, tick);
  if (g4)
    step_group<4>(qp + int64_t(8 * g8) * d, d, keys, vals, m + 8 * g8, l + 8 * g8, O + int64_t(8 * g8) * d, tick);
  tick.finish();
  return true;
}

}  // namespace

const AttnMicroKernel attn_microkernel_avx2{
    "avx2", "avx2", {/*chunk_keys=*/32, /*block_rows=*/32, /*stage_strided=*/false, /*prefetch_l2=*/true, /*prefetch_steps=*/4, /*prefetch_order=*/0}, nullptr, pack_q, scores, softmax_step, pv, unpack_o, step};

}  // namespace hina
