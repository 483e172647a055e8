// The lookup every micro-kernel table shares (microkernel.cpp: bf16 and quantized; ops/attention.cpp):
// the entry a call names, refused if this CPU cannot run it, and the names an error lists as built.
// Each table words its own "not built" error (what it is, which entries it lists): that is all that
// differs between them.
// Include it only from files WITHOUT ISA flags: its std::string code has external linkage (COMDAT),
// which an ISA file must not emit (see LINKAGE in glue.h).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
#include "common.h"  // isa_usable (cpu.cpp)
#endif

namespace hina {

struct AnyEntry {
  template <class Entry>
  bool operator()(const Entry&) const { return true; }
};

// The first entry named `isa` for which `wanted(entry)` also holds (its dtype, say), or nullptr if the
// module has none. Throws std::invalid_argument if it is there but the CPU (or the OS) does not allow
// its ISA, so an ISA the CPU lacks is an error, never a SIGILL. The emulated modules' entries run on any
// x86-64 CPU: they skip the check (and have no cpu.cpp to ask).
template <class Entry, class Wanted = AnyEntry>
const Entry* find_usable(const std::vector<const Entry*>& table, const std::string& isa, Wanted wanted = {}) {
  for (const Entry* mk : table) {
    if (isa != mk->isa || !wanted(*mk)) continue;
#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
    if (mk->cpu_isa && !isa_usable(mk->cpu_isa))
      throw std::invalid_argument("isa '" + isa + "' is not usable on this CPU");
#endif
    return mk;
  }
  return nullptr;
}

// The names of the entries for which `listed(entry)` holds, "a, b, c": what a "not built" error offers.
template <class Entry, class Listed = AnyEntry>
std::string isa_names(const std::vector<const Entry*>& table, Listed listed = {}) {
  std::string known;
  for (const Entry* mk : table)
    if (listed(*mk)) known += (known.empty() ? "" : ", ") + std::string(mk->isa);
  return known;
}

}  // namespace hina
