// The AVX-512 VNNI INT8 W8A8 micro-kernel (quant.h's contract; compiled with the AVX-512 flags, run
// only after isa_usable("avx512"): every CPU we know with AVX512_BF16 -- Cooper Lake, Sapphire Rapids,
// Zen 4/5 -- also has AVX512_VNNI).
//
// vpdpbusd multiplies unsigned bytes by signed bytes, four per 32-bit lane, and adds to int32. The
// token side is made unsigned in the gather (transformation 1): x_u8 = x_s8 + 128 (x in [-127, 127],
// so x_u8 in [1, 255]); then per group
//     sum_k x_u8[k] * w[k] = sum_k x[k] * w[k] + 128 * sum_k w[k]
// and the compensation term 128 * sum_k w[k] is one more vpdpbusd per W chunk, of the byte 0x80 (128
// unsigned) with w, shared by every token of the tile: acc - comp is the exact int32 dot. Per group
// of g (32/64/128) along K the int32 sums are scaled in fp32 by s_w[row][group] * s_x[token][group],
// as in the AVX2 kernel (quant_avx2.cpp). 256-bit vpdpbusd (AVX512_VL): a chunk of 32 bytes lies
// inside one group for every g. FP8 has no AVX-512 kernel yet (the AVX2 one runs on these CPUs).
//
// Built twice from this one source: for real (`_C`, isa "avx512") and against SIMDe's portable
// AVX-512 (HINA_EMU_AVX512, `_C_avx512_emu`, isa "avx512-emulated"), so the same tests run it here.
#if defined(HINA_EMU_AVX512)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#else
#include <immintrin.h>
#endif

#include "quant_glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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
        comp[r] = _mm256_dpbusd_epi32(comp[r], bias, wv);
        #pragma GCC unroll 8
        for (int t = 0; t < TT; ++t) acc[r][t] = _mm256_dpbusd_epi32(acc[r][t], xv[t], wv);
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

struct VnniKn {
  static constexpr Dtype dtype = Dtype::int8;
  // the AVX2 kernel's decode blocking (quant_avx2.cpp: gate/up interleaved, 4 rows at M = 1, 2 from
  // M = 2, the next tile's rows prefetched into L2). Against the first one ({8, 2, ...} rows, no
  // prefetch, no interleave) on a 2-vCPU Sapphire Rapids (2026-12-01): Qwen3-30B-A3B T = 1 / 2 / 4
  // 1.81 / 1.92 / 2.11 ms vs 2.42 / 3.04 / 3.72, Mixtral 12.7 / 13.9 / 14.6 vs 13.5 / 16.3 / 19.2.
  // Spread (QBlocking::spread) and 256-row tasks, on the same machine (Qwen3-30B-A3B T = 1 / 4, DRAM):
  // 1.91 / 2.11 ms -> 1.66 / 2.05 (spread) -> 1.58 / 1.90 (and 256 rows: the rows of a tile further
  // apart, fewer tasks).
  static constexpr QBlocking kBlocking{/*rows=*/{2, 4, 2, 2, 2}, /*prefetch=*/{0, 2, 2, 2, 2}, /*interleave=*/true,
                                       /*spread=*/true};
  template <int R, int TT, int PF>
  static void tile(const int8_t* const* w, const float* const* sw, const void* I, int M, int K, int group,
                   int kb0, int kb1, int t0, float* c, int ldc, const int8_t* const* nxt) {
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
  static const float* scale_row(const float* s, int64_t lds, int row, int) { return s + int64_t(row) * lds; }
};

}  // namespace

#if defined(HINA_EMU_AVX512)
#define HINA_QUANT_AVX512_ISA "avx512-emulated", Dtype::int8, nullptr
#else
#define HINA_QUANT_AVX512_ISA "avx512", Dtype::int8, "avx512"
#endif
const QuantMicroKernel quant_microkernel_avx512_int8{
    HINA_QUANT_AVX512_ISA, /*task_rows=*/256, i8_packed_bytes<uint8_t>, i8_pack_tokens<uint8_t, 128>,
    i8_pack_act<uint8_t, 128>, q_gate_up<VnniKn>, q_down<VnniKn>};
#undef HINA_QUANT_AVX512_ISA

}  // namespace hina
