// The AVX-512 BF16 micro-kernel: `vdpbf16ps` on the general layout, for CPUs without AMX
// (AMD Zen 4/5, Cooper Lake, Sapphire Rapids cores without AMX permission).
//
// Along K, W rows (general layout) and I rows are both contiguous, so the dot-product form needs
// no transform of W at all: one 64-byte load of 32 bf16 from a W row, one from an I row, and
//     acc_lane[j] += W[2j] * I[2j] + W[2j+1] * I[2j+1]            (vdpbf16ps)
// with the 16 lanes summed once per canonical K piece (pieces.h). Transformation 1 is therefore a
// plain gather of bf16 rows, and transformation 2 rounds SiLU(gate)*up to bf16 into the same
// row-major [M, I] layout.
//
// Tasks of 256 output rows (64 before): on Zen 4 (2026-12-02, built variants timed alternately in one
// process, 2 threads, weights from DRAM) Qwen3-30B-A3B T = 1 / 2 / 4 0.91-0.96 / 0.95-0.99 / 0.93-0.96x
// of the time with 64, Mixtral-8x7B and DeepSeek-V3 0.97-1.03x (noise), the linear kernel's q/k/v and o
// at T = 1 0.99-1.02x.
// One token (same machine and method): 4-row tiles with the next tile prefetched into L2 for rows of
// more than 2048 elements (were 8 rows, no prefetch), 8-row tiles for the short rows (were 4):
// Qwen3-30B-A3B 0.95-0.99x of the time, Mixtral-8x7B 0.97-0.98x, DeepSeek-V3 0.94-0.96x, two runs
// with the order of the builds swapped; the linear kernel's q/k/v, o 0.98-0.99x.
// Two fixes in glue.h, found by timing the kernel against a plain loop over the same weights in one
// process (the AMX Xeon, 2026-12-04: Qwen3-30B-A3B T = 1, gate/up 1.07x and down 1.15x the loop's
// time, the whole call 2.63 against 2.39 ms). (1) Decode tiles prefetch the next rows' same piece:
// torch's tensors start 64 bytes past a page, so a 2048-element row is cut 2016 + 32 and the old
// target (the next piece in order, over this piece's length) left most of the next tile cold. Same
// process, 3 alternated rounds, bit-identical, new / old time: Qwen3 T = 1 / 2 / 4 0.97 / 0.93 /
// 0.99x, Mixtral-8x7B 1.00 / 0.94 / 0.97x (hina:avx2: 0.98-1.02x). (2) Rows of differing cuts (Qwen3's
// down projection, K = 768: 8 classes) are run class by class in the order of their first rows
// instead of their cuts: Qwen3 T = 1 / 2 / 4 / 8 0.99 / 0.98 / 0.93 / 0.82x (hina:avx2 0.95 / 0.94
// / 0.92 / 0.93x).
// Tried after (1)-(2) and not kept: decode tiles up to 8 tokens (2 rows x 8 tokens, the next tile
// prefetched), so that an AMX call of 5-8 tokens an expert could stay here: Qwen3 M = 5 / 6 / 8 3.67 /
// 4.05 / 4.57 ms against the AMX tiles' 2.98 / 2.96 / 3.01, Mixtral M = 6 / 8 37.0 / 42.4 against
// 24.5 / 24.5 (one process, 3 alternated rounds): eight vdpbf16ps per 64 bytes of W, two cycles each
// here, bound it, as the blocked path's 4 x 4 tiles (3.64 / 4.00 / 4.58) are bound.
// The packed token rows 64 bytes longer than K (ld): T = 16..256, same method, two runs, 0.92-1.04x of
// the time (mostly under 1). Tried beside it and not kept: K sub-blocks of 512 with the accumulators
// carried (1.07-1.23x: the inner loop is not short of L1, and the carry costs).
// Blocking: R W rows x TT tokens of zmm accumulators.
//   M <= 4: every W row streamed from memory once, R = 4 (M = 1; rows of <= 2048 elements: 8),
//     8 (M = 2) or 4 (M = 3, 4) rows at a time, the next tile prefetched into L2.
//   M > 4: 4 rows x 4 tokens (16 accumulators; Zen 5: 6 x 4, below), K in canonical pieces (<= 2048,
//     pieces.h: a 16 KiB W slice in L1), token blocks of 32 (I slice 128 KiB in L2); W re-read once
//     per 32 tokens.
//
// The horizontal sums (one per row, token and piece) are a halving tree, 16 of them at once at the end
// of a tile (hsum16: four levels of shuffles and adds over 16 accumulators, the same bits as one tree
// per accumulator). They were a store and 16 scalar adds each: on Zen 4 (2026-12-02, 2 threads, same
// machine, before -> after) Mixtral-8x7B T = 16 / 64 61.8 / 199.2 -> 47.0 / 137.7 ms, Qwen3-30B-A3B
// (K = 768 for the down projection: 24 chunks per sum) T = 16 / 64 8.81 / 39.1 -> 6.35 / 16.3 ms.
//
// Built twice from this one source: for real (-mavx512bf16 ..., `_C`, isa "avx512") and against
// SIMDe's portable AVX-512 (HINA_EMU_AVX512, no -mavx512 flags, `_C_avx512_emu`, isa
// "avx512-emulated"), so the kernel's logic is tested on CPUs without AVX-512.
//
// The loop nest, gate_up / down / piece_dots and the stores are glue.h's, shared with the AVX2
// kernel; this file holds what AVX-512 BF16 forces and the blocking parameters as data.
#if defined(HINA_EMU_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include "emu/simde_masked.h"
#else
#include <immintrin.h>
#endif

#include "glue.h"

#include "isa/avx512/attention_vec512.h"  // vec512::hsum16, hsum16x16
#include "isa/avx512/dpbf16.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

struct Avx512Zen5;

struct Avx512 {
  using Elem = bf16_t;               // I and the activation: bf16, row-major (the general layout)
  using Acc = __m512;
  using X = __m512bh;                // 32 bf16 of a token's I
  using W = __m512bh;                // 32 bf16 of a W row
  static constexpr int kChunk = 32;  // bf16 per zmm load

  // Blocking (see the header): tasks of 256 rows; decode M = 1: 4 rows (rows of <= 2048 elements: 8),
  // M = 2: 8 rows, M = 3, 4: 4 rows, the next tile prefetched into L2; M > 4: 4 x 4 tiles, one piece
  // at a time, token blocks of 32 outside the pieces, no sub-blocks, no prefetch. The decode tiles
  // first took the AVX2 kernel's measured tuning (gate/up interleaved, the next tile prefetched into L2
  // from M = 2, one-token rows of at most 2048 elements 4 to a tile): on a 2-vCPU Sapphire Rapids
  // (2026-12-01, against hina:avx2 in the same run, before -> after) Qwen3-30B-A3B T = 1 / 2 / 4
  // 1.14 / 1.23 / 1.36x -> 1.00 / 1.04 / 0.97x of its time, Mixtral 1.02 / 1.13 / 1.04x -> 1.02 /
  // 1.02 / 0.93x (3.12 / 3.41 / 3.79 and 27.6 / 26.7 / 30.2 ms).
  static constexpr Blocking kBlocking{
      /*task_rows=*/256, /*decode_max_m=*/4, /*decode_rows=*/{0, 4, 8, 4, 4},
      /*mr=*/4, /*nr=*/4, /*k_group=*/0, /*k_sub=*/0,
      /*mb_max=*/32, /*mb_min=*/32, /*mb_l2_bytes=*/0,
      /*token_blocks_outer=*/true, /*prefetch_next=*/false, /*decode_prefetch=*/{0, 2, 2, 2, 2},
      /*interleave_gate_up=*/true, /*decode_short_k=*/2048, /*decode_short_rows=*/8,
      /*decode_short_prefetch=*/2};

  static __m512bh load_bh(const bf16_t* p) {
    __m512bh v;
    std::memcpy(&v, p, sizeof(v));  // a plain 64-byte load (vmovdqu16 natively)
    return v;
  }
  static Acc zero() { return _mm512_setzero_ps(); }
  static X load_x(const bf16_t* p) { return load_bh(p); }
  static void prefetch(const bf16_t* p) { __builtin_prefetch(p, 0, 3); }      // into L1 (prefetcht0)
  static void prefetch_l2(const bf16_t* p) { __builtin_prefetch(p, 0, 2); }   // into L2 (prefetcht1)
  // On AMD Zen 5 (family 26) and later: Avx512Zen5's blocking (below); on Intel, Avx512Xeon's (its own
  // alternative).
  static constexpr bool kAltBlocking = true;
  using AltBlocking = Avx512Zen5;
  static bool alt_blocking() { return avx512_tiles() != Avx512Tiles::kDefault; }  // microkernel.cpp
  static W load_w(const bf16_t* p) { return load_bh(p); }
  static Acc fma(Acc acc, const W& w, const X& x) { return dpbf16(acc, w, x); }
  // Horizontal sums: attention_vec512.h's halving tree, 16 at once at a tile's end (the same bits).
  static float hsum(Acc v) { return vec512::hsum16(v); }
  static __attribute__((always_inline)) __m512 hsum16(const Acc (&v)[16]) { return vec512::hsum16x16(v); }
  static void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

  // Rows of the packed I and activation 64 bytes longer than K: W rows 4 or 8 KiB apart (Qwen3's,
  // Mixtral's) all fall in the same L1 sets, and unpadded token rows did too.
  static int64_t ld(int K) { return int64_t(K) + 32; }
  static size_t packed_bytes(int M, int K) { return size_t(M) * size_t(ld(K)) * sizeof(bf16_t); }

  // Transformation 1: the layout vdpbf16ps wants along K is the general one: a plain row gather.
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
    bf16_t* dst = static_cast<bf16_t*>(I);
    for (int m = 0; m < M; ++m)
      std::memcpy(dst + int64_t(m) * ld(K), x + int64_t(rows[m]) * ldx, size_t(K) * sizeof(bf16_t));
  }

  // Transformation 2's store: SiLU(gate)*up rounded to bf16 into the row-major [M, I] activation
  // (the layout the down projection's vdpbf16ps reads along K).
  static void put_act(void* act, int act_K, int m, int k, float v) {
    static_cast<bf16_t*>(act)[int64_t(m) * ld(act_K) + k] = f32_to_bf16(v);
  }
};

// The blocking on AMD Zen 5 and later (Avx512::alt_blocking: cpuid family >= 26, or
// HINA_AVX512_BLOCKING=zen5|default), the same sums bit for bit. Measured on a 2-vCPU EPYC Zen 5
// (2026-12-05; the builds' modules side by side in one process, every token on the same top-k
// experts, weights rotated past the L3, alternated rounds; new / old time). The decode tiles (M <= 4):
//   - rows far apart (decode_far): a tile's rows from as many equal segments of the task's rows, not
//     consecutive rows; gate_up's gate row and its up row stay together (pairs from half as many
//     segments). A standalone loop over a 1 GiB bf16 [N, 4096] matrix, one thread, one token: 4
//     consecutive rows at a time read 34 GB/s, 2 at a time 25-29, 4 far apart 41, 2 far apart 43, one
//     row alone 37 (one chain), a plain stream 42-44; rows of 2048 elements: 8 consecutive 32, 4 far
//     apart 43, 8 far apart 37;
//   - two chunks of a row before the next row's (decode_unroll 2): 4 consecutive rows 40-42 GB/s
//     against 34 (4 chunks: 31);
//   - from 2 tokens, the tile's own rows prefetched 512 elements ahead into L1 (decode_prefetch 3)
//     in place of the next tile's into L2: one thread, Mixtral-8x7B T = 4 0.81-0.82x (1024 elements
//     ahead 0.90x, 256 0.89x), T = 2 0.86-0.91x, T = 3 0.81x;
//   - one token: no prefetch (the first Zen 5 session, then still in the default tiles: T = 1 Mixtral
//     0.955x, Qwen3-30B-A3B 0.94-0.95x, DeepSeek-V3 0.95-0.97x, two runs with the builds' order
//     swapped; at M = 2..4 the prefetch's absence cost 1.03-1.16x; here, 256 or 512 elements ahead
//     0.94x against 0.92x without). Tried then and not kept: two accumulator chains per (row, token)
//     (a piece's even and odd chunks, every tile, so the blockings stay bit-identical): T = 1
//     0.85-1.02x, but the M = 3, 4 tiles, halved to fit 32 registers, 1.12-1.22x;
//   - one token, rows of at most 2048 elements (decode_short_k: Qwen3-30B-A3B, DeepSeek-V3's down
//     projection): 4 far apart, not 8 consecutive: Qwen3 T = 1 0.96x, DeepSeek-V3 T = 1 0.96x (8 far
//     apart 1.08-1.12x, 2 far apart 1.01x, two chunks at a time 0.99-1.03x);
//   - rows whose cuts differ from their neighbours' (Qwen3's down projection, K = 768: 8 classes of
//     cuts, a class every 8th row) no longer class by class (a class's rows, 8 a tile, in order): 4 rows
//     far apart in memory order, each folding its own pieces (decode_mixed_rows 4, glue.h's
//     decode_mixed; a fourth session, 2026-12-05 afternoon). Qwen3-30B-A3B T = 1 / 2 / 4 0.93 / 0.92 /
//     0.89x the time, Qwen2-57B-A14B (K = 2560) T = 1 / 4 0.99 / 0.91x, Qwen3-235B-A22B (K = 1536)
//     T = 1 0.96x (2 rows: Qwen3 0.92 / 0.95 / 0.93x; 8: 0.95x at T = 1). What showed it: the
//     kernel's loops rewritten stand-alone and run in the same process on the same tensors
//     (scratch code, not kept), the down projection by classes 1.08x the time of 4 rows far apart.
// Together, 2 threads, against the default tiles: Mixtral-8x7B T = 1 / 2 / 3 / 4 0.90 / 0.88 / 0.85 /
// 0.86x (T = 1 8.6-9.4 ms, at the read probe's rate), DeepSeek-V3 0.94 / 0.88 / 0.88 / 0.88x,
// Qwen3-30B-A3B 0.96 / 0.87 / 0.97 / 0.97x; one thread, Mixtral T = 1 / 2 / 4 0.92 / 0.86 / 0.82x.
// Not closed: Qwen3 at T = 1 streams ~30 GB/s a core against the probe's 42 (vllm:sgl's packed
// layout reads at the probe's rate). With the rows in memory order (above), in one process on the
// same tensors: the kernel's gate/up phase 590-610 us and its down phase 300-330 (75.5 MB, its
// region 0.93 of the call), stand-alone loops of the same tiles 530-545 and 285-290, the two-stream
// read 0.83-0.87 ms for all of it.
// Tasks of 512 rows (256): Qwen3-30B-A3B T = 1 / 2 / 4 0.95-0.96 / 0.99 / 0.98x, T = 16 / 64 0.98x,
// Mixtral-8x7B and DeepSeek-V3 T = 1 1.00x (1024: as 512; 128: 1.01-1.05x).
// From 5 tokens: token blocks of 128 (W re-read once per 128 tokens, the block's I slice over a piece
// 512 KiB in L2), and the first tile of a row group prefetches the next W piece into L2
// (prefetch_next 2). 2 threads, against blocks of 32 without the prefetch: Mixtral-8x7B T = 16 / 64
// / 256 0.94 / 0.85 / 0.87x, Qwen3-30B-A3B 0.84 / 0.86 / 0.88x, DeepSeek-V3 T = 64 0.85x; the
// prefetch alone 0.93-0.94x, blocks of 64 0.85-0.90x, of 256 0.85-0.99x. Tried and not kept: blocks of
// 8 or 16 (1.13-1.38x), K sub-blocks of 512 with the token blocks inside the pieces (1.26-1.36x),
// 2 x 8 tiles (1.55-1.62x), 8 x 2 tiles (0.92-0.94x, as the prefetch alone), row groups far apart
// (as the decode tiles' rows: 1.00-1.02x). What bounds these tiles: with W in the L3 (one expert,
// H = 4096, I = 512, one thread) they run 256 / 294 / 312 GFLOP/s at T = 16 / 64 / 256 against the
// register-only 524; each 4 x 4 tile reads its 4 tokens' I from L2 for every group of 4 rows (16 bytes
// per vdpbf16ps).
// From 5 tokens, 6 x 4 tiles (24 accumulators; the I read from L2 once per 6 rows, ~11 bytes per
// vdpbf16ps), the same bits (a seventh session, 2026-12-05 evening; same method, 3-5 rounds, against
// 4 x 4): Mixtral-8x7B T = 16 / 32 / 64 / 256 0.73 / 0.67-0.78 / 0.66 / 0.61x of the time (T = 256
// 230 ms, ~785 GFLOP/s), Qwen3-30B-A3B T = 8 / 16 / 64 0.77 / 0.79 / 0.72x, DeepSeek-V3 T = 16 / 64
// 0.73 / 0.65x; T = 5 / 6 1.00-1.05x. Tried beside it at T = 32 (Mixtral): 8 x 3 0.81x, 7 x 3 0.82x,
// 6 x 3 0.85x, 12 x 2 0.96x, 5 x 4 1.05x, 4 x 6 1.02x, 3 x 8 1.28x; with 6 x 4, token blocks of 64
// or 256 1.00-1.09x, K sub-blocks of 1024 / 512 with the accumulators carried 1.03-1.04 / 1.09x
// (T = 64); the decode tiles at M = 3, 4 with 6 or 8 rows in place of 4: 1.02-1.08x. The rows left
// over when 6 does not divide a task's (2 of 512) take 1 x 1 tiles as before: 1 x 4 tiles for them
// were 0.99-1.00x, and rn x 4 tiles inlined into mm_rows cost the 4 x 4 tiles of the other kernels
// 1.07-1.15x.
// The blocked tiles' prefetch (prefetch_next) at a piece's last row group: the row group two ahead
// (prefetch_groups 2; was the next): Mixtral-8x7B T = 16 / 64 0.95-0.96 / 0.98x the time,
// Qwen3-30B-A3B T = 16 0.97-0.99x, DeepSeek-V3 T = 64 0.99x (same method, 5 rounds, two runs); three
// ahead 0.95 / 0.98 / 0.98x; the next group by the first token tile and the one after it by the
// second 1.00 / 0.99 / 0.97x.
// Tasks of 768 rows (512), so that 6 divides a task's rows (gate/up's interleaved, Qwen3's down
// projection's 96 a class) and no task ends in 1 x 1 tiles: Qwen3-30B-A3B T = 4 / 16 / 64 0.98 / 0.94 /
// 0.94x the time (a second run: T = 16 / 64 0.96 / 0.94x), DeepSeek-V3 T = 1 0.99x and T = 16 0.96 and
// 1.01x (two runs), Mixtral-8x7B T = 32 0.99x, T = 1 / 4 / 256 and Qwen3 T = 1 1.00x (same method,
// 3-5 rounds; 384 rows: 0.96-1.03x). The linear op keeps 512
// (linear_task_rows): its rows are powers of two, and at 768 it took 1.01-1.06x the time (T = 1, q/k/v
// and o shapes of Qwen3-30B-A3B and Mixtral-8x7B; T = 128 1.05x).
// Decode tiles up to 6 tokens an expert (4 rows x 5 or 6 tokens, rows far apart, their own rows
// prefetched ahead: each W row streamed once), where 5 and 6 took the blocked tiles (a 6 x 4 tile and
// one-token tiles, the W slice from L1 a second time): Mixtral-8x7B T = 5 / 6 0.78 / 0.78-0.84x the
// time, Qwen3-30B-A3B 0.68 / 0.85x, DeepSeek-V3 T = 6 0.86x (same method, 3 rounds). Up to 8 (3 or 2
// rows at 7 and 8 tokens) was no better at 7 (0.97-1.09x) and worse at 8 (1.07-1.25x).
struct Avx512Xeon;
struct Avx512Zen5 : Avx512 {
  static constexpr bool kAltBlocking = true;  // on Intel, Avx512Xeon's (below)
  using AltBlocking = Avx512Xeon;
  static bool alt_blocking() { return avx512_tiles() == Avx512Tiles::kXeon; }
  static constexpr Blocking kBlocking{
      /*task_rows=*/768, /*decode_max_m=*/6, /*decode_rows=*/{0, 4, 8, 4, 4, 4, 4},
      /*mr=*/6, /*nr=*/4, /*k_group=*/0, /*k_sub=*/0,
      /*mb_max=*/128, /*mb_min=*/128, /*mb_l2_bytes=*/0,
      /*token_blocks_outer=*/true, /*prefetch_next=*/2, /*decode_prefetch=*/{0, 0, 3, 3, 3, 3, 3},
      /*interleave_gate_up=*/true, /*decode_short_k=*/2048, /*decode_short_rows=*/4,
      /*decode_short_prefetch=*/0, /*decode_far=*/true, /*decode_unroll=*/2, /*decode_ahead=*/512,
      /*decode_mixed_rows=*/4, /*prefetch_groups=*/2, /*linear_task_rows=*/512};
};

// The blocking on Intel (Avx512Zen5::alt_blocking: auto on a GenuineIntel CPU, or
// HINA_AVX512_BLOCKING=xeon): Zen 5's, but the one-token tiles (and the short rows') prefetch their own
// rows 512 elements ahead into L1, as Zen 5's do from two tokens (decode_prefetch 3; Zen 5 measured no
// prefetch 2% faster there). The same bits. Measured on a 2-vCPU Xeon with AMX (family 6, model 207,
// L3 300 MiB; 2026-12-06; the blockings alternated in one process on the same tensors, every token on
// the same experts, weights rotated past the L3, 5 rounds, new / default time; hina:amx runs these tiles
// up to 4 tokens an expert, hina:avx512 at every M; the machine's read rate moved between 16 and 30 GB/s
// over the runs, so ratios only):
//   - Zen 5's blocking as it is: T = 1 1.07 / 1.07x (Mixtral-8x7B, amx / avx512), 1.08 / 1.11x
//     (Qwen3-30B-A3B), 1.15 / 1.14x (DeepSeek-V3); T = 2..4 0.90-1.00x (Qwen3 T = 4 0.93 / 0.91x);
//     from 5 tokens (avx512) Mixtral T = 5 / 6 / 16 / 64 0.67 / 0.63 / 0.88 / 0.95x, Qwen3 0.62 / 0.65
//     / 0.92 / 0.90x;
//   - with the one-token prefetch (scratch builds of Zen 5's): T = 1 0.97 / 0.98x, 0.91 / 0.99x, 0.98 /
//     0.95x, and 0.98 / 0.99x, 0.92 / 0.95x, 0.96 / 0.97x with 1024 elements ahead (as 512);
//   - this blocking as built, against the default: T = 1 / 2 / 4 Mixtral 0.98 / 0.92 / 0.96x (amx),
//     0.95 / 0.99 / 0.96x (avx512), Qwen3 1.00 / 0.96 / 1.08x, 1.02 / 0.90 / 0.98x, DeepSeek-V3 1.00 /
//     0.99 / 0.98x, 0.995 / 0.96 / 0.95x (one run, the read rate 16-30 GB/s); again, 7 rounds, amx, Qwen3
//     T = 1 / 2 / 3 / 4 0.94 / 0.96 / 0.98 / 0.95x, Mixtral T = 1 / 4 0.97 / 1.00x.
struct Avx512Xeon : Avx512Zen5 {
  static constexpr bool kAltBlocking = false;
  static constexpr Blocking kBlocking = [] {
    Blocking b = Avx512Zen5::kBlocking;
    b.decode_prefetch[1] = 3;
    b.decode_short_prefetch = 3;
    return b;
  }();
};

#if defined(HINA_AVX512_NOBF16)
// Without AVX512_BF16 (isa "avx512-nobf16"): the AVX2 kernel's form at 512 bits (microkernel_avx2.cpp)
// in place of vdpbf16ps's arithmetic on both operands (dpbf16.h): W's 32 bf16 split into even and odd
// fp32 halves once per load (an AND, a shift), I produced by transformation 1 already split and in fp32
// ("split-32": per chunk of 32 elements the 16 even ones, then the 16 odd ones), so a token costs two FMAs
// per chunk and no integer op. The activation (transformation 2) stays fp32 in the same layout, as
// AVX2's does. Decode (M <= 4) takes the AVX-512 kernel's tiles; from 5 tokens the AVX2 kernel's loop
// nest with 4 x 4 tiles: K groups of one piece cut into 512-element sub-blocks (4 W rows, 4 KiB, and 4
// tokens' fp32 slices, 8 KiB, in L1), token blocks of 4..32 in L2. Measured on a 2-vCPU Xeon without
// AVX512_BF16 (2026-12-03, builds side by side in one process, 5 rounds, Mixtral-8x7B / Qwen3-30B-A3B):
// against vdpbf16ps's arithmetic on both operands in the AVX-512 kernel's 4 x 4 tiles (dpbf16.h), T = 8
// 0.79 / 0.86x of the time, T = 16 0.77 / 0.90x, T = 64 0.91 / 0.92x, T = 1..4 0.96-1.04x (noise).
// Tried: these tiles in the AVX-512 kernel's loop nest (whole pieces, no sub-blocks) 1.17-1.41x the time
// (4 tokens' fp32 slices of a 2048-element piece and the 4 W rows fill L1), and with 4 x 2 tiles 1.09-1.15x;
// 4 x 2 tiles with the sub-blocks 0.96-1.09x.
// even_f32 / odd_f32: dpbf16.h; split_pos: glue.h.

// Avx512's accumulators, horizontal sums and prefetches; its own operands, layout and blocking.
struct Avx512F : Avx512 {
  static constexpr bool kAltBlocking = false;  // its own blocking everywhere
  using Elem = float;                // I and the activation: fp32, split-32
  struct X { __m512 even, odd; };    // 32 elements of a token's I
  struct W { __m512 even, odd; };    // 32 elements of a W row, as fp32
  static constexpr int kChunk = 32;
  static constexpr Blocking kBlocking{
      /*task_rows=*/256, /*decode_max_m=*/4, /*decode_rows=*/{0, 4, 8, 4, 4},
      /*mr=*/4, /*nr=*/4, /*k_group=*/2048, /*k_sub=*/512,
      /*mb_max=*/32, /*mb_min=*/4, /*mb_l2_bytes=*/256 << 10,
      /*token_blocks_outer=*/false, /*prefetch_next=*/1, /*decode_prefetch=*/{0, 2, 2, 2, 2},
      /*interleave_gate_up=*/true, /*decode_short_k=*/2048, /*decode_short_rows=*/8,
      /*decode_short_prefetch=*/2};

  static X load_x(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
  static W load_w(const bf16_t* p) {
    const __m512i v = _mm512_loadu_si512(p);
    return {even_f32(v), odd_f32(v)};
  }
  static Acc fma(Acc acc, const W& w, const X& x) {   // odd first, as vdpbf16ps adds them
    acc = _mm512_fmadd_ps(w.odd, x.odd, acc);
    return _mm512_fmadd_ps(w.even, x.even, acc);
  }

  // rows 64 bytes longer than K (as the bf16 kernel's, for the same L1 sets)
  static int64_t ld(int K) { return int64_t(K) + 16; }
  static size_t packed_bytes(int M, int K) { return size_t(M) * size_t(ld(K)) * sizeof(float); }

  // Transformation 1: gather x rows into I (fp32, split-32): the W conversion's two ops, once per token.
  static void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
    float* dst = static_cast<float*>(I);
    for (int m = 0; m < M; ++m) {
      const bf16_t* src = x + int64_t(rows[m]) * ldx;
      float* d = dst + int64_t(m) * ld(K);
      for (int k = 0; k < K; k += kChunk) {
        const __m512i v = _mm512_loadu_si512(src + k);
        _mm512_storeu_ps(d + k, even_f32(v));
        _mm512_storeu_ps(d + k + 16, odd_f32(v));
      }
    }
  }
  // Transformation 2's store: fp32, split-32, so the down projection runs the same tiles.
  static void put_act(void* act, int act_K, int m, int k, float v) {
    static_cast<float*>(act)[int64_t(m) * ld(act_K) + split_pos<kChunk>(k)] = v;
  }
};
#endif

}  // namespace

#if defined(HINA_AVX512_NOBF16)
const MicroKernel microkernel_avx512_bf16_nobf16 = dot_microkernel<Avx512F>(HINA_AVX512_ISA, HINA_AVX512_CPU_ISA(""));
#else
const MicroKernel microkernel_avx512_bf16 = dot_microkernel<Avx512>(HINA_AVX512_ISA, HINA_AVX512_CPU_ISA(""));
#endif

}  // namespace hina
