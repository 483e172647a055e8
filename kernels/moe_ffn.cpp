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
#include "moe_ffn.h"

#include <omp.h>
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

void run_moe(const MoeArgs& a, const MicroKernel& mk, int threads) {
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
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  char* base = g_scratch.get(bytes);
  g_last_scratch_bytes = bytes;
  float* y = reinterpret_cast<float*>(base + off_y);

  // ---- the task lists of phases 3 and 4: (expert, output block), all experts together ----------
  const int nb_up = block_rows(mk.row_block, I, A, threads);
  const int nb_down = block_rows(mk.row_block, H, A, threads);
  std::vector<Task> up_tasks, down_tasks;
  for (int32_t s = 0; s < A; ++s) {
    for (int32_t n0 = 0; n0 < I; n0 += nb_up) up_tasks.push_back({s, n0});
    for (int32_t n0 = 0; n0 < H; n0 += nb_down) down_tasks.push_back({s, n0});
  }

  // Exceptions (e.g. the tile emulator's #GP/#UD) must not cross the OpenMP region: keep the first.
  std::exception_ptr error;
  std::mutex error_mutex;
  auto guarded = [&](auto&& fn) {
    try { fn(); } catch (...) {
      std::lock_guard<std::mutex> g(error_mutex);
      if (!error) error = std::current_exception();
    }
  };

#pragma omp parallel num_threads(threads)
  {
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
  if (error) std::rethrow_exception(error);
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
         const std::string& isa, int threads) {
        if (H % kShapeMultiple || I % kShapeMultiple || H <= 0 || I <= 0)
          throw std::invalid_argument("H and I must be positive multiples of 32");
        const MicroKernel& mk = select_microkernel(isa);
        MoeArgs a{reinterpret_cast<const bf16_t*>(x), T, H, I, ldx,
                  reinterpret_cast<const bf16_t*>(w_gate), gate_es, gate_rs,
                  reinterpret_cast<const bf16_t*>(w_up), up_es, up_rs,
                  reinterpret_cast<const bf16_t*>(w_down), down_es, down_rs, E, k,
                  reinterpret_cast<const int32_t*>(topk_ids),
                  reinterpret_cast<const float*>(topk_weights), reinterpret_cast<bf16_t*>(out)};
        py::gil_scoped_release release;
        run_moe(a, mk, std::max(1, threads));
      },
      py::arg("x"), py::arg("T"), py::arg("H"), py::arg("I"), py::arg("ldx"),
      py::arg("w_gate"), py::arg("gate_es"), py::arg("gate_rs"),
      py::arg("w_up"), py::arg("up_es"), py::arg("up_rs"),
      py::arg("w_down"), py::arg("down_es"), py::arg("down_rs"), py::arg("E"),
      py::arg("topk_ids"), py::arg("k"), py::arg("topk_weights"), py::arg("out"),
      py::arg("isa"), py::arg("threads"),
      "HiNa-MoE expert FFN on raw buffers (validated by hinabench.kernels.moe_ffn). "
      "Strides in elements; topk_ids int32 [T,k], topk_weights fp32 [T,k], out bf16 [T,H], all contiguous.");
  m.def("moe_scratch_bytes", [] { return g_last_scratch_bytes; },
        "Scratch bytes (packed I, activations, y rows) the last moe_ffn call used.");
}

}  // namespace hina

// The emulated builds are modules of their own (emulated.cmake defines HINA_EMU_MODULE_NAME).
#if defined(HINA_EMU_MODULE_NAME)
PYBIND11_MODULE(HINA_EMU_MODULE_NAME, m) {
  m.doc() = "HiNa-MoE operator with an emulated ISA (tests only: runs anywhere, slowly)";
  hina::register_moe(m);
#if defined(HINA_EMU_AMX)
  hina::register_tile_emulator_tests(m);
#endif
}
#endif
