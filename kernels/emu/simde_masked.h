// The AVX-512 masked loads and stores with their hardware meaning, for the builds against SIMDe's
// portable AVX-512 (HINA_EMU_AVX512): include right after <simde/x86/avx512.h>.
//
// SIMDe 0.8's portable forms are not element-wise: _mm512_mask_storeu_{ps,epi32} store all 64 bytes,
// the unselected lanes as 0 (the hardware leaves that memory alone), and the masked loads read all 64
// bytes before selecting (the hardware reads only the selected lanes, so a masked load that ends at a
// buffer's end does not touch the next page). A masked store that ended a row wrote zeros over the next
// bytes: in the INT8 outer-product tiles (quant_avx512.cpp) that was another allocation's heap data
// ("malloc assertion failure" after the test passed). These touch only the selected elements.
#pragma once
#if defined(HINA_EMU_AVX512)
#include <cstdint>
#include <cstring>

namespace hina {
namespace emu {

template <class V, class E, int N>
inline V masked_load(V src, uint32_t k, const void* p) {
  alignas(64) E v[N];
  std::memcpy(v, &src, sizeof v);
  for (int i = 0; i < N; ++i)
    if ((k >> i) & 1u) std::memcpy(&v[i], static_cast<const char*>(p) + i * sizeof(E), sizeof(E));
  V r;
  std::memcpy(&r, v, sizeof r);
  return r;
}
template <class V, class E, int N>
inline void masked_store(void* p, uint32_t k, V a) {
  alignas(64) E v[N];
  std::memcpy(v, &a, sizeof v);
  for (int i = 0; i < N; ++i)
    if ((k >> i) & 1u) std::memcpy(static_cast<char*>(p) + i * sizeof(E), &v[i], sizeof(E));
}

}  // namespace emu
}  // namespace hina

#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps(k, p) (::hina::emu::masked_load<__m512, float, 16>(_mm512_setzero_ps(), (k), (p)))
#undef _mm512_mask_loadu_epi32
#define _mm512_mask_loadu_epi32(src, k, p) (::hina::emu::masked_load<__m512i, int32_t, 16>((src), (k), (p)))
#undef _mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi32(k, p) (::hina::emu::masked_load<__m512i, int32_t, 16>(_mm512_setzero_si512(), (k), (p)))
#undef _mm512_maskz_loadu_epi64
#define _mm512_maskz_loadu_epi64(k, p) (::hina::emu::masked_load<__m512i, int64_t, 8>(_mm512_setzero_si512(), (k), (p)))
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps(p, k, a) (::hina::emu::masked_store<__m512, float, 16>((p), (k), (a)))
#undef _mm512_mask_storeu_epi32
#define _mm512_mask_storeu_epi32(p, k, a) (::hina::emu::masked_store<__m512i, int32_t, 16>((p), (k), (a)))
#endif
