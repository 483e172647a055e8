// The quantized entries of the micro-kernel table (microkernel.h's contract, for weights that carry
// scales): INT8 W8A8 group-wise and FP8 e4m3 weight-only with 128x128 block scales. Quantization
// itself is the framework's offline step (hinabench/quant.py); the kernels read the quantized
// weights in place, in the framework's layout (out x in, rows contiguous along K, no repacking), and
// their fp32 scales in place:
//   int8  scale[e][n][k / group]            one per (row, group of `group` along K), group 32/64/128
//   fp8   scale_inv[e][n / 128][k / 128]    DeepSeek-V3's weight_scale_inv (multiplies)
// The driver (ops/moe_ffn.cpp, run_quant) is the bf16 one's: group by expert, gather (transformation
// 1: for int8 the activations are quantized per token and group right there), (expert, block)
// tasks on every thread, SiLU(gate)*up fused into gate_up's store as fp32 (transformation 2; for
// int8 pack_act re-quantizes it per token and group for the down projection), down with its
// transpose fused into the store (transformation 3), the routing-weighted scatter.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "microkernel.h"

namespace hina {

// One gate/up task: rows [n0, n0 + n) of W_gate and W_up of one expert, all M gathered tokens.
// Pointers are the expert's row 0 (weights: bytes, int8 or e4m3; scales: fp32), the kernel adds
// the rows' offsets itself (fp8 scale rows are 128-row blocks).
struct QGateUpTask {
  const int8_t* w_gate; const int8_t* w_up;  // row 0 of the expert; row stride ldw_* bytes
  int64_t ldw_gate, ldw_up;
  const float* s_gate; const float* s_up;    // scales of the expert; row stride lds_* floats
  int64_t lds_gate, lds_up;
  int n0, n;       // intermediate columns [n0, n0+n)
  int K;           // = H
  int M;
  int group;       // int8: K elements per scale; fp8: 128
  const void* I;   // the packed tokens (pack_tokens)
  float* act;      // [M, act_K] fp32 row-major: act[m][n0 + j] = SiLU(gate) * up
  int act_K;
};

struct QDownTask {
  const int8_t* w; int64_t ldw;  // row 0 of this expert's W_down [H, I], row stride bytes
  const float* s; int64_t lds;
  int n0, n;       // output columns [n0, n0+n)
  int K;           // = I
  int M;
  int group;
  const void* act;  // the packed activation (pack_act)
  float* y;         // y[m * ldy + n0 + j]
  int64_t ldy;
};

struct QuantMicroKernel {
  const char* isa;
  Dtype dtype;
  const char* cpu_isa;   // isa_usable() must say yes before any call
  int task_rows;         // preferred output rows per task (a multiple of 32)
  // bytes of a packed [M, K] operand (tokens or activation), group as in the task
  size_t (*packed_bytes)(int M, int K, int group);
  // transformation 1: I[m] = x[rows[m]] in this kernel's operand layout (int8: quantized here)
  void (*pack_tokens)(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group,
                      void* I);
  // transformation 2's second half: the fp32 intermediate [M, K] in the down operand's layout
  void (*pack_act)(const float* act, int M, int K, int group, void* out);
  void (*gate_up)(const QGateUpTask& t);
  void (*down)(const QDownTask& t);
  // The task rows on this CPU, where a kernel chooses its blocking at run time (nullptr: task_rows);
  // the driver reads it through task_rows(mk).
  int (*task_rows_now)() = nullptr;
  // At least this many W bytes per task (0: task_rows alone): the driver raises the rows of a task whose
  // rows are short (task_rows(mk, row_bytes)), so that each of a decode tile's streams runs long enough.
  int task_bytes = 0;
};
inline int task_rows(const QuantMicroKernel& mk) { return mk.task_rows_now ? mk.task_rows_now() : mk.task_rows; }
// Rows per task for W rows of row_bytes bytes each (gate/up: both rows of an output row): task_rows,
// or more where task_bytes asks for it (rounded down to a multiple of 32).
inline int task_rows(const QuantMicroKernel& mk, int64_t row_bytes) {
  const int nb = task_rows(mk);
  const int64_t by_bytes = row_bytes > 0 ? mk.task_bytes / row_bytes / 32 * 32 : 0;
  return by_bytes > nb ? int(by_bytes) : nb;
}

// INT8: AVX2 (vpmaddwd), AVX-512 VNNI (vpdpbusd; also built on SIMDe as "avx512-emulated"), AMX
// (tdpbssd; also built on the tile emulator as "amx-emulated"); FP8: AVX2, AVX-512 (e4m3 -> bf16 for
// vdpbf16ps; also on SIMDe), and AMX (W blocks unpacked to bf16 for tdpbf16ps; also on the tile
// emulator).
#if defined(HINA_EMU_AVX512)
extern const QuantMicroKernel quant_microkernel_avx512_int8;
extern const QuantMicroKernel quant_microkernel_avx512_fp8;
extern const QuantMicroKernel quant_microkernel_avx512_int8_nobf16;   // "avx512-nobf16-emulated"
extern const QuantMicroKernel quant_microkernel_avx512_fp8_nobf16;
#elif defined(HINA_EMU_AMX)
extern const QuantMicroKernel quant_microkernel_amx_int8;
extern const QuantMicroKernel quant_microkernel_amx_fp8;
#else
extern const QuantMicroKernel quant_microkernel_avx2_int8;
extern const QuantMicroKernel quant_microkernel_avx2_fp8;
extern const QuantMicroKernel quant_microkernel_avx512_int8;
extern const QuantMicroKernel quant_microkernel_avx512_fp8;
extern const QuantMicroKernel quant_microkernel_avx512_int8_nobf16;   // "avx512-nobf16" (isa/avx512/dpbf16.h)
extern const QuantMicroKernel quant_microkernel_avx512_fp8_nobf16;
extern const QuantMicroKernel quant_microkernel_amx_int8;
extern const QuantMicroKernel quant_microkernel_amx_fp8;
#endif

const std::vector<const QuantMicroKernel*>& quant_microkernels();
// Throws std::invalid_argument if not built into this module or not usable on this CPU.
const QuantMicroKernel& find_quant_microkernel(const std::string& isa, Dtype dtype);

}  // namespace hina
