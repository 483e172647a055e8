// The HiNa-MoE expert-FFN operator (paper Section 4): the interface between the driver
// (moe_ffn.cpp) and the per-ISA micro-kernels (microkernel_<isa>.cpp), and the pybind11 entry
// point shared by the main `_C` module and the emulated builds (`_C_amx_emu`, `_C_avx512_emu`).
//
// Division of labour (KTransformers/SGLang style: one operator driver over small per-ISA kernels):
//   driver       group tokens by expert, schedule (expert, output-block) tasks on all threads,
//                routing-weighted scatter-add back to token order;
//   micro-kernel the three things that depend on the instructions:
//                  pack_tokens  transformation 1: gather x rows into I, already in the layout the
//                               ISA's MM wants ("transform I, not W");
//                  gate_up      Algorithm 1 on W_gate and W_up, SiLU(gate)*up fused into the store,
//                               which writes the activation in the same ISA layout (transformation 2);
//                  down         Algorithm 1 on W_down, transpose fused into the store, which writes
//                               y[token][h] row-major fp32 (transformation 3).
// Weights are read in place, in the framework's layout: out x in, row-major, rows contiguous
// along K, any row stride and any expert stride. Nothing ever copies, repacks or converts them.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pybind11 { class module_; }

namespace hina {

using bf16_t = uint16_t;  // raw bfloat16 bits

// H and I must be multiples of this (the AMX tile's k_r = 32; every MoE model we know uses
// multiples of 128). Other shapes are rejected with a clear error: there is no tail code.
constexpr int kShapeMultiple = 32;

// One gate/up task: rows [n0, n0 + n) of W_gate and W_up of one expert, for all M gathered tokens.
struct GateUpTask {
  const bf16_t* w_gate;  // row n0 of this expert's W_gate   [I, H], row stride ldw_gate
  const bf16_t* w_up;    // row n0 of this expert's W_up     [I, H], row stride ldw_up
  int64_t ldw_gate, ldw_up;  // elements
  int n0, n;             // the output-block: intermediate columns [n0, n0+n); n0, n multiples of 32
  int K;                 // = H
  int M;                 // tokens gathered for this expert
  const void* I;         // the packed token matrix [M, H] (pack_tokens' layout)
  void* act;             // the packed activation [M, I_size] (same layout, K = I_size); this task
  int act_K;             //   writes its columns [n0, n0+n)
};

// One down task: rows [n0, n0 + n) of W_down [H, I] of one expert.
struct DownTask {
  const bf16_t* w_down;  // row n0 of this expert's W_down, row stride ldw
  int64_t ldw;
  int n0, n;             // output columns (hidden units) [n0, n0+n)
  int K;                 // = I_size
  int M;
  const void* act;       // packed activation from gate_up
  float* y;              // y[m * ldy + n0 + j] = (act_m . W_down[n0 + j]), row-major fp32
  int64_t ldy;
};

struct MicroKernel {
  const char* isa;
  int row_block;  // preferred output-block rows per task (a multiple of 32)
  // Bytes of a packed [M, K] matrix in this kernel's layout (64-byte aligned by the caller).
  size_t (*packed_bytes)(int M, int K);
  // Transformation 1: I[m] = x[rows[m]] for m < M, written in this kernel's layout.
  void (*pack_tokens)(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I);
  void (*gate_up)(const GateUpTask& t);
  void (*down)(const DownTask& t);
};

// Per-ISA kernels (each in its own translation unit with its own ISA flags). A kernel is only ever
// called after cpu.cpp's isa_usable() said yes, so the module imports on any x86-64 CPU.
const MicroKernel& microkernel_scalar();
#if defined(HINA_EMU_AMX)
const MicroKernel& microkernel_amx();      // built against tile_emulator.h: isa "amx-emulated"
void register_tile_emulator_tests(pybind11::module_& m);  // the emulator's own entry points
#elif defined(HINA_EMU_AVX512)
const MicroKernel& microkernel_avx512();   // built against SIMDe: isa "avx512-emulated"
#else
const MicroKernel& microkernel_avx2();
const MicroKernel& microkernel_avx512();
const MicroKernel& microkernel_amx();
#endif

// SiLU(g) * u in fp32, shared by every kernel's gate_up store (transformation 2). These helpers are
// static: each ISA-flagged file keeps its own copy (see the note in microkernel_avx2.cpp).
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

// Adds the operator's entry points to a module (the main `_C` and the emulated builds alike).
void register_moe(pybind11::module_& m);

}  // namespace hina
