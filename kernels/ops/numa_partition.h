// Interleave-aware task partitioning (paper Section 5.3, Algorithm 2) for the HiNa-MoE driver.
//
// The segments themselves (Eq. 3-5, generalised to the tensor's page size and address phase) are
// computed in Python (hinabench.numa.plan_for_kernel) from each weight matrix's real address and
// arrive here as flat arrays. This file turns one matrix's S_index into the kernel's work:
//   for node j, for x < T_x: the rows x, x + T_x, x + 2*T_x, ... (which share row x's segments, Eq. 4)
//   taken 32 at a time (the W tile rows, Algorithm 2 line 5), over node j's segments of row x cut
//   into canonical K pieces (moe_ffn.h), each piece's product into its own slot of a partial buffer.
// The driver then adds every row's pieces in ascending y (the reduction across nodes), which is the
// plain kernel's order: results are bit-identical to numa="off" for any node count.
//
// Segment edges and tiles: a segment edge y is rounded UP to the 32-element chunk (the micro-kernels'
// K granularity: the AMX k_r, 2 AVX2 loads, 1 AVX-512 load), i.e. a chunk that straddles a page
// boundary is read by the node holding its first element. When a row starts 64-byte aligned (every
// torch allocation; views at multiples of 32 elements) chunks are cache lines and page boundaries
// fall on chunk edges: no byte is read remotely. Otherwise at most 62 bytes per page boundary are.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "microkernel.h"

namespace hina {

// One weight matrix's S_index (Section 5.3): T_x and, per node, its (x, y_start, y_end) for x < T_x.
struct MatrixPlan {
  int T_x = 1;
  int64_t phase_bytes = 0, page_bytes = 4096;  // the placement model (for the remote-byte count)
  const int32_t* seg_off = nullptr;            // [nodes + 1] offsets into segs (triples)
  const int32_t* segs = nullptr;
};

// Flat plans for every (matrix kind, expert): kind 0 = gate, 1 = up, 2 = down.
struct NumaPlans {
  int nodes = 1;
  int64_t E = 0;
  const int32_t* mat_plan = nullptr;  // [3 * E]: plan index of (kind, expert) at kind * E + e
  const int64_t* plan_hdr = nullptr;  // [P * 4]: T_x, phase bytes, page bytes, first seg_off index
  const int32_t* seg_off = nullptr;   // [P * (nodes + 1)]
  const int32_t* segs = nullptr;      // [S * 3]
  std::vector<std::vector<int>> node_cpus;  // per node; empty: do not bind (virtual nodes)
  MatrixPlan plan(int kind, int64_t e) const;
};

// One weight matrix instance on the piece path: an active expert's gate, up or down.
struct PieceMatrix {
  const bf16_t* w;  // row 0
  int64_t ldw;      // row stride (elements)
  int N, K, M;
  const void* I;    // packed tokens (gate/up) or activation (down)
  float* partial;   // [N][max_pieces][M]
  int max_pieces;
  MatrixPlan plan;  // plan.seg_off == nullptr: the plain kernel's one-node plan (rows with differing cuts)
};

struct PieceTaskRef {  // rows x + (i0 + r) * T_x, r < nrows, of matrix `mat`, pieces [p0, p0 + np)
  int32_t node, mat, x, i0, nrows, p0, np;
};

// All tasks of a set of matrices, per node; pieces and their slot ordinals in shared pools.
struct PieceWork {
  std::vector<PieceMatrix> mats;
  std::vector<std::vector<PieceTaskRef>> per_node;
  std::vector<int32_t> pieces;    // (k0, k1) pairs
  std::vector<int32_t> ordinal;   // one per piece: its slot in the row
  void build(int nodes, int rows_per_task);
};

int max_pieces(int K);  // slots per row in a partial buffer
// The plain kernel's row classes: rows x + i*T share their cuts, T = 2048 / gcd(row stride, 2048).
int plain_period(int64_t ldw);
inline int period_of(const PieceMatrix& pm) { return pm.plan.seg_off ? pm.plan.T_x : plain_period(pm.ldw); }
// Runs one task on the calling thread (scratch: thread-local). Optionally counts bytes for stats.
void run_piece_task(const PieceWork& work, const PieceTaskRef& t, const MicroKernel& mk);
// Row n's reduced dot for token m: its pieces added to 0.f in ascending y (the canonical order).
inline float reduce_row(const PieceMatrix& pm, int n, int m, int npieces_row) {
  const float* p = pm.partial + int64_t(n) * pm.max_pieces * pm.M + m;
  float v = 0.f;
  for (int q = 0; q < npieces_row; ++q) v += p[int64_t(q) * pm.M];
  return v;
}
int row_piece_count(const bf16_t* row, int K);

// Thread -> node assignment and binding (sched_setaffinity from the cpus Python read in sysfs).
std::vector<int> nodes_of_thread(int thread, int threads, int nodes);
struct AffinityGuard {  // restores the calling thread's affinity on destruction
  bool saved = false;
  std::vector<unsigned char> mask;
  void bind(const std::vector<int>& cpus);
  ~AffinityGuard();
};

// ---- testing: what the last partitioned call read, per node -------------------------------------
struct NumaStats {
  bool enabled = false;
  std::vector<int64_t> bytes;         // weight bytes read by each node's threads
  std::vector<int64_t> remote_bytes;  // of those, bytes on another node under the placement model
  std::vector<int64_t> tasks;
  int64_t rows_checked = 0, rows_bad = 0;  // rows whose pieces do not tile [0, K) exactly once
  std::string first_error;
};
NumaStats& numa_stats();
void numa_stats_begin(int nodes, int threads);
void numa_stats_record(const PieceWork& work, int work_id, const PieceTaskRef& t, int thread);
void numa_stats_finish(const std::vector<const PieceWork*>& works);

}  // namespace hina
