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
// 8 lanes are summed once per canonical K piece, pieces.h). The activation written by gate_up (transformation 2) is
// in the same split-16 layout, so the down projection runs the same kernel.
//
// Blocking (Algorithm 1's loop nest on vector registers): R W rows x TT tokens of accumulators
// (dot_tile), each taking 2 FMAs per 16 elements of K.
//   M <= 6 tokens (decode, memory-bound): every W row is streamed from memory exactly once per
//     call, all tokens in registers: 8 rows at a time (M = 1), 4 (M = 2..4), 2 (M = 5, 6); from M = 2
//     each tile prefetches the next tile's W (the next rows' same piece as the one it streams; it
//     was the same rows' next piece, else the next rows' first: see glue.h's rows_x_tokens) into
//     L2 while it streams its own, so the page-sized pieces never start cold. At M = 1 rows of
//     at most one piece (2048 elements: Qwen3-30B-A3B's gate/up, every Qwen3 down projection) take
//     4-row tiles with that prefetch too: each of their tiles starts on new pages. A tile's rows are
//     taken far apart (decode_far, round 3): each its own stream in its own pages.
//   M >= 16 (compute-bound): outer-product tiles, tokens along the vector (mm_outer, below); I and the
//     activation written transposed in blocks of 32 tokens by transformations 1 and 2.
//   M = 7..15: K in groups of one piece, tokens in blocks whose fp32 I slice over a group (<= 256 KiB)
//     stays in L2; per 4 rows, each piece is cut into 512-element sub-blocks whose 4-row W slice
//     (4 KiB) stays in L1 while the block's token pairs pass over it (4 x 2 tile, accumulators
//     carried across a piece's sub-blocks), the next sub-block prefetched into L1. W is read from
//     memory once per token block: once per call up to 32 tokens per expert.
//   gate_up interleaves gate and up rows in its tiles (when the two matrices share their piece
//     cuts): each thread then streams two regions tens of MiB apart, which is what the best read
//     probe (avx2-2streams) does, instead of one.
// Measured here (Zen 3, one core, L1-resident): the 4 x 2 tile runs at ~50-60% of the FMA peak;
// the limit is the 2-FMA dependency chain per accumulator plus 0.5 integer op per FMA for the
// bf16 conversion sharing the FP pipes.
// Round 2 (issue 11; side by side in one process, 3-7 interleaved rounds, each round's efficiency
// over the best read probe of that round; 2 threads), kept: the decode range up to M = 6 with 2-row
// tiles and the L2 prefetch of the next tile (Mixtral-8x7B T = 4 1.15x, Qwen3-30B-A3B T = 2..6
// 1.3-1.4x, DeepSeek-V3 T = 4 1.08x), gate/up interleaving (Qwen3 T = 1..2 1.07-1.16x, Mixtral
// T = 2 1.07-1.10x), K groups of one piece (T = 64 1.03-1.10x). Tried and dropped: the L2 prefetch
// with 6- or 8-row tiles (0.83-0.91x: too many prefetches in flight) and at M = 1 for every model
// but Qwen3 (0.87-0.90x on DeepSeek-V3, Qwen2-57B); prefetching once per line instead of once per
// chunk (0.89-0.94x); 2 x M tiles at M = 7, 8 and 1 x M at 7, 8 (0.6-0.9x: the 4 x 2 blocked tile
// wins from M = 7); again W converted once per 4-row sub-block into an fp32 L1 buffer, now with
// the next sub-block prefetched into L2 during the conversion, through 4 x 2, 4 x 3, 3 x 3 and
// 2 x 4 fp32 tiles (0.72-0.93x at T = 8..64: no memory stall left to blame, the fp32 tiles are
// slower in situ); blocked tiles 2 x 4 and 4 x 3 on bf16 W (0.85-0.93x), k_sub 256 or 1024,
// token blocks outside the K groups, L2 budgets 128/384 KiB, L2 instead of L1 for the blocked
// prefetch (all within the MAD). The M = 1 short-row case: Qwen3-30B-A3B T = 1 1.08x (4.27 vs
// 4.62 ms, 9 rounds), Mixtral-8x7B, Qwen2-57B, Qwen3-235B within the MAD.
// Round 3 (2026-12-07, Zen 3; one process, the two blockings alternated, 8 rounds, 2 threads, weights
// of two expert sets rotated; new / old time): decode tiles take their rows far apart (decode_far: a
// tile's rows from as many equal segments of the task's rows, a gate row and its up row together; each
// row its own stream in its own pages) instead of adjacent: T = 1 Mixtral-8x7B 0.87x (18.2 vs 20.9 ms),
// DeepSeek-V3 0.87x, Qwen3-235B-A22B 0.93x, Qwen3-30B-A3B 0.91x, Qwen2-57B-A14B 1.00x; T = 2 Mixtral
// 0.92x, DeepSeek 0.84x; T = 4 0.95x / 0.91x, Qwen3 1.04x (within its MAD). Tried beside it and not
// kept: two chunks of a row read together (decode_unroll 2; Zen 5's): T = 1 0.93 / 0.98x (within the
// MAD), T = 2 / 4 1.02-1.06x; 4 far rows at M = 1 with the next tile's L2 prefetch: Mixtral 0.93x, Qwen3
// and DeepSeek 1.00-1.01x; 4 far rows without it: 1.01-1.03x. With the far rows, 4 rows a tile instead of
// 2 at M = 3 and 4 (kept; same method, far rows on both sides): T = 3 Mixtral 0.90x, Qwen3-30B-A3B 0.86x,
// DeepSeek 0.88 / 0.91x; T = 4 0.97x / 0.95x / 0.96x (16 accumulators, as many as AVX2 has registers,
// besides W and I: GCC 12 keeps 3 of them on the stack in the inner loop, a store and a load each per
// chunk, and folds every I load into its FMA, seen in the assembly later that day; see the note on M = 4
// below); at M = 5 and 6 (20, 24 accumulators) 1.03x / 0.99x and
// 1.07x / 1.07x (Mixtral / Qwen3): 2 rows kept there.
// Round 4 (2026-12-07, later; same method, 6-8 rounds, a slow stretch: read probe 31-35 GB/s): rows whose
// piece cuts differ from their neighbours' (Qwen3-30B-A3B's down projection, K = 768: 8 classes of cuts, a
// class every 8th row; Qwen3-235B-A22B's K = 1536, Qwen2-57B-A14B's 2560) no longer class by class (8 rows
// a call, every 8th) but 4 rows far apart in memory order, each folding its own pieces (glue.h's
// decode_mixed, as the AVX-512 kernel since 2026-12-05), 2 rows from M = 4 (decode_mixed_acc 12: 16
// accumulators spill here): Qwen3-30B-A3B T = 1 / 2 / 3 0.96 / 0.92 / 0.86x the time, T = 4 0.97-0.98x,
// T = 6 0.90x; Qwen3-235B-A22B T = 2 0.95x, Qwen2-57B-A14B T = 2 0.81x (its MAD 7%). Where gate and up
// rows have mixed cuts too (DeepSeek-V3's K = 7168, Qwen2-57B-A14B's 3584; at M = 1 against 8 far rows a
// class): DeepSeek-V3 T = 1 / 2 / 3 / 4 0.98 / 0.96 / 0.94 / 0.99-1.03x, Qwen2-57B T = 1 / 4 0.95 / 0.96x
// (a fast stretch: probe 45-48 GB/s). 4 rows at M = 4: 1.02-1.03x; 2 rows at M = 1..3: 0.99 / 0.94 /
// 0.91x; 8 rows at M = 2: 0.96x; the next tile's rows prefetched into L2 as the tile streams (Qwen3
// T = 1 / 2 / 3, 8 rounds): 0.97 / 1.01 / 1.01x, within the MADs, not made. The same bits.
// M = 4 in one core's L2 (2026-12-07, a C++ micro-benchmark of the tile forms, K = 4096, FMA efficiency;
// not yet measured from DRAM, where 4 rows beat 2 above by their streams): 4 x 4 as now 0.67, 2 x 4 with
// each half's I (even, then odd) held in registers 0.77, 2 x 4 as now 0.75; M = 3: 4 x 3 as now 0.79,
// 3 x 3 with I held 0.85; M = 2 (4 x 2) 0.82 either way. At M = 4 the FMA peak streams at most ~25.6 GB/s
// of W a core (8 FMAs per 32 bytes), so the tile's efficiency is the T = 4 limit here.
// M = 7..15, later on 2026-12-07 (same method, Mixtral-8x7B T = 8, 6 rounds; perf's cpu-clock samples gave
// the first token pair of each sub-block, the one prefetching the next sub-block, 1.8x the time of each
// other pair): the next sub-block prefetched once per line in bursts spread over the block's token pairs
// 0.97 / 0.99x (two runs), the same into L2 0.99x, in row-interleaved order 0.99x (within the MADs); all
// in one burst at the first pair 1.14x; I's token rows padded by 64 or 512 bytes (their 16 KiB stride put
// every token's K position in one L1 set) 1.00 / 0.99x. Not made.
// Round 1, tried and measured slower on Mixtral at T = 3..16: W converted once per 4-row
// sub-block into an fp32 L1 buffer and run through a 4 x 3 fp32 tile (faster in L1, ~80 vs ~60
// GFLOP/s, but the conversion pass exposes DRAM latency: T = 4 60 vs 47 ms); 2 x M whole-piece
// streaming tiles for M = 3..6 (10-20% slower; with round 2's L2 prefetch they win);
// prefetch 2-8 sub-blocks ahead or into L2 / non-temporal (no gain).
//
// The loop nest above, the tiles' bookkeeping, gate_up / down / piece_dots and the stores are
// glue.h's, shared with the AVX-512 kernel; this file holds what AVX2 forces (the split-16 layout,
// the bf16 -> fp32 conversion, the FMAs, the horizontal sum) and the blocking parameters as data.
#include <immintrin.h>

#include "glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

inline __m256 even_f32(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline __m256 odd_f32(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xFFFF0000u))));
}

struct Avx2 {
  using Elem = float;                // I and the activation: fp32, split-16
  using Acc = __m256;
  struct X { __m256 even, odd; };    // 16 elements of a token's I
  struct W { __m256 even, odd; };    // 16 elements of a W row, as fp32
  static constexpr int kChunk = 16;  // bf16 elements per W load

  // Blocking (see the header): decode up to 6 tokens (M = 1: 8 rows; M = 2..4: 4 rows; M = 5, 6:
  // 2 rows; from M = 2 the next tile prefetched into L2; a tile's rows far apart; rows whose cuts
  // differ, as Qwen3's down projection's: 4 rows far apart in memory order up to M = 3, then 2);
  // M > 6: 4 x 2 tiles, K groups of one piece, 512-element sub-blocks (4 W rows = 4 KiB bf16 in
  // L1), token blocks of 4..32 whose fp32 I slice over a group fits 256 KiB of L2, the next sub-block
  // prefetched into L1; gate and up rows interleaved.
  static constexpr Blocking kBlocking{
      /*task_rows=*/64, /*decode_max_m=*/6, /*decode_rows=*/{0, 8, 4, 4, 4, 2, 2},
      /*mr=*/4, /*nr=*/2, /*k_group=*/2048, /*k_sub=*/512,
      /*mb_max=*/32, /*mb_min=*/4, /*mb_l2_bytes=*/256 << 10,
      /*token_blocks_outer=*/false, /*prefetch_next=*/1, /*decode_prefetch=*/{0, 0, 2, 2, 2, 2, 2},
      /*interleave_gate_up=*/true, /*decode_short_k=*/2048, /*decode_short_rows=*/4,
      /*decode_short_prefetch=*/2, /*decode_far=*/true, /*decode_unroll=*/1, /*decode_ahead=*/0,
      /*decode_mixed_rows=*/4, /*prefetch_groups=*/1, /*linear_task_rows=*/0, /*decode_mixed_acc=*/12};

  static Acc zero() { return _mm256_setzero_ps(); }
  static X load_x(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static W load_w(const bf16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {even_f32(v), odd_f32(v)};
  }
  static Acc fma(Acc acc, const W& w, const X& x) {
    acc = _mm256_fmadd_ps(w.even, x.even, acc);
    return _mm256_fmadd_ps(w.odd, x.odd, acc);
  }
  static float hsum(Acc v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void prefetch(const bf16_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  static void prefetch_l2(const bf16_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

  // From kOuterMinM tokens (the compute-bound regime) I and the activation are written transposed, in
  // blocks of 32 tokens (element k of token m at (m / 32) * 32 * K + split_pos(k) * 32 + m % 32; the
  // block padded to 32 tokens), and glue.h's mm_rows hands the products to mm_outer below: outer-product
  // tiles over a transient fp32 copy of a W sub-block. Below it, token rows (fp32, split-16).
  static constexpr int kOuterMinM = 16;
  static bool outer(int M) { return M >= kOuterMinM; }
  static void mm_outer(const bf16_t* const* w, int nrows, const float* I, int M, int K, const int32_t* pc,
                       int np, Out o);

  static size_t packed_bytes(int M, int K) { return size_t(outer(M) ? (M + 31) & ~31 : M) * K * sizeof(float); }

  // Transformation 1: gather x rows into I (fp32, split-16). Same two ops as the W conversion.
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I);

  // Transformation 2's store: fp32, split-16, so the down projection runs the same tiles; M: the
  // activation's tokens (its layout, above).
  static void put_act_m(void* act, int act_K, int M, int m, int k, float v) {
    float* a = static_cast<float*>(act);
    if (outer(M)) a[int64_t(m & ~31) * act_K + int64_t(split_pos<kChunk>(k)) * 32 + (m & 31)] = v;
    else a[int64_t(m) * act_K + split_pos<kChunk>(k)] = v;
  }
};

// ---- the outer-product form (M >= kOuterMinM tokens) ---------------------------------------------
// The dot-product tile's sum of row r and token t over a piece is, per lane l of its accumulator, the
// chain a_l = fma(W[16c + 2l], I[16c + 2l], a_l); a_l = fma(W[16c + 2l + 1], I[16c + 2l + 1], a_l) over
// the piece's chunks c, then hsum's tree ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). Here the
// same chains run with tokens along the vector instead of K: per lane l, a W element broadcast times 8
// tokens' I elements (an fp32 copy of I, transposed per token block: "transform I"), and the tree on
// whole vectors at the piece's end. Same operations on the same values in the same order: the same bits
// as the dot tiles (and so batch-independent). What it changes: no bf16 split in the inner loop (a W
// sub-block of kOR rows x kOSub is converted once into an L1 fp32 buffer, the next one prefetched),
// kOR x 2 accumulators of 8 tokens each (chains of 2 FMAs per chunk), and each W element loaded once per
// 16 tokens. L1-resident, one thread: 1.16x the 4 x 2 dot tile's rate (91 against 78 GFLOP/s; 86 with the
// conversion; 5 x 2 on fp32 W as dot tiles 77, outer 4 x 2 85, 3 x 3 74).
// Measured in situ (Zen 3, 2 threads, one process, the two paths' blocks alternated, 10 rounds; the dot
// path is the blocked one above): Mixtral-8x7B T = 64 0.88-0.89x the time (144 against 128 GFLOP/s),
// T = 16 0.96x, Qwen3-30B-A3B T = 64 0.92-0.95x, T = 16 0.98x, DeepSeek-V3 T = 256 0.93x. Sub-blocks of
// 256 (5 KiB of W, 16 KiB of I per tile) 0.95-0.96x, of 64 0.93-0.98x; I transposed per task instead of
// by transformation 1 (the down projection's tasks each re-transposed 14336 x 32 tokens): 0.92-0.96x;
// blocks of 64 tokens (each W sub-block converted for 4 tiles, not 2) no better (0.96-1.02x, a noisy
// stretch). From 8 tokens (the block's one 8-token tile, R rows x 8 tokens, the same bits) against the
// blocked dot tiles at T = 8 (2026-12-07, same method, 6 rounds): 10 rows 1.28x the time (87 against 111
// GFLOP/s), 5 rows 1.38x; 8 and 12 rows ~1.4x in a noisy run. With one token vector a W broadcast feeds
// one FMA (likely the loads bind; not counted: no perf counters here). Knocking out the W conversion
// (wrong sums, same loads otherwise) took another 7-10% off: the conversion and its DRAM stream are what
// is left beside the tiles. Also tried (2026-12-07, same method, Qwen3-30B-A3B T = 16 / 64, 6 rounds, time
// against 5 rows): 6 rows 1.14 / 1.13x; the tokens' even then odd vectors loaded in turn (one pair of I
// registers, so 6 rows fit beside 12 accumulators) 1.18 / 1.18x at 5 rows, 1.11 / 1.09x at 6, 1.36x at 7
// (T = 64). Later (2026-12-07, same method, Mixtral-8x7B, 6 rounds; perf's cpu-clock samples put ~85% of
// the kernel's time in outer_tile, most of it on the FMAs that wait for I's loads): 2, 3 or 4 row groups
// converted together so that each 16-token I slice is read from L2 once and then from L1 by every group's
// tile: T = 64 1.01 / 1.02 / 1.02x, T = 16 (2, 4 groups) 1.05 / 1.17x; the next lane pass's I lines
// prefetched into L1 or L2 at each pass: 1.07x.
constexpr int kOR = 5;       // W rows per tile
constexpr int kOSub = 128;   // K sub-block: W fp32 2.5 KiB, a 16-token I slice 8 KiB (L1)
constexpr int kOMb = 32;     // tokens per block (one of I's transposed blocks)

thread_local ThreadScratch<float> tl_wf{nullptr, 0};
thread_local ThreadScratch<__m256> tl_oacc{nullptr, 0};

// The 8 x 8 transpose of r[i][j] (i: token, j: position): d[j * ld + i] = r[i][j].
inline void transpose8(const __m256 (&r)[8], float* d, int64_t ld) {
  const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE);
  const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE);
  const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE);
  const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  _mm256_store_ps(d + 0 * ld, _mm256_permute2f128_ps(b0, b4, 0x20));
  _mm256_store_ps(d + 1 * ld, _mm256_permute2f128_ps(b1, b5, 0x20));
  _mm256_store_ps(d + 2 * ld, _mm256_permute2f128_ps(b2, b6, 0x20));
  _mm256_store_ps(d + 3 * ld, _mm256_permute2f128_ps(b3, b7, 0x20));
  _mm256_store_ps(d + 4 * ld, _mm256_permute2f128_ps(b0, b4, 0x31));
  _mm256_store_ps(d + 5 * ld, _mm256_permute2f128_ps(b1, b5, 0x31));
  _mm256_store_ps(d + 6 * ld, _mm256_permute2f128_ps(b2, b6, 0x31));
  _mm256_store_ps(d + 7 * ld, _mm256_permute2f128_ps(b3, b7, 0x31));
}

void Avx2::pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  float* dst = static_cast<float*>(I);
  if (!outer(M)) {
    for (int m = 0; m < M; ++m) {
      const bf16_t* src = x + int64_t(rows[m]) * ldx;
      float* d = dst + int64_t(m) * K;
      for (int k = 0; k < K; k += kChunk) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
        _mm256_storeu_ps(d + k, even_f32(v));
        _mm256_storeu_ps(d + k + 8, odd_f32(v));
      }
    }
    return;
  }
  // transposed blocks of 32 tokens, 8 tokens at a time: their 16-element chunks split, then transposed
  alignas(32) static const bf16_t zeros[kChunk] = {};
  for (int m0 = 0; m0 < M; m0 += 8) {
    const bf16_t* src[8];
    for (int i = 0; i < 8; ++i) src[i] = m0 + i < M ? x + int64_t(rows[m0 + i]) * ldx : nullptr;
    float* d = dst + int64_t(m0 & ~31) * K + (m0 & 31);
    for (int k = 0; k < K; k += kChunk) {
      __m256 e[8], o[8];
      for (int i = 0; i < 8; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[i] ? src[i] + k : zeros));
        e[i] = even_f32(v);
        o[i] = odd_f32(v);
      }
      transpose8(e, d + int64_t(k) * 32, 32);
      transpose8(o, d + int64_t(k + 8) * 32, 32);
    }
  }
  // the last block's missing tokens: zero
  const int m_end = (M + 31) & ~31;
  for (int m = (M + 7) & ~7; m < m_end; m += 8)
    for (int p = 0; p < K; ++p) _mm256_store_ps(dst + int64_t(m & ~31) * K + int64_t(p) * 32 + (m & 31), _mm256_setzero_ps());
}

// R rows x TV vectors of 8 tokens over len elements (a multiple of 16) of a sub-block: wf the rows' fp32
// copy (row stride kOSub, split-16 like I), it the tokens' transposed I at the sub-block's start (row
// stride ldt), acc the carried lane accumulators [8][R][TV] (zero at a piece's first sub-block).
template <int R, int TV>
inline void outer_tile(const float* wf, int len, const float* it, int ldt, __m256* acc, bool first) {
  #pragma GCC unroll 1
  for (int l = 0; l < 8; ++l) {
    __m256 a[R][TV];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 4
      for (int v = 0; v < TV; ++v) a[r][v] = first ? _mm256_setzero_ps() : acc[(l * R + r) * TV + v];
    for (int k = 0; k < len; k += 16) {
      __m256 ie[TV], io[TV];
      #pragma GCC unroll 4
      for (int v = 0; v < TV; ++v) {
        ie[v] = _mm256_load_ps(it + int64_t(k + l) * ldt + 8 * v);
        io[v] = _mm256_load_ps(it + int64_t(k + 8 + l) * ldt + 8 * v);
      }
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256 b = _mm256_broadcast_ss(wf + r * kOSub + k + l);
        #pragma GCC unroll 4
        for (int v = 0; v < TV; ++v) a[r][v] = _mm256_fmadd_ps(b, ie[v], a[r][v]);
        b = _mm256_broadcast_ss(wf + r * kOSub + k + 8 + l);
        #pragma GCC unroll 4
        for (int v = 0; v < TV; ++v) a[r][v] = _mm256_fmadd_ps(b, io[v], a[r][v]);
      }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 4
      for (int v = 0; v < TV; ++v) acc[(l * R + r) * TV + v] = a[r][v];
  }
}

// The piece's sums of R rows x TV token vectors (hsum's tree, on whole vectors) added into c[r * ldc + t]
// for the first mc tokens.
template <int R, int TV>
inline void outer_sums(const __m256* acc, float* c, int64_t ldc, int mc) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < TV; ++v) {
      auto lane = [&](int l) { return acc[(l * R + r) * TV + v]; };
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(lane(0), lane(4)), _mm256_add_ps(lane(2), lane(6))),
                                     _mm256_add_ps(_mm256_add_ps(lane(1), lane(5)), _mm256_add_ps(lane(3), lane(7))));
      float* cr = c + r * ldc + 8 * v;
      const int n = imin(8, mc - 8 * v);
      if (n == 8) {
        _mm256_storeu_ps(cr, _mm256_add_ps(_mm256_loadu_ps(cr), s));
      } else {
        alignas(32) float t[8];
        _mm256_store_ps(t, s);
        for (int i = 0; i < n; ++i) cr[i] += t[i];
      }
    }
}

// Rows [r, r + R) over the group's pieces [g0, g1) against a block of I (it: the group's first position,
// 32 tokens a position, ext of them (mc rounded up to 8) read, mc real): per piece, sub-blocks of kOSub converted to fp32 (the next one prefetched into L2),
// then each tile of 16 (or the last 8) tokens; the sums added at the piece's end.
template <int R>
void outer_rows(const bf16_t* const* w, int r, int nrows, const float* it, int ext, int mc, const int32_t* pc,
                int g0, int g1, Out o, float* wf, __m256* acc) {
  const int gk0 = pc[2 * g0], gk1 = pc[2 * g1 - 1];
  for (int p = g0; p < g1; ++p) {
    const int k0 = pc[2 * p], k1 = pc[2 * p + 1];
    for (int s0 = k0; s0 < k1; s0 += kOSub) {
      const int s1 = imin(s0 + kOSub, k1);
      // the next sub-block: these rows' next in the group, else the next R rows' first
      const bf16_t* pf[R] = {};
      if (s1 < gk1) for (int q = 0; q < R; ++q) pf[q] = w[r + q] + s1;
      else if (r + 2 * R <= nrows) for (int q = 0; q < R; ++q) pf[q] = w[r + R + q] + gk0;
      for (int q = 0; q < R; ++q) {
        const bf16_t* src = w[r + q];
        float* d = wf + q * kOSub - s0;
        for (int k = s0; k < s1; k += 16) {
          if (pf[q]) Avx2::prefetch_l2(pf[q] + (k - s0));
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
          _mm256_store_ps(d + k, even_f32(v));
          _mm256_store_ps(d + k + 8, odd_f32(v));
        }
      }
      const bool first = s0 == k0;
      int t = 0;
      const float* its = it + int64_t(s0 - gk0) * 32;
      for (; t + 16 <= ext; t += 16) outer_tile<R, 2>(wf, s1 - s0, its + t, 32, acc + t / 8 * 8 * R, first);
      if (t < ext) outer_tile<R, 1>(wf, s1 - s0, its + t, 32, acc + t / 8 * 8 * R, first);
    }
    float* c = o.c + int64_t(r) * o.row_ld + p * o.piece_ld;
    int t = 0;
    for (; t + 16 <= ext; t += 16) outer_sums<R, 2>(acc + t / 8 * 8 * R, c + t, o.row_ld, imin(16, mc - t));
    if (t < ext) outer_sums<R, 1>(acc + t / 8 * 8 * R, c + t, o.row_ld, mc - t);
  }
}

void Avx2::mm_outer(const bf16_t* const* w, int nrows, const float* I, int M, int K, const int32_t* pc, int np,
                    Out o) {
  constexpr Blocking B = kBlocking;
  float* wf = tl_wf.get(size_t(kOR) * kOSub);
  __m256* acc = tl_oacc.get(size_t(8) * kOR * (kOMb / 8));
  for (int g0 = 0; g0 < np;) {
    const int g1 = group_end(pc, np, g0, B.k_group);
    for (int m0 = 0; m0 < M; m0 += kOMb) {
      const int mc = imin(kOMb, M - m0), ext = (mc + 7) & ~7;
      const float* it = I + int64_t(m0) * K + int64_t(pc[2 * g0]) * 32;
      Out om{o.c + m0, o.row_ld, o.piece_ld};
      int r = 0;
      for (; r + kOR <= nrows; r += kOR) outer_rows<kOR>(w, r, nrows, it, ext, mc, pc, g0, g1, om, wf, acc);
      switch (nrows - r) {
        case 4: outer_rows<4>(w, r, nrows, it, ext, mc, pc, g0, g1, om, wf, acc); break;
        case 3: outer_rows<3>(w, r, nrows, it, ext, mc, pc, g0, g1, om, wf, acc); break;
        case 2: outer_rows<2>(w, r, nrows, it, ext, mc, pc, g0, g1, om, wf, acc); break;
        case 1: outer_rows<1>(w, r, nrows, it, ext, mc, pc, g0, g1, om, wf, acc); break;
        default: break;
      }
    }
    g0 = g1;
  }
}

}  // namespace

const MicroKernel microkernel_avx2_bf16 = dot_microkernel<Avx2>("avx2", "avx2");

}  // namespace hina
