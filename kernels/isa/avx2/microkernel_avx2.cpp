// The AVX2 micro-kernel (compiled with -mavx2 -mfma -mf16c; run only after isa_usable("avx2")).
// For CPUs without AVX-512 (AMD Zen 2/3, older Intel): the same general-layout design as the AMX
// and AVX-512 kernels, with bf16 -> fp32 conversion of W on the fly.
//
// W (general layout) rows are contiguous along K. 16 bf16 of a row load as one __m256i; in each
// 32-bit lane the low half is element 2j and the high half element 2j+1, so
//      W_even = v << 16            (the 8 even elements as fp32)
//      W_odd  = v & 0xFFFF0000     (the 8 odd elements as fp32)
// cost 2 integer ops. Transformation 1 writes I in the matching "split-16" fp32 layout: per chunk
// of 16 elements, the 8 even ones then the 8 odd ones. One chunk of W then costs 1 load + 2 ops
// and 2 FMAs per token:  acc += W_even * I_even + W_odd * I_odd  (dot-product form along K; the
// 8 lanes are summed once per canonical K piece, moe_ffn.h). The activation written by gate_up (transformation 2) is
// in the same split-16 layout, so the down projection runs the same kernel.
//
// Blocking (Algorithm 1's loop nest on vector registers): R W rows x TT tokens of accumulators
// (dot_tile), 8 ymm accumulators, each taking 2 FMAs per 16 elements of K.
//   M <= 2 tokens (decode, memory-bound): every W row is streamed from memory exactly once per
//     call, 8 rows (M = 1) or 4 rows (M = 2) at a time, all tokens in registers.
//   M > 2: K in groups of pieces spanning <= 4096, tokens in blocks whose fp32 I slice over a
//     group (<= 256 KiB) stays in L2; per 4 rows, each piece is cut into 512-element sub-blocks
//     whose 4-row W slice (4 KiB) stays in L1 while the block's token pairs pass over it (4 x 2
//     tile, accumulators carried across a piece's sub-blocks). W is read from memory once per
//     token block: once per call up to 16 tokens per expert (K >= 4096) or 32 (K <= 2048).
// Measured here (Zen 3, one core, L1-resident): the 4 x 2 tile runs at ~50-60% of the FMA peak;
// the limit is the 2-FMA dependency chain per accumulator plus 0.5 integer op per FMA for the
// bf16 conversion sharing the FP pipes. Tried and measured slower on Mixtral at T = 3..16 (side
// by side, one process): W converted once per 4-row sub-block into an fp32 L1 buffer and run
// through a 4 x 3 fp32 tile (faster in L1, ~80 vs ~60 GFLOP/s, but the conversion pass exposes
// DRAM latency: T = 4 60 vs 47 ms); 2 x M whole-piece streaming tiles for M = 3..6 (10-20%
// slower); prefetch 2-8 sub-blocks ahead or into L2 / non-temporal (no gain).
#include <immintrin.h>

#include <cstdlib>

#include "microkernel.h"

namespace hina {
namespace avx2_kernel {
namespace {

// This file has its own ISA flags: it must not share out-of-line inline/template code (COMDAT,
// e.g. std::vector members) with files built for other ISAs, or the linker may keep this file's
// copy for everyone. So: no STL containers or algorithms here, only internal-linkage helpers.
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }

// A per-thread scratch buffer, grown on demand (a few hundred KiB at most). Trivially
// destructible on purpose (thread_local objects with destructors upset GCC's LTO here): the
// buffer of a thread lives as long as the thread (OpenMP's pool).
template <class Tp>
struct ThreadScratch {
  Tp* p;
  size_t n;
  Tp* get(size_t want) {
    if (want > n) {
      std::free(p);
      p = static_cast<Tp*>(std::aligned_alloc(64, ((want * sizeof(Tp)) + 63) & ~size_t(63)));
      if (!p) std::abort();
      n = want;
    }
    return p;
  }
};

constexpr int kChunk = 16;     // bf16 elements per W load
constexpr int kSubK = 512;              // K sub-block of a piece (M > 2): 4 W rows = 4 KiB bf16
constexpr int kKOuter = 4096;           // K span of a group of pieces (M > 2)
constexpr int kIBlockBytes = 256 << 10; // L2 budget for a token block's I slice over a group
constexpr int kMaxMBlock = 32;          // tokens per block at most (M > 2)
constexpr auto kPrefetchHint = _MM_HINT_T0;

inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 odd_f32(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xFFFF0000u))));
}

size_t packed_bytes(int M, int K) { return size_t(M) * K * sizeof(float); }

// Transformation 1: gather x rows into I (fp32, split-16). Same two ops as the W conversion.
void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  float* dst = static_cast<float*>(I);
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    float* d = dst + int64_t(m) * K;
    for (int k = 0; k < K; k += kChunk) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      _mm256_storeu_ps(d + k, even_f32(v));
      _mm256_storeu_ps(d + k + 8, odd_f32(v));
    }
  }
}

// Position of element j of a row in the split-16 layout.
inline int split16(int j) { return (j & ~15) | ((j & 1) << 3) | ((j & 15) >> 1); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The register tile: C[r * ldc + t] += sum_{k0 <= k < k1} W_r[k] * I_t[k]   for r < R, t < TT,
// [k0, k1) a piece or a sub-block of one. The accumulators start at zero on the piece's first
// sub-block (`first`), else are loaded from buf (R x TT vectors, row-major); at the piece's last
// sub-block (`last`) their horizontal sums are added into c, else they are stored back to buf.
// Per (row, token) the FMAs are the same, in the same order, whatever R, TT or the sub-blocking:
// every blocking gives bit-identical sums.
// With PF, also prefetches pf[r][0 .. k1-k0): the W slice the next call will stream from memory,
// so DRAM traffic overlaps this tile's FMAs instead of stalling the next one.
template <int R, int TT, bool PF = false>
inline void acc_tile(const bf16_t* const* w, const float* const* in, int k0, int k1, __m256* buf,
                     bool first, bool last, float* c, int ldc, const bf16_t* const* pf = nullptr) {
  __m256 acc[R][TT];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) acc[r][t] = first ? _mm256_setzero_ps() : buf[r * TT + t];
  for (int k = k0; k < k1; k += kChunk) {
    __m256 xe[TT], xo[TT];
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      xe[t] = _mm256_loadu_ps(in[t] + k);
      xo[t] = _mm256_loadu_ps(in[t] + k + 8);
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (PF) _mm_prefetch(reinterpret_cast<const char*>(pf[r] + (k - k0)), kPrefetchHint);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
      const __m256 we = even_f32(v), wo = odd_f32(v);
      #pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) {
        acc[r][t] = _mm256_fmadd_ps(we, xe[t], acc[r][t]);
        acc[r][t] = _mm256_fmadd_ps(wo, xo[t], acc[r][t]);
      }
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      if (last) c[r * ldc + t] += hsum(acc[r][t]);
      else buf[r * TT + t] = acc[r][t];
    }
}

// A whole piece, accumulators in registers only.
template <int R, int TT>
inline void dot_tile(const bf16_t* const* w, const float* const* in, int k0, int k1, float* c,
                     int ldc) {
  acc_tile<R, TT>(w, in, k0, k1, nullptr, true, true, c, ldc);
}

// Output addressing: the product of row r, piece p, token t goes to c[r * row_ld + p * piece_ld + t]
// (piece_ld = 0: pieces chained in ascending order into one sum, the fused plain kernel;
//  piece_ld = M: one slot per piece, the NUMA path). Every piece starts from fresh accumulators
// and adds its horizontal sum into its slot, so a piece's value never depends on R, TT or blocking.
struct Out { float* c; int64_t row_ld, piece_ld; };

// All `nrows` rows against tokens in[0..TT), every piece: R rows at a time.
template <int R, int TT>
void rows_x_tokens(const bf16_t* const* w, int nrows, const float* const* in, const int32_t* pc,
                   int np, Out o) {
  int r = 0;
  for (; r + R <= nrows; r += R)
    for (int p = 0; p < np; ++p)
      dot_tile<R, TT>(w + r, in, pc[2 * p], pc[2 * p + 1], o.c + r * o.row_ld + p * o.piece_ld,
                      int(o.row_ld));
  for (; r < nrows; ++r)
    for (int p = 0; p < np; ++p)
      dot_tile<1, TT>(w + r, in, pc[2 * p], pc[2 * p + 1], o.c + r * o.row_ld + p * o.piece_ld,
                      int(o.row_ld));
}

thread_local ThreadScratch<__m256> tl_acc{nullptr, 0};

// C = W[rows, pieces] . I[M, K]^T, W rows given by pointers, all sharing the pieces `pc`.
void mm_rows(const bf16_t* const* w, int nrows, const float* I, int M, int K, const int32_t* pc,
             int np, Out o) {
  for (int64_t i = 0; i < int64_t(nrows) * o.row_ld; ++i) o.c[i] = 0.f;
  const float* in[kMaxMBlock];
  if (M <= 2) {  // decode: each W row streamed once, all tokens in registers
    for (int t = 0; t < M; ++t) in[t] = I + int64_t(t) * K;
    if (M == 1) rows_x_tokens<8, 1>(w, nrows, in, pc, np, o);
    else rows_x_tokens<4, 2>(w, nrows, in, pc, np, o);
    return;
  }
  // M > 2. Loop nest: K in groups of canonical pieces spanning <= kKOuter (W streams in 8 KiB
  // runs per row), tokens in blocks whose fp32 I slice over the group (<= 256 KiB) stays in L2,
  // 4 rows at a time, the group's pieces, sub-blocks of kSubK, token pairs. A 4-row sub-block of
  // W (4 x kSubK bf16 = 4 KiB) stays in L1 while the block's token pairs pass over it next to the
  // pair's I slice (2 x kSubK fp32); W is read from memory once per token block: once per call up
  // to 16 tokens (K >= 4096) or 32 (K <= 2048). A piece's accumulators are carried across its
  // sub-blocks in L1 (acc), so the sums are those of whole-piece tiles, bit for bit. (Whole
  // 2048-element pieces made the W slice and a pair's I slice 16 KiB each, and L1 thrashed: ~5%
  // slower on Mixtral at T = 4, measured side by side.)
  const int mb = imax(4, imin(kMaxMBlock, (kIBlockBytes / (imin(K, kKOuter) * 4)) & ~1));
  __m256* acc = tl_acc.get(size_t(4) * kMaxMBlock);
  const int ld = int(o.row_ld);
  for (int g0 = 0; g0 < np;) {
    int g1 = g0 + 1;
    while (g1 < np && pc[2 * g1 + 1] - pc[2 * g0] <= kKOuter) ++g1;
    const int gk0 = pc[2 * g0], gk1 = pc[2 * g1 - 1];
    for (int m0 = 0; m0 < M; m0 += mb) {
      const int mc = imin(mb, M - m0);
      for (int t = 0; t < mc; ++t) in[t] = I + int64_t(m0 + t) * K;
      for (int r = 0; r < nrows; r += 4) {
        const int rn = imin(4, nrows - r);
        if (rn < 4) {
          for (int q = 0; q < rn; ++q)
            for (int p = g0; p < g1; ++p)
              for (int t = 0; t < mc; ++t)
                dot_tile<1, 1>(w + r + q, in + t, pc[2 * p], pc[2 * p + 1],
                               o.c + int64_t(r + q) * o.row_ld + p * o.piece_ld + m0 + t, ld);
          continue;
        }
        for (int p = g0; p < g1; ++p) {
          const int k0 = pc[2 * p], k1 = pc[2 * p + 1];
          float* cr = o.c + int64_t(r) * o.row_ld + p * o.piece_ld + m0;
          for (int s0 = k0; s0 < k1; s0 += kSubK) {
            const int s1 = imin(s0 + kSubK, k1);
            const bool first = s0 == k0, last = s1 == k1;
            // The first pair prefetches the W sub-block after this one: the next of these rows
            // in this group, else the group's first of the next 4 rows.
            const bf16_t* pf[4];
            const bf16_t* const* pfp = pf;
            if (s1 < gk1) for (int q = 0; q < 4; ++q) pf[q] = w[r + q] + s1;
            else if (r + 8 <= nrows) for (int q = 0; q < 4; ++q) pf[q] = w[r + 4 + q] + gk0;
            else pfp = nullptr;
            int t = 0;
            if (pfp && mc >= 2) {
              acc_tile<4, 2, true>(w + r, in, s0, s1, acc, first, last, cr, ld, pfp);
              t = 2;
            }
            for (; t + 2 <= mc; t += 2)
              acc_tile<4, 2>(w + r, in + t, s0, s1, acc + 4 * t, first, last, cr + t, ld);
            if (t < mc) acc_tile<4, 1>(w + r, in + t, s0, s1, acc + 4 * t, first, last, cr + t, ld);
          }
        }
      }
    }
    g0 = g1;
  }
}

// The fused plain kernel: all pieces of [0, K) for rows sharing the cuts of w[0], chained.
void mm_rows_chained(const bf16_t* const* w, int nrows, const float* I, int M, int K, float* c) {
  int32_t pc[2 * kMaxPieces];
  const int np = row_pieces(piece_phase(w[0]), K, pc);
  mm_rows(w, nrows, I, M, K, pc, np, Out{c, M, 0});
}

thread_local ThreadScratch<float> tl_c{nullptr, 0};
thread_local ThreadScratch<const bf16_t*> tl_rows{nullptr, 0};

// Gate & up rows together (one pass over both), SiLU(gate)*up fused into the store, which writes
// the activation in the split-16 layout the down projection reads (transformation 2).
void gate_up(const GateUpTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(2) * t.n);
  for (int j = 0; j < t.n; ++j) {
    rows[j] = t.w_gate + j * t.ldw_gate;
    rows[t.n + j] = t.w_up + j * t.ldw_up;
  }
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  // gate rows and up rows separately: each matrix's rows share their piece cuts, the two may not
  mm_rows_chained(rows, t.n, static_cast<const float*>(t.I), t.M, t.K, c);
  mm_rows_chained(rows + t.n, t.n, static_cast<const float*>(t.I), t.M, t.K, c + int64_t(t.n) * t.M);
  float* act = static_cast<float*>(t.act);
  for (int m = 0; m < t.M; ++m) {
    float* a = act + int64_t(m) * t.act_K;
    for (int j = 0; j < t.n; ++j)
      a[split16(t.n0 + j)] = silu_mul(c[j * t.M + m], c[(t.n + j) * t.M + m]);
  }
}

// Down projection, transpose fused into the store: y[m][n0 + j] = C[j][m] (transformation 3).
void down(const DownTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.n));
  for (int j = 0; j < t.n; ++j) rows[j] = t.w_down + j * t.ldw;
  float* c = tl_c.get(size_t(t.n) * t.M);
  mm_rows_chained(rows, t.n, static_cast<const float*>(t.act), t.M, t.K, c);
  for (int m = 0; m < t.M; ++m) {
    float* yr = t.y + m * t.ldy + t.n0;
    for (int j = 0; j < t.n; ++j) yr[j] = c[j * t.M + m];
  }
}

// NUMA path: rows w + r*ldw, the listed pieces, one output slot per piece.
void piece_dots(const PieceTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.nrows));
  for (int j = 0; j < t.nrows; ++j) rows[j] = t.w + j * t.ldw;
  mm_rows(rows, t.nrows, static_cast<const float*>(t.I), t.M, t.K, t.pieces, t.npieces,
          Out{t.out, int64_t(t.npieces) * t.M, t.M});
}

// Transformation 2 on reduced sums: the same store as gate_up's.
void store_act(void* act_v, int act_K, int n0, int n, int M, const float* g, const float* u) {
  float* act = static_cast<float*>(act_v);
  for (int m = 0; m < M; ++m) {
    float* a = act + int64_t(m) * act_K;
    for (int j = 0; j < n; ++j) a[split16(n0 + j)] = silu_mul(g[j * M + m], u[j * M + m]);
  }
}

}  // namespace
}  // namespace avx2_kernel

using namespace avx2_kernel;

const MicroKernel& microkernel_avx2() {
  static const MicroKernel mk{"avx2", 64, packed_bytes, pack_tokens, gate_up, down,
                              piece_dots, store_act};
  return mk;
}

}  // namespace hina
