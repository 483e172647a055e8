// AVX-512 read loops and FMA / BF16 dot-product peak loops (compiled with AVX-512 flags; called only
// after a cpuid + XCR0 check).
#include <immintrin.h>

#include "common.h"
#include "probes/loops.h"

namespace hina {

// Modes: loops.h.
uint64_t read_avx512(const uint8_t* p, size_t n, int mode) {
  auto block = [](const uint8_t* q, __m512i acc) {  // 128 bytes
    __m512i a = _mm512_loadu_si512((const void*)q);
    __m512i b = _mm512_loadu_si512((const void*)(q + 64));
    return _mm512_ternarylogic_epi64(acc, a, b, 0x96);  // acc ^ a ^ b
  };
  auto fold = [](__m512i a, __m512i b) { return uint64_t(_mm512_reduce_add_epi64(_mm512_xor_si512(a, b))); };
  return read_loop(p, n, mode, _mm512_setzero_si512(), block, fold);
}

// vfmadd on 16 fp32 lanes: 32 FLOP per instruction. 20 chains (loops.h): on Zen 5 the BF16 dot with 10
// read 861 GFLOP/s over 2 threads and with 20 1041; the FMA 524 either way.
double fma_avx512(int64_t iters) {
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  return peak_loop<20>(_mm512_set1_ps(1.0f), [=](__m512 a) { return _mm512_fmadd_ps(a, x, y); }, 16 * 2, iters);
}

// vdpbf16ps: 16 lanes x 2 bf16 products x (mul + add) = 64 FLOP per instruction.
double dpbf16_avx512(int64_t iters) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  return peak_loop<20>(_mm512_setzero_ps(), [=](__m512 a) { return _mm512_dpbf16_ps(a, x, y); }, 64, iters);
}

// vpdpbusd on 16 int32 lanes: 16 x 4 u8 x s8 products x (mul + add) = 128 integer ops per instruction:
// the compute roofline of INT8 (W8A8) kernels on VNNI (an FP32 or BF16 peak understates it 4x / 2x).
double dpbusd_avx512(int64_t iters) {
  const __m512i x = _mm512_set1_epi32(0x01010101), y = _mm512_set1_epi32(0x01020304);
  // 10 chains: 20 halved the rate on Zen 5 (2011 -> 1031 GOP/s over 2 threads; not pinned down: GCC 12
  // copies the accumulators around this intrinsic in the kernels, quant_avx512.cpp's dpbusd), and 10
  // already read two 512-bit vpdpbusd a cycle there.
  return peak_loop(_mm512_setzero_si512(), [=](__m512i a) { return _mm512_dpbusd_epi32(a, x, y); }, 128, iters);
}

}  // namespace hina
