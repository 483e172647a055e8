// AVX2 read loops and the FMA and int16 multiply-add peak loops (compiled with -mavx2 -mfma; called
// only after a cpuid check).
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

// vpmaddwd + vpaddd on 16 int16 pairs: 16 multiply-adds, 32 integer ops per pair of instructions; the
// AVX2 INT8 kernel's step per token and 16 weights (quant_avx2.cpp: no VNNI, W and x widened to int16).
// The products do not depend on the chain (as the kernel's do not), so an empty asm tells the compiler
// that x changes at every step: without it the loop-invariant vpmaddwd is hoisted and the loop times
// the adds alone.
double maddwd_avx2(int64_t iters) {
  const __m256i y = _mm256_set1_epi16(-2);
  __m256i x = _mm256_set1_epi16(3);
  return peak_loop(_mm256_set1_epi32(1), [=](__m256i a) mutable {
    asm volatile("" : "+x"(x));
    return _mm256_add_epi32(a, _mm256_madd_epi16(x, y));
  }, 32, iters);
}

}  // namespace hina
