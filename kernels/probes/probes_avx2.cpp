// AVX2 read loops and FMA peak loop (compiled with -mavx2 -mfma; called only after a cpuid check).
#include <immintrin.h>

#include "common.h"
#include "probes/loops.h"

namespace hina {

// Modes: loops.h.
uint64_t read_avx2(const uint8_t* p, size_t n, int mode) {
  auto block = [](const uint8_t* q, __m256i acc) {  // 128 bytes
    __m256i a = _mm256_loadu_si256((const __m256i*)q);
    __m256i b = _mm256_loadu_si256((const __m256i*)(q + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(q + 64));
    __m256i d = _mm256_loadu_si256((const __m256i*)(q + 96));
    return _mm256_xor_si256(acc, _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  };
  auto fold = [](__m256i a, __m256i b) {
    alignas(32) uint64_t v[4];
    _mm256_store_si256((__m256i*)v, _mm256_xor_si256(a, b));
    return v[0] ^ v[1] ^ v[2] ^ v[3];
  };
  return read_loop(p, n, mode, _mm256_setzero_si256(), block, fold);
}

// vfmadd on 8 fp32 lanes: 16 FLOP per instruction.
double fma_avx2(int64_t iters) {
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  return peak_loop(_mm256_set1_ps(1.0f), [=](__m256 a) { return _mm256_fmadd_ps(a, x, y); }, 8 * 2, iters);
}

}  // namespace hina
