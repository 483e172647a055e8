// The micro-kernel layer of the HiNa-MoE expert-FFN operator (paper Section 4): the table the driver
// (ops/moe_ffn.cpp) calls through, and the contract every entry keeps.
//
// Division of labour (KTransformers/SGLang style: one operator driver over small per-ISA kernels):
//   driver       group tokens by expert, schedule (expert, output-block) tasks on all threads,
//                routing-weighted scatter-add back to token order (ops/moe_ffn.cpp); Algorithm 2's
//                piece tasks and their reduction across nodes (ops/numa_partition.cpp);
//   micro-kernel the things that depend on the instructions (isa/<isa>/, shared glue in glue.h):
//                  pack_tokens  transformation 1: gather x rows into I, already in the layout the
//                               ISA's MM wants ("transform I, not W");
//                  gate_up      Algorithm 1 on W_gate and W_up, SiLU(gate)*up fused into the store,
//                               which writes the activation in the same ISA layout (transformation 2);
//                  down         Algorithm 1 on W_down, transpose fused into the store, which writes
//                               y[token][h] row-major fp32 (transformation 3);
//                  piece_dots   the same products per canonical K piece (pieces.h), one slot each:
//                               Algorithm 2's partial products, and plain rows of differing cuts;
//                  store_act    transformation 2 on the driver's reduced sums.
// Weights are read in place, in the framework's layout: out x in, row-major, rows contiguous
// along K, any row stride and any expert stride. Nothing ever copies, repacks or converts them.
//
// The table is keyed (ISA, weight dtype): bf16 is the only dtype today; INT8 and FP8 add entries
// (isa/<isa>/, with their own W loads) rather than branches. Blocking parameters are data next to
// each micro-kernel (BLIS style): `Blocking`, read by glue.h's loop nest and by the driver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numeric.h"  // bf16_t

namespace hina {

// H and I must be multiples of this (the AMX tile's k_r = 32; every MoE model we know uses
// multiples of 128). Other shapes are rejected with a clear error: there is no tail code.
constexpr int kShapeMultiple = 32;

// Weight element types (the second key of the table).
// int8 and fp8 are the quantized entries (quant.h: their tasks carry scales).
enum class Dtype : int { bf16 = 0, int8 = 1, fp8 = 2 };

// ---- tasks: what the driver hands a micro-kernel -------------------------------------------------
// One gate/up task: rows [n0, n0 + n) of W_gate and W_up of one expert, for all M gathered tokens.
// The driver issues fused tasks when all rows of W_gate share their piece cuts, and all rows of W_up
// theirs (row stride a multiple of 2048 elements), or when the micro-kernel takes rows of differing
// cuts (MicroKernel::mixed_cuts); dots follow the canonical pieces (pieces.h) either way.
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

// One piece task (Algorithm 2, or a plain-kernel task on rows of differing piece cuts): rows
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

// ---- blocking: data next to each micro-kernel ----------------------------------------------------
// task_rows is read by the driver (rows per output-block task); the rest by glue.h's loop nest for
// the dot-product kernels (AVX2, AVX-512); AMX's blocking is fixed by its tiles (isa/amx/).
struct Blocking {
  int task_rows;         // preferred output-block rows per task (a multiple of 32)
  // decode, M <= decode_max_m tokens: every W row streamed once, all M tokens in registers,
  // decode_rows[M] W rows per tile
  int decode_max_m;
  int decode_rows[7];
  // blocked, M > decode_max_m: tiles of mr W rows x nr tokens
  int mr, nr;
  int k_group;           // K span of a group of pieces (0: one piece per group)
  int k_sub;             // K sub-block of a piece, accumulators carried across (0: the whole piece)
  int mb_max;            // tokens per block at most
  int mb_min;            // tokens per block at least (when mb_l2_bytes bounds it)
  int mb_l2_bytes;       // L2 budget for a token block's I slice over a group (0: always mb_max)
  bool token_blocks_outer;  // loop order: token blocks outside K groups (else inside)
  int prefetch_next;     // prefetch the next W sub-block while a tile runs (0: no; 1: into L1; 2: L2)
  // decode, M tokens: while a tile streams its rows' piece, prefetch the next tile's same piece
  // (decode_prefetch[M] 0: no; 1: into L1; 2: into L2), or 3: the tile's own rows decode_ahead
  // elements ahead, into L1
  int decode_prefetch[7];
  // gate_up: tiles take gate and up rows alternately (two streams far apart in memory, as the best
  // read probe reads), when the two matrices share their piece cuts
  bool interleave_gate_up;
  // decode, one token, rows (or piece spans) of at most decode_short_k elements: one piece each, so
  // every tile starts on new pages; decode_short_rows rows per tile, decode_short_prefetch as above
  // (decode_short_k 0: no such case)
  int decode_short_k, decode_short_rows, decode_short_prefetch;
  // decode tiles: row q of a tile from the q-th of decode_rows[M] (or decode_short_rows) equal
  // segments of the rows, a gate row and its up row kept together (streams far apart in memory; else
  // consecutive rows, a W row apart)
  bool decode_far = false;
  int decode_unroll = 1;   // decode tiles: chunks of a row read together before the next row's
  int decode_ahead = 0;    // decode_prefetch 3's distance, elements
  // decode, rows whose cuts differ (any row stride: Qwen3's W_down, 768 elements): 0, class by class
  // (mm_rows_chained); R > 0, R rows far apart in memory order, each row folding its own pieces
  // (decode_mixed, glue.h)
  int decode_mixed_rows = 0;
  // prefetch_next at a group's last piece: the first piece of the row group this many groups ahead
  int prefetch_groups = 1;
  int linear_task_rows = 0;  // the linear op's preferred rows per task (0: task_rows)
  // decode_mixed: at most this many accumulators (rows x tokens) a tile, decode_mixed_rows halved until
  // they fit (0: no limit; AVX2's 16 registers)
  int decode_mixed_acc = 0;
};

// ---- the table -----------------------------------------------------------------------------------
struct MicroKernel {
  const char* isa;       // the name Python passes: "scalar", "avx2", "avx512-emulated", ...
  Dtype dtype;
  const char* cpu_isa;   // isa_usable() must say yes before any call (nullptr: portable code)
  Blocking blocking;
  // Bytes of a packed [M, K] matrix in this kernel's layout (64-byte aligned by the caller).
  size_t (*packed_bytes)(int M, int K);
  // Transformation 1: I[m] = x[rows[m]] for m < M, written in this kernel's layout.
  void (*pack_tokens)(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I);
  void (*gate_up)(const GateUpTask& t);
  void (*down)(const DownTask& t);
  // The piece path: piece products, then transformation 2 on the driver's reduced sums:
  // act columns [n0, n0+n) = SiLU(gate[j*M+m]) * up[j*M+m] in this kernel's activation layout
  // (n0, n multiples of 32), exactly as gate_up's fused store does.
  void (*piece_dots)(const PieceTask& t);
  void (*store_act)(void* act, int act_K, int n0, int n, int M, const float* gate, const float* up);
  // gate_up and down also take rows whose piece cuts differ (any row stride), in the canonical
  // order; otherwise the driver sends such a matrix down the piece path.
  bool mixed_cuts = false;
  // The task rows on this CPU (the linear op's, or the FFN's), where a kernel chooses its blocking at
  // run time (nullptr: blocking's); the driver reads it through task_rows(mk, linear).
  int (*task_rows_now)(bool linear) = nullptr;
};
inline int blocking_task_rows(const Blocking& b, bool linear) {
  return linear && b.linear_task_rows ? b.linear_task_rows : b.task_rows;
}
inline int task_rows(const MicroKernel& mk, bool linear = false) {
  return mk.task_rows_now ? mk.task_rows_now(linear) : blocking_task_rows(mk.blocking, linear);
}

// The entries, one per ISA file (isa/<isa>/), each constant-initialised data: reading an entry runs
// none of its ISA's instructions. In the emulated modules the AMX / AVX-512 entries are the same
// sources built against emu/tile_emulator.h / SIMDe, named "amx-emulated" / "avx512-emulated".
extern const MicroKernel microkernel_scalar_bf16;
#if defined(HINA_EMU_AMX)
extern const MicroKernel microkernel_amx_bf16;
#elif defined(HINA_EMU_AVX512)
extern const MicroKernel microkernel_avx512_bf16;
extern const MicroKernel microkernel_avx512_bf16_nobf16;   // "avx512-nobf16-emulated"
#else
extern const MicroKernel microkernel_avx2_bf16;
extern const MicroKernel microkernel_avx512_bf16;
extern const MicroKernel microkernel_avx512_bf16_nobf16;   // "avx512-nobf16" (isa/avx512/dpbf16.h)
extern const MicroKernel microkernel_amx_bf16;
#endif

// The micro-kernels built into this module (microkernel.cpp): scalar, then the SIMD kernels.
const std::vector<const MicroKernel*>& microkernels();
// The (isa, dtype) entry, looked up per call. Throws std::invalid_argument if it is not built into
// this module, or if the CPU (or the OS) does not allow its ISA: never SIGILL.
const MicroKernel& find_microkernel(const std::string& isa, Dtype dtype);

// A kernel struct (glue.h's BF16 ones, quant_glue.h's) whose blocking is chosen per call: where
// Kn::kAltBlocking, the traits Kn::AltBlocking (their own kBlocking and task rows) replace Kn's when
// Kn::alt_blocking() says so on this CPU (the AVX-512 kernels' Zen 5 blockings, avx512_tiles() below).
// A flag, not the type's presence: a kernel's AltBlocking inherits its AltBlocking and must say whether it
// takes it (Avx512Zen5 has its own, Avx512Xeon; Avx512Xeon none).
template <class Kn, class = void> struct HasAltBlocking { static constexpr bool value = false; };
template <class Kn>
struct HasAltBlocking<Kn, decltype(void(Kn::kAltBlocking))> { static constexpr bool value = Kn::kAltBlocking; };

// The AVX-512 kernels' blocking (isa/avx512/microkernel_avx512.cpp): "auto" (Zen 5's on AMD family >= 26,
// the Xeon one on Intel, else the default), "default", "zen5" or "xeon"; the same bits whichever. "xeon"
// is the BF16 FFN kernel's Zen 5 tiles with its one-token tiles prefetching their own rows (Avx512Xeon);
// the INT8/FP8 and attention kernels keep their default blocking under it. Starts from the environment's
// HINA_AVX512_BLOCKING (else "auto"); set_avx512_blocking throws std::invalid_argument on any other name.
enum class Avx512Tiles { kDefault, kZen5, kXeon };
const char* avx512_blocking();       // the setting: auto, default, zen5 or xeon
void set_avx512_blocking(const std::string& choice);
Avx512Tiles avx512_tiles();          // the blocking in effect (read by the kernels, per call)
const char* avx512_tiles_name();     // ... as its name: default, zen5 or xeon
bool avx512_blocking_zen5();         // avx512_tiles() == kZen5: the INT8/FP8 and attention kernels' switch

}  // namespace hina
