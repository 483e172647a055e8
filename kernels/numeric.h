// Scalar numerics shared by every micro-kernel and the driver: bf16 <-> fp32 and SiLU(g) * u.
//
// Everything here is `static inline` (internal linkage): each ISA-flagged file keeps its own copy, so
// no file built with -mavx512* can lend its machine code to another (see glue.h, LINKAGE).
#pragma once
#include <cstdint>

namespace hina {

using bf16_t = uint16_t;  // raw bfloat16 bits

// e^x in fp32 without a call or a branch, so that loops over it vectorize (libm's expf is a call per
// element): x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' expf polynomial, 2^n built in the exponent
// bits; within 2 ulp of expf on [-87, 88], x clamped there (e^x of a NaN is garbage: silu_mul keeps the
// NaN through g). n is rounded with the 1.5 * 2^23 trick (no SSE4.1 round needed).
static inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float two_n;
  __builtin_memcpy(&two_n, &bits, 4);
  return e * two_n;
}

// SiLU(g) * u in fp32: transformation 2 of every kernel (gate_up's store, store_act).
static inline float silu_mul(float g, float u) {
  return g / (1.0f + exp_poly(-g)) * u;
}

// fp32 -> bf16, round to nearest even (NaN kept quiet).
static inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t(u >> 16);
}

static inline float bf16_to_f32(bf16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace hina
