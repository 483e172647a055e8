// A dense projection, y = x W^T, on the HiNa micro-kernels: the driver's single-matrix case.
//
// The paper runs the attention block's projections (and the LM head) on the same micro-kernels as the
// expert FFN; here that is the FFN's phases 2 and 4 with one "expert" holding every token:
//   2. transformation 1: the T rows of x packed into I, in the layout the ISA's MM wants;
//   4. the down micro-kernel over output blocks of W [N, K] (row-major, nn.Linear's [out, in], any row
//      stride, read in place: never copied or repacked), transposed into y [T, N] fp32 by its store;
//      rows whose piece cuts differ (row stride not a multiple of 2048 elements) take the piece path
//      with one node, which keeps the canonical summation order (moe_ffn.h);
//   then one rounding of y to bf16.
#include <omp.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "microkernel.h"
#include "ops/numa_partition.h"
#include "ops/task_errors.h"

namespace py = pybind11;

namespace hina {
namespace {

struct FreeDeleter { void operator()(void* p) const { std::free(p); } };

void run_linear(const bf16_t* x, int64_t T, int64_t K, int64_t ldx, const bf16_t* w, int64_t N,
                int64_t ldw, bf16_t* out, const MicroKernel& mk, int threads) {
  const size_t bytes_I = (mk.packed_bytes(int(T), int(K)) + 63) & ~size_t(63);
  const size_t bytes_y = ((size_t(T) * N * sizeof(float)) + 63) & ~size_t(63);
  const bool fused = ldw % kPieceElems == 0;
  const int mp = max_pieces(int(K));
  const size_t bytes_p = fused ? 0 : size_t(N) * mp * T * sizeof(float);
  std::unique_ptr<char, FreeDeleter> base(static_cast<char*>(std::aligned_alloc(64, bytes_I + bytes_y + ((bytes_p + 63) & ~size_t(63)) + 64)));
  if (!base) throw std::bad_alloc();
  void* I = base.get();
  float* y = reinterpret_cast<float*>(base.get() + bytes_I);
  std::vector<int32_t> rows(T);
  for (int64_t t = 0; t < T; ++t) rows[t] = int32_t(t);

  PieceWork work;
  if (!fused) {
    work.mats.push_back({w, ldw, int(N), int(K), int(T), I, reinterpret_cast<float*>(base.get() + bytes_I + bytes_y),
                         mp, MatrixPlan{1, 0, 4096, nullptr, nullptr}});
    work.build(1, 32);
  }
  std::atomic<int> next{0};
  // output blocks: the kernel's preference, shrunk until every thread has >= 4 tasks
  int nb = mk.row_block;
  while (nb > kShapeMultiple && (N + nb - 1) / nb < 4 * int64_t(threads)) nb /= 2;
  nb = std::max(nb - nb % kShapeMultiple, kShapeMultiple);

  FirstError first_error;
  auto guarded = [&](auto&& fn) { first_error.guard(fn); };
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    guarded([&] { mk.pack_tokens(x, ldx, rows.data(), int(T), int(K), I); });  // transformation 1
    if (fused) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t n0 = 0; n0 < N; n0 += nb) {
        guarded([&] {
          DownTask t;
          t.w_down = w + n0 * ldw;
          t.ldw = ldw;
          t.n0 = int(n0);
          t.n = int(std::min<int64_t>(nb, N - n0));
          t.K = int(K);
          t.M = int(T);
          t.act = I;
          t.y = y;
          t.ldy = N;
          mk.down(t);
        });
      }
    } else {
      const auto& q = work.per_node[0];
      for (int i = next++; i < int(q.size()); i = next++) guarded([&] { run_piece_task(work, q[i], mk); });
#pragma omp barrier
      const PieceMatrix& pm = work.mats[0];
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < N; ++r) {
        const int np = row_piece_count(pm.w + r * pm.ldw, pm.K);
        for (int64_t m = 0; m < T; ++m) y[m * N + r] = reduce_row(pm, int(r), int(m), np);
      }
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < T * N; ++i) out[i] = f32_to_bf16(y[i]);
  }
  first_error.rethrow();
}

}  // namespace

void register_linear(py::module_& m) {
  m.def(
      "linear",
      [](uintptr_t x, int64_t T, int64_t K, int64_t ldx, uintptr_t w, int64_t N, int64_t ldw, uintptr_t out,
         const std::string& isa, int threads) {
        if (K % kShapeMultiple || N % kShapeMultiple || K <= 0 || N <= 0 || T <= 0)
          throw std::invalid_argument("N and K must be positive multiples of 32, T positive");
        if (K > (kMaxPieces - 2) * kPieceElems)
          throw std::invalid_argument("K must be at most " + std::to_string((kMaxPieces - 2) * kPieceElems));
        if (ldx < K || ldw < K) throw std::invalid_argument("row strides must be at least K");
        const MicroKernel& mk = select_microkernel(isa);
        py::gil_scoped_release release;
        run_linear(reinterpret_cast<const bf16_t*>(x), T, K, ldx, reinterpret_cast<const bf16_t*>(w), N, ldw,
                   reinterpret_cast<bf16_t*>(out), mk, std::max(1, threads));
      },
      py::arg("x"), py::arg("T"), py::arg("K"), py::arg("ldx"), py::arg("w"), py::arg("N"), py::arg("ldw"),
      py::arg("out"), py::arg("isa"), py::arg("threads"),
      "y = x W^T on raw buffers (validated by hinabench.kernels.linear): x bf16 [T, K] (row stride ldx), "
      "W bf16 [N, K] (row stride ldw), out bf16 [T, N] contiguous.");
}

}  // namespace hina
