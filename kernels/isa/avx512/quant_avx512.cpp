// The AVX-512 VNNI INT8 W8A8 micro-kernel (quant.h's contract; compiled with the AVX-512 flags, run
// only after isa_usable("avx512"): every CPU we know with AVX512_BF16 -- Cooper Lake, Sapphire Rapids,
// Zen 4/5 -- also has AVX512_VNNI; or, built without AVX512_BF16 (dpbf16.h), isa_usable("avx512-nobf16"):
// Cascade Lake, Ice Lake).
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four per 32-bit lane, and adds to int32. The
// token side is made unsigned in the gather (transformation 1): x_u8 = x_s8 + 128 (x in [-127, 127],
// so x_u8 in [1, 255]); then per group
//     sum_k x_u8[k] * w[k] = sum_k x[k] * w[k] + 128 * sum_k w[k]
// and the compensation term 128 * sum_k w[k] is one more vpdpbusd per W chunk, of the byte 0x80 (128
// unsigned) with w, shared by every token of the tile: acc - comp is the exact int32 dot. Per group
// of g (32/64/128) along K the int32 sums are scaled in fp32 by s_w[row][group] * s_x[token][group],
// as in the AVX2 kernel (quant_avx2.cpp). 256-bit vpdpbusd (AVX512_VL): a chunk of 32 bytes lies
// inside one group for every g. FP8 (weight-only) is below: the e4m3 bytes turned into bf16 for
// vdpbf16ps (AVX512_BF16; without it, its arithmetic in AVX-512F: dpbf16.h, isa "avx512-nobf16").
//
// Built twice from this one source: for real (`_C`, isa "avx512") and against SIMDe's portable
// AVX-512 (HINA_EMU_AVX512, `_C_avx512_emu`, isa "avx512-emulated"), so the same tests run it here.
#if defined(HINA_EMU_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include "emu/simde_masked.h"
#else
#include <immintrin.h>
#endif

#include <cstring>
#include <type_traits>

#include "common.h"   // cpu_features (cpu.cpp)
#include "isa/avx512/dpbf16.h"
#include "isa/avx512/f8_vbmi.h"
#include "microkernel.h"   // avx512_blocking_zen5
#include "quant_glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

// acc += the u8 x s8 dots of a and b per dword (vpdpbusd). The real build writes the instruction
// itself: from the intrinsic GCC 12 copied every accumulator to another register and back around each
// vpdpbusd (two vmovdqa per instruction in the pair tiles' loop: 8 vpdpbusd, 16 copies). The same
// sums; Zen 4 (2026-12-03, same-experts routing, the builds side by side in one process): experts of 5
// tokens (the ymm tiles) 0.80-0.95x the time, 8 tokens 0.96-0.98x, other counts within the noise (the
// copies of the zmm tiles mostly hidden by move elimination).
template <class V>   // __m512i or __m256i
inline V dpbusd(V acc, V a, V b) {
#if defined(HINA_EMU_AVX512)
  if constexpr (sizeof(V) == 64) return _mm512_dpbusd_epi32(acc, a, b);
  else return _mm256_dpbusd_epi32(acc, a, b);
#else
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
  return acc;
#endif
}
// The same with the dword at x broadcast, as the instruction's embedded broadcast operand (m32bcst):
// from the intrinsics (a vpbroadcastd, then vpdpbusd) GCC 12 made the same copies.
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const uint8_t* x) {
#if defined(HINA_EMU_AVX512)
  int32_t xd;
  std::memcpy(&xd, x, sizeof xd);
  return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(xd));
#else
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
#endif
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Tried and not kept (2026-12-04, AMX Xeon, 2 threads, same-experts routing, the builds' modules
// alternated in one process, 5-7 rounds): one token on 512-bit vpdpbusd, the row made unsigned (w ^ 0x80)
// against the signed token and the compensation the token's (from the pack), a quarter of this tile's
// vpdpbusd per byte (a register-only loop issues a 512-bit one at 0.19 ns, a 256-bit one at 0.17):
// Qwen3-30B-A3B T = 1 1.016x the time from DRAM and 1.03x with one group of experts in the L3,
// Mixtral-8x7B 0.996x. The instructions are not what bounds one token here.
template <int R, int TT, int PF>
inline void vnni_tile(const int8_t* const* w, const float* const* sw, const uint8_t* const* x,
                      const float* const* sx, int kb0, int kb1, int group, float* c, int ldc,
                      const int8_t* const* nxt) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  __m256 accf[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) accf[r][t] = _mm256_setzero_ps();
  for (int k0 = kb0, gi = kb0 / group; k0 < kb1; k0 += group, ++gi) {
    if constexpr (PF == 2) prefetch_l2_rows<R>(nxt, k0 - kb0, group);
    __m256i acc[R][TT], comp[R];
    for (int r = 0; r < R; ++r) {
      comp[r] = _mm256_setzero_si256();
      for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_setzero_si256();
    }
    for (int k = k0; k < k0 + group; k += 32) {
      __m256i xv[TT];
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t] + k));
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k));
        comp[r] = dpbusd(comp[r], bias, wv);
        #pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) acc[r][t] = dpbusd(acc[r][t], xv[t], wv);
      }
    }
    for (int r = 0; r < R; ++r) {
      const float swr = sw[r][gi];
      for (int t = 0; t < TT; ++t)
        accf[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][t], comp[r])),
                                     _mm256_set1_ps(swr * sx[t][gi]), accf[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) c[r * ldc + t] += hsum8(accf[r][t]);
}

// The blocked path (more than kTokTile tokens), by M (VnniKn::wide_rows / tile_wide):
//
// 5 to 8 tokens: pair tiles of 8 tokens x 4 rows (vnni_tilep below, P = 4): two tokens per zmm, token
// 2p's 32 bytes of a step in the low half and 2p + 1's in the high half (one load: the pack's pairs),
// the row's 32 bytes broadcast to both, so one 512-bit vpdpbusd serves a row and two tokens; per group
// each row's 4 accumulators are summed across their lanes at once, in int32 (a tree of unpacks and
// adds), less the tokens' compensation, converted and scaled. 5 to 7 tokens are padded to 8 with zero
// tokens (their sums are 0 exactly and their outputs are not stored). Against the 2 x 4 ymm tiles
// before them (Zen 4, 2026-12-02, 2 threads, same-experts routing, the builds' modules side by side in
// one process): Mixtral-8x7B T = 8 0.64x the time, Qwen3-30B-A3B 0.71x; M = 6 / 7 0.72-1.01x of 4-token
// tiles. 5 took kBlocking's 4- and 1-token tiles until 2026-12-03; padded (after dpbusd's register
// copies were gone), 0.85-0.87x their time (Mixtral-8x7B 21.7 -> 18.5 ms, Qwen3-30B-A3B 3.03 -> 2.65).
//
// 9 tokens and more (vnni_wide): the weights transposed on the fly, 16 rows x 128 bytes at a time (one
// to four groups) into a 2 KiB buffer in L1 -- zmm j = dword j (bytes 4j..4j+3) of the 16 rows, made
// unsigned (w ^ 0x80) -- and each token's 4 bytes broadcast against it (vpdpbusd's m32bcst operand:
// the signed side, x itself), so that one vpdpbusd makes 16 rows x 4 products of one token, lane i
// accumulating row i: an outer product, no horizontal sums. Per group and token the 16 int32 sums less
// the token's compensation are converted and scaled by the rows' scales (one vector per group,
// transposed once per block of K) times the token's, into fp32 sums in L1. The transpose (4 x 16
// unpacks and lane shuffles per 1 KiB of W) is shared by all M tokens, where the pair tiles spend a
// tree, a conversion and two scalings per row, group and 8 tokens. Transient and cache-resident, as the
// FP8 kernels' unpacked blocks: nothing persistent is repacked (the weights stay the framework's rows).
// Against the pair tiles, for every M > 4 first (Zen 4, 2026-12-02, 2 threads, same-experts routing,
// weights streamed from DRAM, the builds' modules side by side in one process, two copies of the old
// build, 5 rounds x 3 calls, medians): Mixtral-8x7B M = 5 / 8 / 12 / 16 / 64 0.78 / 1.04 / 0.77 /
// 0.83-0.86 / 0.64-0.69x the time, Qwen3-30B-A3B 1.13-1.19 / 1.04-1.10 / 0.80 / 0.80-0.87 /
// 0.74-0.79x: below 9 tokens the transpose is not paid back (at M = 5 it costs about as much as the
// vpdpbusd), so up to 8 the pair tiles stay, in their own 4-row tiles (wide_rows: run as 4-row pieces
// of vnni_wide's 16-row blocks, spread 16 apart, they were 1.1-1.6x slower). As built (same method):
// M = 5 / 8 0.97-1.00x, M = 9 0.94-0.95x (Mixtral) / 1.01-1.06x (Qwen3), M = 16 0.85-0.87x. From L3
// (one 2048 x 768 expert) the outer form reaches ~1.4x the pair tiles' rate at M >= 16. Tried, no
// change beyond the noise: an L2 prefetch distance of 256 or 1024 bytes instead of 512 (without it:
// 1.05-1.08x the time), 256- or 512-byte chunks, the rows of a block adjacent instead of spread, the
// prefetch into L1, the rows' scales prefetched. GCC 12 compiled the intrinsic form of the broadcast
// vpdpbusd into a vpbroadcastd and two register copies of every accumulator per step: dpbusd_bcast
// writes the instruction.
// Tried on Zen 5 and not kept (2026-12-05, side by side, Qwen3-30B-A3B, 2 threads): register-only loops
// there issue a vpdpbusd on a broadcast register at ~0.12 ns once four share the broadcast (a
// vpbroadcastd load itself ~0.4 ns; eight embedded-broadcast vpdpbusd over tokens 4096 bytes apart read
// ~0.5 ns each, the L1 aliasing above), so 64-row blocks (four transposed row vectors, each token's dword
// broadcast once for four vpdpbusd, 4-token tiles): from the L3 (2 experts) T = 9 / 16 / 64 0.95-0.99 /
// 1.01-1.06 / 0.95x the time, but from DRAM (8 experts) 1.8-2.0x (Mixtral T = 16 2.05x): 64 row streams
// per core (32 rows: 1.16-1.19x); and 16 rows with the tokens' dwords broadcast by vpshufd from a
// 128-bit broadcast load: from the L3 0.99x, from DRAM 1.03-1.06x. The transposes, the per-group scaling
// and the stores, not the vpdpbusd's issue, hold these tiles.
//
// The packed tokens (quant_glue.h's int8 operand: uint8 rows x + 128, then the scales), then the tokens
// again, signed (x itself), for the tiles that take them -- the pair tiles' (a decode expert's 2-4, 3
// padded to 4; the 8-token tiles' 8, 6-7 padded to 8) in pairs: pair p's 32-byte steps of tokens 2p and
// 2p + 1 alternate ([K / 32][2][32]), one 64-byte load per step; vnni_wide's (M > 8) in rows [M][K] --
// then, per such token and group, 128 x the group's sum of x (int32).
constexpr int kPairMax = 8;   // the most tokens the pair tiles take; more: vnni_wide
inline bool vnni_rows(int M) { return M > kPairMax; }
inline int wide_tokens(int M) {   // the 8-token pair tiles' tokens at M = 5..8 (5-7: padded to 8)
  return M >= 5 ? 8 : 0;
}
inline int pair_tokens(int M) {
  return vnni_rows(M) ? M : M > kTokTile ? wide_tokens(M) : M >= 2 ? (M + 1) & ~1 : 0;
}
inline size_t vnni_pairs_at(int M, int K, int group) { return a64(i8_packed_bytes<uint8_t>(M, K, group)); }
inline size_t vnni_csum_at(int M, int K, int group) { return a64(vnni_pairs_at(M, K, group) + size_t(pair_tokens(M)) * K); }
// The pair tiles' per-group operands in their trees' element order (vnni_tilep): per group, 8 fp32
// token scales, then 8 int32 compensations, one 64-byte line -- element j: token tree_tok(P, j), P the
// pairs per tile that M takes (tree_pairs), a padding token read as the last real one (its sums are 0).
// Were two gathers per group and tile (vpgatherdd/vgatherdps from [M][K / group]): at M = 4 they stalled
// the epilogue (a sixth of a Qwen3-30B-A3B T = 4 call's samples sat on the two instructions after them).
// The builds side by side in one process, two copies each (Zen 4, 2026-12-03, 2 threads, same-experts
// routing, weights from DRAM; medians of 41 rounds, Mixtral 9): Qwen3-30B-A3B T = 2 / 3 / 4 / 6 / 8
// 0.96-0.98 / 0.94-0.95 / 0.93-0.95 / 0.93 / 0.91-0.94x the time, Mixtral-8x7B T = 2 0.99-1.01x, T = 8
// 0.94x (T = 4 0.85-0.91x, where the old build's two copies read 0.90x apart). Bit-identical.
constexpr int tree_pairs(int M) { return M <= 2 ? 1 : M <= kTokTile ? 2 : 4; }   // the tiles' P (VnniKn)
inline bool has_tree(int M) { return M >= 2 && !vnni_rows(M); }
inline int tree_tok(int P, int j) {   // P = 4: 0 2 4 6 1 3 5 7; P = 2: 0 2 0 2 1 3 1 3; P = 1: 0 0 0 0 1 1 1 1
  return P == 4 ? 2 * (j % 4) + j / 4 : P == 2 ? 2 * (j % 2) + j / 4 : j / 4;
}
inline size_t vnni_tree_at(int M, int K, int group) {
  return a64(vnni_csum_at(M, K, group) + size_t(pair_tokens(M)) * (K / group) * sizeof(int32_t));
}
size_t vnni_packed_bytes(int M, int K, int group) {
  return vnni_tree_at(M, K, group) + (has_tree(M) ? size_t(K / group) * 64 : 0);
}
inline const float* vnni_tree(const void* I, int M, int K, int group) {
  return reinterpret_cast<const float*>(static_cast<const char*>(I) + vnni_tree_at(M, K, group));
}
inline const int32_t* vnni_csum(const void* I, int M, int K, int group) {
  return reinterpret_cast<const int32_t*>(static_cast<const char*>(I) + vnni_csum_at(M, K, group));
}
inline const uint8_t* vnni_pairs(const void* I, int M, int K, int group) {
  return static_cast<const uint8_t*>(I) + vnni_pairs_at(M, K, group);
}
void vnni_pair_up(void* I, int M, int K, int group) {
  const uint8_t* q = static_cast<const uint8_t*>(I);
  uint8_t* d = const_cast<uint8_t*>(vnni_pairs(I, M, K, group));
  const int tw = pair_tokens(M);
  const bool rows = vnni_rows(M);
  int32_t* cs = const_cast<int32_t*>(vnni_csum(I, M, K, group));
  const int ng = K / group;
  const __m256i bias = _mm256_set1_epi8(char(0x80)), zero = _mm256_setzero_si256();
  for (int t = 0; t < tw; ++t)
    for (int g = 0; g < ng; ++g) {
      __m256i sad = zero;   // sum of the group's u8 bytes (x + 128), in four 64-bit lanes
      for (int k = g * group; k < (g + 1) * group; k += 32) {
        uint8_t* dst = rows ? d + int64_t(t) * K + k : d + int64_t(t / 2) * 2 * K + 2 * k + (t & 1) * 32;
        // a padding token: 0 (its sums 0 exactly)
        const __m256i v = t < M ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + int64_t(t) * K + k)) : bias;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_xor_si256(v, bias));   // x = (x + 128) ^ 0x80
        sad = _mm256_add_epi64(sad, _mm256_sad_epu8(v, zero));
      }
      const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const int64_t su = _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1);
      cs[t * ng + g] = int32_t(128 * (su - 128 * int64_t(group)));   // 128 x the group's sum of x
    }
  if (has_tree(M)) {
    const float* sx = i8_s<uint8_t>(I, M, K);
    float* tr = const_cast<float*>(vnni_tree(I, M, K, group));
    const int P = tree_pairs(M);
    for (int g = 0; g < ng; ++g)
      for (int j = 0; j < 8; ++j) {
        const int tj = tree_tok(P, j), t = tj < M ? tj : M - 1;
        tr[g * 16 + j] = sx[t * ng + g];
        std::memcpy(tr + g * 16 + 8 + j, cs + t * ng + g, sizeof(int32_t));
      }
  }
}
void vnni_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  i8_pack_tokens<uint8_t, 128>(x, ldx, rows, M, K, group, I);
  vnni_pair_up(I, M, K, group);
}
void vnni_pack_act(const float* act, int M, int K, int group, void* out) {
  i8_pack_act<uint8_t, 128>(act, M, K, group, out);
  vnni_pair_up(out, M, K, group);
}

// Dwords [d, d + n) (n <= 16) of the 16 rows p[i] (as bytes), transposed: out[j] = dword d + j of rows
// 0..15 (lane i: row i), out[j] for j >= n 0; XOR-ed with `flip`. Three stages: dwords of row pairs,
// qwords of row quads, 128-bit lanes.
inline void transpose16(const void* const* p, int64_t d, int n, __m512i flip, __m512i* out) {
  const __mmask16 m = __mmask16((1u << n) - 1);
  __m512i r[16], t[16], u[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_epi32(m, static_cast<const int32_t*>(p[i]) + d);
  #pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {   // per lane L: [r2i[4L], r2i+1[4L], r2i[4L+1], r2i+1[4L+1]], then 4L+2, 4L+3
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  #pragma GCC unroll 4
  for (int a = 0; a < 4; ++a) {   // u[4a + b] lane L: dword 4L + b of rows 4a..4a+3
    u[4 * a + 0] = _mm512_unpacklo_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 1] = _mm512_unpackhi_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 2] = _mm512_unpacklo_epi64(t[4 * a + 1], t[4 * a + 3]);
    u[4 * a + 3] = _mm512_unpackhi_epi64(t[4 * a + 1], t[4 * a + 3]);
  }
  #pragma GCC unroll 4
  for (int b = 0; b < 4; ++b) {   // lane L of rows 0-3, 4-7, 8-11, 12-15 together: dword 4L + b
    const __m512i v0 = _mm512_shuffle_i32x4(u[b], u[4 + b], 0x44), v1 = _mm512_shuffle_i32x4(u[b], u[4 + b], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + b], u[12 + b], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + b], u[12 + b], 0xEE);
    out[b] = _mm512_xor_si512(_mm512_shuffle_i32x4(v0, v2, 0x88), flip);
    out[4 + b] = _mm512_xor_si512(_mm512_shuffle_i32x4(v0, v2, 0xDD), flip);
    out[8 + b] = _mm512_xor_si512(_mm512_shuffle_i32x4(v1, v3, 0x88), flip);
    out[12 + b] = _mm512_xor_si512(_mm512_shuffle_i32x4(v1, v3, 0xDD), flip);
  }
}

// NT (1..8) tokens over one group of the transposed rows (wt: group / 4 vectors): acc[t] lane i = the
// int32 dot of row i and token t over the group, then into the fp32 sums cacc[t][16].
template <int NT>
inline void vnni_outer(const __m512i* wt, int nk4, const uint8_t* x, int64_t K, const int32_t* cs,
                       const float* sx, int ng, __m512 swv, float* cacc) {
  __m512i acc[NT];
  #pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_si512();
  for (int j = 0; j < nk4; ++j) {
    const __m512i wv = _mm512_load_si512(wt + j);
    #pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[t] = dpbusd_bcast(acc[t], wv, x + t * K + 4 * j);
  }
  #pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], _mm512_set1_epi32(cs[t * ng])));
    const __m512 s = _mm512_mul_ps(swv, _mm512_set1_ps(sx[t * ng]));
    _mm512_store_ps(cacc + 16 * t, _mm512_fmadd_ps(f, s, _mm512_load_ps(cacc + 16 * t)));
  }
}

thread_local ThreadScratch<float> tl_outer{nullptr, 0};    // vnni_wide's fp32 sums, [M][16]
thread_local ThreadScratch<__m512> tl_wscale{nullptr, 0};  // and its rows' scales, [group][16]

// c[i * ldc + t] += rows w[0..nr) x all M tokens over [kb0, kb1) (nr <= 16; the missing rows repeat
// row 0 and are not stored).
void vnni_wide(const int8_t* const* w, const float* const* sw, int nr, const void* I, int M, int K, int group,
               int kb0, int kb1, float* c, int ldc) {
  const void* wp[16];
  const void* sp[16];
  for (int i = 0; i < 16; ++i) {
    wp[i] = w[i < nr ? i : 0];
    sp[i] = sw[i < nr ? i : 0];
  }
  const uint8_t* xs = vnni_pairs(I, M, K, group);
  const float* sx = i8_s<uint8_t>(I, M, K);
  const int32_t* cs = vnni_csum(I, M, K, group);
  const int ng = K / group, g0 = kb0 / group, g1 = kb1 / group;
  float* cacc = tl_outer.get(size_t(M) * 16);
  for (int i = 0; i < M * 16; ++i) cacc[i] = 0.f;
  // the rows' scales of the block's groups, one vector per group (lane i: row i)
  __m512* swv = tl_wscale.get(size_t(g1 - g0 + 15) & ~size_t(15));
  for (int g = g0; g < g1; g += 16)
    transpose16(sp, g, g1 - g < 16 ? g1 - g : 16, _mm512_setzero_si512(), reinterpret_cast<__m512i*>(swv + (g - g0)));
  const __m512i biasz = _mm512_set1_epi8(char(0x80));
  alignas(64) __m512i wt[32];
  for (int k0 = kb0; k0 < kb1; k0 += 128) {
    const int nb = kb1 - k0 < 128 ? kb1 - k0 : 128;   // whole groups: kb0, kb1 and 128 are multiples of group
    for (int i = 0; i < 16; ++i) {   // 4 chunks ahead, into L2
      __builtin_prefetch(static_cast<const int8_t*>(wp[i]) + k0 + 512, 0, 2);
      __builtin_prefetch(static_cast<const int8_t*>(wp[i]) + k0 + 576, 0, 2);
    }
    for (int kk = 0; kk < nb; kk += 64) transpose16(wp, (k0 + kk) / 4, nb - kk < 64 ? (nb - kk) / 4 : 16, biasz, wt + kk / 4);
    for (int gg = 0; gg < nb; gg += group) {
      const int gi = (k0 + gg) / group;
      const __m512 sv = swv[gi - g0];
      const __m512i* wg = wt + gg / 4;
      for (int t0 = 0; t0 < M; t0 += 8) {
        const uint8_t* x = xs + int64_t(t0) * K + k0 + gg;
        const int32_t* cg = cs + int64_t(t0) * ng + gi;
        const float* sg = sx + int64_t(t0) * ng + gi;
        float* ca = cacc + t0 * 16;
        switch (M - t0 < 8 ? M - t0 : 8) {
          case 8: vnni_outer<8>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 7: vnni_outer<7>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 6: vnni_outer<6>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 5: vnni_outer<5>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 4: vnni_outer<4>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 3: vnni_outer<3>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          case 2: vnni_outer<2>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
          default: vnni_outer<1>(wg, group / 4, x, K, cg, sg, ng, sv, ca); break;
        }
      }
    }
  }
  // [M tokens][16 rows] -> c's [rows][tokens], 16 tokens at a time
  alignas(64) static const float zeros[16] = {};
  for (int t0 = 0; t0 < M; t0 += 16) {
    const int nt = M - t0 < 16 ? M - t0 : 16;
    const void* tp[16];
    for (int j = 0; j < 16; ++j) tp[j] = j < nt ? cacc + (t0 + j) * 16 : zeros;
    __m512i o[16];
    transpose16(tp, 0, 16, _mm512_setzero_si512(), o);
    const __mmask16 m = __mmask16((1u << nt) - 1);
    for (int i = 0; i < nr; ++i) {
      float* ci = c + int64_t(i) * ldc + t0;
      _mm512_mask_storeu_ps(ci, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, ci), _mm512_castsi512_ps(o[i])));
    }
  }
}

// Pairs of tokens, P pairs (2P tokens) x R rows per tile: P = 4 is the 8-token tile above; P = 2 and 1
// take the decode tiles of M = 3-4 and 2 tokens (below, VnniKn::tile), 4 rows, with the decode tiles'
// L2 prefetch of the next tile's rows (PF). Against the ymm tiles they replace (2 rows x 3-4 tokens, 4
// rows x 2; each (row, token) scaled per group on its own: a subtraction, a conversion, a scalar
// product, a broadcast and an FMA, as many vector instructions as its vpdpbusd at M = 4), the builds'
// modules side by side in one process (Zen 4, 2026-12-02, 2 threads, same-experts routing, weights
// streamed from DRAM, 5 rounds, medians): Qwen3-30B-A3B T = 2 / 3 / 4 0.96-0.97 / 0.93 / 0.89x the
// time, Mixtral-8x7B 0.98-1.03 / 0.88 / 0.85-0.88x; at T = 4 both within 5% of T = 1's time. 8 rows at
// M = 2 (0.98-1.00x) or at M = 3-4 (1.03x) were no better. A scratch build without the per-group
// scaling (wrong sums; the int32 sums carried over the whole row) had shown its cost first: T = 4
// 0.80x (Qwen3) / 0.85x (Mixtral), T = 1 0.95-0.97x; without the compensation vpdpbusd 0.90-1.00x.
// The operands' roles are swapped here: the weights are the unsigned side (w ^ 0x80 = w + 128, one
// vpxor per 32 bytes of a row, on any vector pipe) and the tokens the signed one, so that
//     sum_k (w[k] + 128) x[k] = sum_k w[k] x[k] + 128 sum_k x[k],
// a compensation per token and group that the pack computes once (vnni_pair_up), subtracted after the
// tree from the 8 sums at once (one gather and one subtraction per group and tree), where the rows'
// took a vpdpbusd per row and step and four subtractions per row and group. The int32 sums, so the
// outputs, are bit-identical. Against the rows' compensation, the two builds' modules side by side,
// two copies each (Zen 4, 2026-12-02, 7 rounds, weights from DRAM): Mixtral-8x7B T = 8 / 16 / 64
// 0.95 / 0.93 / 0.93x the time, Qwen3-30B-A3B 0.96 / 0.95 / 0.92x; T = 2 and 4 within the noise
// (0.97-1.03x). (On the AMX Xeon the same swap in the ymm decode tiles had been slower, VnniKn's
// comment: there zmm vpdpbusd, conversions and FMAs share one port; not measured there for these
// tiles.)
// Per group, four accumulators go through one tree into 8 int32 sums: a row's four pairs (P = 4), two
// rows' two pairs (P = 2) or four rows' one pair (P = 1) -- 4 / P rows per tree, R / (4 / P) trees.
// Element j of a tree's result (vector i = j % 4 of its input, half h = j / 4) is row 4/P-group's
// row i / P, token 2 (i % P) + h; after the permutation `nat` they are row-major, [4 / P rows][2P tokens].
template <int R, int P, int PF>
inline void vnni_tilep(const int8_t* const* w, const float* const* sw, const uint8_t* x, int64_t ldx,
                       const float* tree, int valid, int kb0, int kb1, int group, float* c, int ldc,
                       const int8_t* const* nxt) {
  static_assert(P == 1 || P == 2 || P == 4, "pairs per tile");
  constexpr int G = 4 / P;            // rows per tree
  static_assert(R % G == 0, "whole trees");
  constexpr int Q = R / G;            // trees
  const __m512i biasz = _mm512_set1_epi8(char(0x80));
  __m256 accf[Q];
  #pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) accf[q] = _mm256_setzero_ps();
  for (int k0 = kb0, gi = kb0 / group; k0 < kb1; k0 += group, ++gi) {
    if constexpr (PF == 2) prefetch_l2_rows<R>(nxt, k0 - kb0, group);
    __m512i acc[R][P];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      #pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_si512();
    }
    for (int k = k0; k < k0 + group; k += 32) {
      __m512i xv[P];
      #pragma GCC unroll 4
      for (int p = 0; p < P; ++p) xv[p] = _mm512_loadu_si512(x + 2 * p * ldx + 2 * k);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i wz = _mm512_xor_si512(
            _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + k))), biasz);
        #pragma GCC unroll 4
        for (int p = 0; p < P; ++p) acc[r][p] = dpbusd(acc[r][p], wz, xv[p]);
      }
    }
    // the tokens' scales and compensations in the trees' element order (vnni_tree)
    const __m256 sxv = _mm256_loadu_ps(tree + 16 * gi);
    const __m256i csv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tree + 16 * gi + 8));
    #pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) {
      __m512i a[4];
      #pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) a[i] = acc[q * G + i / P][i % P];
      // per 128-bit lane L (token half 0: L = 0, 1; half 1: L = 2, 3), a[i]'s four ints summed into
      // element i of lane L
      const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
      const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
      const __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
      // lanes 0 + 1 (half 0) and 2 + 3 (half 1)
      const __m512i v = _mm512_add_epi32(u, _mm512_shuffle_i64x2(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
      const __m256i d = _mm256_sub_epi32(_mm512_castsi512_si256(_mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0))), csv);
      __m256 swv;   // the rows' scales in the same order
      if constexpr (P == 4) {
        swv = _mm256_set1_ps(sw[q][gi]);
      } else if constexpr (P == 2) {
        const __m128 h = _mm_movelh_ps(_mm_set1_ps(sw[2 * q][gi]), _mm_set1_ps(sw[2 * q + 1][gi]));
        swv = _mm256_set_m128(h, h);
      } else {
        const __m128 h = _mm_setr_ps(sw[4 * q][gi], sw[4 * q + 1][gi], sw[4 * q + 2][gi], sw[4 * q + 3][gi]);
        swv = _mm256_set_m128(h, h);
      }
      accf[q] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(d), sxv), swv, accf[q]);
    }
  }
  const __m256i nat = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);   // to [G rows][2P tokens]
  #pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) {
    alignas(32) float o[8];
    _mm256_store_ps(o, _mm256_permutexvar_ps(nat, accf[q]));
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < 2 * P && t < valid; ++t) c[(q * G + g) * ldc + t] += o[g * 2 * P + t];
  }
}

struct VnniKn {
  static constexpr Dtype dtype = Dtype::int8;
  // the AVX2 kernel's decode blocking (quant_avx2.cpp: gate/up interleaved, 4 rows at M = 1, 2 from
  // M = 2, the next tile's rows prefetched into L2). Against the first one ({8, 2, ...} rows, no
  // prefetch, no interleave) on a 2-vCPU Sapphire Rapids (2026-12-01): Qwen3-30B-A3B T = 1 / 2 / 4
  // 1.81 / 1.92 / 2.11 ms vs 2.42 / 3.04 / 3.72, Mixtral 12.7 / 13.9 / 14.6 vs 13.5 / 16.3 / 19.2.
  // Spread (QBlocking::spread) and 256-row tasks, on the same machine (Qwen3-30B-A3B T = 1 / 4, DRAM):
  // 1.91 / 2.11 ms -> 1.66 / 2.05 (spread) -> 1.58 / 1.90 (and 256 rows: the rows of a tile further
  // apart, fewer tasks).
  // 4 rows (two gate/up pairs) at M = 2 too, since the spread: T = 2 Qwen3 1.83 -> 1.61 ms, Mixtral (all 8
  // experts) 55.7 -> 52.3; at M = 3 no change measured (1.80-1.95 vs 1.86 ms), at M = 4 slower (2.06 vs
  // 1.77-1.90: 16 + 16 + 4 accumulators do not fit the 32 registers). Since 2026-12-02 M = 2-4 take the
  // pair tiles (vnni_tilep: 4 rows x 1 or 2 zmm pairs, 8 or 4 accumulators), 4 rows at every M >= 2.
  // Tried and not kept (2026-12-02, same machine, Qwen3-30B-A3B shapes over all 8 experts, median of
  // 300-600 calls, builds alternated twice): the weights made unsigned instead of the tokens (w ^ 0x80 on
  // load, the compensation 128 x sum(x) per token and group computed in the gather), which drops the
  // per-row compensation vpdpbusd -- on 512-bit vectors T = 4 from L3 1.41-1.45 -> 1.53 ms (zmm
  // vpdpbusd, cvt and fma all issue on one port); on 256-bit vectors with the scale products s_w x
  // s_x precomputed per K block and the group a template constant, 1.42-1.48 -> 1.51-1.54; T = 1 the
  // same within noise from L3 (0.96-0.98 ms) and from DRAM (1.67-1.71). Nor an L2 prefetch three tiles
  // ahead instead of one (T = 1 from DRAM 1.67-1.71 -> 1.75-1.81); again on the model 207 Xeon
  // (2026-12-06, each build in its own process, 3 alternated, same-experts routing), after `hinabench
  // overlap` had read its dependent-FMA stream there at 12-14 GB/s with no software prefetch and 22-26
  // with one 4-16 KiB ahead (2 threads): the rows ceil(4096 / K) tiles ahead (K bytes a row: 2 tiles for
  // Qwen3-30B-A3B's gate/up, 6 for its down), T = 1 / 2 / 4 0.95 / 1.00 / 1.01x the time from DRAM,
  // 8192 bytes 1.03 / 1.02 / 1.04x: no change beyond the noise. At T = 1 from L3 the call is ~0.97
  // ms for 37.7 MB, at T = 4 ~1.4: the DRAM time (1.7 / 2.0) is not this loop's instruction count.
  // Tried on Zen 4 (2026-12-03, builds side by side in one process) and not kept: one token in 512-bit
  // steps with the weights made unsigned (w ^ 0x80) and the token's compensation started in each
  // group's lane 0 (one vpdpbusd per 64 bytes of a row, where vnni_tile takes four 256-bit ones): from
  // L3 (one 2048 x 768 expert, one thread) 0.90-0.93x the time, but from DRAM Mixtral-8x7B T = 1
  // 1.02-1.03x and Qwen3-30B-A3B 0.99x: the stream bounds it there. With the next tile's L2 prefetch
  // issued per 64-byte step instead of per group, 1.055x from DRAM (Mixtral T = 1): the burst keeps
  // more lines in flight (FP8's tile the same way: within the noise). The signed token rows (M > 8)
  // padded to K + 64 bytes: at K = 4096 the 8 tokens of vnni_outer share one L1 set, and a loop of its
  // 8 broadcast vpdpbusd alone read 0.6 ns each at a 4096-byte stride against 0.28 at 4160; in the
  // kernel Mixtral-8x7B T = 16 / 32 0.93-0.98 / 0.96-0.99x the time against 0.98-1.02x between copies of
  // the same build (Qwen3's K = 2048 / 768: unchanged): not beyond the noise. Nor, for 5-8 tokens, 2-row
  // tiles without the per-group tree (each accumulator starting the group at minus its tokens'
  // compensations in lanes 0 and 8, its int32 lanes converted and scaled into fp32 lanes, one tree per
  // row at the end; the fp32 lanes take 8 more registers, so 2 rows, not 4): Qwen3-30B-A3B M = 5-8
  // 1.17-1.23x the time, Mixtral-8x7B 1.37-1.52x (two row streams per core where 4 kept DRAM busy).
  // Where one token's time goes (the AMX Xeon, 2026-12-04; Qwen3-30B-A3B shapes, 256 experts so that
  // nothing is in the L3, 8 a call, T = 1, a plain C++ loop over the same int8 weights in the same
  // process, alternated, medians of 96 calls): the kernel 1.38-1.47 ms; a bare stream of the same rows
  // (one 512-bit vpdpbusd per 64 bytes, int32 sums, no scales, the next tile prefetched) 1.20-1.29; this
  // tile's loop rebuilt outside the kernel 1.43-1.54 (so the driver costs nothing), and from it: no
  // per-group epilogue (one group of all K) 0.93x, no scale loads 0.96x, the weights made unsigned with
  // no compensation vpdpbusd on 512-bit vectors 0.94x, the next tile's scales prefetched 0.99x, the L2
  // prefetch per 64-byte step 0.98x. The group's epilogue (convert, scale, add) is the largest piece.
  // Phases alone (the other skipped): gate/up 0.89 ms against the stream's 0.77, down 0.46 against 0.36.
  // Tried 2026-12-06 (the AMX Xeon family 6 model 207, Qwen3-30B-A3B, 2 threads, each build in its own
  // process, 3 alternated processes of 5 rounds) and not kept: each group's step prefetching the tile's
  // own rows 128 or 256 bytes ahead into L1 (T = 1 / 2 / 4 0.98-1.09x the time); 2 rows with the L2
  // prefetch at T = 1, 2 (1.00 / 1.09x from DRAM, 1.08 / 1.01x from the L3); Zen 5's blocking (2 rows, no
  // prefetch at T = 1, 2) from DRAM 1.26 / 1.13x the time, from the L3 0.90 / 0.90x: the L2 prefetch is
  // what the DRAM stream needs here.
  static constexpr QBlocking kBlocking{/*rows=*/{2, 4, 4, 4, 4}, /*prefetch=*/{0, 2, 2, 2, 2}, /*interleave=*/true,
                                       /*spread=*/{true, true, true, true, true}};
  static constexpr int task_rows = 256;
  // Zen 5's (AMD family >= 26, or HINA_AVX512_BLOCKING=zen5: the BF16 kernel's switch, microkernel.h):
  // one token 2 rows a tile, no prefetch at 1 and 2 tokens, tasks of 512 rows. On Zen 5 (2026-12-05, 2
  // threads, same-experts routing, weights from DRAM, the builds side by side in one process, 5
  // rounds), against the default: Mixtral-8x7B T = 1 / 2 / 3 / 4 0.91 / 0.97 / 0.91 / 0.99x the time,
  // Qwen3-30B-A3B 0.89 / 0.93 / 0.95 / 0.97x. Steps of it: no prefetch at T = 1 0.94 / 0.96x, then 2
  // rows 0.98 / 0.97x, tasks of 512 rows 0.99 / 0.95x (of 128: 1.03 / 1.08x). Not kept there: 8 rows
  // at T = 1 (1.05x), a tile's rows taken a group at a time instead of 32 bytes of each in turn (0.97 /
  // 1.02x), no prefetch at T = 3-4 (up to 1.10x), 2 rows at T = 2-4 without prefetch (Mixtral 1.10 /
  // 1.29x at T = 2 / 4, Qwen3 0.91x: mixed), 8 rows with it (0.95-1.25x). One token on 512-bit steps
  // (with the compensation vpdpbusd; a step's halves scaled apart at g = 32), as tried on Zen 4: from
  // the L3 0.89x the time (Qwen3-30B-A3B, 2 experts: 116 against 103 GB/s), from DRAM 1.00-1.01x.
  // Tasks of 1024 rows since 2026-12-05 (Zen 5, side by side, 5-7 rounds, against 512): Qwen3-30B-A3B
  // T = 1 / 2 / 4 / 8 / 16 0.96 / 0.97 / 0.95 / 0.94 / 0.99x the time (an expert's 768 gate/up rows one
  // task: a bare read of the same rows, no arithmetic, took 0.90-0.97x the time in whole experts that
  // it took in 512 rows), Mixtral-8x7B T = 1 / 16 1.00 / 0.99x; 2048 rows no better (0.96 / 0.96 / 0.93x, Mixtral
  // 1.01x). Not kept, same day: gate and up in tiles of their own (two gate rows n / 2 apart, then two
  // up rows; interleave off) 1.00x at 512 rows, 0.96x at 1024 (as 1024 alone); one token's 64-byte
  // steps with the weights made unsigned, one vpdpbusd per 64 bytes of a row and the per-group scaling
  // one conversion and one FMA (the products s_w x s_x made 16 groups at a time, the tokens'
  // compensation taken off once per row): from the L3 0.90x the time, from DRAM 1.03-1.06x (Qwen3-30B-A3B
  // T = 1), Mixtral-8x7B 1.00x -- the arithmetic is not what a token's call waits on (tiles that skip
  // the compensation and the per-group scaling altogether, wrong sums: 0.96-1.00x).
  struct Zen5 {
    static constexpr QBlocking kBlocking{/*rows=*/{2, 2, 4, 4, 4}, /*prefetch=*/{0, 0, 0, 2, 2}, /*interleave=*/true,
                                         /*spread=*/{true, true, true, true, true}};
    static constexpr int task_rows = 1024;
  };
  static constexpr bool kAltBlocking = true;
  using AltBlocking = Zen5;
  static bool alt_blocking() { return avx512_blocking_zen5(); }
  template <int R, int TT, int PF>
  static void tile(const int8_t* const* w, const float* const* sw, const void* I, int M, int K, int group,
                   int kb0, int kb1, int t0, float* c, int ldc, const int8_t* const* nxt) {
    if constexpr (TT >= 2 && R % (TT > 2 ? 2 : 4) == 0) {
      if (M <= kTokTile) {   // the decode tiles of 2-4 tokens: pairs (t0 = 0, TT = M)
        constexpr int P = tree_pairs(TT);
        return vnni_tilep<R, P, PF>(w, sw, vnni_pairs(I, M, K, group), K, vnni_tree(I, M, K, group), M, kb0,
                                    kb1, group, c, ldc, nxt);
      }
    }
    const uint8_t* x[TT];
    const float* sx[TT];
    const uint8_t* q = static_cast<const uint8_t*>(I);
    const float* s = i8_s<uint8_t>(I, M, K);
    for (int t = 0; t < TT; ++t) {
      x[t] = q + int64_t(t0 + t) * K;
      sx[t] = s + int64_t(t0 + t) * (K / group);
    }
    vnni_tile<R, TT, PF>(w, sw, x, sx, kb0, kb1, group, c, ldc, nxt);
  }
  // the blocked path's wide tiles (quant_glue.h): 5-8 tokens x 4 rows in the 8-token pair tiles, more
  // x 16 rows in vnni_wide's outer products
  static int wide_rows(int M) { return vnni_rows(M) ? 16 : wide_tokens(M) != 0 ? 4 : 0; }
  static void tile_wide(const int8_t* const* w, const float* const* sw, int nr, const void* I, int M, int K,
                        int group, int kb0, int kb1, float* c, int ldc, const int8_t* const* next) {
    if (vnni_rows(M)) return vnni_wide(w, sw, nr, I, M, K, group, kb0, kb1, c, ldc);
    auto pairs = [&](auto rr, auto pf, int r, const int8_t* const* nx) {
      constexpr int R = decltype(rr)::value;
      vnni_tilep<R, tree_pairs(kPairMax), decltype(pf)::value>(w + r, sw + r, vnni_pairs(I, M, K, group), K,
                                                               vnni_tree(I, M, K, group), M, kb0, kb1, group,
                                                               c + int64_t(r) * ldc, ldc, nx);
    };
    // The next tile's rows into L2 as this one streams (the decode tiles' prefetch; K is whole here
    // for every model's shapes, M x K <= kWholeK, so each row is one stream): side by side in one
    // process, two copies each (Zen 4, 2026-12-03, weights from DRAM, 9 / 41 rounds), Mixtral-8x7B
    // M = 5 / 6 / 8 0.91-0.95 / 0.87-0.89 / 0.91-0.96x the time (the old build's copies 1.02 / 0.95 /
    // 1.00-1.03x apart), Qwen3-30B-A3B M = 5 / 6 / 7 / 8 0.92 / 0.95-0.96 / 0.99 / 0.96-0.99x.
    if (nr == 4 && next) {
      const int8_t* pf[4];
      for (int q = 0; q < 4; ++q) pf[q] = next[q] + kb0;
      return pairs(IntC<4>{}, IntC<2>{}, 0, pf);
    }
    if (nr == 4) return pairs(IntC<4>{}, IntC<0>{}, 0, nullptr);
    for (int r = 0; r < nr; ++r) pairs(IntC<1>{}, IntC<0>{}, r, nullptr);
  }
  static const float* scale_row(const float* s, int64_t lds, int row, int) { return s + int64_t(row) * lds; }
};

// ================================ FP8 e4m3 weight-only, on AVX512_BF16 ============================
// Per 64 weights of a row: the e4m3 bytes looked up in two 128-entry byte tables (the high and the low
// byte of each magnitude's bf16, exact: every e4m3 value, subnormals included, is a bf16 normal) by
// vpermt2b (AVX512_VBMI, which every CPU with this kernel's "avx512" has but Cooper Lake: see
// isa_usable), the sign OR-ed into the high byte, and the two interleaved into 2 x 32 bf16 by
// vpunpcklbw / vpunpckhbw (in-lane: wa holds weights 16L + e of lane L, e < 8, wb 16L + 8 + e, so the
// tokens are packed in that order, f8_bf_pos: transformation 1 moves I, not W); then one vdpbf16ps per
// token and 32 weights against the token's bf16 values; fp32 sums per 128-wide scale block, times the
// block's scale. The tokens are bf16 (x as it is; the SiLU(gate)*up intermediate rounded to bf16, as
// the AMX FP8 tiles and the BF16 kernels do).
// The interleave was two more vpermt2b into the natural order, and the sums across blocks of every tile
// sat in L1. On Zen 4 (2026-12-03, 2 threads, same-experts routing, weights from DRAM, built modules
// timed alternately in one process beside the INT8 kernel): the unpacks, the sums in registers where a
// tile has at most 8 (R x TT), and 2 rows at M = 3, 4 (was 4: 16 + 16 accumulators spilled) took
// Mixtral-8x7B T = 3 / 4 from 18.4 / 23.8 ms to 16.8 / 17.2-19.1, Qwen3-30B-A3B T = 4 2.83-4.07 ->
// 2.57-3.38, and FP8's speed over INT8's at T = 4 from 0.58-0.62x to 0.75-0.84x (T = 1, 2 within the
// noise); 1 row at M = 4 0.55-0.64x, 4 rows with the unpacks 0.63-0.68x. Tried and not kept: the
// tokens as vdpbf16ps's memory operand (inline assembly; GCC loads them into registers first) with each
// W chunk loaded once, 8 fewer loads per row and step at M = 4: 1.00-1.07x the time. From 5 tokens, 2
// rows' W converted once per chunk of 1024 into bf16 in L1 and every 4-token tile run over that copy
// (instead of a conversion per 4 tokens): Mixtral-8x7B M = 5 / 8 / 16 / 32 1.17 / 1.29 / 1.17 / 1.04x
// the time, Qwen3-30B-A3B 1.23 / 1.12 / 1.14 / 1.00x.
// Before that: five vector instructions per 64 weights, four of them on port 5, where the first version took seven
// per 32 (the e4m3 fields moved into bf16's by shifts and masks, subnormals from a vpermw table), two of
// them on port 0 beside the vdpbf16ps. Measured (AMX Xeon, 2 threads, Qwen3-30B-A3B shapes over all 8
// experts, median of 300 calls, the two builds alternated twice): from DRAM T = 1 / 2 / 4 1.79-1.81 /
// 2.16-2.22 / 3.17-3.19 ms before, 1.67-1.76 / 2.08-2.13 / 2.95-3.06 after; from L3 (one copy) T = 4
// 3.04 -> 2.91-2.94 ms. Not more: the kernel is bound by its vdpbf16ps (one per 32 weights and token,
// where INT8's vpdpbusd takes 64) and, on that machine, its compute does not overlap its stream.
// Tried and not kept: a second set of accumulators (the two vdpbf16ps of a step on separate chains),
// 2.97 -> 3.05 ms at T = 4 from L3.
// On Zen 5 the same (2026-12-05, Qwen3-30B-A3B from the L3, side by side): T = 1 / 2 / 4 1.00 / 1.07 /
// 1.19x the time (and with 2 rows at M = 2, 1.17x at T = 2).
// Every weight is a normal number here (a product with a tiny activation can still underflow, and
// vdpbf16ps flushes subnormals).
// the scales arrive x 2^8 (quant_glue.h's convention for the AVX2 kernel's fp16 step)
constexpr float kF8Unscale = 1.0f / kF8ScaleUp;
// vpermt2b (f8_vbmi.h) is AVX512_VBMI, which this file's flags leave out (the INT8 kernel beside it runs
// on Cooper Lake): the FP8 tile alone is compiled for it; the table entry asks isa_usable("avx512-vbmi")

// Which form an expert of M tokens takes (its pack and its tiles alike). The widening was measured on
// the AMX Xeon only, where vdpbf16ps is a two-cycle instruction; on CPUs without AMX (Zen 4/5, Cooper
// Lake: not measured, and Zen 4 issues a zmm fma no faster than a vdpbf16ps of twice its products)
// the vdpbf16ps tile stays. The emulated build takes each form for half the token counts, so the same
// tests run both.
#if defined(HINA_AVX512_NOBF16)
// without AVX512_BF16, vdpbf16ps is two FMAs and four integer ops (dpbf16.h): the widened tile's FMAs
// with less around them. Side by side on the Xeon without AVX512_BF16 (2026-12-03, same process, 5 and
// 8 rounds, the order swapped) the two forms at T = 2..8 were within each other's noise (0.70-1.05x,
// the later-run build ahead either way): kept for its fewer instructions, not for a measured gain.
// The wide step converts every row's 64 weights first and then, per 16, loads the tokens' fp32 once
// for all the tile's rows (was: per row, the tokens re-read): same process, the two builds alternated
// twice, T = 2 / 4 / 8 0.96-0.99x the time (Mixtral-8x7B, Qwen3-30B-A3B), bit-identical. Where the
// time goes (this Xeon, one thread, a tile's loop over data in L1): ~6.2 ns per row and 64 weights at
// 2 rows x 4 tokens (~19 cycles for its 16 FMAs, 2 vpermt2b of 2 cycles each and 7 unpacks); a plain
// fp32 tile over weights already fp32 in L1 takes 4.5 (2 rows) / 3.1 (4 rows) ns: the FMAs are the
// floor, four times INT8's vpdpbusd count, so FP8 at T = 4 stays ~0.6x INT8's speed (21.0 against
// 13.1 ms, Mixtral-8x7B) on a CPU without a BF16 dot product. Tried and not kept: the e4m3 bits moved
// into fp32 lanes by a shift and a mask (the AVX2 kernel's form; no table): 0.9x the loop's time on
// normal weights, ~80x with one subnormal code in 15, whose fp32 denormals make every FMA that reads
// them take a microcode assist on this core (see quant_avx2.cpp).
inline bool f8_widen(int M) { return M >= 2; }
#elif defined(HINA_EMU_AVX512)
inline bool f8_widen(int M) { return M >= 2 && M % 2 == 0; }
#else
// One token keeps the bf16 tile: widened on the AMX Xeon (family 6 model 207, 2026-12-06, Qwen3-30B-A3B
// T = 1, each build in its own process, 4-6 alternated processes of 2 s) it took 0.96x the time by the
// medians and 0.99x by the minima from DRAM (isa amx), 0.99 / 0.97x (isa avx512), from the L3 1.00 /
// 1.00x and 0.95 / 1.01x: within the runs' spread.
inline bool f8_widen(int M) {
  static const bool amx = cpu_features().amx_bf16;
  return M >= 2 && amx;
}
#endif

// The fp32 tokens' row stride: K to a whole 64-block.
inline int64_t f8_ld(int K) { return (int64_t(K) + 63) & ~int64_t(63); }

// Two or more tokens: the weights widened to fp32 instead (the table bytes put together by vpunpck,
// one cycle each, where vpermt2b takes two) and one vfmadd231ps per 16 weights and token, where a
// vdpbf16ps per 32 takes two cycles (both measured on the AMX Xeon by register-only loops, 2026-12-02:
// vdpbf16ps and vpermt2b ~0.6 ns each at any number of chains, a zmm fma 0.15 ns; the bf16 tile's loop
// alone, data in L1, 15 ns per 64 weights of two rows and four tokens: its vdpbf16ps and permutes
// summed, 2 cycles each). The unpacks keep 128-bit lanes, so a 64-weight step's four fp32 vectors hold
// weights 16L + 4q + e (lane L, vector q, element e): the tokens are packed in that order (f8_tok_pos),
// in fp32 (x exactly; the intermediate unrounded, as the AVX2 kernel keeps it). Against the bf16 tile
// for every M (2026-12-02, Qwen3-30B-A3B shapes over all 8 experts, median of 300 calls, builds
// alternated twice): from DRAM T = 2 2.18-2.22 -> 2.08-2.12 ms, T = 4 3.23-3.30 -> 2.96-3.07, T = 8
// 8.78-8.84 -> 6.93; from L3 T = 2 2.07-2.08 -> 1.81-1.92, T = 4 3.02-3.16 -> 2.88-2.95; Mixtral's
// shapes at T = 4 (all 8 experts) unchanged, 101-102 ms (its 4 tokens' fp32 rows of 4096 and 14336 no
// longer sit in L1). T = 1 keeps the bf16 tile (within noise either way).
inline int f8_bf_pos(int k) {   // the bf16 form's: wa = vpunpcklbw(l, h) holds weights 16L + e, wb 16L + 8 + e
  const int j = k & 63;
  return (k & ~63) | ((j >> 3) & 1) << 5 | (j >> 4) << 3 | (j & 7);
}
inline int f8_tok_pos(int k) {   // position of weight k of its 64-block in the packed token row
  const int j = k & 63;
  return (k & ~63) | ((j >> 2) & 3) << 4 | (j >> 4) << 2 | (j & 3);
}
// c[r * ldc + t] += sum_blocks s[r][blk] * 2^-8 * sum_{k in blk} W_r[k] * X_t[k]  (s arrives x 2^8)
// The bf16 form's fp32 sums across blocks live in registers where a tile has at most 8 (kRegs), else in
// L1 (accm; on the AMX Xeon, 4 x 4 tiles, Qwen3-30B-A3B T = 4 from L3: 2.74 ms, against 2.85 with both
// in registers, with the first conversion), the block's in registers. kWide: the tokens are
// fp32 in f8_tok_pos order and the weights widened to fp32 (above); else bf16 in f8_bf_pos order.
template <int R, int TT, int PF, bool kWide>
HINA_VBMI void f8_tile(const int8_t* const* w, const float* const* s, const void* const* xp, int kb0, int kb1,
                       float* c, int ldc, const int8_t* const* nxt) {
  const F8Tables tab;
  const __m512i zero = _mm512_setzero_si512();
  const float* xs[TT];   // the wide form's token rows (locals: not re-read through xp every step)
  for (int t = 0; t < TT; ++t) xs[t] = static_cast<const float*>(xp[t]);
  constexpr bool kRegs = kWide || R * TT <= 8;   // the sums across blocks in registers, else in L1
  alignas(64) float accm[R * TT * 16];    // the bf16 form's sums across blocks (in L1)
  __m512 acc[R][TT];                       // the wide form's (in registers: T = 4 from L3 2.89-2.91 ms
                                           // against 3.10-3.12 in L1)
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      if constexpr (kRegs) acc[r][t] = _mm512_setzero_ps();
      else _mm512_store_ps(accm + (r * TT + t) * 16, _mm512_setzero_ps());
    }
  for (int k0 = kb0, bi = kb0 / 128; k0 < kb1; k0 += 128, ++bi) {
    const int k1 = k0 + 128 < kb1 ? k0 + 128 : kb1;
    if constexpr (PF == 2) prefetch_l2_rows<R>(nxt, k0 - kb0, k1 - k0);
    __m512 blk[R][TT], blk2[R];
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      blk2[r] = _mm512_setzero_ps();
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) blk[r][t] = _mm512_setzero_ps();
    }
    // a step of 64 weights; kHalf: the last 32 (K is a multiple of 32), the rest read as 0
    auto step = [&](int k, auto half_c) HINA_VBMI {
      constexpr bool half = decltype(half_c)::value;
      if constexpr (kWide) {
        // every row's 64 weights as bf16 words first (2 registers a row), then per 16 of them: the
        // tokens' 16 fp32 loaded once for all rows, each row's 16 widened (one vpunpck) just before its
        // FMAs; one token (a tile's tail): two sums a row (even and odd q), 2R FMA chains
        __m512i lo[R], hi[R];
        #pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i h, l;
          f8_bytes(half ? _mm512_maskz_loadu_epi64(0x0F, w[r] + k) : _mm512_loadu_si512(w[r] + k), tab, h, l);
          lo[r] = _mm512_unpacklo_epi8(l, h);
          hi[r] = _mm512_unpackhi_epi8(l, h);
        }
        #pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          __m512 xv[TT];
          #pragma GCC unroll 8
          for (int t = 0; t < TT; ++t) xv[t] = _mm512_loadu_ps(xs[t] + k + 16 * q);
          #pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const __m512i b = q < 2 ? lo[r] : hi[r];
            const __m512 f = _mm512_castsi512_ps(q % 2 ? _mm512_unpackhi_epi16(zero, b) : _mm512_unpacklo_epi16(zero, b));
            #pragma GCC unroll 8
            for (int t = 0; t < TT; ++t) {
              if (TT == 1 && q % 2) blk2[r] = _mm512_fmadd_ps(f, xv[t], blk2[r]);
              else blk[r][t] = _mm512_fmadd_ps(f, xv[t], blk[r][t]);
            }
          }
        }
      } else {
        __m512i xa[TT], xb[TT];
        #pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) {
          const bf16_t* x = static_cast<const bf16_t*>(xp[t]);
          xa[t] = _mm512_loadu_si512(x + k);
          xb[t] = _mm512_loadu_si512(x + k + 32);
        }
        #pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i h, l;
          f8_bytes(half ? _mm512_maskz_loadu_epi64(0x0F, w[r] + k) : _mm512_loadu_si512(w[r] + k), tab, h, l);
          const __m512i wa = _mm512_unpacklo_epi8(l, h);
          #pragma GCC unroll 8
          for (int t = 0; t < TT; ++t) blk[r][t] = dpbf16(blk[r][t], (__m512bh)wa, (__m512bh)xa[t]);
          const __m512i wb = _mm512_unpackhi_epi8(l, h);
          #pragma GCC unroll 8
          for (int t = 0; t < TT; ++t) blk[r][t] = dpbf16(blk[r][t], (__m512bh)wb, (__m512bh)xb[t]);
        }
      }
    };
    int k = k0;
    for (; k + 64 <= k1; k += 64) step(k, std::false_type{});
    if (k < k1) step(k, std::true_type{});
    if constexpr (kWide && TT == 1)
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) blk[r][0] = _mm512_add_ps(blk[r][0], blk2[r]);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 sv = _mm512_set1_ps(s[r][bi] * kF8Unscale);
      #pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        if constexpr (kRegs) {
          acc[r][t] = _mm512_fmadd_ps(blk[r][t], sv, acc[r][t]);
        } else {
          float* a = accm + (r * TT + t) * 16;
          _mm512_store_ps(a, _mm512_fmadd_ps(blk[r][t], sv, _mm512_load_ps(a)));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) {
      const __m512 a = kRegs ? acc[r][t] : _mm512_load_ps(accm + (r * TT + t) * 16);
      c[r * ldc + t] += hsum8(_mm256_add_ps(_mm512_castps512_ps256(a),
                                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))));
    }
}

struct Fp8Kn {
  static constexpr Dtype dtype = Dtype::fp8;
  // VnniKn's, but 2 rows at M = 3, 4 (their sums in registers; see the FP8 header above). The wide form
  // (AMX CPUs) took 4 rows at M = 2..4 as measured there before (T = 4 from L3: 2.7 ms, against 3.2);
  // 2 rows at M = 3, 4 are not measured on such a CPU.
  static constexpr QBlocking kBlocking{/*rows=*/{2, 4, 4, 2, 2}, /*prefetch=*/{0, 2, 2, 2, 2}, /*interleave=*/true,
                                       /*spread=*/{true, true, true, true, true}};
  static constexpr int task_rows = 256;
  // Zen 5's (the switch as VnniKn's): no prefetch at 1 token, tasks of 512 rows. On Zen 5 (2026-12-05,
  // as VnniKn's), against the default: T = 1 0.91x the time (Mixtral-8x7B), 0.92x (Qwen3-30B-A3B); T = 2
  // 1.06 / 0.95x, T = 4 1.00 / 1.01x (within the runs' spread). Not kept: 2 rows and no prefetch at 2
  // tokens too (T = 1 0.97 / 0.95x, T = 2 1.06 / 0.93x).
  struct Zen5 {
    static constexpr QBlocking kBlocking{/*rows=*/{2, 4, 4, 2, 2}, /*prefetch=*/{0, 0, 2, 2, 2}, /*interleave=*/true,
                                         /*spread=*/{true, true, true, true, true}};
    static constexpr int task_rows = 512;
  };
  static constexpr bool kAltBlocking = true;
  using AltBlocking = Zen5;
  static bool alt_blocking() { return avx512_blocking_zen5(); }
  template <int R, int TT, int PF>
  static void tile(const int8_t* const* w, const float* const* sw, const void* I, int M, int K, int, int kb0,
                   int kb1, int t0, float* c, int ldc, const int8_t* const* nxt) {
    const bool wide = f8_widen(M);   // one token (the conversion is what costs there), or no AMX: bf16
    const void* x[TT];
    for (int t = 0; t < TT; ++t)
      x[t] = wide ? static_cast<const void*>(static_cast<const float*>(I) + (t0 + t) * f8_ld(K))
                  : static_cast<const void*>(static_cast<const bf16_t*>(I) + (t0 + t) * f8_ld(K));
    if (wide) return f8_tile<R, TT, PF, true>(w, sw, x, kb0, kb1, c, ldc, nxt);
    f8_tile<R, TT, PF, false>(w, sw, x, kb0, kb1, c, ldc, nxt);
  }
  static const float* scale_row(const float* s, int64_t lds, int row, int) { return s + int64_t(row / 128) * lds; }
};

// The tokens: rows of f8_ld(K) (K to a whole 64-block, zero-padded): bf16 in f8_bf_pos order (x exactly;
// the intermediate rounded to nearest even); widened (f8_widen), fp32 in f8_tok_pos order.
size_t f8bf_packed_bytes(int M, int K, int) {
  return size_t(M) * f8_ld(K) * (f8_widen(M) ? sizeof(float) : sizeof(bf16_t));
}
// Token m's K values (a bf16 row of x, or the fp32 intermediate) into its packed row, the rest of the
// last 64-block 0: bf16 in f8_bf_pos order (x's bits as they are, the intermediate rounded), or in the
// widened form fp32 in f8_tok_pos order.
template <class Src>
inline void f8_put(const Src* v, int M, int m, int K, void* out) {
  constexpr bool kBf16Src = std::is_same_v<Src, bf16_t>;
  auto f32 = [v](int k) { if constexpr (kBf16Src) return bf16_to_f32(v[k]); else return v[k]; };
  auto b16 = [v](int k) { if constexpr (kBf16Src) return v[k]; else return f32_to_bf16(v[k]); };
  if (f8_widen(M)) {
    float* d = static_cast<float*>(out) + m * f8_ld(K);
    for (int64_t k = K; k < f8_ld(K); ++k) d[f8_tok_pos(int(k))] = 0.f;
    for (int k = 0; k < K; ++k) d[f8_tok_pos(k)] = f32(k);
  } else {
    bf16_t* d = static_cast<bf16_t*>(out) + m * f8_ld(K);
    for (int64_t k = K; k < f8_ld(K); ++k) d[f8_bf_pos(int(k))] = 0;
    for (int k = 0; k < K; ++k) d[f8_bf_pos(k)] = b16(k);
  }
}
void f8bf_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int, void* I) {
  for (int m = 0; m < M; ++m) f8_put(x + int64_t(rows[m]) * ldx, M, m, K, I);
}
void f8bf_pack_act(const float* act, int M, int K, int, void* out) {
  for (int m = 0; m < M; ++m) f8_put(act + int64_t(m) * K, M, m, K, out);
}

}  // namespace

#define HINA_QUANT_AVX512_ISA(dtype) HINA_AVX512_ISA, dtype, HINA_AVX512_CPU_ISA("")
#define HINA_QUANT_AVX512_VBMI_ISA(dtype) HINA_AVX512_ISA, dtype, HINA_AVX512_CPU_ISA("-vbmi")   // cpu.cpp's isa_usable
const QuantMicroKernel HINA_AVX512_ENTRY(quant_microkernel_avx512_int8){
    HINA_QUANT_AVX512_ISA(Dtype::int8), VnniKn::task_rows, vnni_packed_bytes, vnni_pack_tokens, vnni_pack_act,
    q_gate_up_now<VnniKn>, q_down_now<VnniKn>, q_task_rows_now<VnniKn>};
const QuantMicroKernel HINA_AVX512_ENTRY(quant_microkernel_avx512_fp8){
    HINA_QUANT_AVX512_VBMI_ISA(Dtype::fp8), Fp8Kn::task_rows, f8bf_packed_bytes, f8bf_pack_tokens, f8bf_pack_act,
    q_gate_up_now<Fp8Kn>, q_down_now<Fp8Kn>, q_task_rows_now<Fp8Kn>};
#undef HINA_QUANT_AVX512_ISA
#undef HINA_QUANT_AVX512_VBMI_ISA

}  // namespace hina
