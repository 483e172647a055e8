// AVX2 read loops and FMA peak loop (compiled with -mavx2 -mfma; called only after a cpuid check).
#include <immintrin.h>

#include "common.h"

namespace hina {

// mode 0: plain loads, 256 B per iteration; 1: plus a software prefetch 1 KiB ahead;
// 2: two streams (the two halves of the range) read alternately.
static inline __m256i read_block(const uint8_t* p, __m256i acc) {
  __m256i a = _mm256_loadu_si256((const __m256i*)p);
  __m256i b = _mm256_loadu_si256((const __m256i*)(p + 32));
  __m256i c = _mm256_loadu_si256((const __m256i*)(p + 64));
  __m256i d = _mm256_loadu_si256((const __m256i*)(p + 96));
  return _mm256_xor_si256(acc, _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
}

uint64_t read_avx2(const uint8_t* p, size_t n, int mode) {
  __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
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
  acc0 = _mm256_xor_si256(acc0, acc1);
  alignas(32) uint64_t v[4];
  _mm256_store_si256((__m256i*)v, acc0);
  return r ^ v[0] ^ v[1] ^ v[2] ^ v[3];
}

double fma_avx2(int64_t iters) {
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0;
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, x, y); a1 = _mm256_fmadd_ps(a1, x, y);
    a2 = _mm256_fmadd_ps(a2, x, y); a3 = _mm256_fmadd_ps(a3, x, y);
    a4 = _mm256_fmadd_ps(a4, x, y); a5 = _mm256_fmadd_ps(a5, x, y);
    a6 = _mm256_fmadd_ps(a6, x, y); a7 = _mm256_fmadd_ps(a7, x, y);
    a8 = _mm256_fmadd_ps(a8, x, y); a9 = _mm256_fmadd_ps(a9, x, y);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(_mm256_add_ps(a6, a7),
                                                                              _mm256_add_ps(a8, a9))));
  alignas(32) float v[8];
  _mm256_store_ps(v, s);
  volatile float sink = v[0];
  (void)sink;
  return double(iters) * 10 * 8 * 2;
}

}  // namespace hina
