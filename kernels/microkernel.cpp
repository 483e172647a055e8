// The table of micro-kernels built into this module, and the per-call lookup by (isa, dtype).
// This file has no ISA flags: it reads the entries (constant data) and calls cpu.cpp's isa_usable()
// before handing out an entry whose code needs an ISA, so a module imports and runs on any x86-64
// CPU and an ISA the CPU lacks is refused with an error, never a SIGILL.
#include "microkernel.h"
#include "quant.h"

#include <stdexcept>

#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
#include "common.h"  // isa_usable (cpu.cpp)
#endif

namespace hina {

const std::vector<const MicroKernel*>& microkernels() {
  static const std::vector<const MicroKernel*> table{
      &microkernel_scalar_bf16,
#if defined(HINA_EMU_AMX)
      &microkernel_amx_bf16,
#elif defined(HINA_EMU_AVX512)
      &microkernel_avx512_bf16,
#else
      &microkernel_avx2_bf16, &microkernel_avx512_bf16, &microkernel_amx_bf16,
#endif
  };
  return table;
}

const MicroKernel& find_microkernel(const std::string& isa, Dtype dtype) {
  for (const MicroKernel* mk : microkernels()) {
    if (isa != mk->isa || dtype != mk->dtype) continue;
#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
    // Never SIGILL: a kernel runs only if cpuid (and, for AMX, the OS's permission) allows it.
    if (mk->cpu_isa && !isa_usable(mk->cpu_isa))
      throw std::invalid_argument("isa '" + isa + "' is not usable on this CPU");
#endif
    return *mk;
  }
  std::string known;
  for (const MicroKernel* mk : microkernels()) known += (known.empty() ? "" : ", ") + std::string(mk->isa);
  throw std::invalid_argument("isa '" + isa + "' is not built into this module (it has: " + known + ")");
}

const std::vector<const QuantMicroKernel*>& quant_microkernels() {
  static const std::vector<const QuantMicroKernel*> table{
#if defined(HINA_EMU_AVX512)
      &quant_microkernel_avx512_int8,
#elif defined(HINA_EMU_AMX)
      &quant_microkernel_amx_int8,
#else
      &quant_microkernel_avx2_int8, &quant_microkernel_avx2_fp8, &quant_microkernel_avx512_int8,
      &quant_microkernel_amx_int8,
#endif
  };
  return table;
}

const QuantMicroKernel& find_quant_microkernel(const std::string& isa, Dtype dtype) {
  const char* dname = dtype == Dtype::int8 ? "int8" : dtype == Dtype::fp8 ? "fp8" : "bf16";
  for (const QuantMicroKernel* mk : quant_microkernels()) {
    if (isa != mk->isa || dtype != mk->dtype) continue;
#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
    if (mk->cpu_isa && !isa_usable(mk->cpu_isa))
      throw std::invalid_argument("isa '" + isa + "' is not usable on this CPU");
#endif
    return *mk;
  }
  std::string known;
  for (const QuantMicroKernel* mk : quant_microkernels())
    if (mk->dtype == dtype) known += (known.empty() ? "" : ", ") + std::string(mk->isa);
  throw std::invalid_argument("no " + std::string(dname) + " micro-kernel for isa '" + isa +
                              "' in this module (" + dname + " has: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace hina
