// e4m3 -> bf16 by byte tables (vpermt2b, AVX512_VBMI): what the AVX-512 FP8 kernel (quant_avx512.cpp,
// real and SIMDe-emulated) and the AMX FP8 unpack (quant_amx.cpp, real build) share. The including file
// brings the intrinsics (<immintrin.h> or SIMDe's). VBMI is not in those files' flags (the INT8 kernel
// beside the FP8 one runs on Cooper Lake, which lacks it): the functions that need it carry
// HINA_VBMI, and their callers must too (or check cpu_features().avx512_vbmi first).
// LINKAGE: as glue.h -- internal linkage (anonymous namespace), include only from ISA files.
#pragma once

#include <cstdint>

#if defined(HINA_EMU_AVX512)
#define HINA_VBMI
#else
#define HINA_VBMI __attribute__((target("avx512vbmi")))
#endif

namespace hina {
namespace {  // internal linkage, on purpose: see glue.h, LINKAGE

// The tables: the high and the low byte of each magnitude's bf16 (exact: every e4m3fn value, subnormals
// included, is a bf16 normal), and the byte permutations that put them together.
constexpr uint16_t f8_bf16_bits(int m) {   // the bf16 of e4m3fn magnitude m (sign bit clear), m < 128
  const int e = m >> 3, f = m & 7;
  if (m == 0x7F) return 0x7FC0;                                          // NaN
  if (e) return uint16_t(((e + 120) << 7) | (f << 4));                  // (1 + f/8) 2^(e-7)
  if (!f) return 0;
  const int h = f >= 4 ? 2 : f >= 2 ? 1 : 0;                             // f 2^-9 = (f / 2^h) 2^(h-9)
  return uint16_t(((118 + h) << 7) | ((f - (1 << h)) << (7 - h)));
}
struct F8Lut {
  alignas(64) uint8_t hi[128];
  alignas(64) uint8_t lo[128];
  alignas(64) uint8_t f32[4][64]; // fp32 of weight 16q + j in dword j: bytes 2, 3 <- lo, hi (0, 1: masked)
};
// down: the table of each value times 2^-down (exact for down <= 117: the smallest subnormal, 2^-9,
// stays a bf16 normal), the AMX few-token tiles' (quant_amx.cpp)
constexpr uint16_t f8_bf16_bits_down(int m, int down) {
  const uint16_t b = f8_bf16_bits(m);
  return b == 0 || m == 0x7F ? b : uint16_t(b - (down << 7));
}
constexpr F8Lut make_f8_lut(int down = 0) {
  F8Lut t{};
  for (int m = 0; m < 128; ++m) {
    t.hi[m] = uint8_t(f8_bf16_bits_down(m, down) >> 8);
    t.lo[m] = uint8_t(f8_bf16_bits_down(m, down) & 0xFF);
  }
  for (int i = 0; i < 64; ++i)
    for (int q = 0; q < 4; ++q) t.f32[q][i] = uint8_t((i % 4 == 3 ? 64 : 0) + 16 * q + i / 4);
  return t;
}
alignas(64) constexpr F8Lut kF8Lut = make_f8_lut();

// The lookup tables in registers, loaded once per call of a kernel.
struct F8Tables {
  __m512i hi0, hi1, lo0, lo1;
  explicit F8Tables(const F8Lut& t = kF8Lut)
      : hi0(_mm512_load_si512(t.hi)), hi1(_mm512_load_si512(t.hi + 64)),
        lo0(_mm512_load_si512(t.lo)), lo1(_mm512_load_si512(t.lo + 64)) {}
};
// e4m3 bytes b (64, or 32 in the low half) -> the high and low bytes of their bf16s
HINA_VBMI inline void f8_bytes(__m512i b, const F8Tables& t, __m512i& h, __m512i& l) {
  h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, b, t.hi1), b, _mm512_set1_epi8(int8_t(0x80)),
                                0xF8);   // A | B&C: the sign
  l = _mm512_permutex2var_epi8(t.lo0, b, t.lo1);
}

}  // namespace
}  // namespace hina
