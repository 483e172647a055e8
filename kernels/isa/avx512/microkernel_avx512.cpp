// The AVX-512 BF16 micro-kernel: `vdpbf16ps` on the general layout, for CPUs without AMX
// (AMD Zen 4/5, Cooper Lake, Sapphire Rapids cores without AMX permission).
//
// Along K, W rows (general layout) and I rows are both contiguous, so the dot-product form needs
// no transform of W at all: one 64-byte load of 32 bf16 from a W row, one from an I row, and
//     acc_lane[j] += W[2j] * I[2j] + W[2j+1] * I[2j+1]            (vdpbf16ps)
// with the 16 lanes summed once per canonical K piece (moe_ffn.h). Transformation 1 is therefore a
// plain gather of bf16 rows, and transformation 2 rounds SiLU(gate)*up to bf16 into the same
// row-major [M, I] layout.
//
// Blocking: R W rows x TT tokens of zmm accumulators.
//   M <= 4: every W row streamed from memory once, R = 8 (M <= 2) or 4 rows at a time.
//   M > 4: 4 rows x 4 tokens (16 accumulators), K in canonical pieces (<= 2048, moe_ffn.h: a 16 KiB
//     W slice in L1), token blocks of 32 (I slice 128 KiB in L2); W re-read once per 32 tokens.
//
// Built twice from this one source: for real (-mavx512bf16 ..., `_C`, isa "avx512") and against
// SIMDe's portable AVX-512 (HINA_EMU_AVX512, no -mavx512 flags, `_C_avx512_emu`, isa
// "avx512-emulated"), so the kernel's logic is tested on CPUs without AVX-512.
#if defined(HINA_EMU_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif

#include <cstdlib>
#include <cstring>

#include "microkernel.h"

namespace hina {
namespace avx512_kernel {
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

constexpr int kChunk = 32;     // bf16 per zmm load
constexpr int kMBlock = 32;

inline __m512bh load_bh(const bf16_t* p) {
  __m512bh v;
  std::memcpy(&v, p, sizeof(v));  // a plain 64-byte load (vmovdqu16 natively)
  return v;
}

inline float hsum(__m512 v) {
  alignas(64) float f[16];
  _mm512_storeu_ps(f, v);
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += f[i];
  return s;
}

size_t packed_bytes(int M, int K) { return size_t(M) * K * sizeof(bf16_t); }

// Transformation 1: the layout vdpbf16ps wants along K is the general one: a plain row gather.
void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  bf16_t* dst = static_cast<bf16_t*>(I);
  for (int m = 0; m < M; ++m)
    std::memcpy(dst + int64_t(m) * K, x + int64_t(rows[m]) * ldx, size_t(K) * sizeof(bf16_t));
}

// C[r * ldc + t] += sum_{k0 <= k < k1} W_r[k] * I_t[k]
template <int R, int TT>
inline void dot_tile(const bf16_t* const* w, const bf16_t* const* in, int k0, int k1, float* c,
                     int ldc) {
  __m512 acc[R][TT];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int k = k0; k < k1; k += kChunk) {
    __m512bh x[TT];
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) x[t] = load_bh(in[t] + k);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = load_bh(w[r] + k);
      #pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, x[t]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) c[r * ldc + t] += hsum(acc[r][t]);
}

// Output addressing as in the AVX2 kernel: row r, piece p, token t -> c[r*row_ld + p*piece_ld + t]
// (piece_ld = 0: pieces chained in ascending order, the fused plain kernel; M: one slot per piece).
struct Out { float* c; int64_t row_ld, piece_ld; };

template <int R, int TT>
void rows_x_tokens(const bf16_t* const* w, int nrows, const bf16_t* const* in, const int32_t* pc,
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

// C = W[rows, pieces] . I[M, K]^T, rows by pointers, all sharing the pieces `pc` (each <= 2048).
void mm_rows(const bf16_t* const* w, int nrows, const bf16_t* I, int M, int K, const int32_t* pc,
             int np, Out o) {
  for (int64_t i = 0; i < int64_t(nrows) * o.row_ld; ++i) o.c[i] = 0.f;
  const bf16_t* in[kMBlock];
  if (M <= 4) {
    for (int t = 0; t < M; ++t) in[t] = I + int64_t(t) * K;
    switch (M) {
      case 1: rows_x_tokens<8, 1>(w, nrows, in, pc, np, o); break;
      case 2: rows_x_tokens<8, 2>(w, nrows, in, pc, np, o); break;
      case 3: rows_x_tokens<4, 3>(w, nrows, in, pc, np, o); break;
      default: rows_x_tokens<4, 4>(w, nrows, in, pc, np, o); break;
    }
    return;
  }
  const int ld = int(o.row_ld);
  for (int m0 = 0; m0 < M; m0 += kMBlock) {
    const int mc = imin(kMBlock, M - m0);
    for (int t = 0; t < mc; ++t) in[t] = I + int64_t(m0 + t) * K;
    for (int p = 0; p < np; ++p) {  // one piece (<= 2048: a 16 KiB W slice of 4 rows) at a time
      const int k0 = pc[2 * p], k1 = pc[2 * p + 1];
      for (int r = 0; r < nrows; r += 4) {
        const int rn = imin(4, nrows - r);
        float* cr = o.c + int64_t(r) * o.row_ld + p * o.piece_ld + m0;
        if (rn == 4) {
          int t = 0;
          for (; t + 4 <= mc; t += 4) dot_tile<4, 4>(w + r, in + t, k0, k1, cr + t, ld);
          for (; t < mc; ++t) dot_tile<4, 1>(w + r, in + t, k0, k1, cr + t, ld);
        } else {
          for (int q = 0; q < rn; ++q)
            for (int t = 0; t < mc; ++t) dot_tile<1, 1>(w + r + q, in + t, k0, k1, cr + q * ld + t, ld);
        }
      }
    }
  }
}

// The fused plain kernel: all pieces of [0, K) for rows sharing the cuts of w[0], chained.
void mm_rows_chained(const bf16_t* const* w, int nrows, const bf16_t* I, int M, int K, float* c) {
  int32_t pc[2 * kMaxPieces];
  const int np = row_pieces(piece_phase(w[0]), K, pc);
  mm_rows(w, nrows, I, M, K, pc, np, Out{c, M, 0});
}

thread_local ThreadScratch<float> tl_c{nullptr, 0};
thread_local ThreadScratch<const bf16_t*> tl_rows{nullptr, 0};

// Gate & up in one pass; SiLU(gate)*up rounded to bf16 into the row-major activation
// (transformation 2: the layout the down projection's vdpbf16ps reads along K).
void gate_up(const GateUpTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(2) * t.n);
  for (int j = 0; j < t.n; ++j) {
    rows[j] = t.w_gate + j * t.ldw_gate;
    rows[t.n + j] = t.w_up + j * t.ldw_up;
  }
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  // gate rows and up rows separately: each matrix's rows share their piece cuts, the two may not
  mm_rows_chained(rows, t.n, static_cast<const bf16_t*>(t.I), t.M, t.K, c);
  mm_rows_chained(rows + t.n, t.n, static_cast<const bf16_t*>(t.I), t.M, t.K, c + int64_t(t.n) * t.M);
  bf16_t* act = static_cast<bf16_t*>(t.act);
  for (int m = 0; m < t.M; ++m)
    for (int j = 0; j < t.n; ++j)
      act[int64_t(m) * t.act_K + t.n0 + j] =
          f32_to_bf16(silu_mul(c[j * t.M + m], c[(t.n + j) * t.M + m]));
}

// Down projection; the transpose fused into the store (transformation 3).
void down(const DownTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.n));
  for (int j = 0; j < t.n; ++j) rows[j] = t.w_down + j * t.ldw;
  float* c = tl_c.get(size_t(t.n) * t.M);
  mm_rows_chained(rows, t.n, static_cast<const bf16_t*>(t.act), t.M, t.K, c);
  for (int m = 0; m < t.M; ++m) {
    float* yr = t.y + m * t.ldy + t.n0;
    for (int j = 0; j < t.n; ++j) yr[j] = c[j * t.M + m];
  }
}

// NUMA path: rows w + r*ldw, the listed pieces, one output slot per piece.
void piece_dots(const PieceTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.nrows));
  for (int j = 0; j < t.nrows; ++j) rows[j] = t.w + j * t.ldw;
  mm_rows(rows, t.nrows, static_cast<const bf16_t*>(t.I), t.M, t.K, t.pieces, t.npieces,
          Out{t.out, int64_t(t.npieces) * t.M, t.M});
}

// Transformation 2 on reduced sums: the same store as gate_up's.
void store_act(void* act_v, int act_K, int n0, int n, int M, const float* g, const float* u) {
  bf16_t* act = static_cast<bf16_t*>(act_v);
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < n; ++j)
      act[int64_t(m) * act_K + n0 + j] = f32_to_bf16(silu_mul(g[j * M + m], u[j * M + m]));
}

}  // namespace
}  // namespace avx512_kernel

using namespace avx512_kernel;

const MicroKernel& microkernel_avx512() {
#if defined(HINA_EMU_AVX512)
  static const MicroKernel mk{"avx512-emulated", 64, packed_bytes, pack_tokens, gate_up, down,
                              piece_dots, store_act};
#else
  static const MicroKernel mk{"avx512", 64, packed_bytes, pack_tokens, gate_up, down,
                              piece_dots, store_act};
#endif
  return mk;
}

}  // namespace hina
