// Canonical K pieces: the fixed summation order shared by the plain and the NUMA-partitioned kernel.
//
// Every dot product W[n] . I[m] is computed as a sum of *pieces*: row n is cut at each 4 KiB address
// boundary (every 2 MiB boundary is one too), rounded UP to the 32-element chunk (the AMX k_r; one
// 64-byte line when the row is 64-byte aligned, as torch allocates). Each piece is accumulated from
// zero by the micro-kernel (its own register/tile accumulators, its own horizontal sum), and the
// pieces are added to an fp32 0.f in ascending y. The plain kernel chains them in registers/L1; the
// NUMA-partitioned kernel computes each node's pieces on that node and the driver adds all pieces
// of a row in the same ascending order: the two give bit-identical results, for any node count,
// page model or thread count. A piece never spans a page boundary, so every interleaving (4 KiB or
// 2 MiB pages, any node count) assigns each whole piece to one node (a 32-element chunk that
// straddles a page edge -- only when a row is not 64-byte aligned -- goes with its first element).
//
// Pure arithmetic on addresses and indices; `static inline` (internal linkage, see glue.h).
#pragma once
#include <cstdint>

namespace hina {

constexpr int kPieceElems = 2048;  // bf16 elements per 4 KiB
constexpr int kMaxPieces = 160;    // pieces per row at most (K <= 157 * 2048)

// The first cut of a row at `p` (elements, a multiple of 32, in [0, 2048); 0: cuts at 2048, 4096..).
static inline int piece_phase(const void* p) {
  const int b = int((4096 - (reinterpret_cast<uintptr_t>(p) & 4095)) & 4095) / 2;
  return ((b + 31) & ~31) & (kPieceElems - 1);
}
// End of the piece starting at y (the first cut > y, capped at K).
static inline int piece_end(int y, int c0, int K) {
  const int c = c0 + kPieceElems * ((y - c0 + kPieceElems) / kPieceElems);
  return c < K ? c : K;
}
// Ordinal of the piece starting at y within its row (the number of cuts <= y).
static inline int piece_ordinal(int y, int c0) {
  if (c0 == 0) return y / kPieceElems;
  return y < c0 ? 0 : (y - c0) / kPieceElems + 1;
}
// All pieces of [0, K) for first cut c0, as (k0, k1) pairs; returns how many.
static inline int row_pieces(int c0, int K, int32_t* out) {
  int n = 0;
  for (int y = 0; y < K; y = piece_end(y, c0, K), ++n) {
    out[2 * n] = y;
    out[2 * n + 1] = piece_end(y, c0, K);
  }
  return n;
}

}  // namespace hina
