// The table of micro-kernels built into this module, and the per-call lookup by (isa, dtype).
// This file has no ISA flags: it reads the entries (constant data) and calls cpu.cpp's isa_usable()
// before handing out an entry whose code needs an ISA, so a module imports and runs on any x86-64
// CPU and an ISA the CPU lacks is refused with an error, never a SIGILL.
#include "microkernel.h"
#include "quant.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "kernel_table.h"  // find_usable, isa_names
#if !defined(HINA_EMU_MODULE_NAME)
#include "common.h"        // cpu_features
#endif

namespace hina {

const std::vector<const MicroKernel*>& microkernels() {
  static const std::vector<const MicroKernel*> table{
      &microkernel_scalar_bf16,
#if defined(HINA_EMU_AMX)
      &microkernel_amx_bf16,
#elif defined(HINA_EMU_AVX512)
      &microkernel_avx512_bf16, &microkernel_avx512_bf16_nobf16,
#else
      &microkernel_avx2_bf16, &microkernel_avx512_bf16, &microkernel_avx512_bf16_nobf16, &microkernel_amx_bf16,
#endif
  };
  return table;
}

const MicroKernel& find_microkernel(const std::string& isa, Dtype dtype) {
  auto same_dtype = [&](const MicroKernel& m) { return m.dtype == dtype; };
  if (const MicroKernel* mk = find_usable(microkernels(), isa, same_dtype)) return *mk;
  throw std::invalid_argument("isa '" + isa + "' is not built into this module (it has: " +
                              isa_names(microkernels()) + ")");
}

const std::vector<const QuantMicroKernel*>& quant_microkernels() {
  static const std::vector<const QuantMicroKernel*> table{
#if defined(HINA_EMU_AVX512)
      &quant_microkernel_avx512_int8, &quant_microkernel_avx512_fp8, &quant_microkernel_avx512_int8_nobf16,
      &quant_microkernel_avx512_fp8_nobf16,
#elif defined(HINA_EMU_AMX)
      &quant_microkernel_amx_int8, &quant_microkernel_amx_fp8,
#else
      &quant_microkernel_avx2_int8, &quant_microkernel_avx2_fp8, &quant_microkernel_avx512_int8,
      &quant_microkernel_avx512_fp8, &quant_microkernel_avx512_int8_nobf16, &quant_microkernel_avx512_fp8_nobf16,
      &quant_microkernel_amx_int8, &quant_microkernel_amx_fp8,
#endif
  };
  return table;
}

const QuantMicroKernel& find_quant_microkernel(const std::string& isa, Dtype dtype) {
  auto same_dtype = [&](const QuantMicroKernel& m) { return m.dtype == dtype; };
  if (const QuantMicroKernel* mk = find_usable(quant_microkernels(), isa, same_dtype)) return *mk;
  // The quantized tables hold several dtypes: list only the ISAs that have this one.
  const char* dname = dtype == Dtype::int8 ? "int8" : dtype == Dtype::fp8 ? "fp8" : "bf16";
  const std::string known = isa_names(quant_microkernels(), same_dtype);
  throw std::invalid_argument("no " + std::string(dname) + " micro-kernel for isa '" + isa +
                              "' in this module (" + dname + " has: " + (known.empty() ? "none" : known) + ")");
}

// ---- the AVX-512 BF16 kernel's blocking (microkernel.h) ---------------------------------------------
namespace {
constexpr const char* kBlockingChoices[] = {"auto", "default", "zen5", "xeon"};
int blocking_choice_of(const std::string& name) {
  for (int i = 0; i < 4; ++i)
    if (name == kBlockingChoices[i]) return i;
  throw std::invalid_argument("avx512 blocking must be auto, default, zen5 or xeon (got '" + name + "')");
}
std::atomic<int>& blocking_choice() {
  static std::atomic<int> c{[] {
    const char* e = std::getenv("HINA_AVX512_BLOCKING");
    if (e == nullptr || *e == 0) return 0;
    try {
      return blocking_choice_of(e);
    } catch (const std::invalid_argument&) {
      return 0;  // a bad value in the environment: auto (hinabench.kernels says so)
    }
  }()};
  return c;
}
}  // namespace

const char* avx512_blocking() { return kBlockingChoices[blocking_choice().load(std::memory_order_relaxed)]; }
Avx512Tiles avx512_tiles() {
  const int c = blocking_choice().load(std::memory_order_relaxed);
  if (c != 0) return Avx512Tiles(c - 1);
#if defined(HINA_EMU_MODULE_NAME)
  return Avx512Tiles::kDefault;  // an emulated module: no CPU of its own (cpu.cpp is _C's)
#else
  static const Avx512Tiles tiles = cpu_features().amd && cpu_features().family >= 26 ? Avx512Tiles::kZen5
                                   : cpu_features().intel                             ? Avx512Tiles::kXeon
                                                                                      : Avx512Tiles::kDefault;
  return tiles;
#endif
}
const char* avx512_tiles_name() { return kBlockingChoices[int(avx512_tiles()) + 1]; }
bool avx512_blocking_zen5() { return avx512_tiles() == Avx512Tiles::kZen5; }
void set_avx512_blocking(const std::string& choice) { blocking_choice().store(blocking_choice_of(choice)); }

}  // namespace hina
