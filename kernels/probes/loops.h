// The probes' loops, written once as templates over the ISA's vector and included by
// probes_avx2.cpp and probes_avx512.cpp, each compiled with its own -m flags. Internal linkage on
// purpose (anonymous namespace), for the reason glue.h gives: no COMDAT copy of AVX-512 code may
// stand in for the AVX2 one.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace hina {
namespace {

// The read loop: block(p, acc) = acc ^ the 128 bytes at p; fold(acc0, acc1) = the two
// accumulators folded into 64 bits.
// mode 0: plain loads, 256 B per iteration; 1: plus a software prefetch 1 KiB ahead;
// 2: two streams (the two halves of the range) read alternately.
template <class Vec, class Block, class Fold>
uint64_t read_loop(const uint8_t* p, size_t n, int mode, Vec zero, Block block, Fold fold) {
  Vec acc0 = zero, acc1 = zero;
  size_t i = 0;
  const size_t step = 256;
  if (mode == 2) {
    size_t half = (n / 2) & ~size_t(step - 1);
    const uint8_t* q = p + half;
    for (; i + step <= half; i += step) {
      acc0 = block(p + i, acc0);
      acc1 = block(q + i, acc1);
      acc0 = block(p + i + 128, acc0);
      acc1 = block(q + i + 128, acc1);
    }
    p += 2 * half;
    n -= 2 * half;
    i = 0;
  }
  for (; i + step <= n; i += step) {
    if (mode == 1) _mm_prefetch((const char*)(p + i + 1024), _MM_HINT_T0);
    acc0 = block(p + i, acc0);
    acc1 = block(p + i + 128, acc1);
  }
  uint64_t r = 0;
  for (; i < n; ++i) r ^= p[i];
  return r ^ fold(acc0, acc1);
}

// The register-only peak loop: kChains independent chains of one instruction, acc = op(acc) (enough
// chains to cover its latency times its throughput), no memory operand; returns the FLOPs done (flops
// per instruction). Vec is a GNU vector type (__m256, __m512, __m512i): + and the first lane are
// generic. 10 chains fit AVX2's 16 registers with the operands; the AVX-512 loops take 20 of their 32:
// on Zen 5 (two 512-bit vdpbf16ps a cycle, each ~6 cycles long) 10 chains read the BF16 peak at ~855
// GFLOP/s over 2 threads and zentorch's and oneDNN's BF16 GEMMs then showed efficiencies of 1.04-1.12.
template <int kChains = 10, class Vec, class Op>
__attribute__((always_inline)) inline double peak_loop(Vec init, Op op, double flops, int64_t iters) {
  Vec a[kChains];
  // distinct starting values: chains that start equal compute equal values, and the compiler merged
  // ten such chains into one (a latency-bound loop counted as ten chains). A scaled init alone is not
  // distinct when init is 0: the vdpbf16ps probe started from zero and compiled to one chain until
  // 2026-12-03 (its peak read 10x one chain's latency-bound rate, 384 GFLOP/s per Zen 4 core against
  // ~225 of throughput); the offset keeps the starts apart whatever init is.
  #pragma GCC unroll 32
  for (int j = 0; j < kChains; ++j) {
    if constexpr (std::is_floating_point_v<std::remove_reference_t<decltype(init[0])>>)
      a[j] = init * (1.0f + 0.0078125f * float(j)) + 0.0078125f * float(j);
    else
      a[j] = init + j;   // integer lanes (vpdpbusd's int32 sums): starts j apart
  }
  for (int64_t i = 0; i < iters; ++i) {
    #pragma GCC unroll 32
    for (int j = 0; j < kChains; ++j) a[j] = op(a[j]);
  }
  Vec s = a[0];
  #pragma GCC unroll 32
  for (int j = 1; j < kChains; ++j) s = s + a[j];
  volatile float sink = s[0];  // kept, so nothing is elided
  (void)sink;
  return double(iters) * kChains * flops;
}

}  // namespace
}  // namespace hina
