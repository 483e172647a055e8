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
//     call, all tokens in registers: 8 rows at a time (M = 1), 4 (M = 2), 2 (M = 3..6); from M = 2
//     each tile prefetches the next tile's W (the next rows' same piece as the one it streams; it
//     was the same rows' next piece, else the next rows' first: see glue.h's rows_x_tokens) into
//     L2 while it streams its own, so the page-sized pieces never start cold. At M = 1 rows of
//     at most one piece (2048 elements: Qwen3-30B-A3B's gate/up, every Qwen3 down projection) take
//     4-row tiles with that prefetch too: each of their tiles starts on new pages.
//   M > 6: K in groups of one piece, tokens in blocks whose fp32 I slice over a group (<= 256 KiB)
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

  // Blocking (see the header): decode up to 6 tokens (M = 1: 8 rows; M = 2: 4 rows; M = 3..6:
  // 2 rows; from M = 2 the next tile prefetched into L2); M > 6: 4 x 2 tiles, K groups of one
  // piece, 512-element sub-blocks (4 W rows = 4 KiB bf16 in L1), token blocks of 4..32 whose fp32
  // I slice over a group fits 256 KiB of L2, the next sub-block prefetched into L1; gate and up
  // rows interleaved.
  static constexpr Blocking kBlocking{
      /*task_rows=*/64, /*decode_max_m=*/6, /*decode_rows=*/{0, 8, 4, 2, 2, 2, 2},
      /*mr=*/4, /*nr=*/2, /*k_group=*/2048, /*k_sub=*/512,
      /*mb_max=*/32, /*mb_min=*/4, /*mb_l2_bytes=*/256 << 10,
      /*token_blocks_outer=*/false, /*prefetch_next=*/1, /*decode_prefetch=*/{0, 0, 2, 2, 2, 2, 2},
      /*interleave_gate_up=*/true, /*decode_short_k=*/2048, /*decode_short_rows=*/4,
      /*decode_short_prefetch=*/2};

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

  static size_t packed_bytes(int M, int K) { return size_t(M) * K * sizeof(float); }

  // Transformation 1: gather x rows into I (fp32, split-16). Same two ops as the W conversion.
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
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

  // Transformation 2's store: fp32, split-16, so the down projection runs the same tiles.
  static void put_act(void* act, int act_K, int m, int k, float v) {
    static_cast<float*>(act)[int64_t(m) * act_K + split_pos<kChunk>(k)] = v;
  }
};

}  // namespace

const MicroKernel microkernel_avx2_bf16 = dot_microkernel<Avx2>("avx2", "avx2");

}  // namespace hina
