// The scalar micro-kernel: portable C++, the reference the SIMD kernels are read against.
// Layout of I and of the activation: fp32, row-major [M, K] (one row per gathered token).
// W: bf16 rows read in place (general layout), converted element by element.
// Deliberately plain loops, not glue.h's loop nest: a reference that shares the SIMD kernels'
// blocking could share their mistakes. It shares only the stores (glue.h).
#include "glue.h"

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

struct Scalar {
  static void put_act(void* act, int act_K, int m, int k, float v) {
    static_cast<float*>(act)[int64_t(m) * act_K + k] = v;  // transformation 2 (identity here)
  }
};

size_t packed_bytes(int M, int K) { return size_t(M) * K * sizeof(float); }

// Transformation 1: gather x rows, bf16 -> fp32.
void pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, void* I) {
  float* dst = static_cast<float*>(I);
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < K; ++j) dst[int64_t(m) * K + j] = bf16_to_f32(x[int64_t(rows[m]) * ldx + j]);
}

// Algorithm 1's product for one W row and one I row over [k0, k1) (fp32 accumulation along K).
float dot(const bf16_t* w, const float* in, int k0, int k1) {
  float acc = 0.f;
  for (int j = k0; j < k1; ++j) acc += bf16_to_f32(w[j]) * in[j];
  return acc;
}

// The canonical order (pieces.h): one dot per piece, pieces added to 0.f in ascending y.
float dot(const bf16_t* w, const float* in, int K) {
  const int c0 = piece_phase(w);
  float s = 0.f;
  for (int y = 0; y < K; y = piece_end(y, c0, K)) s += dot(w, in, y, piece_end(y, c0, K));
  return s;
}

void piece_dots(const PieceTask& t) {
  const float* I = static_cast<const float*>(t.I);
  for (int r = 0; r < t.nrows; ++r)
    for (int p = 0; p < t.npieces; ++p)
      for (int m = 0; m < t.M; ++m)
        t.out[(int64_t(r) * t.npieces + p) * t.M + m] =
            0.f + dot(t.w + r * t.ldw, I + int64_t(m) * t.K, t.pieces[2 * p], t.pieces[2 * p + 1]);
}

void gate_up(const GateUpTask& t) {
  const float* I = static_cast<const float*>(t.I);
  for (int j = 0; j < t.n; ++j)
    for (int m = 0; m < t.M; ++m) {
      const float* in = I + int64_t(m) * t.K;
      const float g = dot(t.w_gate + j * t.ldw_gate, in, t.K);
      const float u = dot(t.w_up + j * t.ldw_up, in, t.K);
      Scalar::put_act(t.act, t.act_K, m, t.n0 + j, silu_mul(g, u));
    }
}

void down(const DownTask& t) {
  const float* act = static_cast<const float*>(t.act);
  for (int j = 0; j < t.n; ++j)
    for (int m = 0; m < t.M; ++m)  // transformation 3: W row j's results go to column n0+j of y
      t.y[m * t.ldy + t.n0 + j] = dot(t.w_down + j * t.ldw, act + int64_t(m) * t.K, t.K);
}

}  // namespace

const MicroKernel microkernel_scalar_bf16{
    "scalar", Dtype::bf16, nullptr,
    Blocking{/*task_rows=*/64, 0, {}, 0, 0, 0, 0, 0, 0, 0, false, 0},  // plain loops: no blocking
    packed_bytes, pack_tokens, gate_up, down, piece_dots, store_act<Scalar>,
    /*mixed_cuts=*/true};  // dot() cuts every row at its own pieces

}  // namespace hina
