// The portable attention micro-kernel (no ISA flags): natural-order fp32 rows, std::exp2. The
// reference the SIMD kernels' logic is checked against, and what runs where no SIMD kernel can.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/attention.h"

namespace hina {
namespace {

void pack_q(const bf16_t* const* rows, int nrows, int d, float scale, float* qp) {
  for (int r = 0; r < nrows; ++r)
    for (int i = 0; i < d; ++i) qp[int64_t(r) * d + i] = bf16_to_f32(rows[r][i]) * scale;
}

void scores(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds) {
  for (int r = 0; r < nrows; ++r)
    for (int j = 0; j < nkeys; ++j) {
      float acc = 0.f;
      for (int i = 0; i < d; ++i) acc += qp[int64_t(r) * d + i] * bf16_to_f32(keys[j][i]);
      S[int64_t(r) * lds + j] = acc;
    }
}

void softmax_step(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nrows; ++r) {
    float* s = S + int64_t(r) * lds;
    float mx = m[r];
    for (int j = 0; j < nkeys; ++j) mx = std::max(mx, s[j]);
    if (mx == ninf) {                  // every key so far masked: nothing to add
      for (int j = 0; j < nkeys; ++j) s[j] = 0.f;
      continue;
    }
    const float alpha = std::exp2(m[r] - mx);   // m = -inf: 0, and l, O are 0 anyway
    float sum = 0.f;
    for (int j = 0; j < nkeys; ++j) sum += (s[j] = std::exp2(s[j] - mx));
    l[r] = l[r] * alpha + sum;
    m[r] = mx;
    if (alpha != 1.f)
      for (int i = 0; i < d; ++i) O[int64_t(r) * d + i] *= alpha;
  }
}

void pv(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O) {
  for (int r = 0; r < nrows; ++r)
    for (int j = 0; j < nkeys; ++j) {
      const float p = P[int64_t(r) * lds + j];
      for (int i = 0; i < d; ++i) O[int64_t(r) * d + i] += p * bf16_to_f32(vals[j][i]);
    }
}

void unpack_o(const float* O, int d, float scale, float* out) {
  for (int i = 0; i < d; ++i) out[i] = O[i] * scale;
}

}  // namespace

const AttnMicroKernel attn_microkernel_scalar{
    "scalar", nullptr, {/*chunk_keys=*/32, /*block_rows=*/32, /*stage_strided=*/true, /*prefetch_l2=*/true, /*prefetch_steps=*/1, /*prefetch_order=*/0}, nullptr, pack_q, scores, softmax_step, pv, unpack_o, nullptr};

}  // namespace hina
