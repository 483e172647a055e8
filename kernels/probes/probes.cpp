// Roofline probes: a STREAM-like read of given buffers (ideally the kernel's own weights, in the
// same process, just before and after its samples) and a register-only FMA loop for the compute peak.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "common.h"

namespace hina {
namespace {

std::atomic<uint64_t> g_sink{0};

uint64_t read_scalar(const uint8_t* p, size_t n) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) acc ^= *reinterpret_cast<const uint64_t*>(p + i);
  for (; i < n; ++i) acc ^= p[i];
  return acc;
}

// Thread tid's contiguous share [first, second) of `total` bytes over nt threads, cut at 4 KiB.
std::pair<size_t, size_t> thread_share(size_t total, int nt, int tid) {
  const size_t share = ((total / nt) + 4095) & ~size_t(4095);
  return {std::min(total, share * tid), std::min(total, share * (tid + 1))};
}

struct ReadVariant { const char* name; const char* isa; int mode; };
constexpr ReadVariant kReadVariants[] = {
    {"avx512", "avx512f", 0},        {"avx512-prefetch", "avx512f", 1},
    {"avx512-2streams", "avx512f", 2}, {"avx2", "avx2", 0},
    {"avx2-prefetch", "avx2", 1},    {"avx2-2streams", "avx2", 2},
    {"scalar", "scalar", 0},
};

bool variant_usable(const ReadVariant& v) {
  const auto& f = cpu_features();
  std::string isa = v.isa;
  if (isa == "avx512f") return f.avx512f && f.avx512bw;
  if (isa == "avx2") return f.avx2;
  return true;
}

const ReadVariant& find_variant(const std::string& name) {
  for (const auto& v : kReadVariants)
    if (name == v.name) {
      if (!variant_usable(v)) throw std::invalid_argument("read kernel '" + name + "' needs an ISA this CPU lacks");
      return v;
    }
  throw std::invalid_argument("unknown read kernel '" + name + "'");
}

}  // namespace

std::vector<std::string> read_variants() {
  std::vector<std::string> out;
  for (const auto& v : kReadVariants)
    if (variant_usable(v)) out.emplace_back(v.name);
  return out;
}

double read_pass(const std::vector<Buffer>& bufs, int threads, const std::string& variant) {
  const ReadVariant& v = find_variant(variant);
  size_t total = 0;
  for (const auto& b : bufs) total += b.bytes;
  if (threads < 1) threads = 1;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    // Each thread reads one contiguous share of the concatenated buffers.
    const auto [begin, end] = thread_share(total, omp_get_num_threads(), omp_get_thread_num());
    uint64_t acc = 0;
    size_t base = 0;
    for (const auto& b : bufs) {
      size_t lo = std::max(begin, base), hi = std::min(end, base + b.bytes);
      if (lo < hi) {
        const uint8_t* p = static_cast<const uint8_t*>(b.ptr) + (lo - base);
        size_t n = hi - lo;
        if (std::string(v.isa) == "avx512f") acc ^= read_avx512(p, n, v.mode);
        else if (std::string(v.isa) == "avx2") acc ^= read_avx2(p, n, v.mode);
        else acc ^= read_scalar(p, n);
      }
      base += b.bytes;
    }
    g_sink.fetch_xor(acc, std::memory_order_relaxed);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

double stream_work_pass(const void* p, size_t bytes, int threads, int work, int64_t ahead, int repeat) {
  const auto& f = cpu_features();
  if (!f.avx2 || !f.fma) throw std::invalid_argument("the overlap probe needs AVX2 and FMA, which this CPU lacks");
  if (work < 0 || ahead < 0 || repeat < 1) throw std::invalid_argument("work and ahead must be >= 0, repeat >= 1");
  if (threads < 1) threads = 1;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    const auto [begin, end] = thread_share(bytes, omp_get_num_threads(), omp_get_thread_num());
    uint64_t acc = 0;
    for (int r = 0; r < repeat; ++r)
      acc ^= stream_work_avx2(static_cast<const uint8_t*>(p) + begin, end - begin, work, size_t(ahead));
    g_sink.fetch_xor(acc, std::memory_order_relaxed);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

struct PeakUnit {
  const char* name;
  double (*fn)(int64_t);
  bool (*usable)();
};

// Every register-only loop, with the cpuid test that lets it run (AMX: the OS grant too).
const PeakUnit kPeakUnits[] = {
    {"avx2-fma-fp32", fma_avx2, [] { return cpu_features().avx2 && cpu_features().fma; }},
    {"avx2-int16-madd", maddwd_avx2, [] { return cpu_features().avx2; }},
    {"avx2-int8-maddubs", maddubs_avx2, [] { return cpu_features().avx2; }},
    {"avx512-fma-fp32", fma_avx512, [] { return cpu_features().avx512f; }},
    {"avx512-bf16-dot", dpbf16_avx512, [] { return isa_usable("avx512"); }},
    {"avx512-vnni-int8", dpbusd_avx512, [] { return cpu_features().avx512f && cpu_features().avx512_vnni; }},
    {"amx-bf16", tdpbf16_amx, [] { return isa_usable("amx"); }},
    {"amx-int8", tdpbssd_amx, [] { return isa_usable("amx") && cpu_features().amx_int8; }},
};

}  // namespace

std::vector<std::string> peak_units() {
  std::vector<std::string> out;
  for (const auto& u : kPeakUnits)
    if (u.usable()) out.emplace_back(u.name);
  return out;
}

double peak_flops(const std::string& unit, int threads, double seconds) {
  const PeakUnit* u = nullptr;
  for (const auto& c : kPeakUnits)
    if (unit == c.name && c.usable()) u = &c;
  if (!u) throw std::invalid_argument("peak unit '" + unit + "' is not usable on this CPU");
  double (*fn)(int64_t) = u->fn;
  // Calibrate the iteration count on one thread, then run all threads together.
  int64_t iters = 1 << 14;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    fn(iters);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > seconds / 4 || iters > (int64_t(1) << 40)) {
      iters = int64_t(double(iters) * seconds / std::max(dt, 1e-9));
      break;
    }
    iters *= 4;
  }
  double flops = 0;
  auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
  { flops += fn(iters); }
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return flops / dt;
}

}  // namespace hina
