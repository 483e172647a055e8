// The HiNa-MoE expert-FFN operator's C++ entry point (paper Section 4), without pybind11: one
// argument struct in, the output buffer written. bindings.cpp binds MoeCall and moe_ffn for the main
// module `_C` and the emulated builds alike; hinabench/kernels.py validates tensors and fills MoeCall.
//
//   out[t] = sum_s topk_weights[t,s] * FFN_e(x[t]),  e = topk_ids[t,s],
//   FFN_e(I) = (SiLU(I x W_gate^T) . (I x W_up^T)) x W_down^T               (Section 4.1)
//
// NUMA (Section 5): this code does not compute Equations 3-5 (Section 5.2: the placement function,
// the periods T_x, T_y, each node's local segments). Python computes the NUMA plan once, for both
// the model and the kernel, in hinabench's numa package (from each weight matrix's real address,
// page size and phase); the plan arrays arrive here in MoeCall and ops/numa_partition.cpp turns each
// matrix's S_index (Section 5.3) into Algorithm 2's work.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "microkernel.h"  // Dtype
#include "numeric.h"  // bf16_t

namespace hina {

struct MoeCall {
  // activations [T, H] bf16, rows contiguous, row stride ldx (elements)
  const bf16_t* x = nullptr;
  int64_t T = 0, H = 0, I = 0, ldx = 0;
  // weights [E, N, K] bf16 in the framework's layout, rows contiguous along K: expert stride
  // (..._es) and row stride (..._rs) in elements. gate, up: [E, I, H]; down: [E, H, I].
  const bf16_t* w_gate = nullptr;
  int64_t gate_es = 0, gate_rs = 0;
  const bf16_t* w_up = nullptr;
  int64_t up_es = 0, up_rs = 0;
  const bf16_t* w_down = nullptr;
  int64_t down_es = 0, down_rs = 0;
  int64_t E = 0;
  // routing, contiguous: topk_ids int32 [T, k] in [0, E), topk_weights fp32 [T, k]
  const int32_t* topk_ids = nullptr;
  int64_t k = 0;
  const float* topk_weights = nullptr;
  bf16_t* out = nullptr;  // [T, H] bf16, contiguous
  std::string isa;        // a micro-kernel of this module (microkernel.h), looked up per call
  int threads = 1;        // OpenMP threads (< 1: 1)
  // numa_nodes > 0: Algorithm 2 on that many (real or virtual) nodes with the flat plans:
  // int32 mat_plan [3E], int64 plan_hdr [P, 4] = (T_x, phase bytes, page bytes, seg_off base),
  // int32 seg_off, int32 segs [S, 3] = (x, y_start, y_end); node_cpus[j]: the CPUs to bind node
  // j's threads to (empty: no binding). numa_nodes == 0: the plain kernel.
  int numa_nodes = 0;
  const int32_t* mat_plan = nullptr;
  const int64_t* plan_hdr = nullptr;
  const int32_t* seg_off = nullptr;
  const int32_t* segs = nullptr;
  std::vector<std::vector<int>> node_cpus;
  // Quantized weights (kernels/quant.h): dtype int8 or fp8, then w_gate, w_up, w_down point at the
  // 1-byte elements (int8 / e4m3; strides above in elements = bytes) and s_* at their fp32 scales:
  // int8 [E, N, K/group] (row stride s_*_rs floats), fp8 [E, N/128, K/128] (s_*_rs: per 128-row
  // block). s_*_es: the expert stride (floats). The plain kernel only (numa_nodes must be 0).
  Dtype dtype = Dtype::bf16;
  int group = 0;                     // int8: K elements per scale (32, 64, 128); fp8: 128
  const float* s_gate = nullptr;
  int64_t s_gate_es = 0, s_gate_rs = 0;
  const float* s_up = nullptr;
  int64_t s_up_es = 0, s_up_rs = 0;
  const float* s_down = nullptr;
  int64_t s_down_es = 0, s_down_rs = 0;
};

// The error for an expert id outside [0, E): the operator's check, and the int64 ids' narrowing in
// the bindings (moe_ffn_tokens).
inline std::invalid_argument bad_expert_id(int64_t e, int64_t E) {
  return std::invalid_argument("topk_ids holds expert " + std::to_string(e) + ", outside [0, " +
                               std::to_string(E) + ")");
}

// Runs the operator. Throws std::invalid_argument for bad input (shapes, an expert id outside
// [0, E), an ISA not built or not usable here, missing plan arrays) and whatever a micro-kernel
// raised (the tile emulator's #GP/#UD faults). Calls are serialised (one shared scratch).
void moe_ffn(const MoeCall& call);

// Dense projections, y_i = x W_i^T, on the same micro-kernels: the driver's single-matrix case (phase 2
// on x, once for every W_i; phase 4 on each W_i [N_i, K] in nn.Linear's layout, read in place), then
// one rounding to bf16. Several matrices on the same x (an attention block's q, k and v) share one
// token pack and one task list, so the small ones do not each pay a parallel region and a tail.
// Matrices whose rows do not all share their piece cuts take the piece path with one node, one at a
// time, in the canonical summation order.
struct LinearWeight {
  const bf16_t* w = nullptr;  // [N, K] bf16, rows contiguous along K, row stride ldw
  int64_t N = 0, ldw = 0;
  bf16_t* out = nullptr;      // [T, N] bf16, contiguous
};
struct LinearCall {
  const bf16_t* x = nullptr;  // [T, K] bf16, rows contiguous, row stride ldx
  int64_t T = 0, K = 0, ldx = 0;
  std::vector<LinearWeight> weights;
  std::string isa;
  int threads = 1;
};
void linear(const LinearCall& call);

std::vector<std::string> moe_isas();  // the micro-kernels built into this module
size_t moe_last_scratch_bytes();      // packed I, activations, y rows, partials of the last call

}  // namespace hina
