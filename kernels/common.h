// Shared declarations of the hinabench C++ module: run-time ISA detection, probes, fills.
// Nothing here links against libtorch: every entry point takes raw buffers that the Python side
// has validated (dtype, shape, contiguity, alignment).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hina {

// ---- CPU features (cpu.cpp) ----------------------------------------------------------------------
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, avx512_fp16 = false, avx512_vbmi = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_avx512 = false;     // XCR0 enables opmask/ZMM state
  bool os_amx = false;        // the kernel granted XTILEDATA to this process (ARCH_REQ_XCOMP_PERM)
  bool amd = false;           // vendor "AuthenticAMD"
  bool intel = false;         // vendor "GenuineIntel"
  int family = 0;             // cpuid's display family (base + extended): AMD Zen 3/4 25, Zen 5 26
  std::string amx_permission; // what the OS answered, in words
};
const CpuFeatures& cpu_features();
bool isa_usable(const std::string& isa);  // "scalar", "avx2", "avx512", "amx"

// ---- Probes (probes*.cpp) ------------------------------------------------------------------------
struct Buffer { const void* ptr; size_t bytes; };

// One read of every buffer by `threads` threads with the named read kernel; returns seconds.
double read_pass(const std::vector<Buffer>& bufs, int threads, const std::string& variant);
std::vector<std::string> read_variants();  // the kernels usable on this CPU

// The overlap probe: every thread sweeps its share of [p, p + bytes) `repeat` times with `work` rounds
// of FMAs per 64-byte line that take the line as operand (probes_avx2.cpp) and, with ahead > 0, a
// prefetch `ahead` bytes ahead per line; returns seconds. AVX2 + FMA (every CPU hinabench targets).
double stream_work_pass(const void* p, size_t bytes, int threads, int work, int64_t ahead, int repeat);
uint64_t stream_work_avx2(const uint8_t* p, size_t n, int work, size_t ahead);

// A register-only FMA loop; returns FLOP/s.
double peak_flops(const std::string& unit, int threads, double seconds);
std::vector<std::string> peak_units();      // units usable on this CPU

// Per-ISA read loops (probes_<isa>.cpp). Each returns an xor of what it read so nothing is elided.
uint64_t read_avx2(const uint8_t* p, size_t n, int mode);
uint64_t read_avx512(const uint8_t* p, size_t n, int mode);
double fma_avx2(int64_t iters);         // FLOPs done
double fma_avx512(int64_t iters);
double dpbf16_avx512(int64_t iters);
double dpbusd_avx512(int64_t iters);
double tdpbf16_amx(int64_t iters);
double maddwd_avx2(int64_t iters);       // integer ops done
double maddubs_avx2(int64_t iters);      // integer ops done
double tdpbssd_amx(int64_t iters);

// ---- Deterministic fill (fill.cpp) ---------------------------------------------------------------
// bf16 values from a counter-based hash of (seed, index): independent of the thread count.
void fill_bf16(uint16_t* dst, size_t n, uint64_t seed, float scale, int threads);
// bf16 values of a normal-like law (standard deviation `scale`), many binades: fill.cpp says how.
void fill_bf16_normal(uint16_t* dst, size_t n, uint64_t seed, float scale, int threads);

}  // namespace hina
