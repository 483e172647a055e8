// The HiNa-MoE expert-FFN driver: paper Section 4 in code.
//
//   out[t] = sum_s topk_weights[t,s] * FFN_e(x[t]),  e = topk_ids[t,s],
//   FFN_e(I) = (SiLU(I x W_gate^T) . (I x W_up^T)) x W_down^T               (Section 4.1)
//
// Steps, each a phase of one OpenMP parallel region:
//   1. group tokens by expert          (serial: T*k integers)
//   2. gather + transformation 1       ("transform I, not W": the gathered rows are written in the
//                                       layout the ISA's MM wants; W is never touched)
//   3. gate & up, transformation 2     (tasks = (expert, block of I rows); SiLU(gate)*up fused
//                                       into the store, written in the down MM's operand layout)
//   4. down, transformation 3          (tasks = (expert, block of H rows); transpose fused into
//                                       the store: y rows are token-major)
//   5. routing-weighted scatter-add    (token order, fp32 sum over top-k slots, one bf16 rounding)
// Phases 3 and 4 parallelise over experts and output blocks together, so every thread is busy even
// for one token on one expert. The micro-kernels (one per ISA, same signature) are picked once,
// at run time, by name; the Python side checks that the CPU has the ISA before calling in.
#include "microkernel.h"

#include <omp.h>

#include <atomic>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/numa_partition.h"
#include "ops/task_errors.h"
#if !defined(HINA_EMU_AMX) && !defined(HINA_EMU_AVX512)
#include "common.h"  // isa_usable (cpu.cpp)
#endif

namespace py = pybind11;

namespace hina {
namespace {

struct MoeArgs {
  const bf16_t* x; int64_t T, H, I, ldx;
  const bf16_t* w_gate; int64_t gate_es, gate_rs;  // expert stride, row stride (elements)
  const bf16_t* w_up;   int64_t up_es, up_rs;
  const bf16_t* w_down; int64_t down_es, down_rs;
  int64_t E, k;
  const int32_t* topk_ids;     // [T, k] contiguous
  const float* topk_weights;   // [T, k] contiguous
  bf16_t* out;                 // [T, H] contiguous
};

// ---- ISA selection: once per call, by name -----------------------------------------------------
std::vector<std::string> compiled_isas() {
#if defined(HINA_EMU_AMX)
  return {"scalar", "amx-emulated"};
#elif defined(HINA_EMU_AVX512)
  return {"scalar", "avx512-emulated"};
#else
  return {"scalar", "avx2", "avx512", "amx"};
#endif
}

}  // namespace

const MicroKernel& select_microkernel(const std::string& isa) {
  if (isa == "scalar") return microkernel_scalar();
#if defined(HINA_EMU_AMX)
  if (isa == "amx-emulated") return microkernel_amx();
#elif defined(HINA_EMU_AVX512)
  if (isa == "avx512-emulated") return microkernel_avx512();
#else
  if (isa == "avx2" || isa == "avx512" || isa == "amx") {
    // Never SIGILL: a kernel runs only if cpuid (and, for AMX, the OS's permission) allows it.
    if (!isa_usable(isa)) throw std::invalid_argument("isa '" + isa + "' is not usable on this CPU");
    if (isa == "avx2") return microkernel_avx2();
    if (isa == "avx512") return microkernel_avx512();
    return microkernel_amx();
  }
#endif
  std::string known;
  for (auto& s : compiled_isas()) known += (known.empty() ? "" : ", ") + s;
  throw std::invalid_argument("isa '" + isa + "' is not built into this module (it has: " + known + ")");
}

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

// Rows per output-block task: the kernel's preference, shrunk until every thread has >= 4 tasks.
int block_rows(int preferred, int64_t rows_per_expert, int64_t experts, int threads) {
  int nb = preferred;
  while (nb > kShapeMultiple && experts * ((rows_per_expert + nb - 1) / nb) < 4 * int64_t(threads))
    nb /= 2;
  return std::max(nb - nb % kShapeMultiple, kShapeMultiple);
}

struct Task { int32_t slot; int32_t n0; };  // active-expert slot, first output row

// Rows per piece task (Algorithm 2: 32 rows x, x+T_x, ... fill the two W tiles), shrunk for balance.
constexpr int kPieceTaskRows = 32;

// numa == nullptr: the plain kernel (fused tasks; a matrix whose rows do not all share their piece
// cuts -- row stride not a multiple of 2048 elements -- runs on the piece path with one node, which
// keeps the canonical order). Otherwise Algorithm 2 on numa->nodes (real or virtual) nodes.
void run_moe(const MoeArgs& a, const MicroKernel& mk, int threads, const NumaPlans* numa) {
  const int64_t T = a.T, H = a.H, I = a.I, k = a.k, E = a.E;
  if (T == 0) return;

  // ---- 1. group tokens by expert (counting sort of the T*k (token, slot) pairs) ----------------
  // Each (token, slot) pair becomes one row of its expert's I; a token routed to the same expert
  // from several slots simply appears several times (each row carries its own routing weight).
  std::vector<int32_t> count(E + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int32_t e = a.topk_ids[i];
    if (e < 0 || e >= E) throw std::invalid_argument("topk_ids holds expert " + std::to_string(e) +
                                                     ", outside [0, " + std::to_string(E) + ")");
    count[e + 1]++;
  }
  std::vector<int32_t> active;                 // active experts, in expert order
  std::vector<int32_t> first(E + 1, 0);        // first row of expert e in the grouped order
  for (int64_t e = 0; e < E; ++e) {
    first[e + 1] = first[e] + count[e + 1];
    if (count[e + 1]) active.push_back(int32_t(e));
  }
  std::vector<int32_t> row_token(T * k);       // grouped row -> token
  std::vector<int32_t> pair_row(T * k);        // (token, slot) -> grouped row
  {
    std::vector<int32_t> fill(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) {
      const int32_t r = fill[a.topk_ids[i]]++;
      row_token[r] = int32_t(i / k);
      pair_row[i] = r;
    }
  }
  const int64_t A = int64_t(active.size());

  // ---- scratch: packed I and activation per active expert, y rows (token-major, fp32) ----------
  std::vector<size_t> off_I(A), off_act(A);
  size_t bytes = 0;
  for (int64_t s = 0; s < A; ++s) {
    const int M = count[active[s] + 1];
    off_I[s] = bytes;   bytes += align64(mk.packed_bytes(M, int(H)));
    off_act[s] = bytes; bytes += align64(mk.packed_bytes(M, int(I)));
  }
  const size_t off_y = bytes;
  bytes += align64(size_t(T * k) * H * sizeof(float));
  // ---- the piece path: which projections take it, and their partial buffers ---------------------
  const bool fused_gu = !numa && a.gate_rs % kPieceElems == 0 && a.up_rs % kPieceElems == 0;
  const bool fused_down = !numa && a.down_rs % kPieceElems == 0;
  const int nodes = numa ? numa->nodes : 1;
  const int mp_gu = max_pieces(int(H)), mp_down = max_pieces(int(I));
  std::vector<size_t> off_pgu(A), off_pdown(A);
  for (int64_t s = 0; s < A; ++s) {
    const size_t M = size_t(count[active[s] + 1]);
    if (!fused_gu) { off_pgu[s] = bytes; bytes += align64(2 * size_t(I) * mp_gu * M * sizeof(float)); }
    if (!fused_down) { off_pdown[s] = bytes; bytes += align64(size_t(H) * mp_down * M * sizeof(float)); }
  }
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes);
  g_last_scratch_bytes = bytes;
  float* y = reinterpret_cast<float*>(base + off_y);

  // ---- piece work (Algorithm 2, or the plain kernel on rows of differing cuts) -------------------
  PieceWork work_gu, work_down;
  for (int32_t s = 0; s < A && !(fused_gu && fused_down); ++s) {
    const int32_t e = active[s];
    const int M = count[e + 1];
    auto plan = [&](int kind) { return numa ? numa->plan(kind, e) : MatrixPlan{1, 0, 4096, nullptr, nullptr}; };
    if (!fused_gu) {
      float* pg = reinterpret_cast<float*>(base + off_pgu[s]);
      work_gu.mats.push_back({a.w_gate + e * a.gate_es, a.gate_rs, int(I), int(H), M, base + off_I[s],
                              pg, mp_gu, plan(0)});
      work_gu.mats.push_back({a.w_up + e * a.up_es, a.up_rs, int(I), int(H), M, base + off_I[s],
                              pg + size_t(I) * mp_gu * M, mp_gu, plan(1)});
    }
    if (!fused_down)
      work_down.mats.push_back({a.w_down + e * a.down_es, a.down_rs, int(H), int(I), M,
                                base + off_act[s], reinterpret_cast<float*>(base + off_pdown[s]),
                                mp_down, plan(2)});
  }
  if (!fused_gu) work_gu.build(nodes, kPieceTaskRows);
  if (!fused_down) work_down.build(nodes, kPieceTaskRows);
  std::vector<std::atomic<int>> next_gu(nodes), next_down(nodes);
  for (int j = 0; j < nodes; ++j) { next_gu[j] = 0; next_down[j] = 0; }
  const bool stats = numa && numa_stats().enabled;
  if (stats) numa_stats_begin(nodes, threads);
  // reduction + epilogue tasks of the piece path: (expert slot, block of 32 output columns)
  std::vector<Task> red_gu, red_down;
  for (int32_t s = 0; s < A; ++s) {
    if (!fused_gu) for (int32_t n0 = 0; n0 < I; n0 += kShapeMultiple) red_gu.push_back({s, n0});
    if (!fused_down) for (int32_t n0 = 0; n0 < H; n0 += kShapeMultiple) red_down.push_back({s, n0});
  }

  // ---- the task lists of phases 3 and 4: (expert, output block), all experts together ----------
  const int nb_up = block_rows(mk.row_block, I, A, threads);
  const int nb_down = block_rows(mk.row_block, H, A, threads);
  std::vector<Task> up_tasks, down_tasks;
  for (int32_t s = 0; s < A; ++s) {
    if (fused_gu) for (int32_t n0 = 0; n0 < I; n0 += nb_up) up_tasks.push_back({s, n0});
    if (fused_down) for (int32_t n0 = 0; n0 < H; n0 += nb_down) down_tasks.push_back({s, n0});
  }

  // Exceptions (e.g. the tile emulator's #GP/#UD) must not cross the OpenMP region: keep the first.
  FirstError first_error;
  auto guarded = [&](auto&& fn) { first_error.guard(fn); };

#pragma omp parallel num_threads(threads)
  {
    // Algorithm 2's thread groups: this thread's node(s), bound to their CPUs (restored at the end).
    const std::vector<int> my_nodes = nodes_of_thread(omp_get_thread_num(), omp_get_num_threads(), nodes);
    AffinityGuard affinity;
    auto run_pieces = [&](const PieceWork& work, int work_id, std::vector<std::atomic<int>>& next) {
      for (int j : my_nodes) {
        if (numa && j < int(numa->node_cpus.size())) affinity.bind(numa->node_cpus[j]);
        const auto& q = work.per_node[j];
        for (int i = next[j]++; i < int(q.size()); i = next[j]++)
          guarded([&] {
            run_piece_task(work, q[i], mk);
            if (stats) numa_stats_record(work, work_id, q[i], omp_get_thread_num());
          });
      }
    };
    // ---- 2. gather, transformation 1 -----------------------------------------------------------
#pragma omp for schedule(static)
    for (int64_t s = 0; s < A; ++s) {
      guarded([&] {
        const int32_t e = active[s];
        mk.pack_tokens(a.x, a.ldx, &row_token[first[e]], count[e + 1], int(H), base + off_I[s]);
      });
    }
    // ---- 3. gate & up projections, transformation 2 --------------------------------------------
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < up_tasks.size(); ++i) {
      guarded([&] {
        const Task tk = up_tasks[i];
        const int32_t e = active[tk.slot];
        GateUpTask t;
        t.w_gate = a.w_gate + e * a.gate_es + tk.n0 * a.gate_rs;
        t.w_up = a.w_up + e * a.up_es + tk.n0 * a.up_rs;
        t.ldw_gate = a.gate_rs;
        t.ldw_up = a.up_rs;
        t.n0 = tk.n0;
        t.n = int(std::min<int64_t>(nb_up, I - tk.n0));
        t.K = int(H);
        t.M = count[e + 1];
        t.I = base + off_I[tk.slot];
        t.act = base + off_act[tk.slot];
        t.act_K = int(I);
        mk.gate_up(t);
      });
    }
    if (!fused_gu) {  // 3'. each node's partial products over its local segments only
      run_pieces(work_gu, 0, next_gu);
#pragma omp barrier
      // the reduction across nodes (every row's pieces in ascending y), then transformation 2
#pragma omp for schedule(dynamic, 4)
      for (size_t i = 0; i < red_gu.size(); ++i) {
        guarded([&] {
          const Task tk = red_gu[i];
          const PieceMatrix& pg = work_gu.mats[2 * tk.slot];
          const PieceMatrix& pu = work_gu.mats[2 * tk.slot + 1];
          const int M = pg.M, n = kShapeMultiple;
          std::vector<float> gu(size_t(2) * n * M);
          for (int j = 0; j < n; ++j) {
            const int r = tk.n0 + j;
            const int npg = row_piece_count(pg.w + r * pg.ldw, pg.K);
            const int npu = row_piece_count(pu.w + r * pu.ldw, pu.K);
            for (int m = 0; m < M; ++m) {
              gu[j * M + m] = reduce_row(pg, r, m, npg);
              gu[(n + j) * M + m] = reduce_row(pu, r, m, npu);
            }
          }
          mk.store_act(base + off_act[tk.slot], int(I), tk.n0, n, M, gu.data(), gu.data() + n * M);
        });
      }
    }
    // ---- 4. down projection, transformation 3 --------------------------------------------------
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < down_tasks.size(); ++i) {
      guarded([&] {
        const Task tk = down_tasks[i];
        const int32_t e = active[tk.slot];
        DownTask t;
        t.w_down = a.w_down + e * a.down_es + tk.n0 * a.down_rs;
        t.ldw = a.down_rs;
        t.n0 = tk.n0;
        t.n = int(std::min<int64_t>(nb_down, H - tk.n0));
        t.K = int(I);
        t.M = count[e + 1];
        t.act = base + off_act[tk.slot];
        t.y = y + int64_t(first[e]) * H;
        t.ldy = H;
        mk.down(t);
      });
    }
    if (!fused_down) {  // 4'. partial products per node, reduction across nodes, transformation 3
      run_pieces(work_down, 1, next_down);
#pragma omp barrier
#pragma omp for schedule(dynamic, 4)
      for (size_t i = 0; i < red_down.size(); ++i) {
        guarded([&] {
          const Task tk = red_down[i];
          const PieceMatrix& pd = work_down.mats[tk.slot];
          float* ys = y + int64_t(first[active[tk.slot]]) * H;
          for (int j = 0; j < kShapeMultiple; ++j) {
            const int r = tk.n0 + j;
            const int np = row_piece_count(pd.w + r * pd.ldw, pd.K);
            for (int m = 0; m < pd.M; ++m) ys[m * H + r] = reduce_row(pd, r, m, np);
          }
        });
      }
    }
    // ---- 5. routing-weighted scatter-add back to token order -------------------------------------
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      bf16_t* o = a.out + t * H;
      const float* w = a.topk_weights + t * k;
      const int32_t* rows = &pair_row[t * k];
      for (int64_t h0 = 0; h0 < H; h0 += 256) {
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
  }
  first_error.rethrow();
  if (stats) numa_stats_finish({&work_gu, &work_down});
}

}  // namespace

void register_moe(py::module_& m) {
  m.def("moe_isas", &compiled_isas, "The micro-kernels built into this module (not all usable here).");
  m.def(
      "moe_ffn",
      [](uintptr_t x, int64_t T, int64_t H, int64_t I, int64_t ldx,
         uintptr_t w_gate, int64_t gate_es, int64_t gate_rs,
         uintptr_t w_up, int64_t up_es, int64_t up_rs,
         uintptr_t w_down, int64_t down_es, int64_t down_rs, int64_t E,
         uintptr_t topk_ids, int64_t k, uintptr_t topk_weights, uintptr_t out,
         const std::string& isa, int threads, int numa_nodes, uintptr_t mat_plan,
         uintptr_t plan_hdr, uintptr_t seg_off, uintptr_t segs,
         const std::vector<std::vector<int>>& node_cpus) {
        if (H % kShapeMultiple || I % kShapeMultiple || H <= 0 || I <= 0)
          throw std::invalid_argument("H and I must be positive multiples of 32");
        if (H > (kMaxPieces - 2) * kPieceElems || I > (kMaxPieces - 2) * kPieceElems)
          throw std::invalid_argument("H and I must be at most " +
                                      std::to_string((kMaxPieces - 2) * kPieceElems));
        const MicroKernel& mk = select_microkernel(isa);
        NumaPlans plans;
        if (numa_nodes > 0) {
          if (!mat_plan || !plan_hdr || !seg_off || !segs)
            throw std::invalid_argument("numa_nodes > 0 needs the plan arrays");
          plans.nodes = numa_nodes;
          plans.E = E;
          plans.mat_plan = reinterpret_cast<const int32_t*>(mat_plan);
          plans.plan_hdr = reinterpret_cast<const int64_t*>(plan_hdr);
          plans.seg_off = reinterpret_cast<const int32_t*>(seg_off);
          plans.segs = reinterpret_cast<const int32_t*>(segs);
          plans.node_cpus = node_cpus;
        }
        MoeArgs a{reinterpret_cast<const bf16_t*>(x), T, H, I, ldx,
                  reinterpret_cast<const bf16_t*>(w_gate), gate_es, gate_rs,
                  reinterpret_cast<const bf16_t*>(w_up), up_es, up_rs,
                  reinterpret_cast<const bf16_t*>(w_down), down_es, down_rs, E, k,
                  reinterpret_cast<const int32_t*>(topk_ids),
                  reinterpret_cast<const float*>(topk_weights), reinterpret_cast<bf16_t*>(out)};
        py::gil_scoped_release release;
        run_moe(a, mk, std::max(1, threads), numa_nodes > 0 ? &plans : nullptr);
      },
      py::arg("x"), py::arg("T"), py::arg("H"), py::arg("I"), py::arg("ldx"),
      py::arg("w_gate"), py::arg("gate_es"), py::arg("gate_rs"),
      py::arg("w_up"), py::arg("up_es"), py::arg("up_rs"),
      py::arg("w_down"), py::arg("down_es"), py::arg("down_rs"), py::arg("E"),
      py::arg("topk_ids"), py::arg("k"), py::arg("topk_weights"), py::arg("out"),
      py::arg("isa"), py::arg("threads"), py::arg("numa_nodes") = 0, py::arg("mat_plan") = 0,
      py::arg("plan_hdr") = 0, py::arg("seg_off") = 0, py::arg("segs") = 0,
      py::arg("node_cpus") = std::vector<std::vector<int>>{},
      "HiNa-MoE expert FFN on raw buffers (validated by hinabench.kernels.moe_ffn). "
      "Strides in elements; topk_ids int32 [T,k], topk_weights fp32 [T,k], out bf16 [T,H], all contiguous. "
      "numa_nodes > 0: Algorithm 2 on that many nodes with the flat plans (int32 mat_plan [3E], int64 "
      "plan_hdr [P,4] = T_x, phase bytes, page bytes, seg_off base; int32 seg_off, int32 segs [S,3]); "
      "node_cpus[j]: CPUs to bind node j's threads to (empty: no binding).");
  m.def("moe_numa_debug", [](bool on) { numa_stats().enabled = on; }, py::arg("enabled"),
        "Testing: count, per node, the weight bytes the partitioned kernel reads and check coverage.");
  m.def("moe_numa_stats", [] {
    const NumaStats& st = numa_stats();
    py::dict d;
    d["bytes"] = st.bytes;
    d["remote_bytes"] = st.remote_bytes;
    d["tasks"] = st.tasks;
    d["rows_checked"] = st.rows_checked;
    d["rows_bad"] = st.rows_bad;
    d["first_error"] = st.first_error;
    return d;
  }, "Testing: what the last partitioned call read (with moe_numa_debug(True)).");
  m.def("moe_scratch_bytes", [] { return g_last_scratch_bytes; },
        "Scratch bytes (packed I, activations, y rows) the last moe_ffn call used.");
}

}  // namespace hina

// The emulated builds are modules of their own (emulated.cmake defines HINA_EMU_MODULE_NAME).
#if defined(HINA_EMU_MODULE_NAME)
PYBIND11_MODULE(HINA_EMU_MODULE_NAME, m) {
  m.doc() = "HiNa-MoE operator with an emulated ISA (tests only: runs anywhere, slowly)";
  hina::register_moe(m);
  hina::register_linear(m);
#if defined(HINA_EMU_AMX)
  hina::register_tile_emulator_tests(m);
#endif
}
#endif
