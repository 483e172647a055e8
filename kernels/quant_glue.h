// The quantized micro-kernels' shared glue (quant.h's contract): what is the same for every ISA,
// written once as templates over a kernel struct `Kn` that each ISA file defines. Per ISA remain the
// tiles (the instructions) and the packed operand's element type.
//
// LINKAGE: as glue.h -- include only from ISA files, after their intrinsics header; everything here
// has internal linkage (anonymous namespace), no STL.
//
// What a kernel struct provides
//   dtype                      Dtype::int8 or Dtype::fp8
//   kBlocking                  the QBlocking below: rows per tile and prefetch by M, interleave
//   tile<R, TT, PF>(w, sw, I, M, K, group, kb0, kb1, t0, c, ldc, pf)
//                              c[r * ldc + t] += the (scaled) dot of rows w[r] and tokens t0 + t over
//                              [kb0, kb1) (whole groups / fp8 blocks); with PF == 2 it also prefetches
//                              pf[r][0 .. kb1 - kb0) into L2 (the next tile's W) as it streams its own
//   scale_row(s, lds, row, group)  the scales of W row `row`
// and optionally
//   kAltBlocking, AltBlocking, alt_blocking()   another blocking struct (its own kBlocking and
//                              task_rows), taken per call (microkernel.h's HasAltBlocking; q_gate_up_now /
//                              q_down_now / q_task_rows_now below)
#pragma once
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "numeric.h"
#include "quant.h"
#include "scratch.h"

namespace hina {
namespace {  // internal linkage, on purpose: see glue.h, LINKAGE

constexpr int kTokTile = 4;   // tokens per tile at most

inline size_t a64(size_t n) { return (n + 63) & ~size_t(63); }

// Decode blocking (M <= kTokTile tokens: one token tile, each W row streamed once over the whole K),
// by M = 1..kTokTile:
//   rows[M]      W rows per tile;
//   prefetch[M]  0: none; 2: while a tile streams its rows, the next tile's rows are prefetched into
//                L2 (the tile's own loads then find them there: more lines in flight per core);
//   interleave   gate_up's tiles take gate and up rows alternately (two streams far apart per core);
//   spread[M]    (by M as rows[]; 0: the blocked path) a tile's rows are a task's n / R rows apart
//                (tile t: rows t, t + n/R, ...; with interleave, pairs of gate and up rows), not adjacent:
//                each row of a tile is then its own stream in its own pages, and each stream goes on into
//                the next tile (row t + 1). On the 2-vCPU AMX Xeon (2026-12-01, Qwen3-30B-A3B int8, T = 1,
//                2 threads, weights streamed from DRAM): AVX-512 VNNI 1.91 -> 1.65 ms, AVX2 int8 2.02 ->
//                1.73, AVX2 fp8 2.33 -> 1.81 (64-row tasks). The AVX2 kernels take it at every M; from
//                M = 2 their 2-row tiles change only in the down projection (measured on Zen 3,
//                2026-12-07: quant_avx2.cpp's kAvx2Blocking).
// More tokens: rows[0] rows x kTokTile tokens per tile, no prefetch; K whole while M x K <= kWholeK (the
// tokens' int8 or bf16 slice in L2), else in blocks of 1024. K in blocks of 1024 at M = 8 cut every W row
// into 1 KiB pieces visited in turn across all of a task's rows (a 1 KiB read per row and pass, the
// prefetchers never running ahead): on Zen 4 (2026-12-02, 2 threads, Mixtral-8x7B int8) T = 8 took
// 44 ms where T = 4 took 18.7. Tried and not kept: the first token tile of each row tile prefetching the
// next row tile into L2 (as the decode tiles do): beside vllm:int8 in one run each, hina's time over
// vLLM's at T = 8 / 16 went 1.64 / 2.03x -> 1.78 / 2.42x (Mixtral) and 1.74 / 2.03x -> 2.11 / 3.0x (Qwen3)
// (then with K in blocks; the AVX-512 VNNI kernel's 8-token pair tiles, K whole, do prefetch: VnniKn).
constexpr int64_t kWholeK = 256 * 1024;
struct QBlocking {
  int rows[kTokTile + 1];
  int prefetch[kTokTile + 1];
  bool interleave;
  bool spread[kTokTile + 1];   // by M as rows[] (0: the blocked path)
};

template <int N> struct IntC { static constexpr int value = N; };

// A kernel with wide tiles (Kn::wide_rows(M) rows x all M tokens, 0: none for this M; Kn::tile_wide(w,
// sw, nr, I, M, K, group, kb0, kb1, c, ldc, next), nr <= wide_rows(M); next: the next tile's nr row
// pointers, or nullptr for the last whole tile, for a prefetch) takes the blocked path (M > kTokTile)
// with them where wide_rows(M) > 0.
template <class Kn, class = void> struct HasWide : std::false_type {};
template <class Kn> struct HasWide<Kn, decltype(void(Kn::wide_rows(0)))> : std::true_type {};

// An L2 prefetch of `bytes` from each of the R rows p[r] + off (the next tile's slice of a group).
template <int R>
inline void prefetch_l2_rows(const int8_t* const* p, int off, int bytes) {
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p[r] + off + b, 0, 2);  // prefetcht1
}

thread_local ThreadScratch<float> tl_c{nullptr, 0};             // a task's sums, [rows][M]
thread_local ThreadScratch<float> tl_row{nullptr, 0};           // one token's K values as fp32
thread_local ThreadScratch<const int8_t*> tl_w{nullptr, 0};     // a task's W row pointers
thread_local ThreadScratch<const float*> tl_s{nullptr, 0};      // and their scale rows

// Stores of transformation 2 (fp32, row-major; column j's gate and up sums of token m at
// g[j' * ldg + m], u[j' * ldg + m]) and 3 (transpose, c laid out [n][M]: row j's sums at row j'), where
// j' = pos[j] (the tiles' spread order, QBlocking::spread), or j without pos.
// (g and u gathered into blocks of 64 first, so that the SiLU loop vectorizes: scalar, it was ~1.6 ns a
// column, 10 us of a Qwen3-30B-A3B T = 1 call's 6144 on one Zen 5 core.)
inline void store_act_f32(float* act, int act_K, int n0, int n, int M, const float* g, const float* u,
                          int64_t ldg, const int* pos = nullptr) {
  alignas(64) float gb[64], ub[64];
  for (int m = 0; m < M; ++m)
    for (int j0 = 0; j0 < n; j0 += 64) {
      const int jn = n - j0 < 64 ? n - j0 : 64;
      for (int j = 0; j < jn; ++j) {
        const int64_t o = int64_t(pos ? pos[j0 + j] : j0 + j) * ldg + m;
        gb[j] = g[o];
        ub[j] = u[o];
      }
      float* a = act + int64_t(m) * act_K + n0 + j0;
      for (int j = 0; j < jn; ++j) a[j] = silu_mul(gb[j], ub[j]);
    }
}
inline void store_y(float* y, int64_t ldy, int n0, int n, int M, const float* c, const int* pos = nullptr) {
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < n; ++j) y[m * ldy + n0 + j] = c[int64_t(pos ? pos[j] : j) * M + m];
}

// ================================ INT8: quantization of the token side ==========================
// Packed operand: Q q[M][K] (AVX2: int8 q; AVX-512 VNNI: uint8 q + 128), then (64-byte aligned)
// fp32 scale[M][K / group].
template <class Q>
size_t i8_packed_bytes(int M, int K, int group) {
  return a64(size_t(M) * K * sizeof(Q)) + size_t(M) * (K / group) * sizeof(float);
}
template <class Q>
inline float* i8_s(const void* p, int M, int K) {
  return reinterpret_cast<float*>(const_cast<char*>(static_cast<const char*>(p)) + a64(size_t(M) * K * sizeof(Q)));
}

// One token's K values (fp32) quantized per group: hinabench.quant.quantize_act's steps, eight lanes
// at a time in GCC's vector extensions (each ISA file's flags pick the instructions; the scalar
// fmax/nearbyint form compiled to libm calls and was ~15% of a Qwen3-30B-A3B T = 8 call on AMX from
// L3). Rounding is to nearest even by the 1.5 * 2^23 add and subtract (exact for |x| < 2^22; the
// values are within [-127, 127] but for an infinite scale, which the clamp takes), as nearbyint under
// the default MXCSR; a NaN maps to -127, as the scalar form did.
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

template <class Q, int kOffset>
__attribute__((optimize("fp-contract=off")))   // x * inv rounded before the add, as the reference does
inline void quantize_row(const float* v, int K, int group, Q* q, float* s) {
  const f32x8 zero = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  const f32x8 magic = zero + 12582912.f, lo = zero - 127.f, hi = zero + 127.f;
  for (int k0 = 0; k0 < K; k0 += group) {
    f32x8 m = zero;
    for (int k = k0; k < k0 + group; k += 8) {
      f32x8 x;
      std::memcpy(&x, v + k, sizeof x);
      const f32x8 a = x < zero ? -x : x;
      m = a > m ? a : m;
    }
    float amax = 0.f;
    for (int j = 0; j < 8; ++j) amax = m[j] > amax ? m[j] : amax;
    const f32x8 inv = zero + (amax > 0.f ? 127.f / amax : 0.f);
    for (int k = k0; k < k0 + group; k += 8) {
      f32x8 x;
      std::memcpy(&x, v + k, sizeof x);
      f32x8 r = (x * inv + magic) - magic;
      r = r > lo ? r : lo;
      r = r < hi ? r : hi;
      const i32x8 qi = __builtin_convertvector(r, i32x8) + kOffset;
      for (int j = 0; j < 8; ++j) q[k + j] = Q(qi[j]);
    }
    s[k0 / group] = amax / 127.f;
  }
}

template <class Q, int kOffset>
void i8_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  float* v = tl_row.get(size_t(K));
  Q* q = static_cast<Q*>(I);
  float* s = i8_s<Q>(I, M, K);
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) v[k] = bf16_to_f32(src[k]);
    quantize_row<Q, kOffset>(v, K, group, q + int64_t(m) * K, s + int64_t(m) * (K / group));
  }
}

template <class Q, int kOffset>
void i8_pack_act(const float* act, int M, int K, int group, void* out) {
  Q* q = static_cast<Q*>(out);
  float* s = i8_s<Q>(out, M, K);
  for (int m = 0; m < M; ++m)
    quantize_row<Q, kOffset>(act + int64_t(m) * K, K, group, q + int64_t(m) * K, s + int64_t(m) * (K / group));
}

// c[r * ldc + t] = sum_groups s_w[r][grp] * s_x[t][grp] * sum_{k in grp} W_r[k] * X_t[k]
// ================================ FP8: the token side ===========================================
// The AVX2 kernel turns e4m3 into fp16 bits (the value x 2^-8) and F16C into fp32: the tiles' block
// scales arrive x 2^8 (rows_tokens and decode_rows below; the AVX-512 kernel, which shares the loops, takes
// it back out).
constexpr float kF8ScaleUp = 256.0f;

size_t f8_packed_bytes(int M, int K, int) { return size_t(M) * K * sizeof(float); }

// fp8 tokens: fp32 in their own order (the AVX2 kernel's four converted vectors are k0..k0+31 in order)
void f8_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int, void* I) {
  float* d = static_cast<float*>(I);
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) d[int64_t(m) * K + k] = bf16_to_f32(src[k]);
  }
}

void f8_pack_act(const float* act, int M, int K, int, void* out) {
  std::memcpy(out, act, size_t(M) * K * sizeof(float));
}

// ================================ the shared loop: rows x token tiles ============================
// A tile's R scale rows as its tiles take them: FP8's block scales b0 .. b1 - 1 x 2^8, copied into
// scaled (row q at scaled + q * nblk; R * nblk <= R * 1024 floats: K <= 131072), INT8's as they are.
template <class Kn, int R>
inline void tile_scales(const float* const* sw, const float** use, float* scaled, int nblk, int b0, int b1) {
  for (int q = 0; q < R; ++q) {
    if constexpr (Kn::dtype == Dtype::fp8) {
      float* dst = scaled + q * nblk;
      for (int b = b0; b < b1; ++b) dst[b] = sw[q][b] * kF8ScaleUp;
      use[q] = dst;
    } else {
      use[q] = sw[q];
    }
  }
}

// The blocked path (M > kTokTile; decode tasks take decode_rows below): rows w[0..n) (scales sw[j] =
// Kn::scale_row of row j) x all M tokens into c [n][M], K in blocks of kb (the tokens' slice of a block
// stays in L1/L2 while every row tile passes over it; each W byte is read once). R rows per tile (a
// tail of n % R rows one at a time), kTokTile tokens per tile.
template <class Kn, int R>
void rows_tokens(const int8_t* const* rows, const float* const* srows, int n, const void* I, int M, int K,
                 int group, int kb, float* c) {
  const int nblk = (K + 127) / 128;
  float scaled[R * 1024];  // fp8: this tile's block scales x 2^8 (tile_scales)
  for (int64_t i = 0; i < int64_t(n) * M; ++i) c[i] = 0.f;
  for (int kb0 = 0; kb0 < K; kb0 += kb) {
    const int kb1 = kb0 + kb < K ? kb0 + kb : K;
    int r = 0;
    auto row_tile = [&](auto rr) {
      constexpr int RR = decltype(rr)::value;
      const int8_t* w[RR];
      const float* sw[RR];
      for (int q = 0; q < RR; ++q) w[q] = rows[r + q];
      tile_scales<Kn, RR>(srows + r, sw, scaled, nblk, kb0 / 128, (kb1 + 127) / 128);
      float* cr = c + int64_t(r) * M;
      int t = 0;
      for (; t + kTokTile <= M; t += kTokTile)
        Kn::template tile<RR, kTokTile, 0>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M, nullptr);
      switch (M - t) {
        case 3: Kn::template tile<RR, 3, 0>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M, nullptr); break;
        case 2: Kn::template tile<RR, 2, 0>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M, nullptr); break;
        case 1: Kn::template tile<RR, 1, 0>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M, nullptr); break;
        default: break;
      }
    };
    for (; r + R <= n; r += R) row_tile(IntC<R>{});
    for (; r < n; ++r) row_tile(IntC<1>{});
  }
}

// The same with a kernel's wide tiles: R = wide_rows(M) rows at a time, the last nr <= R.
template <class Kn>
void rows_wide(const int8_t* const* rows, const float* const* srows, int n, const void* I, int M, int K,
               int group, int kb, float* c) {
  const int R = Kn::wide_rows(M);
  for (int64_t i = 0; i < int64_t(n) * M; ++i) c[i] = 0.f;
  for (int kb0 = 0; kb0 < K; kb0 += kb) {
    const int kb1 = kb0 + kb < K ? kb0 + kb : K;
    for (int r = 0; r < n; r += R)
      Kn::tile_wide(rows + r, srows + r, n - r < R ? n - r : R, I, M, K, group, kb0, kb1, c + int64_t(r) * M, M,
                    r + 2 * R <= n ? rows + r + R : nullptr);
  }
}

// Rows x all M > kTokTile tokens into c [n][M], with Bl::kBlocking's tiles (Bl: Kn, or Kn::AltBlocking).
// K whole while the tokens' slice stays in L2 (M x K <= kWholeK elements): each W row is then one
// contiguous stream and its tile is re-read from L1/L2 by the next token tiles; more tokens: K in blocks
// of 1024, the tokens' slice of a block in L1/L2.
template <class Kn, class Bl = Kn>
void mm(const int8_t* const* rows, const float* const* srows, int n, const void* I, int M, int K, int group,
        float* c) {
  const int kb = int64_t(M) * K <= kWholeK ? K : 1024;
  if constexpr (HasWide<Kn>::value)
    if (Kn::wide_rows(M) != 0) return rows_wide<Kn>(rows, srows, n, I, M, K, group, kb, c);
  rows_tokens<Kn, Bl::kBlocking.rows[0]>(rows, srows, n, I, M, K, group, kb, c);
}

// QBlocking::spread: the list position of natural unit u of U when each tile takes `per` consecutive
// positions, so that the units of one tile are U / per apart (tile t: t, t + S, t + 2S, ...).
// As a table, once per task (it was two divisions per row, twice a task).
inline const int* spread_table(int U, int per, int* pos) {
  if (per <= 1 || U % per) {
    for (int u = 0; u < U; ++u) pos[u] = u;
    return pos;
  }
  const int S = U / per;
  for (int q = 0, u = 0; q < per; ++q)
    for (int i = 0; i < S; ++i, ++u) pos[u] = i * per + q;
  return pos;
}
template <class Kn, class Bl = Kn>
int tile_rows(int M) {   // the blocked path's rows per tile (M > kTokTile)
  if constexpr (HasWide<Kn>::value)
    if (Kn::wide_rows(M) != 0) return Kn::wide_rows(M);
  return Bl::kBlocking.rows[0];
}

thread_local ThreadScratch<int> tl_pos{nullptr, 0};    // a task's spread positions

// Decode tasks (M <= kTokTile tokens): Bl's rows[M] rows per tile, one tile of all M tokens, the next
// tile's rows prefetched with prefetch[M], each tile's row pointers made as it is called and its sums
// stored straight to their rows (no pointer lists, no reordering stores). What a Qwen3-30B-A3B int8 T = 1
// call spends outside its tiles (Zen 5, 2026-12-05, a build whose tiles return at once, 2 threads,
// median of 3000 calls): 67 us when the tasks went through pointer lists, a spread order computed with
// two divisions a row, a reordering copy of the sums and a scalar SiLU; 50 with the order a table read
// by the stores, the SiLU vectorized and the scatter shared by both threads (moe_ffn.cpp) -- side by
// side from DRAM T = 1 / 2 / 4 0.93 / 0.95 / 0.97x the time, FP8 T = 1 0.97x, Mixtral-8x7B unchanged --
// and 27 (16 with one thread) with the tiles called from here -- T = 1 0.98x, T = 2 / 4 0.99-1.01x, the
// same bits. Per thread then ~3.6 us in gate/up tasks, ~7.4 in down, ~3.3 each in the token pack and the
// scatter, ~6 in the region's start and barriers.
// Positions p0 .. p0 + N - 1 in tiles of R, the last N % R one at a time; row(p, w, sw) names position
// p's W row and scale row, out(p, c) takes its TT sums. Tile i takes positions i R .. i R + R - 1, or
// with `spread` (QBlocking::spread; N a multiple of R) G positions from each of R / G equal segments:
// i G .. i G + G - 1 of each (G = 2: a gate row and its up row stay together).
template <class Kn, int R, int TT, int PF, class Row, class Out>
void decode_rows(int p0, int N, int G, bool spread, const void* I, int K, int group, Row row, Out out) {
  float scaled[Kn::dtype == Dtype::fp8 ? R * 1024 : 1];   // tile_scales'
  const int nblk = (K + 127) / 128;
  const int tiles = N / R;
  auto pos = [&](int q, int i) { return p0 + (spread ? (i + (q / G) * tiles) * G + q % G : i * R + q); };
  for (int i = 0; i < tiles; ++i) {
    const int8_t* w[R];
    const float* sw[R];
    const float* use[R];
    for (int q = 0; q < R; ++q) row(pos(q, i), w[q], sw[q]);
    tile_scales<Kn, R>(sw, use, scaled, nblk, 0, nblk);
    float c[R * TT] = {};
    if (PF != 0 && i + 1 < tiles) {
      const int8_t* pf[R];
      const float* unused;
      for (int q = 0; q < R; ++q) row(pos(q, i + 1), pf[q], unused);
      Kn::template tile<R, TT, PF>(w, use, I, TT, K, group, 0, K, 0, c, TT, pf);
    } else {
      Kn::template tile<R, TT, 0>(w, use, I, TT, K, group, 0, K, 0, c, TT, nullptr);
    }
    for (int q = 0; q < R; ++q) out(pos(q, i), c + q * TT);
  }
  if constexpr (R > 1)
    if (N % R) decode_rows<Kn, 1, TT, 0>(p0 + tiles * R, N % R, 1, false, I, K, group, row, out);
}
// gate_up's 2n positions: gate j, up j, gate j + 1, ... (interleave) or every gate row, then every up row
template <class Kn, class Bl, int TT>
void q_gate_up_decode(const QGateUpTask& t) {
  constexpr QBlocking B = Bl::kBlocking;
  constexpr int R = B.rows[TT];
  constexpr bool il = B.interleave;
  const int N = 2 * t.n;
  float* g = tl_c.get(size_t(N) * TT);
  float* u = g + int64_t(t.n) * TT;
  auto up_j = [&](int p, bool& up) {
    up = il ? p % 2 != 0 : p >= t.n;
    return il ? p / 2 : up ? p - t.n : p;
  };
  decode_rows<Kn, R, TT, B.prefetch[TT]>(
      0, N, 2, B.spread[TT] && il && R % 2 == 0 && N % R == 0, t.I, t.K, t.group,
      [&](int p, const int8_t*& w, const float*& sw) {
        bool up;
        const int row = t.n0 + up_j(p, up);
        w = up ? t.w_up + int64_t(row) * t.ldw_up : t.w_gate + int64_t(row) * t.ldw_gate;
        sw = up ? Kn::scale_row(t.s_up, t.lds_up, row, t.group) : Kn::scale_row(t.s_gate, t.lds_gate, row, t.group);
      },
      [&](int p, const float* c) {
        bool up;
        const int j = up_j(p, up);
        float* d = (up ? u : g) + int64_t(j) * TT;
        for (int m = 0; m < TT; ++m) d[m] = c[m];
      });
  store_act_f32(t.act, t.act_K, t.n0, t.n, TT, g, u, TT);
}
template <class Kn, class Bl, int TT>
void q_down_decode(const QDownTask& t) {
  constexpr QBlocking B = Bl::kBlocking;
  constexpr int R = B.rows[TT];
  float* y = t.y + t.n0;
  decode_rows<Kn, R, TT, B.prefetch[TT]>(
      0, t.n, 1, B.spread[TT] && t.n % R == 0, t.act, t.K, t.group,
      [&](int p, const int8_t*& w, const float*& sw) {
        w = t.w + int64_t(t.n0 + p) * t.ldw;
        sw = Kn::scale_row(t.s, t.lds, t.n0 + p, t.group);
      },
      [&](int p, const float* c) {
        for (int m = 0; m < TT; ++m) y[m * t.ldy + p] = c[m];
      });
}

// f(IntC<M>{}) for a decode task's M = 1..kTokTile tokens (true), else nothing (false).
template <class F>
inline bool by_tokens(int M, F&& f) {
  static_assert(kTokTile == 4, "one case per decode token count");
  switch (M) {
    case 1: f(IntC<1>{}); return true;
    case 2: f(IntC<2>{}); return true;
    case 3: f(IntC<3>{}); return true;
    case 4: f(IntC<4>{}); return true;
    default: return false;
  }
}

// Gate and up rows in one pass (interleaved: gate j, up j, gate j+1, ... so every tile streams both
// matrices), SiLU(gate)*up fused into the store (transformation 2).
template <class Kn, class Bl = Kn>
void q_gate_up(const QGateUpTask& t) {
  if (by_tokens(t.M, [&](auto tt) { q_gate_up_decode<Kn, Bl, decltype(tt)::value>(t); })) return;
  const int8_t** rows = tl_w.get(size_t(2) * t.n);
  const float** srows = tl_s.get(size_t(2) * t.n);
  constexpr bool il = Bl::kBlocking.interleave;
  const int per = (Bl::kBlocking.spread[0] && il) ? tile_rows<Kn, Bl>(t.M) / 2 : 1;
  const int* pos = spread_table(t.n, per, tl_pos.get(size_t(t.n)));
  for (int j = 0; j < t.n; ++j) {
    const int row = t.n0 + j;
    const int pj = pos[j];
    const int g = il ? 2 * pj : j, u = il ? 2 * pj + 1 : t.n + j;
    rows[g] = t.w_gate + int64_t(row) * t.ldw_gate;
    rows[u] = t.w_up + int64_t(row) * t.ldw_up;
    srows[g] = Kn::scale_row(t.s_gate, t.lds_gate, row, t.group);
    srows[u] = Kn::scale_row(t.s_up, t.lds_up, row, t.group);
  }
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  mm<Kn, Bl>(rows, srows, 2 * t.n, t.I, t.M, t.K, t.group, c);
  if (il) store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + t.M, 2 * int64_t(t.M), per > 1 ? pos : nullptr);
  else store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M, t.M);
}

template <class Kn, class Bl = Kn>
void q_down(const QDownTask& t) {
  if (by_tokens(t.M, [&](auto tt) { q_down_decode<Kn, Bl, decltype(tt)::value>(t); })) return;
  const int8_t** rows = tl_w.get(size_t(t.n));
  const float** srows = tl_s.get(size_t(t.n));
  const int per = Bl::kBlocking.spread[0] ? tile_rows<Kn, Bl>(t.M) : 1;
  const int* pos = spread_table(t.n, per, tl_pos.get(size_t(t.n)));
  for (int j = 0; j < t.n; ++j) {
    const int pj = pos[j];
    rows[pj] = t.w + int64_t(t.n0 + j) * t.ldw;
    srows[pj] = Kn::scale_row(t.s, t.lds, t.n0 + j, t.group);
  }
  float* c = tl_c.get(size_t(t.n) * t.M);
  mm<Kn, Bl>(rows, srows, t.n, t.act, t.M, t.K, t.group, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c, per > 1 ? pos : nullptr);
}

// The entries of a kernel whose blocking is chosen per call (HasAltBlocking): the same tiles, other
// rows per tile, prefetch and task rows.
template <class Kn>
void q_gate_up_now(const QGateUpTask& t) {
  if constexpr (HasAltBlocking<Kn>::value)
    if (Kn::alt_blocking()) return q_gate_up<Kn, typename Kn::AltBlocking>(t);
  q_gate_up<Kn>(t);
}
template <class Kn>
void q_down_now(const QDownTask& t) {
  if constexpr (HasAltBlocking<Kn>::value)
    if (Kn::alt_blocking()) return q_down<Kn, typename Kn::AltBlocking>(t);
  q_down<Kn>(t);
}
template <class Kn>
int q_task_rows_now() {
  if constexpr (HasAltBlocking<Kn>::value)
    if (Kn::alt_blocking()) return Kn::AltBlocking::task_rows;
  return Kn::task_rows;
}

}  // namespace
}  // namespace hina
