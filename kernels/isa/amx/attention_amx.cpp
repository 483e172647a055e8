// The AMX-BF16 attention micro-kernel (paper Section 6: the decode MV turned into small MMs on tiles).
//
// Operands of `tdpbf16ps C, A, B` (C[m][n] += sum_k A[m][k] * B[k][n], B VNNI-packed in pairs):
//   scores  S^T = K . Q^T:  A = 16 keys x 32 d of K, loaded straight from the cache rows (stride = the
//           token stride; the framework's layout, never repacked); B = the query block, transformed once
//           per task into VNNI B-tile images (pack_q: transformation 1, "the Q block in the tile layout");
//           C = 16 keys x (up to 16) query rows, transposed into S by the store, times the scale.
//   P x V   O += P . V:  A = P, 16 query rows x 32 keys, rounded to bf16 (row-major, as A wants);
//           B = V converted on demand: 32 keys x 16 columns of V interleaved into 16 key pairs
//           (a 1 KiB tile image per column block); C = the O block, 16 rows x 16 columns fp32, loaded
//           from and stored back to the L1-resident O.
// Keys whose rows are not evenly spaced (a chunk that crosses a paged block) and a half block of d
// (head_dim an odd multiple of 16) go through a 16 x 64-byte staging copy, zero-padded.
// The online softmax is plain C++ on the L1-resident scores (the driver's exp2 rule; no vector ISA is
// assumed besides AMX here).
//
// Built twice from this one source, like microkernel_amx.cpp: for real (`_C`, isa "amx") and against
// emu/tile_emulator.h (HINA_EMU_AMX, `_C_amx_emu`, isa "amx-emulated"), so it runs in the same tests.
#include "isa/amx/tiles.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/attention.h"

namespace hina {
namespace {

constexpr int kQOffset = 16;   // floats before the packed images (the scale, then padding to 64 bytes)

struct alignas(64) TileConfig {
  uint8_t palette_id, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// tmm0: K (A, keys x 64 B)   tmm1: Q^T image (B, 16 pairs x 4*rows)   tmm2: S^T (C, keys x 4*rows)
// tmm3: P (A, rows x 64 B)   tmm4: V pairs (B, 16 x 64 B)             tmm5: O block (C, rows x 64 B)
void configure(int rows, int keys) {
  TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int r, int colsb) { cfg.rows[t] = uint8_t(r); cfg.colsb[t] = uint16_t(colsb); };
  set(0, keys, 64);
  set(1, 16, 4 * rows);
  set(2, keys, 4 * rows);
  set(3, rows, 64);
  set(4, 16, 64);
  set(5, rows, 64);
  _tile_loadconfig(&cfg);
}

inline int blocks32(int d) { return (d + 31) / 32; }

// The image of row group g (16 rows), d block kb: [pair kp][row m][2 bf16].
inline uint32_t* q_image(float* qp, int d, int g, int kb) {
  return reinterpret_cast<uint32_t*>(qp + kQOffset) + (size_t(g) * blocks32(d) + kb) * 256;
}

void pack_q(const bf16_t* const* rows, int nrows, int d, float scale, float* qp) {
  qp[0] = scale;
  const int groups = (nrows + 15) / 16, KB = blocks32(d);
  std::memset(qp + kQOffset, 0, size_t(groups) * KB * 1024);
  for (int r = 0; r < nrows; ++r)
    for (int p = 0; p < d / 2; ++p) {
      uint32_t pair;
      std::memcpy(&pair, rows[r] + 2 * p, 4);
      q_image(qp, d, r / 16, p / 16)[(p % 16) * 16 + r % 16] = pair;
    }
}

void scores(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  const float scale = qp[0];
  float* q = const_cast<float*>(qp);
  alignas(64) bf16_t stage[16 * 32];
  alignas(64) float C[16 * 16];
  const int KB = blocks32(d);
  for (int g = 0; g * 16 < nrows; ++g) {
    const int rows = nrows - g * 16 < 16 ? nrows - g * 16 : 16;
    for (int j0 = 0; j0 < nkeys; j0 += 16) {
      const int nk = nkeys - j0 < 16 ? nkeys - j0 : 16;
      configure(rows, nk);
      const int64_t step = nk > 1 ? keys[j0 + 1] - keys[j0] : d;
      bool even = true;
      for (int j = 1; j < nk && even; ++j) even = keys[j0 + j] - keys[j0 + j - 1] == step;
      _tile_zero(2);
      for (int kb = 0; kb < KB; ++kb) {
        const bool half = d - kb * 32 < 32;
        if (even && step > 0 && !half) {
          _tile_loadd(0, keys[j0] + kb * 32, long(step * sizeof(bf16_t)));   // K rows as they are
        } else {
          std::memset(stage, 0, sizeof(stage));
          for (int j = 0; j < nk; ++j)
            std::memcpy(stage + j * 32, keys[j0 + j] + kb * 32, size_t(half ? 16 : 32) * sizeof(bf16_t));
          _tile_loadd(0, stage, 64);
        }
        _tile_loadd(1, q_image(q, d, g, kb), 64);
        _tile_dpbf16ps(2, 0, 1);
      }
      _tile_stored(2, C, 64);
      for (int j = 0; j < nk; ++j)
        for (int r = 0; r < rows; ++r) S[int64_t(g * 16 + r) * lds + j0 + j] = C[j * 16 + r] * scale;
    }
  }
  _tile_release();
}

void softmax_step(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nrows; ++r) {
    float* s = S + int64_t(r) * lds;
    float mx = m[r];
    for (int j = 0; j < nkeys; ++j) mx = s[j] > mx ? s[j] : mx;
    if (mx == ninf) {
      for (int j = 0; j < nkeys; ++j) s[j] = 0.f;
      continue;
    }
    const float alpha = m[r] == ninf ? 0.f : std::exp2(m[r] - mx);
    float sum = 0.f;
    for (int j = 0; j < nkeys; ++j) sum += (s[j] = std::exp2(s[j] - mx));
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
    if (alpha != 1.f)
      for (int i = 0; i < d; ++i) O[int64_t(r) * d + i] *= alpha;
  }
}

void pv(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  alignas(64) bf16_t Pb[16 * 32];
  alignas(64) uint32_t Vt[16 * 16];
  for (int g = 0; g * 16 < nrows; ++g) {
    const int rows = nrows - g * 16 < 16 ? nrows - g * 16 : 16;
    configure(rows, 16);
    for (int j0 = 0; j0 < nkeys; j0 += 32) {
      const int nk = nkeys - j0 < 32 ? nkeys - j0 : 32;
      for (int r = 0; r < rows; ++r)           // A: P rows as bf16, keys past nk zero
        for (int j = 0; j < 32; ++j)
          Pb[r * 32 + j] = j < nk ? f32_to_bf16(P[int64_t(g * 16 + r) * lds + j0 + j]) : bf16_t(0);
      _tile_loadd(3, Pb, 64);
      for (int c = 0; c < d; c += 16) {
        // B: V converted on demand, row kp = (V_{2kp}[c+n], V_{2kp+1}[c+n]) for n < 16
        for (int kp = 0; kp < 16; ++kp) {
          const int ja = j0 + 2 * kp, jb = ja + 1;
          for (int n = 0; n < 16; ++n) {
            const uint32_t a = ja < j0 + nk ? vals[ja][c + n] : 0u, b = jb < j0 + nk ? vals[jb][c + n] : 0u;
            Vt[kp * 16 + n] = a | (b << 16);
          }
        }
        _tile_loadd(4, Vt, 64);
        float* o = O + int64_t(g * 16) * d + c;
        _tile_loadd(5, o, long(d * sizeof(float)));
        _tile_dpbf16ps(5, 3, 4);
        _tile_stored(5, o, long(d * sizeof(float)));
      }
    }
  }
  _tile_release();
}

void unpack_o(const float* O, int d, float scale, float* out) {
  for (int i = 0; i < d; ++i) out[i] = O[i] * scale;
}

}  // namespace

#if defined(HINA_EMU_AMX)
const AttnMicroKernel attn_microkernel_amx{
    "amx-emulated", nullptr, {/*chunk_keys=*/32, /*block_rows=*/32}, pack_q, scores, softmax_step, pv, unpack_o};
#else
const AttnMicroKernel attn_microkernel_amx{
    "amx", "amx", {/*chunk_keys=*/32, /*block_rows=*/32}, pack_q, scores, softmax_step, pv, unpack_o};
#endif

}  // namespace hina
