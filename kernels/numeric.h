// Scalar numerics shared by every micro-kernel and the driver: bf16 <-> fp32 and SiLU(g) * u.
//
// Everything here is `static inline` (internal linkage): each ISA-flagged file keeps its own copy, so
// no file built with -mavx512* can lend its machine code to another (see glue.h, LINKAGE).
#pragma once
#include <cstdint>

namespace hina {

using bf16_t = uint16_t;  // raw bfloat16 bits

// SiLU(g) * u in fp32: transformation 2 of every kernel (gate_up's store, store_act).
static inline float silu_mul(float g, float u) {
  return g / (1.0f + __builtin_expf(-g)) * u;
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
