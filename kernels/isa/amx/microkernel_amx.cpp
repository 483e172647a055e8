// The AMX micro-kernel: paper Section 4.2, Algorithm 1, on weights in their general layout.
//
// Operands of `tdpbf16ps C, A, B` (C[m][n] += sum_k A[m][k] * B[k][n], B VNNI-packed in pairs):
//   A = W in the general layout: 16 consecutive W rows x 32 bf16 along K, loaded straight from the
//       framework's tensor (stride = the row stride). W is never repacked ("tmm0 in Figure 3").
//   B = I, VNNI-packed by transformation 1 (the gather): one tile = 32 K values (16 pairs) x up to
//       16 tokens, row kp = [I[m0][2kp], I[m0][2kp+1], I[m0+1][2kp], ...]  ("tmm1 in Figure 3").
//   C = W . I^T: rows are output features, columns are tokens (the transposed result).
// Micro-kernel size (Section 4.2.1, Eq. 1-2): k_r = 32, n_r = 32 W rows (tmm2, tmm3), m_r = 32
// tokens (tmm0, tmm1), four fp32 accumulators (tmm4..tmm7) - the CMR optimum for 8 tiles of 1 KiB.
// For M < 32 tokens the B and C tiles are shorter (colsb = 4 * tokens; one B tile when M <= 16):
// The tile configuration is set per shape. A call whose experts have at most 4 tokens each runs the
// AVX-512-BF16 micro-kernel instead (ops/moe_ffn.cpp, bf16_microkernel: measured there), as the INT8
// and FP8 paths do for few tokens (quant_amx.cpp); the emulated build runs the tiles for every M.
// When the expert has M <= 32 tokens, W has no reuse: it is loaded with TILELOADDT1 (non-temporal
// hint, Section 4.2.2), else with TILELOADD. With 32 < M <= 128 the K loop is cut into chunks and
// every 32-token step runs a chunk before the next one starts (algorithm1_steps, measured there).
// Line 4 of Algorithm 1 (the layout transformation fused into the store):
//   gate/up: SiLU(gate) * up, then rows 2kp and 2kp+1 of C interleaved per token = the VNNI B
//            layout of the down projection (transformation 2);
//   down:    C transposed into token-major y rows (transformation 3).
//
// Built twice from this one source: for real (-mamx-tile -mamx-bf16, `_C`, isa "amx") and against
// emu/tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated"), so the logic is tested
// on CPUs without AMX. The tile-operand code uses only `_tile_*` intrinsics; the transforms are
// plain C++ on the L1-resident tile stores (glue.h's stores, shared with every kernel).
//
// Measured on real AMX (2026-12-01, a 2-vCPU Xeon with AMX-BF16, 480 MiB L3; results/intel-f6m167-2t-1n/):
// memory-bound up to T = 16 on Mixtral-8x7B (2 threads: 0.83-0.88 of the same-process read probe),
// 0.70-0.72 on Qwen3-30B-A3B's small experts at T <= 4, where vLLM-CPU's AMX kernel reaches ~0.8.
// From T = 64 the tiles wait on their loads: at T = 256, 17% of the AMX peak, 0.76x onednn:prepacked;
// perf (cpu-clock) puts ~65% of the samples on the four TILELOADDs of the K loop: each A tile is 16
// W rows one row stride (8 KiB for Mixtral's gate) apart, and neither operand of a 2048-element piece
// (128 KiB each) stays in L1 between iterations, so every tile comes from L2 or further.
// Tried and not kept (A/B in one session, medians of interleaved processes): token groups outer and
// W rows inner (B stays in L2): 0.95-0.97x at T = 32..256; TILELOAD instead of TILELOADDT1 for W at
// M <= 32: 0.99-1.01x; software prefetch of each W row 4/8/16 K steps ahead: 1.02 / 0.97 / 0.88x
// (Qwen3, T = 1..16); the next W block prefetched into L2 as one sequential stream while the current
// one streams (Qwen3 rows are 4 KiB, a page each): 0.95-0.98x. At T <= 16 the K loop's time is on
// the W TILELOADDT1s (~80% of cpu-clock samples at Qwen3 T = 1): it streams, at 0.72 of the probe
// on Qwen3 and 0.85 on Mixtral. Next: a K-blocked loop over L1-sized chunks of W and I (C tiles
// carried across chunks), and a transient contiguous copy of the W block when M spans several token
// groups (2026-12-06: the first is algorithm1_steps for 32 < M <= 128; the copy was tried there and
// not kept).
//
// Rows of differing piece cuts (Qwen3's W_down, K = 768) in the fused tasks (2026-12-01; then
// algorithm1_pieces, now algorithm1_steps):
// before, such a matrix took the piece path, 32-row tiles 8 rows apart, through a partial buffer and
// a scalar reduction. Qwen3 shapes, all 8 experts, median of 400 calls, A/B alternated twice: from
// L3, T = 16 3.65-3.80 -> 2.76-2.99 ms, T = 1 within noise; from DRAM T = 4 4.35-4.73 -> 3.93-4.14.
// Transformation 2 vectorised (store_act_tiles: SiLU, bf16 rounding and the pair interleave on 16 tokens
// at once; it was glue.h's scalar store, an expf call per element): from L3, same A/B, T = 16
// 2.48-2.50 -> 2.08-2.23 ms, T = 4 1.98-2.13 -> 1.94-1.95. With W in L1 instead of streamed (a
// scratch build, not kept) the call's other work read 0.57 ms at T = 1 and 1.15 ms at T = 16.
// Tried at Qwen3-30B-A3B M = 4 / 8 / 16 (2026-12-04, the AMX Xeon, in one process against the build as
// it is, weights from DRAM, 3 alternated rounds; vLLM-CPU's AMX kernel, on its packed blocks, does M = 4
// in ~2.7 ms where these tiles take ~3.1) and not kept: each K step prefetching the next 32-row block's
// lines at the same K into L2 (or L1) 1.33-1.42x the time; 16-row blocks (half the row streams) 1.04-
// 1.05x; a transient copy of each 32-row block (per piece, rows 64 bytes apart) into an L2 buffer, then
// the tiles from it, 1.32-1.37x, with the next block prefetched during the copy or 1 KiB ahead in the
// row 1.31-1.37x (the copy's loads stall, and it does not overlap the tiles).
// Tried and not kept: at M <= 16, two sets of operand tiles ((tmm0, tmm2, tmm3) and (tmm1, tmm5, tmm7))
// in alternate K blocks, so that block kb+1's loads need not wait for block kb's products to release
// their tiles: from L3 T = 1 / 16 0.95-1.02x / 0.92-1.00x, from DRAM T = 1 / 4 0.97-1.03x / 0.87-0.96x.
// Tried 2026-12-06 (AMX Xeon family 6 model 207, 2 threads, each build in its own process, 2-3 alternated
// processes of 5 rounds) and not kept: each K step prefetching its 32 W rows 256 or 1024 bytes ahead into
// L1 (what the INT8 and FP8 tiles of quant_amx.cpp gained from): Qwen3-30B-A3B T = 8 / 16 / 64 from DRAM
// 1.03 / 1.02 / 1.00x the time (256) and 1.11 / 1.15 / 1.32x (1024), from the L3 1.07-1.27x;
// Mixtral-8x7B T = 16 / 64 0.99-1.01x (256), 1.02-1.07x (1024).
#include "isa/amx/tiles.h"

#include "glue.h"
#if !defined(HINA_EMU_AMX)
#include "isa/avx512/attention_vec512.h"   // vec512::exp2_ps, bf16_16 (tiles.h brought <immintrin.h>)
#endif

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

constexpr int kKr = 32;       // bf16 along K per tile row (64 bytes)
constexpr int kTokTile = 16;  // tokens per B tile (16 pairs of K x 16 tokens x 2 bf16)
constexpr int kNr = 32;       // W rows per micro-kernel step (two A tiles)
constexpr int kMr = 32;       // tokens per micro-kernel step (two B tiles)
constexpr int kC = kNr * kMr; // one C block (fp32)
constexpr int kStepsKB = 8;      // K blocks per chunk when a W block's token steps run together
constexpr int kStepsMaxM = 128;  // up to this many tokens (at most 4 steps, one pass over the block)
constexpr int kStepsMax = kStepsMaxM / kMr;
// A W block's 32-token steps run together over shared K chunks (algorithm1_steps, measured there).
inline bool steps_together(int M) { return M > kMr && M <= kStepsMaxM; }

// ---- the packed (VNNI) layout of I and of the activation ---------------------------------------
// [token group g = m / 16][K block kb = k / 32][pair kp][token m % 16][2]: each (g, kb) is one
// 1 KiB B-tile image (stride 64 bytes), so the micro-kernel's B loads are contiguous.
// When the steps run together, an even number of groups: every step loads two whole B tiles; the
// tokens past M are zeros in I, and their columns of C are never stored.
size_t packed_bytes(int M, int K) {
  size_t groups = (size_t(M) + kTokTile - 1) / kTokTile;
  if (steps_together(M)) groups += groups & 1;
  return groups * (size_t(K) / kKr) * 1024;
}

// Transformation 1: the gather writes I directly as B tiles (a 16 x 16 transpose of bf16 pairs).
void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  uint32_t* dst = static_cast<uint32_t*>(I);
  std::memset(I, 0, packed_bytes(M, K));  // tokens past M in the last group stay zero
  const int KB = K / kKr;
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int p = 0; p < K / 2; ++p) {
      uint32_t pair;
      std::memcpy(&pair, src + 2 * p, 4);
      dst[bf16_b_pair_index(m, p, KB)] = pair;
    }
  }
}

// ---- Algorithm 1 ----------------------------------------------------------------------------------
// C[32 rows][32 tokens] (fp32, row stride 32) = W[32 rows, K] . I[tokens m0 .. m0+mt, K]^T
// `B` points at token group m0/16 of a packed matrix with KB = K/32 blocks per group.
// tokens in B tile 0 and B tile 1 (0 = unused); W rows in A tile 0 and A tile 1 (0 = unused; the
// NUMA path's strided row classes may end in a block of fewer than 32 rows)
struct Shape { int mt0, mt1, a0 = 16, a1 = 16; };

void configure(Shape s) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int rows, int colsb) { cfg.rows[t] = uint8_t(rows); cfg.colsb[t] = uint16_t(colsb); };
  set(0, 16, 4 * s.mt0);                           // tmm0: I, tokens m0 .. m0+mt0      (B operand)
  if (s.mt1) set(1, 16, 4 * s.mt1);                // tmm1: I, the next 16 tokens
  set(2, s.a0, 64);                                // tmm2: W rows n .. n+16            (A operand)
  if (s.a1) set(3, s.a1, 64);                      // tmm3: W rows n+16 .. n+32
  set(4, s.a0, 4 * s.mt0);                         // tmm4 = tmm2 x tmm0
  if (s.mt1) set(5, s.a0, 4 * s.mt1);              // tmm5 = tmm2 x tmm1
  if (s.a1) set(6, s.a1, 4 * s.mt0);               // tmm6 = tmm3 x tmm0
  if (s.a1 && s.mt1) set(7, s.a1, 4 * s.mt1);      // tmm7 = tmm3 x tmm1
  _tile_loadconfig(&cfg);
}

// The K loop of Algorithm 1, blocks [kb0, kb1), into the accumulators tmm4..tmm7 as they are; w is
// the block's rows at K block kb0.
template <bool kStreamW>
inline void k_steps(const bf16_t* w, int64_t ldw, const uint8_t* B, int KB, int kb0, int kb1, Shape s) {
  const long wstride = long(ldw * sizeof(bf16_t));
  const uint8_t* B1 = B + size_t(KB) * 1024;  // the next token group
  for (int kb = kb0; kb < kb1; ++kb) {
    // line 1: (tmm0 ~ tmm1) <- I(m : m+32, k : k+32)                              tileloadd
    _tile_loadd(0, B + size_t(kb) * 1024, 64);
    if (s.mt1) _tile_loadd(1, B1 + size_t(kb) * 1024, 64);
    // line 2: (tmm2 ~ tmm3) <- W(n : n+32, k : k+32), general layout    tileloaddt1 / tileloadd
    // (Algorithm 2, line 5: W(x : x + 32*T_x, y : y+32) is the same load with stride T_x rows)
    const bf16_t* wk = w + size_t(kb - kb0) * kKr;
    if (kStreamW) {
      _tile_stream_loadd(2, wk, wstride);
      if (s.a1) _tile_stream_loadd(3, wk + 16 * ldw, wstride);
    } else {
      _tile_loadd(2, wk, wstride);
      if (s.a1) _tile_loadd(3, wk + 16 * ldw, wstride);
    }
    // line 3: (tmm4 ~ tmm7) <- FMA(tmm0 ~ tmm1, tmm2 ~ tmm3)
    _tile_dpbf16ps(4, 2, 0);
    if (s.a1) _tile_dpbf16ps(6, 3, 0);
    if (s.mt1) {
      _tile_dpbf16ps(5, 2, 1);
      if (s.a1) _tile_dpbf16ps(7, 3, 1);
    }
  }
}

// line 5: store (tmm4 - tmm7) into the L1-resident C block (32 x 32 fp32); line 4's transform
// reads it there. load_c is the way back (exact both ways).
inline void store_c(Shape s, float* C) {
  _tile_stored(4, C, 32 * 4);
  if (s.a1) _tile_stored(6, C + 16 * 32, 32 * 4);
  if (s.mt1) {
    _tile_stored(5, C + 16, 32 * 4);
    if (s.a1) _tile_stored(7, C + 16 * 32 + 16, 32 * 4);
  }
}
inline void load_c(Shape s, const float* C) {
  _tile_loadd(4, C, 32 * 4);
  if (s.a1) _tile_loadd(6, C + 16 * 32, 32 * 4);
  if (s.mt1) {
    _tile_loadd(5, C + 16, 32 * 4);
    if (s.a1) _tile_loadd(7, C + 16 * 32 + 16, 32 * 4);
  }
}
inline void zero_c(Shape s) {
  _tile_zero(4);
  if (s.a1) _tile_zero(6);
  if (s.mt1) { _tile_zero(5); if (s.a1) _tile_zero(7); }
}

// One canonical piece: K blocks [kb0, kb1) with fresh accumulators (pieces.h), stored to C.
template <bool kStreamW>
void algorithm1(const bf16_t* w, int64_t ldw, const uint8_t* B, int KB, int kb0, int kb1, Shape s,
                float* C) {
  zero_c(s);
  k_steps<kStreamW>(w + size_t(kb0) * kKr, ldw, B, KB, kb0, kb1, s);
  store_c(s, C);
}

// Tokens [m0, m0 + mt) as the B-tile shape: mt0 in tmm0, the rest (if any) in tmm1.
inline Shape shape_of(int mt, int rows = kNr) {
  return Shape{imin(mt, kTokTile), imax(0, mt - kTokTile), imin(rows, 16), imax(0, rows - 16)};
}

// Tile configuration per shape; loaded only when the shape changes (ldtilecfg is not free).
struct TileShapeCache {
  Shape current{-1, -1, -1, -1};
  void use(Shape s) {
    if (s.mt0 != current.mt0 || s.mt1 != current.mt1 || s.a0 != current.a0 || s.a1 != current.a1) {
      configure(s);
      current = s;
    }
  }
};

inline const uint8_t* token_group(const void* packed, int m0, int KB) {
  return static_cast<const uint8_t*>(packed) + size_t(m0 / kTokTile) * KB * 1024;
}

// ---- the fused kernel's K loop: canonical pieces, one or several token steps ---------------------
// Acc[st] (32 x 32 fp32 each) = W[32 rows at w, K] . (tokens of step st)^T for `steps` 32-token steps
// (B at the first step's token group, the steps' groups one after the other), in K chunks of `chunk`
// blocks: every step runs a chunk before the next chunk starts. Each row's canonical pieces (pieces.h)
// come from fresh accumulators added in ascending order into the zeroed Acc: rows that share their cuts
// (row stride a multiple of 2048 elements) fold all together at each cut; rows whose cuts differ (any
// other row stride, e.g. Qwen3's W_down, 768 elements) take one pass over K for the whole block, and at
// each cut of any row the accumulators are stored, the rows cut there added into Acc and zeroed, and the
// tiles reloaded. Tile stores and loads are exact, so the sums are the canonical ones bit for bit (the
// piece path's, which took the second kind of rows before, 8 row classes apart, through a partial buffer
// and a scalar reduction), for any chunk (0: the whole K) and number of steps. The shape s is configured
// by the caller; P is steps x 32 x 32 fp32 of work space.
//
// One step (M <= 32, and every 32-token step of M > kStepsMaxM) runs with chunk 0: the K loop runs
// between cuts unbroken. With 32 < M <= kStepsMaxM the steps share the chunks (kStepsKB blocks, 32 rows x
// 512 bytes of W), so the later steps find the chunk's W lines just loaded, where one step after the
// other over the whole K reloaded W from L2, 16 rows a row stride apart per tile, a whole K later; each
// step's accumulators are loaded and stored around each chunk.
// Measured (2026-12-06, the AMX Xeon model 207, 2 threads, same experts for every token, weights
// rotated past the L3, 3 alternated rounds in one process, time against the steps one after the other):
// Mixtral-8x7B M = 48 / 64 / 96 / 128 0.95 / 0.85-0.89 / 0.86 / 0.87-0.91x, DeepSeek-V3 M = 48 / 96
// 0.85 / 0.80x, Qwen3-30B-A3B M = 64 / 128 0.92-0.95 / 0.98x; from M = 160 0.98-1.04x and at M = 256
// 1.08-1.21x (each chunk's store and reload of the accumulators drains the tile pipeline, more steps
// more drains), so above kStepsMaxM the steps run one after the other. Chunks of 4 / 16 blocks: within
// 0.05x of 8 at M = 64..128, 64 (whole pieces) 1.02-1.13x. Tried and not kept: each chunk copied to
// a contiguous L1 buffer (the next chunk prefetched into L2) and the tiles loaded from there: 1.07-1.20x
// (the copy's loads wait on DRAM and do not overlap the tiles; with W already in L1, i.e. the copy
// skipped, Mixtral M = 256 takes 0.77x: the token tiles from L2 and the accumulator spills remain).
template <bool kStreamW>
void algorithm1_steps(const bf16_t* w, int64_t ldw, const uint8_t* B, int KB, int steps, int chunk,
                      Shape s, float* Acc, float* P) {
  for (int i = 0; i < steps * kC; ++i) Acc[i] = 0.f;
  const int K = KB * kKr, rows = s.a0 + s.a1;
  if (chunk == 0) chunk = KB;
  const size_t step_bytes = size_t(2) * KB * 1024;  // two token groups
  int next[kNr];  // each row's next cut, in K blocks (KB: none before the end)
  for (int r = 0; r < rows; ++r) next[r] = piece_end(0, piece_phase(w + r * ldw), K) / kKr;
  bool fresh = true;  // every row was folded at the last cut: P holds nothing, the tiles start at 0
  for (int kb = 0; kb < KB;) {
    int stop = KB;
    for (int r = 0; r < rows; ++r) stop = imin(stop, next[r]);
    for (int c0 = kb; c0 < stop; c0 += chunk) {
      const int c1 = imin(c0 + chunk, stop);
      for (int st = 0; st < steps; ++st) {
        float* Ps = P + st * kC;
        if (fresh) zero_c(s);
        else load_c(s, Ps);
        k_steps<kStreamW>(w + size_t(c0) * kKr, ldw, B + st * step_bytes, KB, c0, c1, s);
        store_c(s, Ps);
      }
      fresh = false;
    }
    int folded = 0;
    for (int r = 0; r < rows; ++r) {  // fold the rows cut at stop
      if (next[r] != stop) continue;
      for (int st = 0; st < steps; ++st) {
        float* a = Acc + st * kC + r * kMr;
        float* p = P + st * kC + r * kMr;
        for (int m = 0; m < kMr; ++m) { a[m] += p[m]; p[m] = 0.f; }
      }
      next[r] = imin(stop + kPieceElems / kKr, KB);
      ++folded;
    }
    fresh = folded == rows;
    kb = stop;
  }
}

// Transformation 2's store, element k of token m: bf16 into its half of the VNNI pair
// (k / 2, token m) of the B tiles the down projection loads.
struct Amx {
  static void put_act(void* act, int act_K, int m, int k, float v) {
    static_cast<bf16_t*>(act)[2 * bf16_b_pair_index(m, k / 2, act_K / kKr) + (k & 1)] = f32_to_bf16(v);
  }
};

// Transformation 2 on AMX: act columns [n0, n0 + n) of tokens [m0, m0 + M) = SiLU(g) * u, g and u
// of column j and token m at [j * ldg + m], as the down projection's B tiles (bf16 pairs of rows
// 2kp, 2kp+1 per token). The gate_up tasks and the piece path's store_act both come here, so the two
// stay bit-identical. On real AMX (AVX-512 present): 16 tokens of a pair of rows at a time, exp(-g)
// as 2^(-g log2 e) by the attention kernels' exp2_ps (relative error ~1e-7, then the product's
// rounding), the bf16 rounding as f32_to_bf16's, one 64-byte tile row per store. The emulated build
// keeps glue.h's scalar store.
#if defined(HINA_EMU_AMX)
void store_act_tiles(void* act, int act_K, int n0, int n, int m0, int M, const float* g, const float* u,
                     int64_t ldg) {
  store_act_block<Amx>(act, act_K, n0, n, m0, M, g, u, ldg);
}
#else
inline __m512 silu_mul16(__m512 g, __m512 u) {
  // exp(-g) = 2^(-g log2 e); above 2^127 (g < -88) the quotient is ~0 either way, and exp2_ps does
  // not clamp that side
  const __m512 x = _mm512_min_ps(_mm512_mul_ps(g, _mm512_set1_ps(-1.44269504088896341f)), _mm512_set1_ps(127.f));
  const __m512 e = vec512::exp2_ps(x);
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}
void store_act_tiles(void* act, int act_K, int n0, int n, int m0, int M, const float* g, const float* u,
                     int64_t ldg) {
  uint32_t* dst = static_cast<uint32_t*>(act);
  const int KB = act_K / kKr;
  for (int j = 0; j < n; j += 2) {
    const int pair = (n0 + j) / 2;
    for (int m = 0; m < M;) {
      const int mi = (m0 + m) % kTokTile, cnt = imin(kTokTile - mi, M - m);
      const __mmask16 k = __mmask16(((1u << cnt) - 1u) << mi);
      const float* g0 = g + int64_t(j) * ldg + m - mi;  // lane l: token m0 + m - mi + l
      const float* u0 = u + int64_t(j) * ldg + m - mi;
      const __m512 a = silu_mul16(_mm512_maskz_loadu_ps(k, g0), _mm512_maskz_loadu_ps(k, u0));
      const __m512 b = silu_mul16(_mm512_maskz_loadu_ps(k, g0 + ldg), _mm512_maskz_loadu_ps(k, u0 + ldg));
      const __m512i w = _mm512_or_si512(vec512::bf16_16(a), _mm512_slli_epi32(vec512::bf16_16(b), 16));
      _mm512_mask_storeu_epi32(dst + bf16_b_pair_index(m0 + m - mi, pair, KB), k, w);
      m += cnt;
    }
  }
}
#endif
void store_act_amx(void* act, int act_K, int n0, int n, int M, const float* g, const float* u) {
  store_act_tiles(act, act_K, n0, n, 0, M, g, u, M);
}

// W's load hint, chosen once per task: with M <= 32 tokens there is one token step, W has no reuse
// and is streamed (TILELOADDT1, Section 4.2.2); f gets it as a type, Hint<true> or Hint<false>.
template <bool kStream> struct Hint { static constexpr bool stream = kStream; };
template <class F>
inline void with_w_hint(int M, F&& f) {
  if (M <= kMr) f(Hint<true>{});
  else f(Hint<false>{});
}

// Algorithm 1's outer loops for nrows W rows and M tokens: blocks of 32 W rows (fewer at the end of
// the NUMA path's row classes), each with its 32-token steps; the tile configuration is set when the
// shape changes and released after the last block; W's load hint is with_w_hint's. With `shared` and
// 32 < M <= kStepsMaxM a block's steps run together over shared K chunks (algorithm1_steps):
// f(hint, r0, 0, steps, kStepsKB, s) with the full step shape. Otherwise one step at a time:
// f(hint, r0, m0, 1, 0, s) with that step's shape (chunk 0: the K loop unbroken between cuts).
template <class F>
inline void for_each_block(int nrows, int M, bool shared, F&& f) {
  const bool together = shared && steps_together(M);
  with_w_hint(M, [&](auto hint) {
    TileShapeCache tiles;
    for (int r0 = 0; r0 < nrows; r0 += kNr) {
      const int rows = imin(kNr, nrows - r0);
      if (together) {
        const Shape s = shape_of(kMr, rows);
        tiles.use(s);
        f(hint, r0, 0, (M + kMr - 1) / kMr, kStepsKB, s);
        continue;
      }
      for (int m0 = 0; m0 < M; m0 += kMr) {
        const Shape s = shape_of(imin(kMr, M - m0), rows);
        tiles.use(s);
        f(hint, r0, m0, 1, 0, s);
      }
    }
    _tile_release();
  });
}

// Gate & up, SiLU(gate)*up fused into the store, written as the down projection's B tiles:
// C rows 2kp and 2kp+1 of a token become the bf16 pair at row kp of its B tile (transformation 2).
void gate_up(const GateUpTask& t) {
  const int KB = t.K / kKr;
  alignas(64) float G[kStepsMax * kC], U[kStepsMax * kC], P[kStepsMax * kC];
  for_each_block(t.n, t.M, true, [&](auto hint, int r0, int m0, int steps, int chunk, Shape s) {
    constexpr bool kStream = decltype(hint)::stream;
    const uint8_t* B = token_group(t.I, m0, KB);
    algorithm1_steps<kStream>(t.w_gate + r0 * t.ldw_gate, t.ldw_gate, B, KB, steps, chunk, s, G, P);
    algorithm1_steps<kStream>(t.w_up + r0 * t.ldw_up, t.ldw_up, B, KB, steps, chunk, s, U, P);
    for (int st = 0; st < steps; ++st) {  // line 4: the second layout transformation
      const int m = m0 + st * kMr;
      store_act_tiles(t.act, t.act_K, t.n0 + r0, kNr, m, imin(kMr, t.M - m), G + st * kC, U + st * kC, kMr);
    }
  });
}

// Down projection; the transpose fused into the store: y[m][n0 + r] = C[r][m] (transformation 3).
void down(const DownTask& t) {
  const int KB = t.K / kKr;
  alignas(64) float C[kStepsMax * kC], P[kStepsMax * kC];
  for_each_block(t.n, t.M, true, [&](auto hint, int r0, int m0, int steps, int chunk, Shape s) {
    algorithm1_steps<decltype(hint)::stream>(t.w_down + r0 * t.ldw, t.ldw, token_group(t.act, m0, KB), KB,
                                             steps, chunk, s, C, P);
    for (int st = 0; st < steps; ++st) {  // line 4: the third layout transformation
      const int m = m0 + st * kMr;
      store_y(t.y + m * t.ldy, t.ldy, t.n0 + r0, kNr, imin(kMr, t.M - m), C + st * kC, kMr);
    }
  });
}

// Algorithm 2's micro-kernel: rows w + r*ldw (x, x+T_x, ...: 32 of them per step, fewer at the end
// of a row class), only the listed pieces (this node's local segments), one output slot per piece.
void piece_dots(const PieceTask& t) {
  const int KB = t.K / kKr;
  alignas(64) float C[kC];
  for_each_block(t.nrows, t.M, false, [&](auto hint, int r0, int m0, int, int, Shape s) {
    const int rows = s.a0 + s.a1, mt = s.mt0 + s.mt1;
    const uint8_t* B = token_group(t.I, m0, KB);
    for (int p = 0; p < t.npieces; ++p) {
      const int kb0 = t.pieces[2 * p] / kKr, kb1 = t.pieces[2 * p + 1] / kKr;
      algorithm1<decltype(hint)::stream>(t.w + r0 * t.ldw, t.ldw, B, KB, kb0, kb1, s, C);
      for (int r = 0; r < rows; ++r)
        for (int m = 0; m < mt; ++m)
          t.out[(int64_t(r0 + r) * t.npieces + p) * t.M + m0 + m] = 0.f + C[r * kMr + m];
    }
  });
}

}  // namespace

const MicroKernel microkernel_amx_bf16{
#if defined(HINA_EMU_AMX)
    "amx-emulated", Dtype::bf16, nullptr,
#else
    "amx", Dtype::bf16, "amx",
#endif
    // Blocking: AMX's is fixed by its tiles (n_r = m_r = 32 above); the driver reads task_rows.
    Blocking{/*task_rows=*/64, 0, {}, 0, 0, 0, 0, 0, 0, 0, false, 0},
    packed_bytes, pack_tokens, gate_up, down, piece_dots, store_act_amx, /*mixed_cuts=*/true};

}  // namespace hina
