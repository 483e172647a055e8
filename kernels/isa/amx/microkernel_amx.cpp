// The AMX micro-kernel: paper Section 4.2, Algorithm 1, on weights in their general layout.
//
// Operands of `tdpbf16ps C, A, B` (C[m][n] += sum_k A[m][k] * B[k][n], B VNNI-packed in pairs):
//   A = W in the general layout: 16 consecutive W rows x 32 bf16 along K, loaded straight from the
//       framework's tensor (stride = the row stride). W is never repacked ("tmm0 in Figure 3").
//   B = I, VNNI-packed by transformation 1 (the gather): one tile = 32 K values (16 pairs) x up to
//       16 tokens, row kp = [I[m0][2kp], I[m0][2kp+1], I[m0+1][2kp], ...]  ("tmm1 in Figure 3").
//   C = W . I^T: rows are output features, columns are tokens (the transposed result).
// Micro-kernel size (Section 4.2.1, Eq. 1-2): k_r = 32, n_r = 32 W rows (tmm2, tmm3), m_r = 32
// tokens (tmm0, tmm1), four fp32 accumulators (tmm4..tmm7) - the CMR optimum for 8 tiles of 1 KiB.
// For M < 32 tokens the B and C tiles are shorter (colsb = 4 * tokens; one B tile when M <= 16):
// AMX for every M, no AVX-512 fallback for few tokens. The tile configuration is set per shape.
// When the expert has M <= 32 tokens, W has no reuse: it is loaded with TILELOADDT1 (non-temporal
// hint, Section 4.2.2), else with TILELOADD.
// Line 4 of Algorithm 1 (the layout transformation fused into the store):
//   gate/up: SiLU(gate) * up, then rows 2kp and 2kp+1 of C interleaved per token = the VNNI B
//            layout of the down projection (transformation 2);
//   down:    C transposed into token-major y rows (transformation 3).
//
// Built twice from this one source: for real (-mamx-tile -mamx-bf16, `_C`, isa "amx") and against
// tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated"), so the logic is tested
// on CPUs without AMX. The tile-operand code uses only `_tile_*` intrinsics; the transforms are
// plain C++ on the L1-resident tile stores.
#if defined(HINA_EMU_AMX)
#include "emu/tile_emulator.h"
#else
#include <immintrin.h>
#endif

#include <cstdlib>
#include <cstring>

#include "microkernel.h"

#if defined(HINA_EMU_AMX)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#endif

namespace hina {
namespace amx_kernel {
namespace {

// This file has its own ISA flags: it must not share out-of-line inline/template code (COMDAT,
// e.g. std::vector members) with files built for other ISAs, or the linker may keep this file's
// copy for everyone. So: no STL containers or algorithms here, only internal-linkage helpers.
inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }


constexpr int kKr = 32;       // bf16 along K per tile row (64 bytes)
constexpr int kTokTile = 16;  // tokens per B tile (16 pairs of K x 16 tokens x 2 bf16)
constexpr int kNr = 32;       // W rows per micro-kernel step (two A tiles)
constexpr int kMr = 32;       // tokens per micro-kernel step (two B tiles)

struct alignas(64) TileConfig {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// ---- the packed (VNNI) layout of I and of the activation ---------------------------------------
// [token group g = m / 16][K block kb = k / 32][pair kp][token m % 16][2]: each (g, kb) is one
// 1 KiB B-tile image (stride 64 bytes), so the micro-kernel's B loads are contiguous.
size_t packed_bytes(int M, int K) {
  const size_t groups = (size_t(M) + kTokTile - 1) / kTokTile;
  return groups * (size_t(K) / kKr) * 1024;
}
inline size_t vnni_pair_index(int m, int pair, int KB) {  // index of the 32-bit pair (k = 2*pair)
  const int g = m / kTokTile, mi = m % kTokTile, kb = pair / 16, kp = pair % 16;
  return ((size_t(g) * KB + kb) * 16 + kp) * 16 + mi;
}

// Transformation 1: the gather writes I directly as B tiles (a 16 x 16 transpose of bf16 pairs).
void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  uint32_t* dst = static_cast<uint32_t*>(I);
  std::memset(I, 0, packed_bytes(M, K));  // tokens past M in the last group stay zero
  const int KB = K / kKr;
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int p = 0; p < K / 2; ++p) {
      uint32_t pair;
      std::memcpy(&pair, src + 2 * p, 4);
      dst[vnni_pair_index(m, p, KB)] = pair;
    }
  }
}

// ---- Algorithm 1 ----------------------------------------------------------------------------------
// C[32 rows][32 tokens] (fp32, row stride 32) = W[32 rows, K] . I[tokens m0 .. m0+mt, K]^T
// `B` points at token group m0/16 of a packed matrix with KB = K/32 blocks per group.
// tokens in B tile 0 and B tile 1 (0 = unused); W rows in A tile 0 and A tile 1 (0 = unused; the
// NUMA path's strided row classes may end in a block of fewer than 32 rows)
struct Shape { int mt0, mt1, a0 = 16, a1 = 16; };

void configure(Shape s) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int rows, int colsb) { cfg.rows[t] = uint8_t(rows); cfg.colsb[t] = uint16_t(colsb); };
  set(0, 16, 4 * s.mt0);                           // tmm0: I, tokens m0 .. m0+mt0      (B operand)
  if (s.mt1) set(1, 16, 4 * s.mt1);                // tmm1: I, the next 16 tokens
  set(2, s.a0, 64);                                // tmm2: W rows n .. n+16            (A operand)
  if (s.a1) set(3, s.a1, 64);                      // tmm3: W rows n+16 .. n+32
  set(4, s.a0, 4 * s.mt0);                         // tmm4 = tmm2 x tmm0
  if (s.mt1) set(5, s.a0, 4 * s.mt1);              // tmm5 = tmm2 x tmm1
  if (s.a1) set(6, s.a1, 4 * s.mt0);               // tmm6 = tmm3 x tmm0
  if (s.a1 && s.mt1) set(7, s.a1, 4 * s.mt1);      // tmm7 = tmm3 x tmm1
  _tile_loadconfig(&cfg);
}

// One canonical piece: K blocks [kb0, kb1) with fresh accumulators (moe_ffn.h), stored to C.
template <bool kStreamW>
void algorithm1(const bf16_t* w, int64_t ldw, const uint8_t* B, int KB, int kb0, int kb1, Shape s,
                float* C) {
  const long wstride = long(ldw * sizeof(bf16_t));
  const uint8_t* B1 = B + size_t(KB) * 1024;  // the next token group
  _tile_zero(4);
  if (s.a1) _tile_zero(6);
  if (s.mt1) { _tile_zero(5); if (s.a1) _tile_zero(7); }
  for (int kb = kb0; kb < kb1; ++kb) {
    // line 1: (tmm0 ~ tmm1) <- I(m : m+32, k : k+32)                              tileloadd
    _tile_loadd(0, B + size_t(kb) * 1024, 64);
    if (s.mt1) _tile_loadd(1, B1 + size_t(kb) * 1024, 64);
    // line 2: (tmm2 ~ tmm3) <- W(n : n+32, k : k+32), general layout    tileloaddt1 / tileloadd
    // (Algorithm 2, line 5: W(x : x + 32*T_x, y : y+32) is the same load with stride T_x rows)
    const bf16_t* wk = w + size_t(kb) * kKr;
    if (kStreamW) {
      _tile_stream_loadd(2, wk, wstride);
      if (s.a1) _tile_stream_loadd(3, wk + 16 * ldw, wstride);
    } else {
      _tile_loadd(2, wk, wstride);
      if (s.a1) _tile_loadd(3, wk + 16 * ldw, wstride);
    }
    // line 3: (tmm4 ~ tmm7) <- FMA(tmm0 ~ tmm1, tmm2 ~ tmm3)
    _tile_dpbf16ps(4, 2, 0);
    if (s.a1) _tile_dpbf16ps(6, 3, 0);
    if (s.mt1) {
      _tile_dpbf16ps(5, 2, 1);
      if (s.a1) _tile_dpbf16ps(7, 3, 1);
    }
  }
  // line 5: store (tmm4 - tmm7) into the L1-resident C block; line 4's transform reads it there.
  _tile_stored(4, C, 32 * 4);
  if (s.a1) _tile_stored(6, C + 16 * 32, 32 * 4);
  if (s.mt1) {
    _tile_stored(5, C + 16, 32 * 4);
    if (s.a1) _tile_stored(7, C + 16 * 32 + 16, 32 * 4);
  }
}

// The fused plain kernel's K loop: every canonical piece of the rows at w (which share their cuts),
// each from fresh tiles, added in ascending y into the zeroed accumulator Acc (32 x 32 fp32).
template <bool kStreamW>
void algorithm1_pieces(const bf16_t* w, int64_t ldw, const uint8_t* B, int KB, Shape s, float* Acc) {
  alignas(64) float P[kNr * kMr];
  for (int i = 0; i < kNr * kMr; ++i) Acc[i] = 0.f;
  const int K = KB * kKr, c0 = piece_phase(w);
  for (int y = 0; y < K; y = piece_end(y, c0, K)) {
    algorithm1<kStreamW>(w, ldw, B, KB, y / kKr, piece_end(y, c0, K) / kKr, s, P);
    for (int i = 0; i < kNr * kMr; ++i) Acc[i] += P[i];
  }
}

// Tokens [m0, m0 + mt) as the B-tile shape: mt0 in tmm0, the rest (if any) in tmm1.
inline Shape shape_of(int mt, int rows = kNr) {
  return Shape{imin(mt, kTokTile), imax(0, mt - kTokTile), imin(rows, 16), imax(0, rows - 16)};
}

// Tile configuration per shape; loaded only when the shape changes (ldtilecfg is not free).
struct TileShapeCache {
  Shape current{-1, -1, -1, -1};
  void use(Shape s) {
    if (s.mt0 != current.mt0 || s.mt1 != current.mt1 || s.a0 != current.a0 || s.a1 != current.a1) {
      configure(s);
      current = s;
    }
  }
};

inline const uint8_t* token_group(const void* packed, int m0, int KB) {
  return static_cast<const uint8_t*>(packed) + size_t(m0 / kTokTile) * KB * 1024;
}

// Gate & up, SiLU(gate)*up fused into the store, written as the down projection's B tiles:
// C rows 2kp and 2kp+1 of a token become the bf16 pair at row kp of its B tile (transformation 2).
// With M <= 32 there is one token step, so each W row is streamed once (TILELOADDT1).
void gate_up(const GateUpTask& t) {
  alignas(64) float G[kNr * kMr], U[kNr * kMr];
  uint32_t* act = static_cast<uint32_t*>(t.act);
  const int KB = t.K / kKr, KBa = t.act_K / kKr;
  const bool stream = t.M <= kMr;
  TileShapeCache tiles;
  for (int r0 = 0; r0 < t.n; r0 += kNr) {
    for (int m0 = 0; m0 < t.M; m0 += kMr) {
      const int mt = imin(kMr, t.M - m0);
      const Shape s = shape_of(mt);
      tiles.use(s);
      const uint8_t* B = token_group(t.I, m0, KB);
      if (stream) {
        algorithm1_pieces<true>(t.w_gate + r0 * t.ldw_gate, t.ldw_gate, B, KB, s, G);
        algorithm1_pieces<true>(t.w_up + r0 * t.ldw_up, t.ldw_up, B, KB, s, U);
      } else {
        algorithm1_pieces<false>(t.w_gate + r0 * t.ldw_gate, t.ldw_gate, B, KB, s, G);
        algorithm1_pieces<false>(t.w_up + r0 * t.ldw_up, t.ldw_up, B, KB, s, U);
      }
      // line 4: the second layout transformation
      for (int m = 0; m < mt; ++m)
        for (int kp = 0; kp < kNr / 2; ++kp) {
          const int r = 2 * kp;
          const uint32_t lo = f32_to_bf16(silu_mul(G[r * kMr + m], U[r * kMr + m]));
          const uint32_t hi = f32_to_bf16(silu_mul(G[(r + 1) * kMr + m], U[(r + 1) * kMr + m]));
          act[vnni_pair_index(m0 + m, (t.n0 + r0) / 2 + kp, KBa)] = lo | (hi << 16);
        }
    }
  }
  _tile_release();
}

// Down projection; the transpose fused into the store: y[m][n0 + r] = C[r][m] (transformation 3).
void down(const DownTask& t) {
  alignas(64) float C[kNr * kMr];
  const int KB = t.K / kKr;
  const bool stream = t.M <= kMr;
  TileShapeCache tiles;
  for (int r0 = 0; r0 < t.n; r0 += kNr) {
    for (int m0 = 0; m0 < t.M; m0 += kMr) {
      const int mt = imin(kMr, t.M - m0);
      const Shape s = shape_of(mt);
      tiles.use(s);
      const uint8_t* B = token_group(t.act, m0, KB);
      if (stream) algorithm1_pieces<true>(t.w_down + r0 * t.ldw, t.ldw, B, KB, s, C);
      else algorithm1_pieces<false>(t.w_down + r0 * t.ldw, t.ldw, B, KB, s, C);
      // line 4: the third layout transformation
      for (int m = 0; m < mt; ++m) {
        float* yr = t.y + (m0 + m) * t.ldy + t.n0 + r0;
        for (int r = 0; r < kNr; ++r) yr[r] = C[r * kMr + m];
      }
    }
  }
  _tile_release();
}

// Algorithm 2's micro-kernel: rows w + r*ldw (x, x+T_x, ...: 32 of them per step, fewer at the end
// of a row class), only the listed pieces (this node's local segments), one output slot per piece.
void piece_dots(const PieceTask& t) {
  alignas(64) float C[kNr * kMr];
  const int KB = t.K / kKr;
  const bool stream = t.M <= kMr;
  TileShapeCache tiles;
  for (int r0 = 0; r0 < t.nrows; r0 += kNr) {
    const int rows = imin(kNr, t.nrows - r0);
    for (int m0 = 0; m0 < t.M; m0 += kMr) {
      const int mt = imin(kMr, t.M - m0);
      const Shape s = shape_of(mt, rows);
      tiles.use(s);
      const uint8_t* B = token_group(t.I, m0, KB);
      for (int p = 0; p < t.npieces; ++p) {
        const int kb0 = t.pieces[2 * p] / kKr, kb1 = t.pieces[2 * p + 1] / kKr;
        if (stream) algorithm1<true>(t.w + r0 * t.ldw, t.ldw, B, KB, kb0, kb1, s, C);
        else algorithm1<false>(t.w + r0 * t.ldw, t.ldw, B, KB, kb0, kb1, s, C);
        for (int r = 0; r < rows; ++r)
          for (int m = 0; m < mt; ++m)
            t.out[(int64_t(r0 + r) * t.npieces + p) * t.M + m0 + m] = 0.f + C[r * kMr + m];
      }
    }
  }
  _tile_release();
}

// Transformation 2 on reduced sums: the same store as gate_up's (bf16 pairs into B tiles).
void store_act(void* act_v, int act_K, int n0, int n, int M, const float* g, const float* u) {
  uint32_t* act = static_cast<uint32_t*>(act_v);
  const int KBa = act_K / kKr;
  for (int m = 0; m < M; ++m)
    for (int kp = 0; kp < n / 2; ++kp) {
      const int r = 2 * kp;
      const uint32_t lo = f32_to_bf16(silu_mul(g[r * M + m], u[r * M + m]));
      const uint32_t hi = f32_to_bf16(silu_mul(g[(r + 1) * M + m], u[(r + 1) * M + m]));
      act[vnni_pair_index(m, n0 / 2 + kp, KBa)] = lo | (hi << 16);
    }
}

}  // namespace
}  // namespace amx_kernel

using namespace amx_kernel;

const MicroKernel& microkernel_amx() {
#if defined(HINA_EMU_AMX)
  static const MicroKernel mk{"amx-emulated", 64, packed_bytes, pack_tokens, gate_up, down,
                              piece_dots, store_act};
#else
  static const MicroKernel mk{"amx", 64, packed_bytes, pack_tokens, gate_up, down,
                              piece_dots, store_act};
#endif
  return mk;
}

#if defined(HINA_EMU_AMX)
// ---- the emulator's own entry points, for tests/test_tile_emulator.py ---------------------------
namespace py = pybind11;

void register_tile_emulator_tests(py::module_& m) {
  auto sub = m.def_submodule("tile", "the software AMX tile unit (tests of its semantics)");
  // Load a 64-byte configuration (raises RuntimeError on #GP), then run `program`: a list of
  // (op, *args) with op in load/stream_load (tile, offset, stride), store (tile, offset, stride),
  // zero (tile), and dpbf16ps/dpbssd/dpbsud/dpbusd/dpbuud (dst, a, b), on the bytearray `mem`.
  // Releases the tiles afterwards.
  sub.def("run", [](py::bytes cfg, py::list program, py::bytearray mem) {
    std::string c = cfg;
    if (c.size() != 64) throw std::invalid_argument("the tile configuration is 64 bytes");
    char* base = PyByteArray_AsString(mem.ptr());
    const size_t size = size_t(PyByteArray_Size(mem.ptr()));
    struct Release { ~Release() { _tile_release(); } } release;
    _tile_loadconfig(c.data());
    for (auto item : program) {
      auto op = item.cast<py::tuple>();
      const std::string name = op[0].cast<std::string>();
      auto mem_at = [&](size_t off, long stride) {  // 16 rows of 64 bytes must fit
        if (stride < 0 || off + size_t(stride) * 15 + 64 > size)
          throw std::out_of_range("tile access outside mem");
        return base + off;
      };
      if (name == "load" || name == "stream_load" || name == "store") {
        const int t = op[1].cast<int>();
        const size_t off = op[2].cast<size_t>();
        const long stride = op[3].cast<long>();
        char* p = mem_at(off, stride);
        if (name == "load") _tile_loadd(t, p, stride);
        else if (name == "stream_load") _tile_stream_loadd(t, p, stride);
        else _tile_stored(t, p, stride);
      } else if (name == "zero") {
        _tile_zero(op[1].cast<int>());
      } else {
        const int d = op[1].cast<int>(), a = op[2].cast<int>(), b = op[3].cast<int>();
        if (name == "dpbf16ps") _tile_dpbf16ps(d, a, b);
        else if (name == "dpbssd") _tile_dpbssd(d, a, b);
        else if (name == "dpbsud") _tile_dpbsud(d, a, b);
        else if (name == "dpbusd") _tile_dpbusd(d, a, b);
        else if (name == "dpbuud") _tile_dpbuud(d, a, b);
        else throw std::invalid_argument("unknown tile op '" + name + "'");
      }
    }
  }, py::arg("cfg"), py::arg("program"), py::arg("mem"));
  sub.def("storeconfig_after_load", [](py::bytes cfg) {
    std::string c = cfg;
    if (c.size() != 64) throw std::invalid_argument("the tile configuration is 64 bytes");
    alignas(64) char out[64];
    _tile_loadconfig(c.data());
    _tile_storeconfig(out);
    _tile_release();
    return py::bytes(out, 64);
  });
}
#endif

}  // namespace hina
