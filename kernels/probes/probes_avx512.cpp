// AVX-512 read loops and FMA / BF16 dot-product peak loops (compiled with AVX-512 flags; called only
// after a cpuid + XCR0 check).
#include <immintrin.h>

#include "common.h"

namespace hina {

static inline __m512i read_block(const uint8_t* p, __m512i acc) {
  __m512i a = _mm512_loadu_si512((const void*)p);
  __m512i b = _mm512_loadu_si512((const void*)(p + 64));
  return _mm512_ternarylogic_epi64(acc, a, b, 0x96);  // acc ^ a ^ b
}

// Modes as in probes_avx2.cpp: 0 plain, 1 software prefetch 1 KiB ahead, 2 two interleaved streams.
uint64_t read_avx512(const uint8_t* p, size_t n, int mode) {
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  size_t i = 0;
  const size_t step = 256;
  if (mode == 2) {
    size_t half = (n / 2) & ~size_t(step - 1);
    const uint8_t* q = p + half;
    for (; i + step <= half; i += step) {
      acc0 = read_block(p + i, acc0);
      acc1 = read_block(q + i, acc1);
      acc0 = read_block(p + i + 128, acc0);
      acc1 = read_block(q + i + 128, acc1);
    }
    p += 2 * half;
    n -= 2 * half;
    i = 0;
  }
  for (; i + step <= n; i += step) {
    if (mode == 1) _mm_prefetch((const char*)(p + i + 1024), _MM_HINT_T0);
    acc0 = read_block(p + i, acc0);
    acc1 = read_block(p + i + 128, acc1);
  }
  uint64_t r = 0;
  for (; i < n; ++i) r ^= p[i];
  acc0 = _mm512_xor_si512(acc0, acc1);
  return r ^ uint64_t(_mm512_reduce_add_epi64(acc0));
}

double fma_avx512(int64_t iters) {
  __m512 a0 = _mm512_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0;
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, x, y); a1 = _mm512_fmadd_ps(a1, x, y);
    a2 = _mm512_fmadd_ps(a2, x, y); a3 = _mm512_fmadd_ps(a3, x, y);
    a4 = _mm512_fmadd_ps(a4, x, y); a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y); a7 = _mm512_fmadd_ps(a7, x, y);
    a8 = _mm512_fmadd_ps(a8, x, y); a9 = _mm512_fmadd_ps(a9, x, y);
  }
  volatile float sink = _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(a4, a5),
                                  _mm512_add_ps(_mm512_add_ps(a6, a7), _mm512_add_ps(a8, a9)))));
  (void)sink;
  return double(iters) * 10 * 16 * 2;
}

// vdpbf16ps: 16 lanes x 2 bf16 products x (mul + add) = 64 FLOP per instruction.
double dpbf16_avx512(int64_t iters) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0;
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_dpbf16_ps(a0, x, y); a1 = _mm512_dpbf16_ps(a1, x, y);
    a2 = _mm512_dpbf16_ps(a2, x, y); a3 = _mm512_dpbf16_ps(a3, x, y);
    a4 = _mm512_dpbf16_ps(a4, x, y); a5 = _mm512_dpbf16_ps(a5, x, y);
    a6 = _mm512_dpbf16_ps(a6, x, y); a7 = _mm512_dpbf16_ps(a7, x, y);
    a8 = _mm512_dpbf16_ps(a8, x, y); a9 = _mm512_dpbf16_ps(a9, x, y);
  }
  volatile float sink = _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(a4, a5),
                                  _mm512_add_ps(_mm512_add_ps(a6, a7), _mm512_add_ps(a8, a9)))));
  (void)sink;
  return double(iters) * 10 * 64;
}

}  // namespace hina
