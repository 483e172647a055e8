// The AMX-INT8 W8A8 micro-kernel (quant.h's contract): `tdpbssd` on weights in their general layout,
// as the BF16 AMX kernel (microkernel_amx.cpp) does with `tdpbf16ps`.
//
//   A = W: 16 consecutive W rows x kstep int8 along K, loaded straight from the framework's tensor
//       (stride = the row stride; kstep = min(group, 64) bytes, so a tile never spans two groups);
//   B = the tokens' int8, packed by the gather (transformation 1) in the VNNI-4 layout: per group of
//       16 tokens, row k/4 = [x[t][k .. k+3] for t = 0..15] (64 bytes); a B tile is kstep/4 rows;
//   C = int32 [16 rows][tokens]: per group of g along K a fresh C (tilezero), the group's kstep
//       steps of tdpbssd, then C stored to L1 and added in fp32 scaled by s_w[row][group] *
//       s_x[token][group] (plain C++ on the stored tile, like the BF16 kernel's fused stores).
// The SiLU(gate)*up intermediate is stored in fp32 and re-quantized per token and group by pack_act
// into the same VNNI-4 layout for the down projection (quant_glue.h's stores).
// Per group the scale step touches every C element once: a real AMX kernel would keep more in
// tiles (two A x two B tiles, as the BF16 kernel) and scale with AVX-512; this one was written for
// correctness first, on the tile emulator. On real AMX (2026-12-01, 2 vCPUs of a Xeon; results/
// intel-f6m167-2t-1n/fig11-amx.csv) it passes every test and is 1.66x hina BF16 at Mixtral T = 1, but
// reaches only 0.62-0.69 of the roofline on Mixtral at T <= 8 and 0.27-0.40 on Qwen3-30B-A3B's small
// experts, slower there than the AVX2 INT8 kernel on the same CPU (1.95 vs 2.86 ms at T = 1): with
// g = 128 a C tile lives for two tdpbssd before its scale step. perf (cpu-clock, Qwen3 T = 1) says
// otherwise, though: ~70% of the samples sit on the W TILELOADDT1s and the scale pass barely shows;
// each A tile is 16 lines from 16 rows, and with 16 tiles of state there are few loads in flight.
// Tried and not kept (2026-12-01, same machine, interleaved runs, 2 threads): two A tiles per B
// tile (32 rows a step, tmm3 and tmm6), the scales of a group as one 16-token vector (the scale pass
// vectorized), and the next 32 rows prefetched into L2 at the same offsets: Qwen3 T = 1 / 4 / 16
// 2.82 / 3.15 / 3.71 ms against 2.86 / 3.47 / 4.29 before, but Mixtral T = 1 / 16 29.7 / 33.4 ms
// against 15.1 / 19.5 (the prefetches stall on full fill buffers: 16% of the samples), and still
// 19.3 / 22.3 ms without the prefetch.
// Kept instead: with M <= 4 tokens an expert's gate/up and down run on the AVX-512 VNNI kernel
// (quant_avx512.cpp, vpdpbusd on the same int8 rows; every AMX CPU has it), as SGLang's and
// kt-kernel's INT8 MoE use AVX-512 for few tokens and AMX for many: Qwen3 T = 1 / 2 / 4 1.81 / 1.92 /
// 2.11 ms against the tiles' 2.82 / 3.15 / 3.11, Mixtral 12.7 / 13.9 / 14.6 against 15.1 / 15.4 /
// 16.6. The dispatch is by the expert's M, the same in the pack and the tiles' calls, so one call
// mixes both for experts of different M. The emulated build runs the tiles for every M (so the tests
// cover their logic at small M too).
//
// Built twice from this one source: for real (-mamx-int8 ..., `_C`, isa "amx") and against
// emu/tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated").
#include "isa/amx/tiles.h"

#include <cstring>

#include "quant_glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

constexpr int kTok = 16;  // tokens per B tile

struct alignas(64) QTileConfig {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Packed operand: [token group][K/4][16 tokens][4 bytes] int8, then fp32 scale[M][K / group].
size_t amx_packed_bytes(int M, int K, int group) {
  const size_t groups = (size_t(M) + kTok - 1) / kTok;
  return a64(groups * size_t(K) * kTok) + size_t(M) * (K / group) * sizeof(float);
}
inline float* amx_scales(const void* p, int M, int K) {
  const size_t groups = (size_t(M) + kTok - 1) / kTok;
  return reinterpret_cast<float*>(const_cast<char*>(static_cast<const char*>(p)) + a64(groups * size_t(K) * kTok));
}

thread_local ThreadScratch<int8_t> tl_q{nullptr, 0};  // one token's int8 row before it is scattered into the layout

// Token m's K values v quantized per group (quant_glue.h's quantize_row) and written in VNNI-4 order.
inline void put_token(const float* v, int m, int K, int group, void* out, int M) {
  int8_t* qrow = tl_q.get(size_t(K));
  quantize_row<int8_t, 0>(v, K, group, qrow, amx_scales(out, M, K) + int64_t(m) * (K / group));
  int8_t* g = static_cast<int8_t*>(out) + size_t(m / kTok) * K * kTok;
  for (int k = 0; k < K; k += 4) std::memcpy(g + (size_t(k) / 4 * kTok + m % kTok) * 4, qrow + k, 4);
}

void amx_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  std::memset(I, 0, ((size_t(M) + kTok - 1) / kTok) * size_t(K) * kTok);  // tokens past M stay zero
  float* v = tl_row.get(size_t(K));
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) v[k] = bf16_to_f32(src[k]);
    put_token(v, m, K, group, I, M);
  }
}

void amx_pack_act(const float* act, int M, int K, int group, void* out) {
  std::memset(out, 0, ((size_t(M) + kTok - 1) / kTok) * size_t(K) * kTok);
  for (int m = 0; m < M; ++m) put_token(act + int64_t(m) * K, m, K, group, out, M);
}

void configure(int kstep, int mt) {
  QTileConfig cfg{};
  cfg.palette_id = 1;
  cfg.rows[0] = uint8_t(kstep / 4); cfg.colsb[0] = uint16_t(4 * mt);   // tmm0: B, the tokens
  cfg.rows[2] = 16;                 cfg.colsb[2] = uint16_t(kstep);    // tmm2: A, 16 W rows
  cfg.rows[4] = 16;                 cfg.colsb[4] = uint16_t(4 * mt);   // tmm4: C = tmm2 x tmm0
  _tile_loadconfig(&cfg);
}

// c[j * M + m] for rows j < n (row 0 at w0 + n0 * ldw) x all M tokens.
void amx_mm(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I, int M,
            int K, int group, float* c) {
  const int kstep = group < 64 ? group : 64;
  const int8_t* q = static_cast<const int8_t*>(I);
  const float* sx = amx_scales(I, M, K);
  alignas(64) int32_t C[16 * kTok];
  for (int64_t i = 0; i < int64_t(n) * M; ++i) c[i] = 0.f;
  for (int t0 = 0; t0 < M; t0 += kTok) {
    const int mt = M - t0 < kTok ? M - t0 : kTok;
    configure(kstep, mt);
    const int8_t* B = q + size_t(t0 / kTok) * K * kTok;
    for (int r0 = 0; r0 < n; r0 += 16) {
      const int8_t* w = w0 + int64_t(n0 + r0) * ldw;
      for (int k0 = 0, gi = 0; k0 < K; k0 += group, ++gi) {
        _tile_zero(4);
        for (int k = k0; k < k0 + group; k += kstep) {
          _tile_loadd(0, B + size_t(k) / 4 * kTok * 4, kTok * 4);
          _tile_loadd(2, w + k, long(ldw));
          _tile_dpbssd(4, 2, 0);
        }
        _tile_stored(4, C, kTok * 4);
        for (int r = 0; r < 16; ++r) {
          const float swr = s0[int64_t(n0 + r0 + r) * lds + gi];
          float* cr = c + int64_t(r0 + r) * M + t0;
          for (int t = 0; t < mt; ++t) cr[t] += float(C[r * kTok + t]) * (swr * sx[int64_t(t0 + t) * (K / group) + gi]);
        }
      }
    }
  }
  _tile_release();
}

void amx_gate_up(const QGateUpTask& t) {
  float* c = tl_c.get(size_t(2) * t.n * t.M);
  amx_mm(t.w_gate, t.ldw_gate, t.s_gate, t.lds_gate, t.n0, t.n, t.I, t.M, t.K, t.group, c);
  amx_mm(t.w_up, t.ldw_up, t.s_up, t.lds_up, t.n0, t.n, t.I, t.M, t.K, t.group, c + int64_t(t.n) * t.M);
  store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M, t.M);
}

void amx_down(const QDownTask& t) {
  float* c = tl_c.get(size_t(t.n) * t.M);
  amx_mm(t.w, t.ldw, t.s, t.lds, t.n0, t.n, t.act, t.M, t.K, t.group, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c);
}

}  // namespace

#if defined(HINA_EMU_AMX)
#define HINA_QUANT_AMX_ISA "amx-emulated", Dtype::int8, nullptr
#else
#define HINA_QUANT_AMX_ISA "amx", Dtype::int8, "amx"
#endif
#if defined(HINA_EMU_AMX)
const QuantMicroKernel quant_microkernel_amx_int8{
    HINA_QUANT_AMX_ISA, /*task_rows=*/64, amx_packed_bytes, amx_pack_tokens, amx_pack_act, amx_gate_up,
    amx_down};
#else
namespace {
// Few tokens: the AVX-512 VNNI kernel (see the header); its operand layout, packed and read by it.
constexpr int kVnniMaxM = 4;
inline const QuantMicroKernel& vnni() { return quant_microkernel_avx512_int8; }
size_t mixed_packed_bytes(int M, int K, int group) {
  return M <= kVnniMaxM ? vnni().packed_bytes(M, K, group) : amx_packed_bytes(M, K, group);
}
void mixed_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  if (M <= kVnniMaxM) vnni().pack_tokens(x, ldx, rows, M, K, group, I);
  else amx_pack_tokens(x, ldx, rows, M, K, group, I);
}
void mixed_pack_act(const float* act, int M, int K, int group, void* out) {
  if (M <= kVnniMaxM) vnni().pack_act(act, M, K, group, out);
  else amx_pack_act(act, M, K, group, out);
}
void mixed_gate_up(const QGateUpTask& t) {
  if (t.M <= kVnniMaxM) vnni().gate_up(t);
  else amx_gate_up(t);
}
void mixed_down(const QDownTask& t) {
  if (t.M <= kVnniMaxM) vnni().down(t);
  else amx_down(t);
}
}  // namespace
const QuantMicroKernel quant_microkernel_amx_int8{
    HINA_QUANT_AMX_ISA, /*task_rows=*/64, mixed_packed_bytes, mixed_pack_tokens, mixed_pack_act, mixed_gate_up,
    mixed_down};
#endif
#undef HINA_QUANT_AMX_ISA

}  // namespace hina
