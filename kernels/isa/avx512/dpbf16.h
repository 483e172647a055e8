// vdpbf16ps, the one AVX512_BF16 instruction the AVX-512 kernels use, and its arithmetic in AVX-512F for
// the CPUs that have AVX-512 but not AVX512_BF16 (Cascade Lake, Ice Lake, and virtual machines that hide
// the bit): the same three sources (microkernel_avx512.cpp, quant_avx512.cpp, attention_avx512.cpp) are
// built a second time into `_C` with HINA_AVX512_NOBF16 and without -mavx512bf16 (CMakeLists.txt), their
// table entries named "avx512-nobf16" and asking isa_usable("avx512-nobf16") (AVX-512 F/BW/DQ/VL and
// VNNI, which the INT8 kernel needs). Such a build cannot emit any AVX512_BF16 instruction: the compiler
// refuses the intrinsics without the flag. Both are also built on SIMDe ("avx512-emulated",
// "avx512-nobf16-emulated"), so the tests run them on CPUs without AVX-512.
//
// The instruction, per fp32 lane i (Intel SDM, VDPBF16PS):
//     acc[i] += a.bf16[2i+1] * b.bf16[2i+1];   acc[i] += a.bf16[2i] * b.bf16[2i]
// each step an fp32 fused multiply-add (a product of two bf16 is exact in fp32), odd pair first, round to
// nearest even, denormal inputs and outputs flushed to zero. In AVX-512F: the odd bf16 of a lane are its
// high 16 bits (an AND keeps them, already an fp32), the even ones its low 16 (a shift left by 16 makes
// them one), two vfmadd231ps in the same order: the same bits as the instruction for every operand and
// sum that is not denormal.
#pragma once

// The table entries' names: the isa Python passes, the one isa_usable() checks (nullptr: the emulated
// builds, which run anywhere), and the C++ name (the two builds in one module need two).
#if defined(HINA_AVX512_NOBF16)
#define HINA_AVX512_ENTRY(name) name##_nobf16
#define HINA_AVX512_ISA_BASE "avx512-nobf16"
#else
#define HINA_AVX512_ENTRY(name) name
#define HINA_AVX512_ISA_BASE "avx512"
#endif
#if defined(HINA_EMU_AVX512)   // SIMDe's portable AVX-512 (emu/emulated.cmake)
#define HINA_AVX512_ISA HINA_AVX512_ISA_BASE "-emulated"
#define HINA_AVX512_CPU_ISA(suffix) nullptr
#else
#define HINA_AVX512_ISA HINA_AVX512_ISA_BASE
#define HINA_AVX512_CPU_ISA(suffix) HINA_AVX512_ISA_BASE suffix
#endif

namespace hina {
namespace {  // internal linkage: see glue.h, LINKAGE

// The 16 even / odd bf16 of a zmm of pairs as fp32 (the low / high half of each lane).
inline __m512 even_f32(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
inline __m512 odd_f32(__m512i v) {
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u))));
}

inline __m512 dpbf16(__m512 acc, __m512bh a, __m512bh b) {
#if defined(HINA_AVX512_NOBF16)
  __m512i ai, bi;
  static_assert(sizeof(ai) == sizeof(a), "a zmm of bf16 pairs");
  __builtin_memcpy(&ai, &a, sizeof ai);
  __builtin_memcpy(&bi, &b, sizeof bi);
  acc = _mm512_fmadd_ps(odd_f32(ai), odd_f32(bi), acc);
  return _mm512_fmadd_ps(even_f32(ai), even_f32(bi), acc);
#else
  return _mm512_dpbf16_ps(acc, a, b);
#endif
}

}  // namespace
}  // namespace hina
