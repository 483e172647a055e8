// The quantized micro-kernels' shared glue (quant.h's contract): what is the same for every ISA,
// written once as templates over a kernel struct `Kn` that each ISA file defines. Per ISA remain the
// tiles (the instructions) and the packed operand's element type.
//
// LINKAGE: as glue.h -- include only from ISA files, after their intrinsics header; everything here
// has internal linkage (anonymous namespace), no STL.
//
// What a kernel struct provides
//   dtype                      Dtype::int8 or Dtype::fp8
//   kRowsOne, kRows            W rows per tile for M == 1, and for M > 1
//   tile<R, TT>(w, sw, I, M, K, group, kb0, kb1, t0, c, ldc)
//                              c[r * ldc + t] += the (scaled) dot of rows w[r] and tokens t0 + t over
//                              [kb0, kb1) (whole groups / fp8 blocks)
//   scale_row(s, lds, row, group)  the scales of W row `row`
#pragma once
#include <cmath>
#include <cstdlib>

#include "numeric.h"
#include "quant.h"

namespace hina {
namespace {  // internal linkage, on purpose: see glue.h, LINKAGE

constexpr int kTokTile = 4;   // tokens per tile at most

inline size_t a64(size_t n) { return (n + 63) & ~size_t(63); }

// A per-thread fp32 buffer (gate and up sums of one task), trivially destructible (glue.h's reason).
struct TlBuf { float* p; size_t n; };
thread_local TlBuf tl_c{nullptr, 0};
float* tl_floats(size_t want) {
  if (want > tl_c.n) {
    std::free(tl_c.p);
    tl_c.p = static_cast<float*>(std::aligned_alloc(64, a64(want * sizeof(float))));
    if (!tl_c.p) std::abort();
    tl_c.n = want;
  }
  return tl_c.p;
}

// Stores of transformation 2 (fp32, row-major) and 3 (transpose), c laid out [2][n][M] / [n][M].
inline void store_act_f32(float* act, int act_K, int n0, int n, int M, const float* g, const float* u) {
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < n; ++j) act[int64_t(m) * act_K + n0 + j] = silu_mul(g[j * M + m], u[j * M + m]);
}
inline void store_y(float* y, int64_t ldy, int n0, int n, int M, const float* c) {
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < n; ++j) y[m * ldy + n0 + j] = c[j * M + m];
}

// ================================ INT8: quantization of the token side ==========================
// Packed operand: Q q[M][K] (AVX2: int16 q; AVX-512 VNNI: uint8 q + 128), then (64-byte aligned)
// fp32 scale[M][K / group].
template <class Q>
size_t i8_packed_bytes(int M, int K, int group) {
  return a64(size_t(M) * K * sizeof(Q)) + size_t(M) * (K / group) * sizeof(float);
}
template <class Q>
inline float* i8_s(const void* p, int M, int K) {
  return reinterpret_cast<float*>(const_cast<char*>(static_cast<const char*>(p)) + a64(size_t(M) * K * sizeof(Q)));
}

// One token's K values (fp32) quantized per group: hinabench.quant.quantize_act's steps.
template <class Q, int kOffset>
inline void quantize_row(const float* v, int K, int group, Q* q, float* s) {
  for (int k0 = 0; k0 < K; k0 += group) {
    float amax = 0.f;
    for (int k = k0; k < k0 + group; ++k) amax = std::fmax(amax, std::fabs(v[k]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int k = k0; k < k0 + group; ++k) {
      float r = std::nearbyint(v[k] * inv);          // round half to even (default MXCSR)
      r = std::fmin(127.f, std::fmax(-127.f, r));
      q[k] = Q(int(r) + kOffset);
    }
    s[k0 / group] = amax / 127.f;
  }
}

thread_local TlBuf tl_row{nullptr, 0};
template <class Q, int kOffset>
void i8_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int group, void* I) {
  if (K > int(tl_row.n)) {
    std::free(tl_row.p);
    tl_row.p = static_cast<float*>(std::aligned_alloc(64, a64(size_t(K) * sizeof(float))));
    if (!tl_row.p) std::abort();
    tl_row.n = size_t(K);
  }
  float* v = tl_row.p;
  Q* q = static_cast<Q*>(I);
  float* s = i8_s<Q>(I, M, K);
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) v[k] = bf16_to_f32(src[k]);
    quantize_row<Q, kOffset>(v, K, group, q + int64_t(m) * K, s + int64_t(m) * (K / group));
  }
}

template <class Q, int kOffset>
void i8_pack_act(const float* act, int M, int K, int group, void* out) {
  Q* q = static_cast<Q*>(out);
  float* s = i8_s<Q>(out, M, K);
  for (int m = 0; m < M; ++m)
    quantize_row<Q, kOffset>(act + int64_t(m) * K, K, group, q + int64_t(m) * K, s + int64_t(m) * (K / group));
}

// c[r * ldc + t] = sum_groups s_w[r][grp] * s_x[t][grp] * sum_{k in grp} W_r[k] * X_t[k]
// ================================ FP8: the token side ===========================================
constexpr float kTwo120 = 1.329227995784916e36f;  // 2^120: the e4m3 -> fp32 bit move's factor
inline int fp8_pos(int k) { return (k & ~31) | ((k & 3) << 3) | ((k & 31) >> 2); }

size_t f8_packed_bytes(int M, int K, int) { return size_t(M) * K * sizeof(float); }

void f8_pack_tokens(const bf16_t* x, int64_t ldx, const int32_t* rows, int M, int K, int, void* I) {
  float* d = static_cast<float*>(I);
  for (int m = 0; m < M; ++m) {
    const bf16_t* src = x + int64_t(rows[m]) * ldx;
    for (int k = 0; k < K; ++k) d[int64_t(m) * K + fp8_pos(k)] = bf16_to_f32(src[k]);
  }
}

void f8_pack_act(const float* act, int M, int K, int, void* out) {
  float* d = static_cast<float*>(out);
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) d[int64_t(m) * K + fp8_pos(k)] = act[int64_t(m) * K + k];
}

// ================================ the shared loop: rows x token tiles ============================
template <class Kn, int R>
void rows_tokens(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I,
                 int M, int K, int group, int kb, float* c) {
  const int nblk = (K + 127) / 128;
  float scaled[R * 1024];  // fp8: this tile's block scales x 2^120 (K <= 131072)
  for (int64_t i = 0; i < int64_t(n) * M; ++i) c[i] = 0.f;
  for (int kb0 = 0; kb0 < K; kb0 += kb) {
    const int kb1 = kb0 + kb < K ? kb0 + kb : K;
    for (int r = 0; r + R <= n; r += R) {
      const int8_t* w[R];
      const float* sw[R];
      for (int q = 0; q < R; ++q) {
        w[q] = w0 + int64_t(n0 + r + q) * ldw;
        const float* sr = Kn::scale_row(s0, lds, n0 + r + q, group);
        if constexpr (Kn::dtype == Dtype::fp8) {
          float* dst = scaled + q * nblk;
          for (int b = kb0 / 128; b < (kb1 + 127) / 128; ++b) dst[b] = sr[b] * kTwo120;
          sw[q] = dst;
        } else {
          sw[q] = sr;
        }
      }
      float* cr = c + int64_t(r) * M;
      int t = 0;
      for (; t + kTokTile <= M; t += kTokTile)
        Kn::template tile<R, kTokTile>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M);
      switch (M - t) {
        case 3: Kn::template tile<R, 3>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M); break;
        case 2: Kn::template tile<R, 2>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M); break;
        case 1: Kn::template tile<R, 1>(w, sw, I, M, K, group, kb0, kb1, t, cr + t, M); break;
        default: break;
      }
    }
  }
}

// One matrix's rows [n0, n0+n) x all tokens into c [n][M]. Decode (M <= 4, one token tile): the
// whole K at once, Kn::kRowsOne rows per tile for one token (memory-bound: more rows in flight), else
// Kn::kRows. More tokens: K blocks of 1024 (a multiple of every group and of fp8's 128), kRows rows x
// 4 tokens.
template <class Kn>
void mm(const int8_t* w0, int64_t ldw, const float* s0, int64_t lds, int n0, int n, const void* I, int M,
        int K, int group, float* c) {
  if (M == 1) rows_tokens<Kn, Kn::kRowsOne>(w0, ldw, s0, lds, n0, n, I, M, K, group, K, c);
  else if (M <= kTokTile) rows_tokens<Kn, Kn::kRows>(w0, ldw, s0, lds, n0, n, I, M, K, group, K, c);
  else rows_tokens<Kn, Kn::kRows>(w0, ldw, s0, lds, n0, n, I, M, K, group, 1024, c);
}

template <class Kn>
void q_gate_up(const QGateUpTask& t) {
  float* c = tl_floats(size_t(2) * t.n * t.M);
  mm<Kn>(t.w_gate, t.ldw_gate, t.s_gate, t.lds_gate, t.n0, t.n, t.I, t.M, t.K, t.group, c);
  mm<Kn>(t.w_up, t.ldw_up, t.s_up, t.lds_up, t.n0, t.n, t.I, t.M, t.K, t.group, c + int64_t(t.n) * t.M);
  store_act_f32(t.act, t.act_K, t.n0, t.n, t.M, c, c + int64_t(t.n) * t.M);
}

template <class Kn>
void q_down(const QDownTask& t) {
  float* c = tl_floats(size_t(t.n) * t.M);
  mm<Kn>(t.w, t.ldw, t.s, t.lds, t.n0, t.n, t.act, t.M, t.K, t.group, c);
  store_y(t.y, t.ldy, t.n0, t.n, t.M, c);
}

}  // namespace
}  // namespace hina
