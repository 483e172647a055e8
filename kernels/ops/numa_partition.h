// Interleave-aware task partitioning (paper Section 5; Algorithm 2 of Section 5.3) for the HiNa-MoE
// driver: the piece path, from the plan arrays to the reduced products.
//
// Equations 3-5 (Section 5.2: the placement function, the periods T_x and T_y, each node's local
// segments; here generalised to the tensor's page size and address phase) are NOT computed here:
// Python computes the NUMA plan once, for both the model and the kernel, in hinabench's numa package
// (plan_for_kernel), from each weight matrix's real address, and passes the plan arrays in (MoeCall).
// This file turns one matrix's S_index (Section 5.3) into the kernel's work:
//   for node j, for x < T_x: the rows x, x + T_x, x + 2*T_x, ... (which share row x's segments, Eq. 4)
//   taken 32 at a time (the W tile rows, Algorithm 2 line 5), over node j's segments of row x cut
//   into canonical K pieces (pieces.h), each piece's product into its own slot of a partial buffer.
// Then, still here, the reduction across nodes: every row's pieces added in ascending y, which is the
// plain kernel's order (results are bit-identical to numa="off" for any node count), and
// transformation 2 (gate/up, the micro-kernel's store_act) or 3 (down, into the y rows).
// The same path serves the plain kernel on a projection whose rows do not all share their piece
// cuts (row stride not a multiple of 2048 elements): one node, whole rows, the same order.
//
// Segment edges and tiles: a segment edge y is rounded UP to the 32-element chunk (the micro-kernels'
// K granularity: the AMX k_r, 2 AVX2 loads, 1 AVX-512 load), i.e. a chunk that straddles a page
// boundary is read by the node holding its first element. When a row starts 64-byte aligned (every
// torch allocation; views at multiples of 32 elements) chunks are cache lines and page boundaries
// fall on chunk edges: no byte is read remotely. Otherwise at most 62 bytes per page boundary are.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "microkernel.h"
#include "ops/moe_ffn.h"
#include "ops/parallel.h"
#include "pieces.h"

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
// The plans of a call with numa_nodes > 0 (throws std::invalid_argument if an array is missing).
NumaPlans numa_plans_of(const MoeCall& call);

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

// Thread -> node assignment and binding (sched_setaffinity from the cpus Python read in sysfs).
std::vector<int> nodes_of_thread(int thread, int threads, int nodes);
struct AffinityGuard {  // restores the calling thread's affinity on destruction
  bool saved = false;
  std::vector<unsigned char> mask;
  void bind(const std::vector<int>& cpus);
  ~AffinityGuard();
};

// ---- the piece path of one call ------------------------------------------------------------------
// One active expert, as the driver grouped it and placed it in its scratch.
struct ExpertSlot {
  int32_t e;   // expert id
  int M;       // tokens (grouped rows) routed to it
  void* I;     // packed tokens [M, H], the micro-kernel's layout
  void* act;   // packed activation [M, I_size]
  float* y;    // its rows of y [M, H], fp32
};

class PieceThread;

// The piece path of one call, for the projections that take it: Algorithm 2 on numa->nodes nodes,
// or (numa == nullptr) the plain kernel on rows of differing cuts. Set up serially by the driver
// (partial_bytes for its scratch layout, then build), run by every thread of its parallel region.
class PiecePath {
 public:
  PiecePath(const MoeCall& call, const NumaPlans* numa, bool gate_up, bool down);
  bool gate_up() const { return gate_up_; }
  bool down() const { return down_; }
  // Scratch bytes of one expert's partial products (M tokens) for gate and up together / for down.
  size_t gate_up_partial_bytes(int M) const;
  size_t down_partial_bytes(int M) const;
  // The work lists, once the scratch is placed: partial_gu[s], partial_down[s] for slots[s].
  void build(const std::vector<ExpertSlot>& slots, const std::vector<float*>& partial_gu,
             const std::vector<float*>& partial_down, int threads);
  // Phases 3' and 4', inside the region, by every thread: each node's threads compute the partial
  // products over its local segments only; a barrier; then the reduction across nodes (every row's
  // pieces in ascending y) and transformation 2 (store_act into the activation) or 3 (the y rows).
  void run_gate_up(PieceThread& me, const MicroKernel& mk, FirstError& err);
  void run_down(PieceThread& me, const MicroKernel& mk, FirstError& err);
  // After the region (numa_debug): check coverage, publish the counters.
  void finish();

 private:
  friend class PieceThread;
  struct Red { int32_t slot, n0; };  // a reduction task: (expert slot, 32 output columns)
  void run_pieces(PieceThread& me, const PieceWork& work, int work_id,
                  std::vector<std::atomic<int>>& next, const MicroKernel& mk, FirstError& err);
  const MoeCall& call_;
  const NumaPlans* numa_;
  bool gate_up_, down_, stats_ = false;
  int nodes_, mp_gu_, mp_down_;
  std::vector<ExpertSlot> slots_;
  PieceWork work_gu_, work_down_;
  std::vector<std::atomic<int>> next_gu_, next_down_;
  std::vector<Red> red_gu_, red_down_;
};

// A thread of the region, as Algorithm 2 groups them: its node(s), and its CPU binding (made on
// its first piece task of a real node, undone when the region ends).
class PieceThread {
 public:
  PieceThread(const PiecePath& path, int thread, int threads)
      : thread_(thread), nodes_(nodes_of_thread(thread, threads, path.nodes_)) {}
  PieceThread(const PieceThread&) = delete;
  PieceThread& operator=(const PieceThread&) = delete;

 private:
  friend class PiecePath;
  int thread_;
  std::vector<int> nodes_;
  AffinityGuard affinity_;
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
