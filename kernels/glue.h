// The micro-kernels' shared glue: everything that is the same for every ISA, written once as
// templates over an ISA-traits struct `Kn` that each ISA file (isa/<isa>/) defines. Per ISA remains
// only what the instructions force: the vector types, the W / I loads and the multiply-add, the
// packed layouts of I and of the activation, the tile code of AMX.
//
// LINKAGE: include this header only from ISA files, and only there. Everything in it has INTERNAL
// linkage (the anonymous namespace below; numeric.h and pieces.h are `static inline`). Each ISA file
// is compiled with its own -m flags; an inline function or template instantiation with external
// linkage would be emitted as a COMDAT in every file that uses it, the linker would keep ONE copy
// for all of them -- possibly the AVX-512 one -- and the AVX2 or scalar path would SIGILL on an
// AVX2-only CPU. For the same reason: no STL containers or algorithms here or in the ISA files
// (their members are COMDAT), and no link-time optimisation (CMakeLists.txt: NO_EXTRAS).
//
// What a traits struct provides
//   every kernel      put_act(act, act_K, m, k, v): element k of token m's activation := v, in the
//                     kernel's layout (transformation 2's store); or put_act_m(act, act_K, M, m, k, v)
//                     where the layout depends on the token count M
//   optional          outer(M) and mm_outer: the kernel's own loop nest where outer(M) says so (AVX2's
//                     outer-product tiles, on its transposed layout of I and the activation)
//   dot-product form  (AVX2, AVX-512: W rows and token rows both contiguous along K)
//                     Elem          element of the packed I and activation
//                     Acc, X, W     accumulator vector; one chunk of a token's I; one chunk of a W row
//                     kChunk        K elements per chunk
//                     kBlocking     the Blocking (microkernel.h) of glue's loop nest
//                     zero(), load_x(const Elem*), load_w(const bf16_t*), fma(Acc, W, X) -> Acc,
//                     hsum(Acc) -> float (optional: hsum16 and store16, 16 sums at once, the
//                     same bits), packed_bytes, pack_tokens; prefetch(const bf16_t*)
//                     (into L1) and prefetch_l2 where kBlocking's prefetch fields ask for them;
//                     optional: kAltBlocking, AltBlocking (traits with another kBlocking) and
//                     alt_blocking() (whether to take it on this CPU, per call)
#pragma once
#include <cstdlib>
#include <cstring>

#include "microkernel.h"
#include "numeric.h"
#include "pieces.h"
#include "scratch.h"

namespace hina {
namespace {  // internal linkage, on purpose: see LINKAGE above

inline int imin(int a, int b) { return a < b ? a : b; }
// Position of element j of a row in the "split-C" layout of the fp32 tiles (AVX2: C = 16, AVX-512 without
// AVX512_BF16: 32): per chunk of C elements, the C/2 even ones, then the C/2 odd ones.
template <int C>
inline int split_pos(int j) { return (j & ~(C - 1)) | ((j & 1) * (C / 2)) | ((j & (C - 1)) >> 1); }
inline int imax(int a, int b) { return a > b ? a : b; }

// ---- the stores of transformations 2 and 3 (every kernel) ---------------------------------------
// Kn::put_act_m(act, act_K, M, m, k, v): put_act for a kernel whose activation layout depends on its
// token count M (AVX2's transposed blocks); the stores below take it where a kernel has it.
template <class Kn, class = void> struct HasPutActM { static constexpr bool value = false; };
template <class Kn>
struct HasPutActM<Kn, decltype(void(Kn::put_act_m(nullptr, 0, 0, 0, 0, 0.f)))> { static constexpr bool value = true; };

// Transformation 2: activation columns [n0, n0+n) of tokens [m0, m0+M) = SiLU(g) * u, with g, u of
// column j and token m at [j * ldg + m], written in the kernel's layout (Kn::put_act, or Kn::put_act_m
// with the token count m0 + M: every caller passes m0 = 0, M = all the activation's tokens).
// (SiLU first into a block of 64, a loop that vectorizes, then the kernel's stores.)
template <class Kn>
inline void store_act_block(void* act, int act_K, int n0, int n, int m0, int M, const float* g,
                            const float* u, int64_t ldg) {
  float s[64];
  for (int m = 0; m < M; ++m)
    for (int j0 = 0; j0 < n; j0 += 64) {
      const int jn = n - j0 < 64 ? n - j0 : 64;
      for (int j = 0; j < jn; ++j) s[j] = silu_mul(g[(j0 + j) * ldg + m], u[(j0 + j) * ldg + m]);
      for (int j = 0; j < jn; ++j) {
        if constexpr (HasPutActM<Kn>::value) Kn::put_act_m(act, act_K, m0 + M, m0 + m, n0 + j0 + j, s[j]);
        else Kn::put_act(act, act_K, m0 + m, n0 + j0 + j, s[j]);
      }
    }
}

// The table's store_act: transformation 2 on the driver's reduced sums, the same store as gate_up's.
template <class Kn>
void store_act(void* act, int act_K, int n0, int n, int M, const float* g, const float* u) {
  store_act_block<Kn>(act, act_K, n0, n, 0, M, g, u, M);
}

// Transformation 3, the transpose: y[m][n0 + j] = C[j][m] (C's rows ldc apart), y row-major fp32.
inline void store_y(float* y, int64_t ldy, int n0, int n, int M, const float* c, int64_t ldc) {
  for (int m = 0; m < M; ++m) {
    float* yr = y + m * ldy + n0;
    for (int j = 0; j < n; ++j) yr[j] = c[j * ldc + m];
  }
}

// ---- the dot-product form (AVX2, AVX-512) --------------------------------------------------------
// Kn::hsum16(const Acc (&)[16]) -> 16 horizontal sums in one vector (Kn::store16 writes it out), where
// a kernel has it: the same bits as 16 calls of Kn::hsum, fewer instructions.
template <class Kn, class = void> struct HasHsum16 { static constexpr bool value = false; };
template <class Kn>
struct HasHsum16<Kn, decltype(void(Kn::hsum16(*static_cast<const typename Kn::Acc (*)[16]>(nullptr))))> {
  static constexpr bool value = true;
};
// Kn::ld(K): the row stride of the packed I and activation, where a kernel pads it (else K).
template <class Kn, class = void> struct ILd { static int64_t of(int K) { return K; } };
template <class Kn> struct ILd<Kn, decltype(void(Kn::ld(0)))> { static int64_t of(int K) { return Kn::ld(K); } };
// One step of a register tile: chunks [k, k + N * kChunk) of its R rows against its TT tokens (acc_tile).
template <class Kn, int R, int TT, int PF, int N>
__attribute__((always_inline)) inline void tile_step(typename Kn::Acc (&acc)[R][TT], const bf16_t* const* w,
                                                     const typename Kn::Elem* const* in, int k, int k0,
                                                     const bf16_t* const* pf) {
  constexpr int C = Kn::kChunk;
  typename Kn::X x[N][TT];
  #pragma GCC unroll 16
  for (int u = 0; u < N; ++u)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) x[u][t] = Kn::load_x(in[t] + k + u * C);
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int u = 0; u < N; ++u) {
      if constexpr (PF == 1) Kn::prefetch(pf[r] + (k + u * C - k0));
      if constexpr (PF == 2) Kn::prefetch_l2(pf[r] + (k + u * C - k0));
      if constexpr (PF == 3) Kn::prefetch(w[r] + k + u * C + Kn::kBlocking.decode_ahead);
      const typename Kn::W wv = Kn::load_w(w[r] + k + u * C);
      #pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) acc[r][t] = Kn::fma(acc[r][t], wv, x[u][t]);
    }
}

// The horizontal sums of a tile's accumulators added into at(r, t) (a float&): 16 at a time where the
// kernel has hsum16 and the tile has at least 4 (the same bits as Kn::hsum's), else one by one.
template <class Kn, int R, int TT, class At>
__attribute__((always_inline)) inline void add_sums(const typename Kn::Acc (&acc)[R][TT], At at) {
  if constexpr (HasHsum16<Kn>::value && R * TT >= 4) {
    constexpr int N = R * TT;
    #pragma GCC unroll 4
    for (int g = 0; g < N; g += 16) {
      typename Kn::Acc v[16];
      #pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) v[i] = g + i < N ? acc[(g + i) / TT][(g + i) % TT] : Kn::zero();
      alignas(64) float s[16];
      Kn::store16(s, Kn::hsum16(v));
      #pragma GCC unroll 16
      for (int i = 0; i < 16 && g + i < N; ++i) at((g + i) / TT, (g + i) % TT) += s[i];
    }
  } else {
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) at(r, t) += Kn::hsum(acc[r][t]);
  }
}

// The register tile: C[r * ldc + t] += sum_{k0 <= k < k1} W_r[k] * I_t[k]   for r < R, t < TT,
// [k0, k1) a piece or a sub-block of one. The accumulators start at zero on the piece's first
// sub-block (`first`), else are loaded from buf (R x TT vectors, row-major); at the piece's last
// sub-block (`last`) their horizontal sums are added into c, else they are stored back to buf.
// Per (row, token) the multiply-adds are the same, in the same order, whatever R, TT or the
// sub-blocking: every blocking gives bit-identical sums.
// With PF (1: into L1, 2: into L2), also prefetches pf[r][0 .. k1-k0): the W slice the next call
// will stream from memory, so DRAM traffic overlaps this tile's FMAs instead of stalling the next one.
// PF 3: w[r] itself, Kn::kBlocking.decode_ahead elements ahead, into L1. U: U chunks of a row are
// read (and their multiply-adds issued, in order) before the next row's: a row's accesses come U
// lines at a time. Neither changes a sum.
// Row r's sums go to c + r * ldc, or with `pair_ld` (rows taken in pairs, rows_x_tokens) to
// c + (r / 2) * ldc + (r % 2) * pair_ld.
template <class Kn, int R, int TT, int PF = 0, int U = 1>
inline void acc_tile(const bf16_t* const* w, const typename Kn::Elem* const* in, int k0, int k1,
                     typename Kn::Acc* buf, bool first, bool last, float* c, int ldc,
                     const bf16_t* const* pf = nullptr, int pair_ld = 0) {
  auto row_off = [&](int r) { return pair_ld ? (r >> 1) * ldc + (r & 1) * pair_ld : r * ldc; };
  constexpr int C = Kn::kChunk;
  typename Kn::Acc acc[R][TT];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) acc[r][t] = first ? Kn::zero() : buf[r * TT + t];
  // U chunks of every row at a time, then the rest one at a time
  int k = k0;
  if constexpr (U > 1)
    for (; k + U * C <= k1; k += U * C) tile_step<Kn, R, TT, PF, U>(acc, w, in, k, k0, pf);
  for (; k < k1; k += C) tile_step<Kn, R, TT, PF, 1>(acc, w, in, k, k0, pf);
  if (last) return add_sums<Kn, R, TT>(acc, [&](int r, int t) -> float& { return c[row_off(r) + t]; });
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) buf[r * TT + t] = acc[r][t];
}

// A whole piece, accumulators in registers only.
template <class Kn, int R, int TT>
inline void dot_tile(const bf16_t* const* w, const typename Kn::Elem* const* in, int k0, int k1,
                     float* c, int ldc) {
  acc_tile<Kn, R, TT>(w, in, k0, k1, nullptr, true, true, c, ldc);
}

// Output addressing: the product of row r, piece p, token t goes to c[r * row_ld + p * piece_ld + t]
// (piece_ld = 0: pieces chained in ascending order into one sum, the fused plain kernel;
//  piece_ld = M: one slot per piece, the piece path). Every piece starts from fresh accumulators
// and adds its horizontal sum into its slot, so a piece's value never depends on R, TT or blocking.
// group 2: the rows come in pairs (gate_up's interleaved gate and up rows) that a decode tile taking
// rows far apart (rows_x_tokens' FAR) keeps together.
struct Out { float* c; int64_t row_ld, piece_ld; int group = 1; };

// All `nrows` rows against tokens in[0..TT), every piece: R rows at a time, U chunks of a row at a
// time (acc_tile). FAR: the rows cut into R equal segments, tile i takes row i of each (with pairs,
// o.group 2: R/2 segments, pair i of each): R streams far apart in memory instead of a W row apart
// (on Zen 5, 2026-12-05, one thread: two consecutive rows at a time read at 0.6-0.7 of one stream's
// rate, four at 0.8, two or four far apart at 0.95-1.0); the rows left over go one at a time.
template <class Kn, int R, int TT, int PF, bool FAR = false, int U = 1>
void rows_x_tokens(const bf16_t* const* w, int nrows, const typename Kn::Elem* const* in,
                   const int32_t* pc, int np, Out o) {
  // FAR: tile i takes rows i*G .. i*G+G-1 of each of the R/G segments of S rows (G: o.group, pairs
  // kept together); else rows i*R .. i*R+R-1. Row q of a tile is w[first + (q / G) * S + q % G].
  const int G = FAR && o.group == 2 && R % 2 == 0 ? 2 : 1;
  const int tiles = nrows / R;
  const int S = FAR ? tiles * G : 0;
  const int ldc = FAR ? int(S * o.row_ld) : int(o.row_ld);
  const int pair_ld = G == 2 ? int(o.row_ld) : 0;
  for (int i = 0; i < tiles; ++i) {
    const int first = FAR ? i * G : i * R;
    const bf16_t* far_rows[R];
    if constexpr (FAR) {
      #pragma GCC unroll 16
      for (int q = 0; q < R; ++q) far_rows[q] = w[first + (q / G) * S + q % G];
    }
    // (not copied when consecutive: the copy cost Qwen3-30B-A3B's one-token tiles 1.05x the time)
    const bf16_t* const* wr = FAR ? far_rows : w + first;
    for (int p = 0; p < np; ++p) {
      float* c = o.c + first * o.row_ld + p * o.piece_ld;
      // PF 1, 2: while this tile streams piece p of its rows, the same piece of the next tile's rows
      // is prefetched, so every piece of the next tile is covered whatever the pieces' lengths.
      // (It was the next piece in this order: these rows' next piece, else the next R rows' first,
      // over this piece's length. torch's large tensors start 64 bytes past a page, so a 2048-element
      // row is cut 2016 + 32: the 32-element piece prefetched 32 elements of the next tile's 2016.)
      if constexpr (PF == 1 || PF == 2) {
        if (i + 1 < tiles) {
          const int next = FAR ? first + G : first + R;
          const bf16_t* pf[R];
          for (int q = 0; q < R; ++q) pf[q] = w[next + (FAR ? (q / G) * S + q % G : q)] + pc[2 * p];
          acc_tile<Kn, R, TT, PF, U>(wr, in, pc[2 * p], pc[2 * p + 1], nullptr, true, true, c, ldc, pf, pair_ld);
          continue;
        }
        acc_tile<Kn, R, TT, 0, U>(wr, in, pc[2 * p], pc[2 * p + 1], nullptr, true, true, c, ldc, nullptr, pair_ld);
      } else {
        acc_tile<Kn, R, TT, PF, U>(wr, in, pc[2 * p], pc[2 * p + 1], nullptr, true, true, c, ldc, nullptr, pair_ld);
      }
    }
  }
  for (int r = tiles * R; r < nrows; ++r)
    for (int p = 0; p < np; ++p)
      dot_tile<Kn, 1, TT>(w + r, in, pc[2 * p], pc[2 * p + 1], o.c + r * o.row_ld + p * o.piece_ld,
                          int(o.row_ld));
}

// Decode tiles over rows whose cuts differ (decode_mixed_rows R > 0): R rows far apart (tile i takes
// row i of each of R equal segments), every row with its own pieces: the tile streams chunks up to the
// nearest cut of any of its rows, and each row whose piece ends there adds its horizontal sums into
// c[row * M + t] and starts from zero again. Per (row, token) the same multiply-adds in the same order
// and the pieces added to 0 in ascending order: the canonical sums, bit for bit, with the rows read
// in memory order instead of class by class (every 8th row of Qwen3's down projection).
template <class Kn, int R, int TT, int PF, int U>
void rows_mixed(const bf16_t* const* w, int nrows, const typename Kn::Elem* const* in, int K, float* c,
                int M) {
  constexpr int C = Kn::kChunk;
  const int tiles = nrows / R;
  for (int i = 0; i < tiles; ++i) {
    const bf16_t* wr[R];
    int c0[R], cut[R], row[R];
    typename Kn::Acc acc[R][TT];
    #pragma GCC unroll 16
    for (int q = 0; q < R; ++q) {
      row[q] = q * tiles + i;
      wr[q] = w[row[q]];
      c0[q] = piece_phase(wr[q]);
      cut[q] = piece_end(0, c0[q], K);
      #pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) acc[q][t] = Kn::zero();
    }
    for (int k = 0; k < K;) {
      int e = cut[0];
      #pragma GCC unroll 16
      for (int q = 1; q < R; ++q) e = imin(e, cut[q]);
      if constexpr (U > 1)
        for (; k + U * C <= e; k += U * C) tile_step<Kn, R, TT, PF, U>(acc, wr, in, k, 0, nullptr);
      for (; k < e; k += C) tile_step<Kn, R, TT, PF, 1>(acc, wr, in, k, 0, nullptr);
      if (e == K) break;
      #pragma GCC unroll 16
      for (int q = 0; q < R; ++q)
        if (cut[q] == e) {
          #pragma GCC unroll 16
          for (int t = 0; t < TT; ++t) {
            c[int64_t(row[q]) * M + t] += Kn::hsum(acc[q][t]);
            acc[q][t] = Kn::zero();
          }
          cut[q] = piece_end(e, c0[q], K);
        }
    }
    add_sums<Kn, R, TT>(acc, [&](int q, int t) -> float& { return c[int64_t(row[q]) * M + t]; });
  }
  if constexpr (R > 1)
    rows_mixed<Kn, 1, TT, PF, U>(w + tiles * R, nrows - tiles * R, in, K, c + int64_t(tiles) * R * M, M);
}

// decode_mixed_rows rows a tile (halved while rows x M exceeds decode_mixed_acc), one token:
// decode_short_prefetch, one chunk at a time; 2..decode_max_m tokens: decode_prefetch[M] and
// decode_unroll. Of the prefetches only 3 (the tile's own rows ahead) is taken: the next tile's rows (1,
// 2) have other cuts, so they run without one.
constexpr int mixed_rows(const Blocking& b, int tokens) {
  int r = b.decode_mixed_rows;
  while (b.decode_mixed_acc && r > 1 && r * tokens > b.decode_mixed_acc) r /= 2;
  return r;
}
template <class Kn, int TT = 1>
void decode_mixed(const bf16_t* const* w, int nrows, const typename Kn::Elem* I, int M, int K, float* c) {
  constexpr Blocking B = Kn::kBlocking;
  if constexpr (TT < B.decode_max_m) {
    if (M > TT) return decode_mixed<Kn, TT + 1>(w, nrows, I, M, K, c);
  }
  const typename Kn::Elem* in[TT];
  for (int t = 0; t < TT; ++t) in[t] = I + int64_t(t) * ILd<Kn>::of(K);
  for (int64_t i = 0; i < int64_t(nrows) * M; ++i) c[i] = 0.f;
  constexpr int PF = TT == 1 ? (B.decode_short_prefetch == 3 ? 3 : 0) : (B.decode_prefetch[TT] == 3 ? 3 : 0);
  rows_mixed<Kn, mixed_rows(B, TT), TT, PF, TT == 1 ? 1 : B.decode_unroll>(w, nrows, in, K, c, M);
}

// Decode (M <= decode_max_m tokens): each W row streamed once, all tokens in registers,
// decode_rows[M] rows per tile.
template <class Kn, int TT = 1>
void decode(const bf16_t* const* w, int nrows, const typename Kn::Elem* const* in, int M,
                 const int32_t* pc, int np, Out o) {
  constexpr Blocking B = Kn::kBlocking;
  if constexpr (TT < B.decode_max_m) {
    if (M > TT) return decode<Kn, TT + 1>(w, nrows, in, M, pc, np, o);
  }
  if constexpr (TT == 1 && B.decode_short_k != 0) {
    if (pc[2 * np - 1] - pc[0] <= B.decode_short_k)
      return rows_x_tokens<Kn, B.decode_short_rows, 1, B.decode_short_prefetch, B.decode_far>(w, nrows, in, pc, np, o);
  }
  rows_x_tokens<Kn, B.decode_rows[TT], TT, B.decode_prefetch[TT], B.decode_far, B.decode_unroll>(
      w, nrows, in, pc, np, o);
}

template <class Kn>
thread_local ThreadScratch<typename Kn::Acc> tl_acc{nullptr, 0};

// The end of the K group that starts at piece g0: the pieces from g0 spanning <= k_group (at least one).
inline int group_end(const int32_t* pc, int np, int g0, int k_group) {
  int g1 = g0 + 1;
  while (g1 < np && pc[2 * g1 + 1] - pc[2 * g0] <= k_group) ++g1;
  return g1;
}

// Kn::mm_outer(w, nrows, I, M, K, pc, np, o): a kernel's own loop nest where Kn::outer(M) (AVX2's
// outer-product tiles from 16 tokens, on I and the activation in their transposed layout), the same
// sums bit for bit.
template <class Kn, class = void> struct HasOuter { static constexpr bool value = false; };
template <class Kn> struct HasOuter<Kn, decltype(void(Kn::kOuterMinM))> { static constexpr bool value = true; };

// C = W[rows, pieces] . I[M, K]^T, W rows given by pointers, all sharing the pieces `pc`; the loop
// nest (Algorithm 1's, on vector registers) with the kernel's Blocking:
//   M <= decode_max_m: decode.
//   else: K in groups of canonical pieces spanning <= k_group (0: one piece per group), tokens in
//   blocks of mb (mb_l2_bytes: the block's I slice over a group fits that L2 budget), token blocks
//   outside or inside the K groups (token_blocks_outer); per block mr rows at a time, the group's
//   pieces, sub-blocks of k_sub (0: the whole piece; a piece's accumulators are carried across its
//   sub-blocks in L1, so the sums are those of whole-piece tiles, bit for bit), tiles of nr tokens.
// Kn::AltBlocking (microkernel.h's HasAltBlocking): traits whose kBlocking replaces Kn's, chosen per
// call here and in mm_rows_chained. The same bits.
template <class Kn>
void mm_rows(const bf16_t* const* w, int nrows, const typename Kn::Elem* I, int M, int K,
             const int32_t* pc, int np, Out o) {
  if constexpr (HasAltBlocking<Kn>::value) {
    if (Kn::alt_blocking()) return mm_rows<typename Kn::AltBlocking>(w, nrows, I, M, K, pc, np, o);
  }
  using Elem = typename Kn::Elem;
  constexpr Blocking B = Kn::kBlocking;
  constexpr int MR = B.mr, NR = B.nr;
  for (int64_t i = 0; i < int64_t(nrows) * o.row_ld; ++i) o.c[i] = 0.f;
  const Elem* in[B.mb_max];
  if (M <= B.decode_max_m) {
    for (int t = 0; t < M; ++t) in[t] = I + int64_t(t) * ILd<Kn>::of(K);
    decode<Kn>(w, nrows, in, M, pc, np, o);
    return;
  }
  if constexpr (HasOuter<Kn>::value) {
    if (Kn::outer(M)) return Kn::mm_outer(w, nrows, I, M, K, pc, np, o);
  }
  int mb = B.mb_max;  // tokens per block
  if constexpr (B.mb_l2_bytes != 0)
    mb = imax(B.mb_min, imin(B.mb_max, (B.mb_l2_bytes / (imin(K, B.k_group) * int(sizeof(Elem)))) & -NR));
  // carried accumulators of a token block's tiles (k_sub: a piece in several sub-blocks)
  typename Kn::Acc* acc = nullptr;
  if constexpr (B.k_sub != 0) acc = tl_acc<Kn>.get(size_t(MR) * B.mb_max);
  auto acc_of = [&](int t) -> typename Kn::Acc* {
    if constexpr (B.k_sub != 0) return acc + MR * t;
    else return nullptr;
  };
  const int ld = int(o.row_ld);
  // Pieces [g0, g1) (spanning [gk0, gk1)) against tokens [m0, m0 + mb).
  auto block = [&](int g0, int g1, int m0) {
    const int gk0 = pc[2 * g0], gk1 = pc[2 * g1 - 1];
    const int mc = imin(mb, M - m0);
    for (int t = 0; t < mc; ++t) in[t] = I + int64_t(m0 + t) * ILd<Kn>::of(K);
    for (int r = 0; r < nrows; r += MR) {
      const int rn = imin(MR, nrows - r);
      if (rn < MR) {
        for (int q = 0; q < rn; ++q)
          for (int p = g0; p < g1; ++p)
            for (int t = 0; t < mc; ++t)
              dot_tile<Kn, 1, 1>(w + r + q, in + t, pc[2 * p], pc[2 * p + 1],
                                 o.c + int64_t(r + q) * o.row_ld + p * o.piece_ld + m0 + t, ld);
        continue;
      }
      for (int p = g0; p < g1; ++p) {
        const int k0 = pc[2 * p], k1 = pc[2 * p + 1];
        float* cr = o.c + int64_t(r) * o.row_ld + p * o.piece_ld + m0;
        for (int s0 = k0; s0 < k1; s0 += B.k_sub ? B.k_sub : k1 - k0) {
          const int s1 = B.k_sub ? imin(s0 + B.k_sub, k1) : k1;
          const bool first = B.k_sub ? s0 == k0 : true, last = B.k_sub ? s1 == k1 : true;
          int t = 0;
          if constexpr (B.prefetch_next) {
            // The first tile prefetches the W sub-block after this one: the next of these rows
            // in this group, else the group's first of the MR rows prefetch_groups groups ahead.
            constexpr int PG = B.prefetch_groups;
            const bf16_t* pf[MR];
            const bf16_t* const* pfp = pf;
            if (s1 < gk1) for (int q = 0; q < MR; ++q) pf[q] = w[r + q] + s1;
            else if (r + (PG + 1) * MR <= nrows) for (int q = 0; q < MR; ++q) pf[q] = w[r + PG * MR + q] + gk0;
            else pfp = nullptr;
            if (pfp && mc >= NR) {
              acc_tile<Kn, MR, NR, B.prefetch_next>(w + r, in, s0, s1, acc_of(0), first, last, cr, ld, pfp);
              t = NR;
            }
          }
          for (; t + NR <= mc; t += NR)
            acc_tile<Kn, MR, NR>(w + r, in + t, s0, s1, acc_of(t), first, last, cr + t, ld);
          for (; t < mc; ++t)
            acc_tile<Kn, MR, 1>(w + r, in + t, s0, s1, acc_of(t), first, last, cr + t, ld);
        }
      }
    }
  };
  if constexpr (B.token_blocks_outer) {
    for (int m0 = 0; m0 < M; m0 += mb)
      for (int g0 = 0; g0 < np;) { const int g1 = group_end(pc, np, g0, B.k_group); block(g0, g1, m0); g0 = g1; }
  } else {
    for (int g0 = 0; g0 < np;) {
      const int g1 = group_end(pc, np, g0, B.k_group);
      for (int m0 = 0; m0 < M; m0 += mb) block(g0, g1, m0);
      g0 = g1;
    }
  }
}

thread_local ThreadScratch<float> tl_c{nullptr, 0};
thread_local ThreadScratch<const bf16_t*> tl_rows{nullptr, 0};
thread_local ThreadScratch<float> tl_c_class{nullptr, 0};
thread_local ThreadScratch<const bf16_t*> tl_rows_class{nullptr, 0};
thread_local ThreadScratch<int> tl_row_of{nullptr, 0};

// The fused plain kernel: all pieces of [0, K) of every row, chained: c[r * M + t].
// Rows that share their cuts (row stride a multiple of 2048 elements) in one loop nest. Rows whose
// cuts differ (any other stride, e.g. Qwen3's W_down, 768 elements: 8 classes of rows) are grouped by
// their first cut (a counting sort of row pointers), each class through the same loop nest with its
// own pieces, and the sums put back in row order: each row's canonical sum, bit for bit (the piece
// path's, which took such matrices before through a partial buffer and a scalar reduction). Where
// the blocking has decode_mixed_rows, decode calls take such rows in memory order instead
// (decode_mixed), the same bits.
template <class Kn>
void mm_rows_chained(const bf16_t* const* w, int nrows, const typename Kn::Elem* I, int M, int K,
                     float* c, int group = 1) {
  if constexpr (HasAltBlocking<Kn>::value) {
    if (Kn::alt_blocking()) return mm_rows_chained<typename Kn::AltBlocking>(w, nrows, I, M, K, c, group);
  }
  int32_t pc[2 * kMaxPieces];
  const int c0 = piece_phase(w[0]);
  bool shared = true;
  for (int r = 1; r < nrows && shared; ++r) shared = piece_phase(w[r]) == c0;
  if (shared) {
    const int np = row_pieces(c0, K, pc);
    mm_rows<Kn>(w, nrows, I, M, K, pc, np, Out{c, M, 0, group});
    return;
  }
  if constexpr (Kn::kBlocking.decode_mixed_rows > 0) {
    if (M <= Kn::kBlocking.decode_max_m) return decode_mixed<Kn>(w, nrows, I, M, K, c);
  }
  constexpr int kClasses = kPieceElems / kShapeMultiple;  // first cuts are multiples of 32
  int start[kClasses + 1] = {};
  for (int r = 0; r < nrows; ++r) ++start[piece_phase(w[r]) / kShapeMultiple + 1];
  for (int q = 0; q < kClasses; ++q) start[q + 1] += start[q];
  const bf16_t** rows = tl_rows_class.get(size_t(nrows));
  int* row_of = tl_row_of.get(size_t(nrows));
  int fill[kClasses];
  for (int q = 0; q < kClasses; ++q) fill[q] = start[q];
  for (int r = 0; r < nrows; ++r) {
    const int i = fill[piece_phase(w[r]) / kShapeMultiple]++;
    rows[i] = w[r];
    row_of[i] = r;
  }
  float* cc = tl_c_class.get(size_t(nrows) * M);
  // Classes in the order of their first rows (row 0's class, then row 1's, ...), not of their cuts:
  // a class's rows are every 8th (Qwen3's 768) and the next class then starts on the row that
  // follows, in memory, the one the last class started on. In the order of the cuts (row 0's class,
  // then row 3's, 6's, 1's, ...) Qwen3-30B-A3B's down projection at T = 1 took 1.15x the time.
  bool done[kClasses] = {};
  for (int r0 = 0; r0 < nrows; ++r0) {
    const int q = piece_phase(w[r0]) / kShapeMultiple;
    if (done[q]) continue;
    done[q] = true;
    const int n = start[q + 1] - start[q];
    const int np = row_pieces(q * kShapeMultiple, K, pc);
    mm_rows<Kn>(rows + start[q], n, I, M, K, pc, np, Out{cc + int64_t(start[q]) * M, M, 0});
  }
  for (int i = 0; i < nrows; ++i)
    for (int t = 0; t < M; ++t) c[int64_t(row_of[i]) * M + t] = cc[int64_t(i) * M + t];
}

// Gate & up rows together (one pass over both), SiLU(gate)*up fused into the store, which writes
// the activation in the layout the down projection reads (transformation 2).
template <class Kn>
void gate_up(const GateUpTask& t) {
  using Elem = typename Kn::Elem;
  const bf16_t** rows = tl_rows.get(size_t(2) * t.n);
  if constexpr (Kn::kBlocking.interleave_gate_up) {
    if (piece_phase(t.w_gate) == piece_phase(t.w_up)) {
      for (int j = 0; j < t.n; ++j) {
        rows[2 * j] = t.w_gate + j * t.ldw_gate;
        rows[2 * j + 1] = t.w_up + j * t.ldw_up;
      }
      float* c = tl_c.get(size_t(2) * t.n * t.M);
      mm_rows_chained<Kn>(rows, 2 * t.n, static_cast<const Elem*>(t.I), t.M, t.K, c, /*group=*/2);
      store_act_block<Kn>(t.act, t.act_K, t.n0, t.n, 0, t.M, c, c + t.M, 2 * int64_t(t.M));
      return;
    }
  }
  for (int j = 0; j < t.n; ++j) {
    rows[j] = t.w_gate + j * t.ldw_gate;
    rows[t.n + j] = t.w_up + j * t.ldw_up;
  }
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  // gate rows and up rows separately (the two matrices' cuts may differ)
  mm_rows_chained<Kn>(rows, t.n, static_cast<const Elem*>(t.I), t.M, t.K, c);
  mm_rows_chained<Kn>(rows + t.n, t.n, static_cast<const Elem*>(t.I), t.M, t.K, c + int64_t(t.n) * t.M);
  store_act<Kn>(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M);
}

// Down projection, transpose fused into the store: y[m][n0 + j] = C[j][m] (transformation 3).
template <class Kn>
void down(const DownTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.n));
  for (int j = 0; j < t.n; ++j) rows[j] = t.w_down + j * t.ldw;
  float* c = tl_c.get(size_t(t.n) * t.M);
  mm_rows_chained<Kn>(rows, t.n, static_cast<const typename Kn::Elem*>(t.act), t.M, t.K, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c, t.M);
}

// The piece path: rows w + r*ldw, the listed pieces, one output slot per piece.
template <class Kn>
void piece_dots(const PieceTask& t) {
  const bf16_t** rows = tl_rows.get(size_t(t.nrows));
  for (int j = 0; j < t.nrows; ++j) rows[j] = t.w + j * t.ldw;
  mm_rows<Kn>(rows, t.nrows, static_cast<const typename Kn::Elem*>(t.I), t.M, t.K, t.pieces,
              t.npieces, Out{t.out, int64_t(t.npieces) * t.M, t.M});
}

// The task rows of Kn's blocking in effect (a kernel with an alternative blocking: per call).
template <class Kn>
int task_rows_now(bool linear) {
  if constexpr (HasAltBlocking<Kn>::value) {
    if (Kn::alt_blocking()) return task_rows_now<typename Kn::AltBlocking>(linear);
  }
  return blocking_task_rows(Kn::kBlocking, linear);
}

// A dot-product kernel's table entry (microkernel.h), every function from the glue above.
template <class Kn>
constexpr MicroKernel dot_microkernel(const char* isa, const char* cpu_isa) {
  return MicroKernel{isa, Dtype::bf16, cpu_isa, Kn::kBlocking, Kn::packed_bytes, Kn::pack_tokens,
                     gate_up<Kn>, down<Kn>, piece_dots<Kn>, store_act<Kn>, /*mixed_cuts=*/true,
                     HasAltBlocking<Kn>::value ? task_rows_now<Kn> : nullptr};
}

}  // namespace
}  // namespace hina
