// The HiNa-MoE expert-FFN driver: paper Section 4 in code (the entry point: ops/moe_ffn.h).
//
//   out[t] = sum_s topk_weights[t,s] * FFN_e(x[t]),  e = topk_ids[t,s],
//   FFN_e(I) = (SiLU(I x W_gate^T) . (I x W_up^T)) x W_down^T               (Section 4.1)
//
// Phases, one function each; 2-5 run in one OpenMP parallel region:
//   1. group tokens by expert          (serial: T*k integers)                       group_by_expert
//   2. gather + transformation 1       ("transform I, not W": the gathered rows are     gather_pack
//                                       written in the layout the ISA's MM wants; W is never touched)
//   3. gate & up, transformation 2     (tasks = (expert, block of I rows); SiLU(gate)*up    gate_up
//                                       fused into the store, written in the down MM's operand layout)
//   4. down, transformation 3          (tasks = (expert, block of H rows); transpose fused     down
//                                       into the store: y rows are token-major)
//   5. routing-weighted scatter-add    (token order, fp32 sum over top-k slots, one         scatter
//                                       bf16 rounding)
// The tasks of phases 3 and 4 (schedule_blocks) cover experts and output blocks together, so every
// thread is busy even for one token on one expert. A projection whose rows do not all share their
// piece cuts, and every projection under Algorithm 2 (numa_nodes > 0), takes the piece path
// instead (phases 3', 4': ops/numa_partition.cpp). The micro-kernel (microkernel.h) is looked up
// per call, by ISA name and dtype; a real ISA's only after cpuid (and the OS) said yes.
#include "ops/moe_ffn.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "microkernel.h"
#include "ops/numa_partition.h"
#include "ops/parallel.h"
#include "pieces.h"
#include "quant.h"

namespace hina {
namespace {

// ---- Scratch: small (tokens x H or I), grown on demand, reused across calls ---------------------
struct Scratch {
  struct Free { void operator()(void* p) const { std::free(p); } };
  std::unique_ptr<char, Free> buf;
  size_t cap = 0;
  char* get(size_t bytes) {
    if (bytes > cap) {
      buf.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) & ~size_t(63))));
      if (!buf) throw std::bad_alloc();
      cap = bytes;
    }
    return buf.get();
  }
};
std::mutex g_scratch_mutex;  // one call at a time uses the shared scratch
Scratch g_scratch;
size_t g_last_scratch_bytes = 0;

inline size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

// ---- 1. group tokens by expert (counting sort of the T*k (token, slot) pairs) --------------------
// Each (token, slot) pair becomes one row of its expert's I; a token routed to the same expert
// from several slots simply appears several times (each row carries its own routing weight).
struct Grouping {
  std::vector<int32_t> count;      // count[e + 1]: rows of expert e
  std::vector<int32_t> first;      // first row of expert e in the grouped order
  std::vector<int32_t> active;     // experts with rows, in expert order
  std::vector<int32_t> row_token;  // grouped row -> token
  std::vector<int32_t> pair_row;   // (token, slot) -> grouped row
  int rows(int32_t e) const { return count[e + 1]; }
};

Grouping group_by_expert(const MoeCall& a) {
  const int64_t T = a.T, k = a.k, E = a.E;
  Grouping g;
  g.count.assign(E + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = a.topk_ids[i];
    if (e < 0 || e >= E) throw bad_expert_id(e, E);
    g.count[e + 1]++;
  }
  g.first.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    g.first[e + 1] = g.first[e] + g.count[e + 1];
    if (g.count[e + 1]) g.active.push_back(int32_t(e));
  }
  g.row_token.resize(T * k);
  g.pair_row.resize(T * k);
  std::vector<int32_t> fill(g.first.begin(), g.first.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t r = fill[a.topk_ids[i]]++;
    g.row_token[r] = int32_t(i / k);
    g.pair_row[i] = r;
  }
  return g;
}

// ---- the tasks of phases 3 and 4: (expert slot, output block), all experts together ------------
struct Task { int32_t slot; int32_t n0; int32_t n; };

// Rows per output-block task: the kernel's preference, shrunk until every thread has >= 4 tasks.
int block_rows(int preferred, int64_t rows_per_expert, int64_t experts, int threads) {
  int nb = preferred;
  while (nb > kShapeMultiple && experts * ((rows_per_expert + nb - 1) / nb) < 4 * int64_t(threads))
    nb /= 2;
  return std::max(nb - nb % kShapeMultiple, kShapeMultiple);
}

// The last `threads` tasks of a list (the final round, where a thread that is done waits for the
// others at the phase's end) cut into tasks of a quarter of nb, rounded down to a multiple of 32 (a
// Zen 5 FFN task's 768 rows: 192, which the 6-row tiles divide too), so a thread that runs slower than
// the other, or drew the longer last task, keeps it waiting for less. The same rows, so the same sums:
// a row's dot product never depends on its task.
std::vector<Task> split_tail(std::vector<Task> tasks, int nb, int threads) {
  const int sub = (nb / 4) / kShapeMultiple * kShapeMultiple;
  if (sub < kShapeMultiple || tasks.size() < 2) return tasks;
  const size_t first = tasks.size() > size_t(threads) ? tasks.size() - size_t(threads) : 0;
  std::vector<Task> out(tasks.begin(), tasks.begin() + int64_t(first));
  for (size_t i = first; i < tasks.size(); ++i)
    for (int32_t n0 = tasks[i].n0; n0 < tasks[i].n0 + tasks[i].n; n0 += sub)
      out.push_back({tasks[i].slot, n0, std::min(sub, tasks[i].n0 + tasks[i].n - n0)});
  return out;
}

// Tasks of nb rows over slot s's rows[s] (an expert's, or a linear matrix's), slot by slot, the last
// round split (split_tail).
std::vector<Task> schedule_blocks(const std::vector<int64_t>& rows, int nb, int threads) {
  std::vector<Task> tasks;
  for (int32_t s = 0; s < int32_t(rows.size()); ++s)
    for (int32_t n0 = 0; n0 < rows[s]; n0 += nb) tasks.push_back({s, n0, int32_t(std::min<int64_t>(nb, rows[s] - n0))});
  return split_tail(std::move(tasks), nb, threads);
}
std::vector<Task> schedule_blocks(int64_t slots, int64_t rows, int nb, int threads) {
  return schedule_blocks(std::vector<int64_t>(size_t(slots), rows), nb, threads);
}

// What phases 2-5 share (read-only inside the region).
struct Phases {
  const MoeCall& a;
  const MicroKernel& mk;
  const Grouping& g;
  const std::vector<ExpertSlot>& slots;
  float* y;  // [T*k, H] fp32, grouped rows
  FirstError& err;
};

// ---- 2. gather, transformation 1 ------------------------------------------------------------------
void gather_pack(const Phases& p) {
#pragma omp for schedule(static)
  for (int64_t s = 0; s < int64_t(p.slots.size()); ++s) {
    p.err.guard([&] {
      const ExpertSlot& es = p.slots[s];
      p.mk.pack_tokens(p.a.x, p.a.ldx, &p.g.row_token[p.g.first[es.e]], es.M, int(p.a.H), es.I);
    });
  }
}

// The tasks of phase 3 or 4 on all threads, one at a time, dynamically scheduled.
template <class F>
void run_tasks(const Phases& p, const std::vector<Task>& tasks, F&& run_one) {
#pragma omp for schedule(dynamic, 1)
  for (size_t i = 0; i < tasks.size(); ++i)
    p.err.guard([&] { run_one(tasks[i], p.slots[tasks[i].slot]); });
}

// ---- 3. gate & up projections, transformation 2 ---------------------------------------------------
void gate_up(const Phases& p, const std::vector<Task>& tasks) {
  const MoeCall& a = p.a;
  run_tasks(p, tasks, [&](const Task tk, const ExpertSlot& es) {
    GateUpTask t;
    t.w_gate = a.w_gate + es.e * a.gate_es + tk.n0 * a.gate_rs;
    t.w_up = a.w_up + es.e * a.up_es + tk.n0 * a.up_rs;
    t.ldw_gate = a.gate_rs;
    t.ldw_up = a.up_rs;
    t.n0 = tk.n0;
    t.n = tk.n;
    t.K = int(a.H);
    t.M = es.M;
    t.I = es.I;
    t.act = es.act;
    t.act_K = int(a.I);
    p.mk.gate_up(t);
  });
}

// ---- 4. down projection, transformation 3 ---------------------------------------------------------
void down(const Phases& p, const std::vector<Task>& tasks) {
  const MoeCall& a = p.a;
  run_tasks(p, tasks, [&](const Task tk, const ExpertSlot& es) {
    DownTask t;
    t.w_down = a.w_down + es.e * a.down_es + tk.n0 * a.down_rs;
    t.ldw = a.down_rs;
    t.n0 = tk.n0;
    t.n = tk.n;
    t.K = int(a.I);
    t.M = es.M;
    t.act = es.act;
    t.y = es.y;
    t.ldy = a.H;
    p.mk.down(t);
  });
}

// ---- 5. routing-weighted scatter-add back to token order -----------------------------------------
// (Over (token, block of 256 columns) pairs, so that a decode step's one token is shared by every
// thread: over tokens, one thread summed all of it while the others waited.)
void scatter(const MoeCall& a, const Grouping& g, const float* y) {
  const int64_t T = a.T, H = a.H, k = a.k, nb = (H + 255) / 256;
#pragma omp for schedule(static)
  for (int64_t i = 0; i < T * nb; ++i) {
    const int64_t t = i / nb, h0 = (i % nb) * 256;
    bf16_t* o = a.out + t * H;
    const float* w = a.topk_weights + t * k;
    const int32_t* rows = &g.pair_row[t * k];
    float acc[256];
    const int64_t hn = std::min<int64_t>(256, H - h0);
    for (int64_t j = 0; j < hn; ++j) acc[j] = 0.f;
    for (int64_t s = 0; s < k; ++s) {
      const float ws = w[s];
      const float* yr = y + int64_t(rows[s]) * H + h0;
      for (int64_t j = 0; j < hn; ++j) acc[j] += ws * yr[j];
    }
    for (int64_t j = 0; j < hn; ++j) o[h0 + j] = f32_to_bf16(acc[j]);
  }
}

// Whether the plain kernel's fused tasks can take a matrix of this row stride: its rows share their
// piece cuts (a multiple of 2048 elements), or the micro-kernel handles differing cuts itself.
// Otherwise the matrix takes the piece path with one node, which keeps the canonical order.
bool fused_rows(const MicroKernel& mk, int64_t row_stride) {
  return mk.mixed_cuts || row_stride % kPieceElems == 0;
}

// numa == nullptr: the plain kernel (fused tasks, or the piece path with one node: fused_rows).
// Otherwise Algorithm 2 on numa->nodes (real or virtual) nodes.
void run(const MoeCall& a, const MicroKernel& mk, int threads, const NumaPlans* numa) {
  const int64_t T = a.T, H = a.H, I = a.I, k = a.k;
  if (T == 0) return;
  const Grouping g = group_by_expert(a);
  const int64_t A = int64_t(g.active.size());

  // ---- scratch: packed I and activation per active expert, y rows (token-major, fp32), and the
  // piece path's partial products
  const bool fused_gu = !numa && fused_rows(mk, a.gate_rs) && fused_rows(mk, a.up_rs);
  const bool fused_down = !numa && fused_rows(mk, a.down_rs);
  PiecePath pieces(a, numa, !fused_gu, !fused_down);
  std::vector<size_t> off_I(A), off_act(A), off_pgu(A), off_pdown(A);
  size_t bytes = 0;
  for (int64_t s = 0; s < A; ++s) {
    const int M = g.rows(g.active[s]);
    off_I[s] = bytes;   bytes += align64(mk.packed_bytes(M, int(H)));
    off_act[s] = bytes; bytes += align64(mk.packed_bytes(M, int(I)));
  }
  const size_t off_y = bytes;
  bytes += align64(size_t(T * k) * H * sizeof(float));
  for (int64_t s = 0; s < A; ++s) {
    const int M = g.rows(g.active[s]);
    off_pgu[s] = bytes;   bytes += align64(pieces.gate_up_partial_bytes(M));
    off_pdown[s] = bytes; bytes += align64(pieces.down_partial_bytes(M));
  }
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes);
  g_last_scratch_bytes = bytes;
  float* y = reinterpret_cast<float*>(base + off_y);
  std::vector<ExpertSlot> slots(A);
  std::vector<float*> partial_gu(A), partial_down(A);
  for (int64_t s = 0; s < A; ++s) {
    const int32_t e = g.active[s];
    slots[s] = {e, g.rows(e), base + off_I[s], base + off_act[s], y + int64_t(g.first[e]) * H};
    partial_gu[s] = reinterpret_cast<float*>(base + off_pgu[s]);
    partial_down[s] = reinterpret_cast<float*>(base + off_pdown[s]);
  }
  pieces.build(slots, partial_gu, partial_down, threads);

  // ---- the task lists of phases 3 and 4 -----------------------------------------------------------
  const int nb_up = block_rows(task_rows(mk), I, A, threads);
  const int nb_down = block_rows(task_rows(mk), H, A, threads);
  const std::vector<Task> up_tasks = fused_gu ? schedule_blocks(A, I, nb_up, threads) : std::vector<Task>{};
  const std::vector<Task> down_tasks = fused_down ? schedule_blocks(A, H, nb_down, threads) : std::vector<Task>{};

  FirstError err;
  const Phases p{a, mk, g, slots, y, err};
#pragma omp parallel num_threads(threads)
  {
    PieceThread me(pieces, omp_get_thread_num(), omp_get_num_threads());  // Algorithm 2's groups
    gather_pack(p);
    if (fused_gu) gate_up(p, up_tasks);
    else pieces.run_gate_up(me, mk, err);
    if (fused_down) down(p, down_tasks);
    else pieces.run_down(me, mk, err);
    scatter(a, g, y);
  }
  err.rethrow();
  pieces.finish();
}


// ---- the quantized path (kernels/quant.h): the same phases, the quantized micro-kernel ----------
// 1 group by expert; 2 gather + transformation 1 (int8: activations quantized per token and group);
// 3 gate & up tasks, SiLU(gate)*up stored fp32; 3b pack_act (int8: the intermediate re-quantized per
// token and group; fp8: its operand order); 4 down tasks, transpose fused; 5 the scatter.
void run_quant(const MoeCall& a, const QuantMicroKernel& mk, int threads) {
  const int64_t T = a.T, H = a.H, I = a.I, k = a.k;
  if (T == 0) return;
  const Grouping g = group_by_expert(a);
  const int64_t A = int64_t(g.active.size());
  const int grp = a.group;
  std::vector<size_t> off_I(A), off_act(A), off_pact(A);
  size_t bytes = 0;
  for (int64_t s = 0; s < A; ++s) {
    const int M = g.rows(g.active[s]);
    off_I[s] = bytes;    bytes += align64(mk.packed_bytes(M, int(H), grp));
    off_act[s] = bytes;  bytes += align64(size_t(M) * I * sizeof(float));
    off_pact[s] = bytes; bytes += align64(mk.packed_bytes(M, int(I), grp));
  }
  const size_t off_y = bytes;
  bytes += align64(size_t(T * k) * H * sizeof(float));
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes);
  g_last_scratch_bytes = bytes;
  float* y = reinterpret_cast<float*>(base + off_y);
  const int nb_up = block_rows(task_rows(mk, 2 * H), I, A, threads);
  const int nb_down = block_rows(task_rows(mk, I), H, A, threads);
  const std::vector<Task> up_tasks = schedule_blocks(A, I, nb_up, threads);
  const std::vector<Task> down_tasks = schedule_blocks(A, H, nb_down, threads);
  const int8_t* wg = reinterpret_cast<const int8_t*>(a.w_gate);
  const int8_t* wu = reinterpret_cast<const int8_t*>(a.w_up);
  const int8_t* wd = reinterpret_cast<const int8_t*>(a.w_down);
  auto slot_of = [&](int32_t s) { return g.active[s]; };
  FirstError err;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t s = 0; s < A; ++s)
      err.guard([&] {
        const int32_t e = slot_of(int32_t(s));
        mk.pack_tokens(a.x, a.ldx, &g.row_token[g.first[e]], g.rows(e), int(H), grp, base + off_I[s]);
      });
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < up_tasks.size(); ++i)
      err.guard([&] {
        const Task tk = up_tasks[i];
        const int32_t e = slot_of(tk.slot);
        QGateUpTask t;
        t.w_gate = wg + e * a.gate_es;  t.ldw_gate = a.gate_rs;
        t.w_up = wu + e * a.up_es;      t.ldw_up = a.up_rs;
        t.s_gate = a.s_gate + e * a.s_gate_es;  t.lds_gate = a.s_gate_rs;
        t.s_up = a.s_up + e * a.s_up_es;        t.lds_up = a.s_up_rs;
        t.n0 = tk.n0;
        t.n = tk.n;
        t.K = int(H);
        t.M = g.rows(e);
        t.group = grp;
        t.I = base + off_I[tk.slot];
        t.act = reinterpret_cast<float*>(base + off_act[tk.slot]);
        t.act_K = int(I);
        mk.gate_up(t);
      });
#pragma omp for schedule(static)
    for (int64_t s = 0; s < A; ++s)
      err.guard([&] {
        const int32_t e = slot_of(int32_t(s));
        mk.pack_act(reinterpret_cast<const float*>(base + off_act[s]), g.rows(e), int(I), grp,
                    base + off_pact[s]);
      });
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < down_tasks.size(); ++i)
      err.guard([&] {
        const Task tk = down_tasks[i];
        const int32_t e = slot_of(tk.slot);
        QDownTask t;
        t.w = wd + e * a.down_es;  t.ldw = a.down_rs;
        t.s = a.s_down + e * a.s_down_es;  t.lds = a.s_down_rs;
        t.n0 = tk.n0;
        t.n = tk.n;
        t.K = int(I);
        t.M = g.rows(e);
        t.group = grp;
        t.act = base + off_pact[tk.slot];
        t.y = y + int64_t(g.first[e]) * H;
        t.ldy = H;
        mk.down(t);
      });
    scatter(a, g, y);
  }
  err.rethrow();
}

void check_quant_call(const MoeCall& a) {
  const bool i8 = a.dtype == Dtype::int8;
  if (a.numa_nodes > 0)
    throw std::invalid_argument("quantized weights (int8, fp8) run the plain kernel only: numa must be off");
  if (!a.s_gate || !a.s_up || !a.s_down) throw std::invalid_argument("quantized weights need their scales");
  if (i8 && !(a.group == 32 || a.group == 64 || a.group == 128))
    throw std::invalid_argument("int8 group size must be 32, 64 or 128 (got " + std::to_string(a.group) + ")");
  if (!i8 && a.group != 128) throw std::invalid_argument("fp8 block scales are 128 x 128 (group must be 128)");
  if (i8 && (a.H % a.group || a.I % a.group))
    throw std::invalid_argument("the group size " + std::to_string(a.group) + " must divide H=" +
                                std::to_string(a.H) + " and I=" + std::to_string(a.I));
  if (!i8 && a.I % 128)
    throw std::invalid_argument("fp8: I must be a multiple of 128 (gate and up rows in whole scale blocks)");
  if (!i8 && (a.H > 131072 || a.I > 131072)) throw std::invalid_argument("fp8: H and I must be at most 131072");
}

// Few tokens on AMX: the AVX-512-BF16 micro-kernel (every AMX CPU has it), for the whole call, when
// no expert has more than `few` rows (tokens). With one or two tokens a tile uses one or two of its 16
// token columns while its 32 W rows stream side by side; the AVX-512 tile streams 8 and takes the
// tokens in registers. Measured (2026-12-03, the AMX Xeon, 2 threads, isa "amx" against "avx512" in
// one process, 5 alternated rounds, every token on the same top-k experts, weights rotated past the
// L3, median ms [range]): Qwen3-30B-A3B M = 1 / 2 / 4 / 8: 2.63 [2.62-2.64] / 2.80 [2.79-2.85] / 3.05 /
// 5.21 against the tiles' 2.86 [2.85-3.07] / 2.89 [2.88-2.91] / 2.93 / 3.01; Mixtral-8x7B M = 1 / 2 / 3
// / 4: 22.81 [22.57-22.86] / 23.82 [23.72-23.89] / 24.14 / 24.63 against 24.29 [23.93-24.76] / 24.10
// [24.04-25.14] / 24.18 / 24.33; Qwen3's experts as transformers maps them from the safetensors file
// (4 layers, 8 random experts of 128 a call, T = 1) 2.65 against 2.99. The linear layer keeps the
// split at one token (linear, below). The emulated AMX build runs the tiles for every M.
// Up to 4 tokens since the AVX-512 decode tiles prefetch the next rows' same piece (glue.h; 2026-12-04,
// same method, 5 rounds): Qwen3 M = 3 / 4 2.63 [2.59-2.65] / 2.66 [2.64-2.68] against the tiles' 2.94
// [2.90-2.99] / 2.91 [2.89-3.04], Mixtral 22.18 [22.11-22.28] / 23.08 [23.03-23.17] against 23.79
// [23.77-24.93] / 23.78 [23.70-25.31]; from 5 tokens the AVX-512 kernel leaves its decode tiles (M = 6:
// Qwen3 4.16 against 3.14).
constexpr int kAmxFfnFewMaxM = 4;

// The named ISA is looked up (and refused where the CPU lacks it) first: on a CPU with AVX-512 and
// without AMX (Zen 4/5), isa "amx" with few tokens ran the AVX-512 kernel instead of refusing.
const MicroKernel& bf16_microkernel(const std::string& isa, int64_t max_m, int few) {
  const MicroKernel& named = find_microkernel(isa, Dtype::bf16);
  return isa == "amx" && max_m <= few ? find_microkernel("avx512", Dtype::bf16) : named;
}

// The most rows any expert gets (tokens routed to it); ids outside [0, E) are left to group_by_expert.
int64_t max_rows_per_expert(const MoeCall& a) {
  std::vector<int64_t> count(size_t(std::max<int64_t>(a.E, 0)), 0);
  int64_t most = 0;
  for (int64_t i = 0; i < a.T * a.k; ++i) {
    const int32_t e = a.topk_ids[i];
    if (e >= 0 && e < a.E) most = std::max(most, ++count[e]);
  }
  return most;
}

}  // namespace

void moe_ffn(const MoeCall& a) {
  if (a.H % kShapeMultiple || a.I % kShapeMultiple || a.H <= 0 || a.I <= 0)
    throw std::invalid_argument("H and I must be positive multiples of 32");
  if (a.H > (kMaxPieces - 2) * kPieceElems || a.I > (kMaxPieces - 2) * kPieceElems)
    throw std::invalid_argument("H and I must be at most " +
                                std::to_string((kMaxPieces - 2) * kPieceElems));
  if (a.dtype != Dtype::bf16) {
    check_quant_call(a);
    run_quant(a, find_quant_microkernel(a.isa, a.dtype), std::max(1, a.threads));
    return;
  }
  const MicroKernel& mk =
      bf16_microkernel(a.isa, a.isa == "amx" ? max_rows_per_expert(a) : a.T * a.k, kAmxFfnFewMaxM);
  if (a.numa_nodes > 0) {
    const NumaPlans plans = numa_plans_of(a);
    run(a, mk, std::max(1, a.threads), &plans);
  } else {
    run(a, mk, std::max(1, a.threads), nullptr);
  }
}

namespace {

// One matrix whose rows differ in their piece cuts: the piece path with one node.
void linear_pieces(const LinearCall& c, const LinearWeight& lw, const std::vector<int32_t>& rows,
                   const MicroKernel& mk, int threads) {
  // The FFN's down projection with one "expert" holding every token: W as w_down [1, N, K], the packed
  // x as its activation (pack_tokens and gate_up's store write the same layout), y [T, N] fp32.
  MoeCall a;
  a.x = c.x; a.T = c.T; a.H = lw.N; a.I = c.K; a.ldx = c.ldx;
  a.w_down = lw.w; a.down_es = 0; a.down_rs = lw.ldw; a.E = 1; a.k = 1;
  a.isa = c.isa; a.threads = threads;
  PiecePath pieces(a, nullptr, false, true);
  const size_t bytes_I = align64(mk.packed_bytes(int(c.T), int(c.K)));
  const size_t bytes_y = align64(size_t(c.T) * lw.N * sizeof(float));
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes_I + bytes_y + align64(pieces.down_partial_bytes(int(c.T))));
  float* y = reinterpret_cast<float*>(base + bytes_I);
  const std::vector<ExpertSlot> slots{{0, int(c.T), base, base, y}};
  pieces.build(slots, {nullptr}, {reinterpret_cast<float*>(base + bytes_I + bytes_y)}, threads);
  FirstError err;
#pragma omp parallel num_threads(threads)
  {
    PieceThread me(pieces, omp_get_thread_num(), omp_get_num_threads());
#pragma omp single
    err.guard([&] { mk.pack_tokens(c.x, c.ldx, rows.data(), int(c.T), int(c.K), base); });
    pieces.run_down(me, mk, err);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < c.T * lw.N; ++i) lw.out[i] = f32_to_bf16(y[i]);
  }
  err.rethrow();
  pieces.finish();
}

// The matrices whose rows share their cuts, together: one pack of x, then tasks (matrix, block of
// output rows) over all of them, dynamically scheduled, then the roundings.
void linear_fused(const LinearCall& c, const std::vector<LinearWeight>& ws, const std::vector<int32_t>& rows,
                  const MicroKernel& mk, int threads) {
  const size_t bytes_I = align64(mk.packed_bytes(int(c.T), int(c.K)));
  std::vector<size_t> off_y;
  size_t bytes = bytes_I;
  int64_t rows_all = 0;
  std::vector<int64_t> rows_of;   // each matrix's output rows
  for (const LinearWeight& lw : ws) {
    off_y.push_back(bytes);
    bytes += align64(size_t(c.T) * lw.N * sizeof(float));
    rows_of.push_back(lw.N);
    rows_all += lw.N;
  }
  const int nb = block_rows(task_rows(mk, /*linear=*/true), rows_all, 1, threads);
  const std::vector<Task> tasks = schedule_blocks(rows_of, nb, threads);
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes);
  FirstError err;
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    err.guard([&] { mk.pack_tokens(c.x, c.ldx, rows.data(), int(c.T), int(c.K), base); });
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < tasks.size(); ++i)
      err.guard([&] {
        const LinearWeight& lw = ws[tasks[i].slot];
        DownTask t;
        t.w_down = lw.w + tasks[i].n0 * lw.ldw;
        t.ldw = lw.ldw;
        t.n0 = tasks[i].n0;
        t.n = tasks[i].n;
        t.K = int(c.K);
        t.M = int(c.T);
        t.act = base;
        t.y = reinterpret_cast<float*>(base + off_y[tasks[i].slot]);
        t.ldy = lw.N;
        mk.down(t);
      });
    for (size_t w = 0; w < ws.size(); ++w) {
      const float* y = reinterpret_cast<const float*>(base + off_y[w]);
      bf16_t* out = ws[w].out;
#pragma omp for schedule(static) nowait
      for (int64_t i = 0; i < c.T * ws[w].N; ++i) out[i] = f32_to_bf16(y[i]);
    }
  }
  err.rethrow();
}

}  // namespace

void linear(const LinearCall& c) {
  if (c.K % kShapeMultiple || c.K <= 0 || c.T <= 0)
    throw std::invalid_argument("K must be a positive multiple of 32, T positive");
  if (c.K > (kMaxPieces - 2) * kPieceElems)
    throw std::invalid_argument("K must be at most " + std::to_string((kMaxPieces - 2) * kPieceElems));
  if (c.weights.empty()) throw std::invalid_argument("linear needs at least one weight matrix");
  if (c.ldx < c.K) throw std::invalid_argument("row strides must be at least K");
  for (const LinearWeight& lw : c.weights) {
    if (lw.N % kShapeMultiple || lw.N <= 0) throw std::invalid_argument("N must be a positive multiple of 32");
    if (lw.ldw < c.K) throw std::invalid_argument("row strides must be at least K");
  }
  // One token on AMX: the AVX-512-BF16 micro-kernel (every AMX CPU has it). A tile would use one of
  // its 16 token columns, and its 32 W rows stream side by side, where the AVX-512 tile streams 8.
  // Measured (2026-12-02, the AMX Xeon, 2 threads, Qwen3's LM head 151936 x 2048, alternated in one
  // process): W mapped from the safetensors file, as transformers leaves it, 25.0-25.6 ms on the AMX
  // tiles against 20.1-20.8 on AVX-512; W in anonymous memory 23.3-24.4 against 21.7-23.4; Qwen3's
  // o projection (`hinabench linear`) 0.69 / 0.70 ms. At 2 and 4 tokens the two trade places
  // (W mapped: AVX-512 ahead by ~6%; anonymous: AMX ahead by ~8%), so AMX keeps them.
  const MicroKernel& mk = bf16_microkernel(c.isa, c.T, 1);
  const int threads = std::max(1, c.threads);
  std::vector<int32_t> rows(c.T);  // every token, in order: the rows transformation 1 packs
  for (int64_t t = 0; t < c.T; ++t) rows[t] = int32_t(t);
  std::vector<LinearWeight> fused;
  for (const LinearWeight& lw : c.weights)
    if (fused_rows(mk, lw.ldw)) fused.push_back(lw);
    else linear_pieces(c, lw, rows, mk, threads);
  if (!fused.empty()) linear_fused(c, fused, rows, mk, threads);
}

std::vector<std::string> moe_isas() {
  std::vector<std::string> out;
  for (const MicroKernel* mk : microkernels()) out.emplace_back(mk->isa);
  return out;
}

size_t moe_last_scratch_bytes() { return g_last_scratch_bytes; }

}  // namespace hina
