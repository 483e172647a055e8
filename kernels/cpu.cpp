// Run-time ISA detection: cpuid for what the CPU has, XCR0 and arch_prctl for what the OS allows.
#include "common.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace hina {
namespace {

constexpr long ARCH_GET_XCOMP_PERM = 0x1022;
constexpr long ARCH_REQ_XCOMP_PERM = 0x1023;
constexpr long XFEATURE_XTILEDATA = 18;

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    f.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;    // "Auth" "enti" "cAMD"
    f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "Genu" "ineI" "ntel"
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.family = int((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? int((a >> 20) & 0xff) : 0);
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  f.os_avx512 = (xcr0 & 0xe6) == 0xe6;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_avx && ((b >> 5) & 1);
  f.avx512f = f.os_avx512 && ((b >> 16) & 1);
  f.avx512dq = f.os_avx512 && ((b >> 17) & 1);
  f.avx512bw = f.os_avx512 && ((b >> 30) & 1);
  f.avx512vl = f.os_avx512 && ((b >> 31) & 1);
  f.avx512_vnni = f.os_avx512 && ((c >> 11) & 1);
  f.avx512_vbmi = f.os_avx512 && ((c >> 1) & 1);
  f.avx512_fp16 = f.os_avx512 && ((d >> 23) & 1);
  f.amx_bf16 = (d >> 22) & 1;
  f.amx_tile = (d >> 24) & 1;
  f.amx_int8 = (d >> 25) & 1;
  unsigned max7 = a;
  if (max7 >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.os_avx512 && ((a >> 5) & 1);
  }
  if (f.amx_tile) {
    long r = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    uint64_t perm = 0;
    syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm);
    f.os_amx = r == 0 && ((perm >> XFEATURE_XTILEDATA) & 1);
    f.amx_permission = f.os_amx ? "granted" : "refused by the kernel (ARCH_REQ_XCOMP_PERM failed)";
  } else {
    f.amx_permission = "no AMX on this CPU";
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_usable(const std::string& isa) {
  const auto& f = cpu_features();
  if (isa == "scalar") return true;
  if (isa == "avx2") return f.avx2 && f.fma && f.f16c;   // the sources are built with -mf16c (FP8 uses it)
  if (isa == "avx512") return f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16;
  // the same AVX-512 sources built without AVX512_BF16 (isa/avx512/dpbf16.h); VNNI for the INT8 kernel:
  // Cascade Lake, Ice Lake, and every AVX512_BF16 CPU we know (Skylake-SP stays on avx2)
  if (isa == "avx512-nobf16") return f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512_vnni;
  // the AVX-512 FP8 kernel's byte tables (vpermt2b): every AVX512_BF16 CPU but Cooper Lake
  if (isa == "avx512-vbmi") return isa_usable("avx512") && f.avx512_vbmi;
  if (isa == "avx512-nobf16-vbmi") return isa_usable("avx512-nobf16") && f.avx512_vbmi;
  if (isa == "amx") return f.amx_tile && f.amx_bf16 && f.os_amx && f.avx512f && f.avx512bw;
  return false;
}

}  // namespace hina
