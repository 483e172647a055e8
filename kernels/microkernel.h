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
#include <string>

namespace pybind11 { class module_; }

namespace hina {

using bf16_t = uint16_t;  // raw bfloat16 bits

// H and I must be multiples of this (the AMX tile's k_r = 32; every MoE model we know uses
// multiples of 128). Other shapes are rejected with a clear error: there is no tail code.
constexpr int kShapeMultiple = 32;

// One gate/up task: rows [n0, n0 + n) of W_gate and W_up of one expert, for all M gathered tokens.
// The driver issues fused tasks only when all rows of W_gate share their piece cuts, and all rows of
// W_up theirs (row stride a multiple of 2048 elements); dots follow the canonical pieces above.
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

// ---- Canonical K pieces: the fixed summation order shared by the plain and the NUMA kernels -------
// Every dot product W[n] . I[m] is computed as a sum of *pieces*: row n is cut at each 4 KiB address
// boundary (every 2 MiB boundary is one too), rounded UP to the 32-element chunk (the AMX k_r; one
// 64-byte line when the row is 64-byte aligned, as torch allocates). Each piece is accumulated from
// zero by the micro-kernel (its own register/tile accumulators, its own horizontal sum), and the
// pieces are added to an fp32 0.f in ascending y. The plain kernel chains them in registers/L1; the
// NUMA-partitioned kernel computes each node's pieces on that node and the driver adds all pieces
// of a row in the same ascending order: the two give bit-identical results, for any node count,
// page model or thread count. A piece never spans a page boundary, so every interleaving (4 KiB or
// 2 MiB pages, any node count) assigns each whole piece to one node (a 32-element chunk that
// straddles a page edge -- only when a row is not 64-byte aligned -- goes with its first element).
constexpr int kPieceElems = 2048;  // bf16 elements per 4 KiB
constexpr int kMaxPieces = 160;    // pieces per row at most (K <= 157 * 2048)

// The first cut of a row at `p` (elements, a multiple of 32, in [0, 2048); 0: cuts at 2048, 4096..).
static inline int piece_phase(const void* p) {
  const int b = int((4096 - (reinterpret_cast<uintptr_t>(p) & 4095)) & 4095) / 2;
  return ((b + 31) & ~31) & (kPieceElems - 1);
}
// End of the piece starting at y (the first cut > y, capped at K).
static inline int piece_end(int y, int c0, int K) {
  const int c = c0 + kPieceElems * ((y - c0 + kPieceElems) / kPieceElems);
  return c < K ? c : K;
}
// Ordinal of the piece starting at y within its row (the number of cuts <= y).
static inline int piece_ordinal(int y, int c0) {
  if (c0 == 0) return y / kPieceElems;
  return y < c0 ? 0 : (y - c0) / kPieceElems + 1;
}
// All pieces of [0, K) for first cut c0, as (k0, k1) pairs; returns how many.
static inline int row_pieces(int c0, int K, int32_t* out) {
  int n = 0;
  for (int y = 0; y < K; y = piece_end(y, c0, K), ++n) {
    out[2 * n] = y;
    out[2 * n + 1] = piece_end(y, c0, K);
  }
  return n;
}

// One NUMA-partition task (or a plain-kernel task on rows of differing piece cuts): rows
// w, w + ldw, ..., w + (nrows-1)*ldw (ldw = T_x * row stride: rows x, x+T_x, ... share their cuts),
// for the listed pieces only; every piece's product goes to its own slot:
//   out[(r * npieces + p) * M + m] = sum_{k in piece p} W_r[k] * I_m[k]   (fresh accumulators)
struct PieceTask {
  const bf16_t* w;
  int64_t ldw;
  int nrows;
  const int32_t* pieces;  // (k0, k1) pairs, ascending, multiples of 32, inside one cut interval
  int npieces;
  int K, M;               // K of the packed I
  const void* I;
  float* out;
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
  // The NUMA path (and plain rows with differing cuts): piece products, then transformation 2 on
  // the driver's reduced sums: act columns [n0, n0+n) = SiLU(gate[j*M+m]) * up[j*M+m] in this
  // kernel's activation layout (n0, n multiples of 32), exactly as gate_up's fused store does.
  void (*piece_dots)(const PieceTask& t);
  void (*store_act)(void* act, int act_K, int n0, int n, int M, const float* gate, const float* up);
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

// The micro-kernel a call asks for by name; throws for an ISA not built in or not usable here.
const MicroKernel& select_microkernel(const std::string& isa);

// Adds the operators' entry points to a module (the main `_C` and the emulated builds alike).
void register_moe(pybind11::module_& m);
void register_linear(pybind11::module_& m);   // linear.cpp: y = x W^T on the same micro-kernels

}  // namespace hina
