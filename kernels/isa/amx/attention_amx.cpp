// The AMX-BF16 attention micro-kernel (paper Section 6: the decode MV turned into small MMs on tiles).
//
// Operands of `tdpbf16ps C, A, B` (C[m][n] += sum_k A[m][k] * B[k][n], B VNNI-packed in pairs):
//   scores  S^T = K . Q^T:  A = 16 keys x 32 d of K, loaded straight from the cache rows (stride = the
//           token stride; the framework's layout, never repacked); B = the query block, transformed once
//           per task into VNNI B-tile images (pack_q: transformation 1, "the Q block in the tile layout");
//           C = 16 keys x (up to 16) query rows, transposed into S by the store, times the scale.
//   P x V   (d % 32 == 0) V is not converted either: a V row loaded as a B tile row is 16 pairs of
//           adjacent columns (V_j[2n], V_j[2n+1]), so one product with A = (P_j, 0) pairs sums the even
//           columns and one with A = (0, P_j) the odd ones, over the same V tile (see pv). O is kept as
//           16 even then 16 odd columns per 32; unpack_o restores the order. A head dim that is an odd
//           multiple of 16 takes the conversion path (pv_pairs: V interleaved into key pairs).
// Keys whose rows are not evenly spaced (a chunk that crosses a paged block), a tail shorter than the
// tile, and a half block of d go through a 16 x 64-byte staging copy, zero-padded.
// The online softmax, the P images and the O store run on AVX-512 (every AMX CPU has AVX-512 BF16;
// the emulated build runs the same steps in plain C++).
//
// Measured (Qwen3-30B-A3B shapes, 8 query rows per KV head, d = 128, batch 1, 4096 keys, 2 threads of
// the 2-vCPU Xeon with AMX, harness rows): paged 1.78 -> 0.66 ms, contiguous 1.41 -> 0.55 ms. What
// each step changed, on 16384 keys held in L2 (the same two blocks over and over: the compute alone):
//   - V converted into key pairs by two vpermt2w per 32 columns of a key pair was the largest single
//     cost, more than the rest of P x V (the conversion removed: 0.82 -> 0.58 ms); the doubled tile
//     products cost less (the tile unit idles otherwise);
//   - 128-key chunks instead of 32 (LDTILECFG, the O tiles' loads and stores, the softmax's reductions
//     per call spread over 4x the keys) with two score accumulators: 1.14 -> 1.09 ms; chunks of 64
//     and 256 keys measured no better at DRAM (4096 keys: 0.61-0.68 vs 0.60-0.62 ms);
//   - four independent accumulator tiles per step, sharing each Q tile load: 1.09 -> 1.07 ms;
//   - scalar exp2 and per-element stores (the first version): the vector softmax and P images here.
//   - extend: tasks of 128 query rows instead of 32 (K and V read once per 128 rows; decode's groups are
//     one token's, unchanged): 128 new tokens over 4096, B = 1: Mixtral 17.7 -> 13.5 ms, Qwen3 16.7 ->
//     11.7 ms (64 rows: 14.1, 13.4), torch's SDPA 14.0-14.4 and 11.9-12.3 ms in the same runs.
// Tried and not kept: the score tile's transpose by shuffles instead of a gather per query row (decode's
// 8 rows, three rounds of vpermt2ps: 0.81 vs 0.81 ms; extend's 16, a 16 x 16 transpose: 14.0 and 11.4
// ms, no change); prefetching the next step's rows from inside the tile loops (no gain at
// DRAM, 0.58 -> 0.78 ms on L2-resident keys); staging the strided rows as the vector kernels then did
// (0.67 -> 0.78 ms). On this machine a core's streaming rate does not overlap its compute (a test loop
// with software prefetch: a step of compute per 1 KiB lowered the rate as 1/(1/14 + 1/C) GB/s), so
// the kernel's time is its memory time plus its compute time, and both were cut.
// Where a key's time goes (2026-12-03, the same Xeon; Qwen3-30B-A3B shapes, batch 1, one thread, rdtsc
// counters in a scratch build, TSC 2.6 GHz, cycles per key and KV head): with the KV in L2 (1024 keys,
// one cache) ~73: the score tiles 11, their stores and the gathers into S 10.5, the P images 1.6, the
// P x V tiles 16, the softmax ~8, the rest the driver and pack_q; from DRAM (4096 keys, 83 caches
// rotated) ~151: the same steps 48, and the burst of prefetches before each head's scores the rest
// (512 bytes a key at the ~14 GB/s one core streams is ~95). Memory time plus compute time, as above.
// Tried then and not kept (2 threads, KV from DRAM, the builds side by side in one process, 7-9 rounds):
//   - the next chunk's rows handed to scores and pv and prefetched from inside their tile loops, into
//     L2, in pieces of 64 and then 16 lines between tile ops: contiguous 0.509-0.517 against 0.526 ms
//     (into L1: 0.571); the stalls moved from the driver's burst into the pieces;
//   - the rows' even spacing checked once per 16-key group and call instead of per d block: 0.97-1.01x
//     the time (Qwen3 and Mixtral-8x7B, contiguous and paged, 4096 keys), no change in L2.
// A standalone loop on this core (one thread; work per KiB streamed): the hardware prefetcher alone
// overlaps the work when it is longer than the stream's own time (work alone 6 GB/s: 5.7 streamed)
// but not when they are equal (12 GB/s: 8.7); prefetcht1 one line per sixteenth of the work, 4-16 KiB
// ahead, restores it (11.9), and a burst of the KiB's 16 lines before the work is worse than none (9.4
// against 13.3, work alone 24 GB/s); with 16 tdpbf16ps per KiB as the work, 6.95 GB/s without and 10.75
// with the single-line prefetches (the loop above lowered the rate; this one spreads its lines). This
// kernel works ~145 cycles per KiB of KV held in L2, about half of it in its tile loops (~1.5 tile
// products and their loads per KiB) and half in vector steps (the score stores, the softmax, the P
// images). Spread over both (a few lines before each K or V tile load and each query row of the score
// stores and P images, into L2; the same A/B): contiguous Qwen3 / Mixtral 0.96x / 0.98x the time, paged
// 1.02x / 1.21x (whole token records per head's share); not kept. Nor is it the DTLB: the caches moved
// onto 2 MiB pages (MADV_COLLAPSE; half of the 700 MB took) 0.465 against 0.479 ms. What else holds
// the stream back there is open (the tile loads' own misses are the next suspect).
// Tried 2026-12-04 (same Xeon, batch-1 decode, 2 threads, the builds' modules swapped in one process,
// 5-9 alternated rounds, bit-identical) and not kept: the K and V tiles loaded with TILELOADDT1 (vLLM's
// AMX attention streams its packed cache so): 0.99-1.01x the time, contiguous and paged, l = 4096; the
// driver's prefetch into L2 in 4 pieces (the vector kernels' blocking): contiguous 1.07 / 1.24x (Qwen3 /
// Mixtral-8x7B), paged 1.02 / 1.09x; on a contiguous cache, instead of the driver's burst, the rows 32
// keys ahead prefetched from inside the tile loops (one 16-key group's lines per K tile step and per V
// tile row group, addresses extrapolated by the rows' spacing): from DRAM 1.01-1.04x at l = 4096 and
// 0.96x at 16384, with the KV in the L3 (one 8 / 16 MiB cache) 0.83-0.85x, and 16 or 64 keys ahead, or
// into L2, 1.13-1.21x (from DRAM). From the L3 this kernel takes 0.31-0.37 ms for Qwen3's 8 MiB at l =
// 4096 (0.50-0.67 for Mixtral's 16) against ~0.5 / ~0.87 from DRAM: its compute alone is about its
// memory time; vLLM's AMX kernel reads a cache in its own pre-packed tile layout (cpu_attn_amx.hpp:
// every K and V tile one dense 1 KiB block, no transposes or gathers around the tile products), where
// this one keeps the framework's layout and pays for it in compute.
// 2026-12-06, the same Xeon, extend (128 new tokens over 4096, paged, B = 1, 2 threads; the builds in
// alternated processes, 8 rounds of 2 s, median of each process's per-call median): P x V for more than
// 16 rows on V converted into key pairs once per call (pv_pairs, split), with the softmax's row sums,
// alphas and l done 16 rows at a time and exp2_ps on vscalefps (attention_vec512.h): Qwen3-30B-A3B
// 15.18 -> 14.33 ms (0.94x; per-call minimum 0.96x), Mixtral-8x7B 16.68 -> 15.25 (0.91x; 0.92x); the
// pairs alone 0.95x by the minimum. Tried then and not kept: the scores' K tiles of 16 keys held while
// every row group's Q^T images stream past them (a key row read once per call, not once per group):
// 1.08 / 1.05x the time; pv's operand tiles loaded right after their last reader (software-pipelined:
// tiles are not renamed): 0.99x by the minimum, medians within the noise; the rows staged into dense
// buffers (AttnBlocking::stage_strided, a memcpy per row) 1.32 / 1.33x; each K tile's source (the rows'
// spacing checked) found once per call instead of once per row group: 0.96-1.02x by the minimum over two
// runs of 6-8 rounds, the medians within the noise; no prefetch of the next chunk for extend's tasks
// (more than 16 rows; the driver's burst of every line into L1 was 6% of the samples), or into L2:
// 0.97-0.99x / 0.99x the time (medians of two runs, ranges overlapping), not kept.
// Tried 2026-12-06 (same Xeon) and not kept: extend's tasks (128 query rows, eight groups of 16) with the
// roles turned -- S = Q . K^T, A = the query rows as they are, B = each 16 keys' d pairs (the keys' rows
// transposed, 16 x 16 dwords by unpacks and lane shuffles, once per call and shared by the eight row
// groups), C stored straight into S: no gathers -- and P x V on V converted into key pairs once per call
// for the eight groups (half the tile products; O in pv's even / odd order), bit-compatible with the
// tests: 128 / 512 new tokens over 4096 (paged, B = 1, two alternated runs each) Qwen3-30B-A3B 16.2 / 62-66
// ms against 14.1-15.3 / 61-63, Mixtral-8x7B 17.7-17.8 / 65-69 against 17.5-18.7 / 65-68. perf on the
// 512 case: scores 27%, pv 28%, softmax_step 21%, the driver 7%, the samples in the tile loops on the
// tile loads and products; per 16 rows x 128 keys ~9000 cycles where its 64 tile products take ~1000 at
// their throughput and the softmax ~2000: the tile loops wait on their loads and chains (an accumulator
// tile every 4 products, stored and reloaded per chunk), not on the transposes.
//
// Tried 2026-12-06 (the same Xeon, each build in its own process, alternated, 5-6 rounds of 2 s, median
// and minimum per process; extend 128 over 4096, paged, B = 1) and not kept: a fused step for extend's
// tasks -- per row group of 16 in turn its scores, its softmax step and its P x V, so that the group's S
// (8 KiB) and O rows stay in L1 between the three, V converted once for the groups and one LDTILECFG for
// both tile loops (bit-identical): Qwen3-30B-A3B / Mixtral-8x7B 1.05 / 0.97x the time by the medians,
// 0.99 / 1.05x by the minima. Nor tasks of 256 query rows (the prefix's K and V read from the L3 once
// per 256 rows): 1.02 / 1.07x (minima 0.90 / 1.17x); of 512, 1.10 / 1.24x (Mixtral's 128 tokens one
// task). Nor, for decode (Qwen3-30B-A3B, 4096 / 16384 keys, contiguous and paged), the driver's L1
// prefetch in 4 pieces between the calls (prefetch_steps 4): 1.00-1.07x, minima 1.01-1.15x; the burst
// into L2 instead (prefetch_l2): 1.00-1.05x at three of the four points and 0.81x at the fourth (paged,
// 16384 keys; the processes' ranges overlapping), minima 1.03-1.08x at all four. With the KV in the L3
// (one 33.5 MB cache, l = 16384) perf still puts 45% of a decode call on the driver's prefetch burst and
// 48% in scores, P x V and the softmax: the burst runs at the L3's read rate and the tiles wait for it,
// from the L3 as from DRAM.
//
// Built twice from this one source, like microkernel_amx.cpp: for real (`_C`, isa "amx") and against
// emu/tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated"), so it runs in the same tests.
#include "isa/amx/tiles.h"

#include <cmath>
#include <cstring>
#include <limits>

#if !defined(HINA_EMU_AMX)
#include "isa/avx512/attention_vec512.h"   // tiles.h brought <immintrin.h>
#endif
#include "ops/attention.h"

namespace hina {
namespace {

constexpr int kQOffset = 16;   // floats before the packed images (the scale, then padding to 64 bytes)

// Tile ops run at 16 cycles apiece but their results come much later, so each step keeps four
// independent accumulation chains in flight (a single chain per 16 keys and per O block was ~3x slower).
// scores: tmm0, tmm6, tmm7: K (A, keys x 64 B); tmm1: the Q^T image (B, 16 pairs x 4*rows);
//         tmm2..tmm5: S^T of four groups of 16 keys (C, keys x 4*rows)
void configure_scores(int rows, int keys) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int r, int colsb) { cfg.rows[t] = uint8_t(r); cfg.colsb[t] = uint16_t(colsb); };
  for (int t : {0, 6, 7}) set(t, keys, 64);
  set(1, 16, 4 * rows);
  for (int t : {2, 3, 4, 5}) set(t, keys, 4 * rows);
  _tile_loadconfig(&cfg);
}
// pv:     tmm0: P (A, rows x 64 B); tmm1..tmm3: V pairs (B, 16 x 64 B); tmm4..tmm7: four O blocks
//         of 16 columns (C, rows x 64 B)
//         (pv, d % 32 == 0: tmm1 is the second P image, an A tile like tmm0)
void configure_pv(int rows, bool split) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int r, int colsb) { cfg.rows[t] = uint8_t(r); cfg.colsb[t] = uint16_t(colsb); };
  set(0, rows, 64);
  set(1, split ? rows : 16, 64);
  for (int t : {2, 3}) set(t, 16, 64);
  for (int t : {4, 5, 6, 7}) set(t, rows, 64);
  _tile_loadconfig(&cfg);
}

inline int blocks32(int d) { return (d + 31) / 32; }

// The image of row group g (16 rows), d block kb: [pair kp][row m][2 bf16].
inline uint32_t* q_image(float* qp, int d, int g, int kb) {
  return reinterpret_cast<uint32_t*>(qp + kQOffset) + (size_t(g) * blocks32(d) + kb) * 256;
}

void pack_q(const bf16_t* const* rows, int nrows, int d, float scale, float* qp) {
  qp[0] = scale;
  const int groups = (nrows + 15) / 16, KB = blocks32(d);
  std::memset(qp + kQOffset, 0, size_t(groups) * KB * 1024);
  uint32_t* img = q_image(qp, d, 0, 0);
  for (int r = 0; r < nrows; ++r)
    for (int p = 0; p < d / 2; ++p) std::memcpy(img + bf16_b_pair_index(r, p, KB), rows[r] + 2 * p, 4);
}

// S[r][j0 + j] = C[j][r] * scale for the rows < rows and keys < nk of one S^T tile image (C: 16 keys
// x 16 rows fp32, 64-byte rows): one 16-lane gather per query row.
inline void store_scores(const float* C, int rows, int nk, float scale, float* S, int lds) {
#if defined(HINA_EMU_AMX)
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < nk; ++j) S[int64_t(r) * lds + j] = C[j * 16 + r] * scale;
#else
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(16));
  const __mmask16 km = nk >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nk) - 1);
  const __m512 vs = _mm512_set1_ps(scale);
  for (int r = 0; r < rows; ++r) {
    const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), km, idx, C + r, 4);
    _mm512_mask_storeu_ps(S + int64_t(r) * lds, km, _mm512_mul_ps(v, vs));
  }
#endif
}

// Where the A tile of 16 keys' rows, d block kb, loads from (the return) with which row stride: the
// cache itself when the rows are evenly spaced (one paged block, or a contiguous cache), else (a
// chunk that crosses blocks, a half block of d) a zero-padded 16 x 64-byte staging copy.
// tile_rows: the tile's configured rows; past nk they come from the zero-padded staging copy.
inline const bf16_t* keys_tile(const bf16_t* const* keys, int nk, int d, int kb, bf16_t* stage, long* stride,
                               int tile_rows) {
  const bool half = d - kb * 32 < 32;
  const int64_t step = nk > 1 ? keys[1] - keys[0] : d;
  bool even = !half && step > 0 && nk >= tile_rows;
  for (int j = 2; j < nk && even; ++j) even = keys[j] - keys[j - 1] == step;
  if (even) {
    *stride = long(step * sizeof(bf16_t));
    return keys[0] + kb * 32;   // K rows as they are
  }
  std::memset(stage, 0, 16 * 32 * sizeof(bf16_t));
  for (int j = 0; j < nk; ++j)
    std::memcpy(stage + j * 32, keys[j] + kb * 32, size_t(half ? 16 : 32) * sizeof(bf16_t));
  *stride = 64;
  return stage;
}

void scores(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  const float scale = qp[0];
  float* q = const_cast<float*>(qp);
  alignas(64) bf16_t stage[4][16 * 32];
  alignas(64) float C[4][16 * 16];
  const int KB = blocks32(d);
  int cfg_rows = -1, cfg_keys = -1;   // LDTILECFG only when the tile shapes change (a chunk's tail)
  for (int g = 0; g * 16 < nrows; ++g) {
    const int rows = nrows - g * 16 < 16 ? nrows - g * 16 : 16;
    float* Sg = S + int64_t(g * 16) * lds;
    int j0 = 0;
    for (; j0 + 64 <= nkeys; j0 += 64) {   // four full groups of 16 keys per step
      if (rows != cfg_rows || cfg_keys != 16) {
        configure_scores(rows, 16);
        cfg_rows = rows;
        cfg_keys = 16;
      }
      _tile_zero(2);
      _tile_zero(3);
      _tile_zero(4);
      _tile_zero(5);
      for (int kb = 0; kb < KB; ++kb) {
        long st0, st1, st2, st3;
        const bf16_t* k0 = keys_tile(keys + j0, 16, d, kb, stage[0], &st0, 16);
        const bf16_t* k1 = keys_tile(keys + j0 + 16, 16, d, kb, stage[1], &st1, 16);
        const bf16_t* k2 = keys_tile(keys + j0 + 32, 16, d, kb, stage[2], &st2, 16);
        const bf16_t* k3 = keys_tile(keys + j0 + 48, 16, d, kb, stage[3], &st3, 16);
        _tile_loadd(1, q_image(q, d, g, kb), 64);
        _tile_loadd(0, k0, st0);
        _tile_loadd(6, k1, st1);
        _tile_dpbf16ps(2, 0, 1);
        _tile_loadd(7, k2, st2);
        _tile_dpbf16ps(3, 6, 1);
        _tile_loadd(0, k3, st3);
        _tile_dpbf16ps(4, 7, 1);
        _tile_dpbf16ps(5, 0, 1);
      }
      _tile_stored(2, C[0], 64);
      _tile_stored(3, C[1], 64);
      _tile_stored(4, C[2], 64);
      _tile_stored(5, C[3], 64);
      for (int i = 0; i < 4; ++i) store_scores(C[i], rows, 16, scale, Sg + j0 + 16 * i, lds);
    }
    for (; j0 < nkeys; j0 += 16) {          // the rest: one group of up to 16 at a time
      const int nk = nkeys - j0 < 16 ? nkeys - j0 : 16;
      if (rows != cfg_rows || nk != cfg_keys) {
        configure_scores(rows, nk);
        cfg_rows = rows;
        cfg_keys = nk;
      }
      _tile_zero(2);
      for (int kb = 0; kb < KB; ++kb) {
        long st;
        const bf16_t* k0 = keys_tile(keys + j0, nk, d, kb, stage[0], &st, nk);
        _tile_loadd(1, q_image(q, d, g, kb), 64);
        _tile_loadd(0, k0, st);
        _tile_dpbf16ps(2, 0, 1);
      }
      _tile_stored(2, C[0], 64);
      store_scores(C[0], rows, nk, scale, Sg + j0, lds);
    }
  }
  _tile_release();
}

#if defined(HINA_EMU_AMX)
void softmax_step(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nrows; ++r) {
    float* s = S + int64_t(r) * lds;
    float mx = m[r];
    for (int j = 0; j < nkeys; ++j) mx = s[j] > mx ? s[j] : mx;
    if (mx == ninf) {
      for (int j = 0; j < nkeys; ++j) s[j] = 0.f;
      continue;
    }
    const float alpha = m[r] == ninf ? 0.f : std::exp2(m[r] - mx);
    float sum = 0.f;
    for (int j = 0; j < nkeys; ++j) sum += (s[j] = std::exp2(s[j] - mx));
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
    if (alpha != 1.f)
      for (int i = 0; i < d; ++i) O[int64_t(r) * d + i] *= alpha;
  }
}
#else
using vec512::softmax_step;   // every AMX CPU has AVX-512 BF16
#endif

// A: the probabilities of rows [0, rows) and keys [0, nk) (of at most 32) as bf16, zero past nk.
inline void p_image(const float* P, int lds, int rows, int nk, bf16_t* Pb) {
#if defined(HINA_EMU_AMX)
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 32; ++j) Pb[r * 32 + j] = j < nk ? f32_to_bf16(P[int64_t(r) * lds + j]) : bf16_t(0);
#else
  const __mmask16 m0 = vec512::first_lanes(nk), m1 = vec512::first_lanes(nk - 16);
  for (int r = 0; r < rows; ++r) {
    const float* p = P + int64_t(r) * lds;
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, p + 16), _mm512_maskz_loadu_ps(m0, p));
    std::memcpy(Pb + r * 32, &b, 64);
  }
#endif
}

// B: keys [0, nk) (of at most 32) of V in VNNI pairs, one 1 KiB image per 16 columns:
// Vt[cb * 256 + kp * 16 + n] = (V_{2kp}[16 cb + n], V_{2kp+1}[16 cb + n]), zero past nk.
// Where d % 32 == 0 the columns are split instead: per 32 columns the even ones first, then the odd
// ones -- block 2q holds columns 32q + 2n, block 2q + 1 columns 32q + 2n + 1 -- so that O comes out in
// pv's even / odd order, the order unpack_o takes for such a d.
inline void v_image(const bf16_t* const* vals, int nk, int d, uint32_t* Vt) {
  const int CB = d / 16;
  const bool split = d % 32 == 0;
  for (int kp = 0; kp < 16; ++kp) {
    const int ja = 2 * kp, jb = ja + 1;
    if (ja >= nk) {
      for (int cb = 0; cb < CB; ++cb) std::memset(Vt + cb * 256 + kp * 16, 0, 64);
      continue;
    }
    const bf16_t* va = vals[ja];
    const bf16_t* vb = jb < nk ? vals[jb] : nullptr;
    int c = 0;
#if !defined(HINA_EMU_AMX)
    // 32 columns of both rows per step: two vpermt2w give the pairs of columns c..c+15 and c+16..c+31
    const __m512i nat = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                         39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i even = _mm512_set_epi16(62, 30, 60, 28, 58, 26, 56, 24, 54, 22, 52, 20, 50, 18, 48, 16,
                                          46, 14, 44, 12, 42, 10, 40, 8, 38, 6, 36, 4, 34, 2, 32, 0);
    const __m512i lo = split ? even : nat;
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(split ? 1 : 16));
    for (; c + 32 <= d; c += 32) {
      const __m512i a = _mm512_loadu_si512(va + c);
      const __m512i b = vb ? _mm512_loadu_si512(vb + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(Vt + (c / 16) * 256 + kp * 16, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(Vt + (c / 16 + 1) * 256 + kp * 16, _mm512_permutex2var_epi16(a, hi, b));
    }
#endif
    for (; c < d; ++c) {
      const uint32_t a = va[c], b = vb ? vb[c] : 0u;
      const int blk = split ? (c / 32) * 2 + (c % 2) : c / 16, n = split ? (c % 32) / 2 : c % 16;
      Vt[blk * 256 + kp * 16 + n] = a | (b << 16);
    }
  }
}

constexpr int kChunkKeys = 128;   // keys per chunk: per-call costs (LDTILECFG, the O tiles' loads and
                                  // stores, the softmax's reductions) spread over 128 keys, not 32

// P x V for a head dim that is an odd multiple of 16 (O in natural column order), and for more than 16
// rows (extend; split: O in pv's even / odd order, so unpack_o is the same): V converted into VNNI pairs
// of keys once per call and shared by every group of 16 rows -- the conversion that costs decode more
// than pv's doubled products (one group) is paid once for a task's eight, and the products are halved
// (tmm0: P, tmm1..3: V pairs, tmm4..7: O, as configure_pv(rows, 16) sets them).
void pv_pairs(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  // the chunk's V, converted once and used by every row group: [32-key block][16 columns] images
  alignas(64) static thread_local uint32_t Vt[kChunkKeys / 32 * (kAttnHeadDimMax / 16) * 256];   // 64 KiB
  alignas(64) bf16_t Pb[kChunkKeys / 32][16 * 32];
  const int KB32 = (nkeys + 31) / 32, CB = d / 16;
  for (int kb = 0; kb < KB32; ++kb) {
    const int nk = nkeys - kb * 32 < 32 ? nkeys - kb * 32 : 32;
    v_image(vals + kb * 32, nk, d, Vt + size_t(kb) * CB * 256);
  }
  int cfg_rows = -1;
  for (int g = 0; g * 16 < nrows; ++g) {
    const int rows = nrows - g * 16 < 16 ? nrows - g * 16 : 16;
    if (rows != cfg_rows) {
      configure_pv(rows, false);
      cfg_rows = rows;
    }
    for (int kb = 0; kb < KB32; ++kb) {
      const int nk = nkeys - kb * 32 < 32 ? nkeys - kb * 32 : 32;
      p_image(P + int64_t(g * 16) * lds + kb * 32, lds, rows, nk, Pb[kb]);
    }
    float* Og = O + int64_t(g * 16) * d;
    const long ldo = long(d * sizeof(float));
    auto vt = [&](int kb, int cb) { return Vt + (size_t(kb) * CB + cb) * 256; };
    int cb = 0;
    for (; cb + 4 <= CB; cb += 4) {        // four O blocks stay in their tiles across the chunk's keys
      _tile_loadd(4, Og + cb * 16, ldo);
      _tile_loadd(5, Og + cb * 16 + 16, ldo);
      _tile_loadd(6, Og + cb * 16 + 32, ldo);
      _tile_loadd(7, Og + cb * 16 + 48, ldo);
      for (int kb = 0; kb < KB32; ++kb) {
        _tile_loadd(0, Pb[kb], 64);
        _tile_loadd(1, vt(kb, cb), 64);
        _tile_loadd(2, vt(kb, cb + 1), 64);
        _tile_dpbf16ps(4, 0, 1);
        _tile_loadd(3, vt(kb, cb + 2), 64);
        _tile_dpbf16ps(5, 0, 2);
        _tile_loadd(1, vt(kb, cb + 3), 64);
        _tile_dpbf16ps(6, 0, 3);
        _tile_dpbf16ps(7, 0, 1);
      }
      _tile_stored(4, Og + cb * 16, ldo);
      _tile_stored(5, Og + cb * 16 + 16, ldo);
      _tile_stored(6, Og + cb * 16 + 32, ldo);
      _tile_stored(7, Og + cb * 16 + 48, ldo);
    }
    for (; cb < CB; ++cb) {                // head dims that are not a multiple of 64
      _tile_loadd(4, Og + cb * 16, ldo);
      for (int kb = 0; kb < KB32; ++kb) {
        _tile_loadd(0, Pb[kb], 64);
        _tile_loadd(1, vt(kb, cb), 64);
        _tile_dpbf16ps(4, 0, 1);
      }
      _tile_stored(4, Og + cb * 16, ldo);
    }
  }
  _tile_release();
}

// P x V with V's rows loaded as they are (d % 32 == 0). A B tile needs pairs along its K dimension;
// V's rows are pairs of adjacent *columns* (V_j[2n], V_j[2n+1]) instead, so each 16-key step runs two
// products over the same V tile: one with A = (P_j, 0) pairs, which sums only the even columns, one
// with A = (0, P_j), only the odd ones. Twice the tile products of converting V into key pairs, but the
// tile unit is otherwise idle, where the conversion (two vpermt2w per 32 columns of a key pair: port 5)
// cost more than the rest of P x V together. O is kept per 32 columns as 16 even then 16 odd columns;
// unpack_o puts them back in order.
// tmm0: (P, 0) pairs, tmm1: (0, P) pairs (A, rows x 16 keys); tmm2, tmm3: V (B, 16 keys x 32 columns);
// tmm4..tmm7: O even / odd of two groups of 32 columns (C, rows x 64 B).
inline void p_split_images(const float* P, int lds, int rows, int nk, uint32_t* Pe, uint32_t* Po) {
#if defined(HINA_EMU_AMX)
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < 16; ++j) {
      const uint32_t b = j < nk ? f32_to_bf16(P[int64_t(r) * lds + j]) : 0u;
      Pe[r * 16 + j] = b;
      Po[r * 16 + j] = b << 16;
    }
#else
  const __mmask16 km = nk >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nk) - 1);
  for (int r = 0; r < rows; ++r) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(km, P + int64_t(r) * lds));
    __m256i bi;
    std::memcpy(&bi, &b, 32);
    const __m512i e = _mm512_cvtepu16_epi32(bi);
    _mm512_storeu_si512(Pe + r * 16, e);
    _mm512_storeu_si512(Po + r * 16, _mm512_slli_epi32(e, 16));
  }
#endif
}

void pv(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  if (d % 32 || nrows > 16) return pv_pairs(P, lds, nrows, vals, nkeys, d, O);
  alignas(64) uint32_t Pe[kChunkKeys / 16][16 * 16], Po[kChunkKeys / 16][16 * 16];
  alignas(64) bf16_t stage[2][16 * 32];
  const int KG = (nkeys + 15) / 16, CG = d / 32;
  int cfg_rows = -1;
  for (int g = 0; g * 16 < nrows; ++g) {
    const int rows = nrows - g * 16 < 16 ? nrows - g * 16 : 16;
    if (rows != cfg_rows) {
      configure_pv(rows, true);
      cfg_rows = rows;
    }
    for (int kg = 0; kg < KG; ++kg) {
      const int nk = nkeys - kg * 16 < 16 ? nkeys - kg * 16 : 16;
      p_split_images(P + int64_t(g * 16) * lds + kg * 16, lds, rows, nk, Pe[kg], Po[kg]);
    }
    float* Og = O + int64_t(g * 16) * d;
    const long ldo = long(d * sizeof(float));
    int cg = 0;
    for (; cg + 2 <= CG; cg += 2) {        // two groups of 32 columns: four O tiles across the chunk
      _tile_loadd(4, Og + cg * 32, ldo);
      _tile_loadd(5, Og + cg * 32 + 16, ldo);
      _tile_loadd(6, Og + cg * 32 + 32, ldo);
      _tile_loadd(7, Og + cg * 32 + 48, ldo);
      for (int kg = 0; kg < KG; ++kg) {
        const int nk = nkeys - kg * 16 < 16 ? nkeys - kg * 16 : 16;
        long st0, st1;
        const bf16_t* v0 = keys_tile(vals + kg * 16, nk, d, cg, stage[0], &st0, 16);
        const bf16_t* v1 = keys_tile(vals + kg * 16, nk, d, cg + 1, stage[1], &st1, 16);
        _tile_loadd(0, Pe[kg], 64);
        _tile_loadd(1, Po[kg], 64);
        _tile_loadd(2, v0, st0);
        _tile_dpbf16ps(4, 0, 2);
        _tile_loadd(3, v1, st1);
        _tile_dpbf16ps(5, 1, 2);
        _tile_dpbf16ps(6, 0, 3);
        _tile_dpbf16ps(7, 1, 3);
      }
      _tile_stored(4, Og + cg * 32, ldo);
      _tile_stored(5, Og + cg * 32 + 16, ldo);
      _tile_stored(6, Og + cg * 32 + 32, ldo);
      _tile_stored(7, Og + cg * 32 + 48, ldo);
    }
    if (cg < CG) {                         // an odd number of 32-column groups: the last one alone
      _tile_loadd(4, Og + cg * 32, ldo);
      _tile_loadd(5, Og + cg * 32 + 16, ldo);
      for (int kg = 0; kg < KG; ++kg) {
        const int nk = nkeys - kg * 16 < 16 ? nkeys - kg * 16 : 16;
        long st0;
        const bf16_t* v0 = keys_tile(vals + kg * 16, nk, d, cg, stage[0], &st0, 16);
        _tile_loadd(0, Pe[kg], 64);
        _tile_loadd(1, Po[kg], 64);
        _tile_loadd(2, v0, st0);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 1, 2);
      }
      _tile_stored(4, Og + cg * 32, ldo);
      _tile_stored(5, Og + cg * 32 + 16, ldo);
    }
  }
  _tile_release();
}

// O -> natural column order (pv's even / odd halves per 32 columns when d % 32 == 0), times scale.
void unpack_o(const float* O, int d, float scale, float* out) {
  if (d % 32) {
    for (int i = 0; i < d; ++i) out[i] = O[i] * scale;
    return;
  }
#if defined(HINA_EMU_AMX)
  for (int c = 0; c < d; c += 32)
    for (int n = 0; n < 16; ++n) {
      out[c + 2 * n] = O[c + n] * scale;
      out[c + 2 * n + 1] = O[c + 16 + n] * scale;
    }
#else
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int c = 0; c < d; c += 32) {
    const __m512 e = _mm512_mul_ps(_mm512_loadu_ps(O + c), s), o = _mm512_mul_ps(_mm512_loadu_ps(O + c + 16), s);
    _mm512_storeu_ps(out + c, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(out + c + 16, _mm512_permutex2var_ps(e, hi, o));
  }
#endif
}

}  // namespace

#if defined(HINA_EMU_AMX)
const AttnMicroKernel attn_microkernel_amx{
    "amx-emulated", nullptr, {kChunkKeys, /*block_rows=*/128, /*stage_strided=*/false, /*prefetch_l2=*/false, /*prefetch_steps=*/1, /*prefetch_order=*/0}, nullptr, pack_q, scores, softmax_step, pv, unpack_o, nullptr};
#else
const AttnMicroKernel attn_microkernel_amx{
    "amx", "amx", {kChunkKeys, /*block_rows=*/128, /*stage_strided=*/false, /*prefetch_l2=*/false, /*prefetch_steps=*/1, /*prefetch_order=*/0}, nullptr, pack_q, scores, softmax_step, pv, unpack_o, nullptr};
#endif

}  // namespace hina
