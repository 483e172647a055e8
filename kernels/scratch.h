// A per-thread scratch buffer, 64-byte aligned, grown on demand (a few hundred KiB at most), for the
// micro-kernels' glue (glue.h, quant_glue.h) and the attention driver's fp32 buffers. Trivially
// destructible on purpose (thread_local objects with destructors upset GCC's LTO here): the buffer of a
// thread lives as long as the thread (OpenMP's pool). Internal linkage, as everything the ISA files
// include (glue.h, LINKAGE).
#pragma once
#include <cstddef>
#include <cstdlib>

namespace hina {
namespace {  // internal linkage, on purpose: see glue.h, LINKAGE

template <class Tp>
struct ThreadScratch {
  Tp* p;
  size_t n;
  Tp* get(size_t want) {
    if (want > n) {
      std::free(p);
      p = static_cast<Tp*>(std::aligned_alloc(64, ((want * sizeof(Tp)) + 63) & ~size_t(63)));
      if (!p) std::abort();
      n = want;
    }
    return p;
  }
};

}  // namespace
}  // namespace hina
