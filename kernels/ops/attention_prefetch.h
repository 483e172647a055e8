// The next step's lines (AttnPrefetch, ops/attention.h), a few at a time, for the micro-kernels' fused
// steps (AttnMicroKernel::step): the AVX-512 BF16 and the AVX2 kernels include it. No intrinsics: the
// prefetches are asm statements, which the compiler cannot drop (see ops/attention.cpp, prefetch_line).
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/attention.h"

namespace hina {
namespace {  // internal linkage: each ISA file compiles its own copy

// The next step's lines (AttnPrefetch), a few at a time: `tick` at each of `slots` points of the work
// issues them evenly (after tick s, ceil(s * total / slots) of them), every line of a row's K and V in
// turn (K's line at an offset, then V's), row by row (prefetcht0, or prefetcht1 where the segment says
// l2). The schedule is kept without a division per tick (a running remainder), and a tick issues
// whole K/V pairs of a row in one plain loop: on Zen 3's AVX2 step, which ticks every 8 keys of P x V,
// the first form's per-line bookkeeping and division per tick cost ~25% of a chunk's time from L3.
struct LinePrefetch {
  const AttnPrefetch* pf;   // the segment being issued
  int64_t total = 0, issued = 0, upto = 0, slots = 1, per = 0, rem = 0, frac = 0;
  int row = 0, off = 0;
  bool v_next = false;      // K's line at `off` issued, V's not yet
  LinePrefetch(const AttnPrefetch* p, int nslots) : pf(p), slots(std::max(1, nslots)) {
    for (; p; p = p->next) total += 2 * int64_t(std::max(0, p->n)) * ((p->bytes + 63) / 64);
    per = total / slots, rem = total % slots, frac = slots - 1;   // upto_s = floor((s * total + slots - 1) / slots)
  }
  static void line(const char* p, bool l2) {
    if (l2) __asm__ volatile("prefetcht1 %0" ::"m"(*p));
    else __asm__ volatile("prefetcht0 %0" ::"m"(*p));
  }
  void tick() {
    if (issued >= total) return;
    upto += per;
    if ((frac += rem) >= slots) frac -= slots, ++upto;
    issue();
  }
  void finish() {
    upto = total;
    issue();
  }

 private:
  void issue() {
    if (upto > total) upto = total;
    while (issued < upto) {
      while (row >= pf->n) pf = pf->next, row = 0;   // the next segment (total counts only what is there)
      const char* k = reinterpret_cast<const char*>(pf->k[row]);
      const char* v = reinterpret_cast<const char*>(pf->v[row]);
      const bool l2 = pf->l2;
      if (v_next) {
        line(v + off, l2);
        v_next = false, ++issued;
        if ((off += 64) >= pf->bytes) off = 0, ++row;
        continue;
      }
      int64_t pairs = std::min<int64_t>((upto - issued) / 2, (pf->bytes - off + 63) / 64);
      issued += 2 * pairs;
      for (; pairs > 0; --pairs, off += 64) line(k + off, l2), line(v + off, l2);
      if (off >= pf->bytes) {
        off = 0, ++row;
      } else if (issued < upto) {   // one line left in this tick: K's
        line(k + off, l2);
        v_next = true, ++issued;
      }
    }
  }
};

}  // namespace
}  // namespace hina
