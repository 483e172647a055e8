// AVX2 read loops and the FMA and int16 multiply-add peak loops (compiled with -mavx2 -mfma; called
// only after a cpuid check).
#include <immintrin.h>

#include "common.h"
#include "probes/loops.h"

namespace hina {

namespace {
uint64_t xor_fold(__m256i a) {   // the four 64-bit lanes xor-ed
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), a);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}
}  // namespace

// Modes: loops.h.
uint64_t read_avx2(const uint8_t* p, size_t n, int mode) {
  auto block = [](const uint8_t* q, __m256i acc) {  // 128 bytes
    __m256i a = _mm256_loadu_si256((const __m256i*)q);
    __m256i b = _mm256_loadu_si256((const __m256i*)(q + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(q + 64));
    __m256i d = _mm256_loadu_si256((const __m256i*)(q + 96));
    return _mm256_xor_si256(acc, _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  };
  auto fold = [](__m256i a, __m256i b) { return xor_fold(_mm256_xor_si256(a, b)); };
  return read_loop(p, n, mode, _mm256_setzero_si256(), block, fold);
}

// The overlap probe's loop (probes.cpp, stream_work_pass): per 64-byte line, its two 32-byte halves
// loaded (and xor-ed into a sum, so that no load is dropped) and `work` rounds of 8 FMA chains that take
// them as addends, c = c * 0.5 + x: every FMA waits for its line, as a kernel's arithmetic waits for its
// operands, and the chains settle near 2 x (never denormal, never infinite on the buffers the command
// fills). A round is 8 x 16 = 128 FLOP: 2 FLOP per byte of the line. With ahead > 0 each line also
// prefetches (prefetcht1, into L2) the line `ahead` bytes further: one per line, spread over the work.
uint64_t stream_work_avx2(const uint8_t* p, size_t n, int work, size_t ahead) {
  const __m256 half = _mm256_set1_ps(0.5f);
  __m256 c0 = _mm256_set1_ps(0.f), c1 = _mm256_set1_ps(1.f), c2 = _mm256_set1_ps(2.f), c3 = _mm256_set1_ps(3.f);
  __m256 c4 = _mm256_set1_ps(4.f), c5 = _mm256_set1_ps(5.f), c6 = _mm256_set1_ps(6.f), c7 = _mm256_set1_ps(7.f);
  __m256i acc = _mm256_setzero_si256();
  for (size_t i = 0; i + 64 <= n; i += 64) {
    if (ahead) _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T1);   // never faults
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32));
    acc = _mm256_xor_si256(acc, _mm256_xor_si256(a, b));
    const __m256 x = _mm256_castsi256_ps(a), y = _mm256_castsi256_ps(b);
    for (int r = 0; r < work; ++r) {
      c0 = _mm256_fmadd_ps(c0, half, x); c1 = _mm256_fmadd_ps(c1, half, y);
      c2 = _mm256_fmadd_ps(c2, half, x); c3 = _mm256_fmadd_ps(c3, half, y);
      c4 = _mm256_fmadd_ps(c4, half, x); c5 = _mm256_fmadd_ps(c5, half, y);
      c6 = _mm256_fmadd_ps(c6, half, x); c7 = _mm256_fmadd_ps(c7, half, y);
    }
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                 _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  return xor_fold(_mm256_xor_si256(acc, _mm256_castps_si256(s)));
}

// vfmadd on 8 fp32 lanes: 16 FLOP per instruction.
double fma_avx2(int64_t iters) {
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  return peak_loop(_mm256_set1_ps(1.0f), [=](__m256 a) { return _mm256_fmadd_ps(a, x, y); }, 8 * 2, iters);
}

// vpmaddwd + vpaddd on 16 int16 pairs: 16 multiply-adds, 32 integer ops per pair of instructions; the
// AVX2 INT8 kernel's step per token and 16 weights until 2026-12-07 (W and x widened to int16).
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

// The AVX2 INT8 kernel's step per token and 32 weights since 2026-12-07 (quant_avx2.cpp, the sign
// trick): vpsignb, vpmaddubsw, vpmaddwd by ones, vpaddd: 32 multiply-adds, 64 integer ops per four
// instructions. |w| (vpabsb, once per row and shared by the tile's tokens) is hoisted, as in the kernel
// at 4 tokens; x changes at every step (the empty asm, as above).
double maddubs_avx2(int64_t iters) {
  const __m256i w = _mm256_set1_epi8(-3), aw = _mm256_abs_epi8(w), ones = _mm256_set1_epi16(1);
  __m256i x = _mm256_set1_epi8(5);
  return peak_loop(_mm256_set1_epi32(1), [=](__m256i a) mutable {
    asm volatile("" : "+x"(x));
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones));
  }, 64, iters);
}

}  // namespace hina
