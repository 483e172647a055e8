// The AVX-512 vector steps the attention micro-kernels share: the AVX-512 BF16 kernel
// (attention_avx512.cpp, real and SIMDe-emulated) and the AMX kernel's non-tile steps
// (attention_amx.cpp: every AMX CPU has AVX-512 BF16). exp2_ps and bf16_16 also serve the AMX FFN
// kernel's SiLU store (microkernel_amx.cpp). The including file brings the intrinsics
// (<immintrin.h> or SIMDe's), so this header works under both.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace hina {
namespace vec512 {

// The horizontal sum of 16 lanes, a halving tree: [j] + [j + 8], then [j] + [j + 4], [j] + [j + 2],
// [j] + [j + 1]; the same instructions native and under SIMDe, so both builds give the same bits.
inline float hsum16(__m512 v) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// Lane i of the result = hsum16(v[i]), to the bit (IEEE addition is commutative, and each level adds
// the same two partials as the tree above), in ~2 instructions per sum instead of ~8. The levels work
// on pairs of vectors; the inputs are taken in the order u[4e + l] = v[4l + e], which the levels'
// interleaving turns back into lane order.
__attribute__((always_inline)) inline __m512 hsum16x16(const __m512 (&v)[16]) {
  __m512 h8[8], h4[4], h2[2];
  #pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // [j] + [j + 8]: two inputs per vector (256-bit halves)
    const int a = 2 * i, b = 2 * i + 1;
    const __m512 x = v[4 * (a % 4) + a / 4], y = v[4 * (b % 4) + b / 4];
    h8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  #pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // [j] + [j + 4]: four inputs per vector (128-bit lanes)
    h4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h8[2 * i], h8[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(h8[2 * i], h8[2 * i + 1], 0xDD));
  #pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {  // [j] + [j + 2]
    const __m512d x = _mm512_castps_pd(h4[2 * i]), y = _mm512_castps_pd(h4[2 * i + 1]);
    h2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(h2[0], h2[1], 0x88),  // [j] + [j + 1]
                       _mm512_shuffle_ps(h2[0], h2[1], 0xDD));
}

// f32_to_bf16 (numeric.h) on 16 lanes: round to nearest even, NaN kept quiet; the bf16 in each lane's
// low half. The same bits as the scalar form (vcvtne2ps2bf16 treats denormal inputs as zero, and
// SIMDe lacks it). Also the AMX FFN kernel's store (microkernel_amx.cpp).
inline __m512i bf16_16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40)));
}

// The first n of 16 lanes (n <= 0: none, n >= 16: all).
inline __mmask16 first_lanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 2^x: round to nearest, degree-6 polynomial on [-1/2, 1/2] (rel. error ~1e-7); x below -126 (and a
// masked key's -inf) gives exactly 0, and those lanes are never scaled (no denormal to assist).
// 2^round(x) applied by vscalefps, rounding by vrndscaleps: 10 operations where the integer
// conversions and the exponent built by hand took 15, with the same bits for x >= -126 (scalef is an
// exact scaling, as the product by the power of two was; above 127 it gives inf, not a wrapped exponent).
inline __m512 exp2_ps(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.f), _CMP_GE_OQ);
  const __m512 xr = _mm512_roundscale_ps(x, 0x08);   // to nearest, no exceptions
  const __m512 f = _mm512_sub_ps(x, xr);
  __m512 p = _mm512_set1_ps(1.540353039e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.333355815e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129108e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265070e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471806e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(keep, p, xr);
}

// The online-softmax step of AttnMicroKernel::softmax_step (ops/attention.h), 16 keys per vector.
// Keys [nkeys, round-up-16) of each row are set to -inf first, so they come out as exactly 0.
// Sixteen rows at a time: each row's max and exponentials in turn, then the rows' sums (hsum16x16),
// alphas (one exp2_ps) and l (one fma) as vectors -- per lane the bits of the one-row form (hsum16,
// exp2_ps of a broadcast, one fma: the AVX-512 kernel's fused step computes them so too).
inline void softmax_step(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int n16 = (nkeys + 15) & ~15;   // <= lds (chunk_keys is a multiple of 16)
  for (int r0 = 0; r0 < nrows; r0 += 16) {
    const int nr = nrows - r0 < 16 ? nrows - r0 : 16;
    __m512 sums[16];
    alignas(64) float mx[16], mo[16];
    __mmask16 live = 0;   // rows with a key to see (a fully masked row keeps m, l and O)
    for (int i = 0; i < 16; ++i) {
      sums[i] = _mm512_setzero_ps();
      mx[i] = ninf;
      mo[i] = ninf;
      if (i >= nr) continue;
      const int r = r0 + i;
      float* s = S + int64_t(r) * lds;
      for (int j = nkeys; j < n16; ++j) s[j] = ninf;
      __m512 vmax = _mm512_set1_ps(m[r]);
      for (int j = 0; j < n16; j += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(s + j));
      const float x = _mm512_reduce_max_ps(vmax);
      if (x == ninf) {
        for (int j = 0; j < n16; j += 16) _mm512_storeu_ps(s + j, _mm512_setzero_ps());
        continue;
      }
      live |= __mmask16(1u << i);
      mx[i] = x;
      mo[i] = m[r];
      const __m512 vm = _mm512_set1_ps(x);
      __m512 sum = _mm512_setzero_ps();
      for (int j = 0; j < n16; j += 16) {
        const __m512 p = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        _mm512_storeu_ps(s + j, p);
        sum = _mm512_add_ps(sum, p);
      }
      sums[i] = sum;
    }
    if (!live) continue;
    const __m512 vmx = _mm512_load_ps(mx), vmo = _mm512_load_ps(mo);
    // alpha = 2^(m_old - m_new); m_old = -inf: 0 (exp2_ps's underflow); dead lanes (NaN: 0) are never used
    alignas(64) float alpha[16];
    _mm512_store_ps(alpha, exp2_ps(_mm512_sub_ps(vmo, vmx)));
    const __m512 vl = _mm512_maskz_loadu_ps(first_lanes(nr), l + r0);
    const __m512 nl = _mm512_fmadd_ps(vl, _mm512_load_ps(alpha), hsum16x16(sums));
    _mm512_mask_storeu_ps(l + r0, live, nl);
    _mm512_mask_storeu_ps(m + r0, live, vmx);
    for (int i = 0; i < nr; ++i) {
      if (!(live >> i & 1) || alpha[i] == 1.f) continue;
      const __m512 a = _mm512_set1_ps(alpha[i]);
      float* o = O + int64_t(r0 + i) * d;
      for (int k = 0; k < d; k += 16) _mm512_storeu_ps(o + k, _mm512_mul_ps(_mm512_loadu_ps(o + k), a));
    }
  }
}

}  // namespace vec512
}  // namespace hina
