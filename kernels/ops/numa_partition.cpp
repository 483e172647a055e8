// Algorithm 2's work lists from S_index, canonical pieces, the piece path (partial products per
// node, the reduction across nodes), thread grouping and binding, and the testing counters.
// See numa_partition.h.
#include "ops/numa_partition.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <tuple>

namespace hina {

MatrixPlan NumaPlans::plan(int kind, int64_t e) const {
  const int64_t p = mat_plan[kind * E + e];
  MatrixPlan mp;
  mp.T_x = int(plan_hdr[4 * p]);
  mp.phase_bytes = plan_hdr[4 * p + 1];
  mp.page_bytes = plan_hdr[4 * p + 2];
  mp.seg_off = seg_off + plan_hdr[4 * p + 3];
  mp.segs = segs;
  return mp;
}

NumaPlans numa_plans_of(const MoeCall& a) {
  if (!a.mat_plan || !a.plan_hdr || !a.seg_off || !a.segs)
    throw std::invalid_argument("numa_nodes > 0 needs the plan arrays");
  NumaPlans plans;
  plans.nodes = a.numa_nodes;
  plans.E = a.E;
  plans.mat_plan = a.mat_plan;
  plans.plan_hdr = a.plan_hdr;
  plans.seg_off = a.seg_off;
  plans.segs = a.segs;
  plans.node_cpus = a.node_cpus;
  return plans;
}

int max_pieces(int K) { return K / kPieceElems + 2; }

int plain_period(int64_t ldw) { return int(kPieceElems / std::gcd<int64_t>(ldw, kPieceElems)); }

namespace {
int row_piece_count(const bf16_t* row, int K) {
  const int c0 = piece_phase(row);
  return piece_ordinal(K - 1, c0) + 1;
}

// Row n's reduced dot for token m: its pieces added to 0.f in ascending y (the canonical order).
inline float reduce_row(const PieceMatrix& pm, int n, int m, int npieces_row) {
  const float* p = pm.partial + int64_t(n) * pm.max_pieces * pm.M + m;
  float v = 0.f;
  for (int q = 0; q < npieces_row; ++q) v += p[int64_t(q) * pm.M];
  return v;
}
}  // namespace

static inline int ceil32(int y) { return (y + kShapeMultiple - 1) & ~(kShapeMultiple - 1); }

void PieceWork::build(int nodes, int rows_per_task) {
  per_node.assign(nodes, {});
  pieces.clear();
  ordinal.clear();
  for (int mi = 0; mi < int(mats.size()); ++mi) {
    const PieceMatrix& pm = mats[mi];
    const bool plain = pm.plan.seg_off == nullptr;
    // The plain kernel's plan: one node, whole rows, row classes by the period of their cuts.
    const int T_x = period_of(pm);
    for (int j = 0; j < (plain ? 1 : nodes); ++j) {
      for (int x = 0; x < std::min(T_x, pm.N); ++x) {
        const bf16_t* row = pm.w + x * pm.ldw;
        const int c0 = piece_phase(row);
        const int p0 = int(ordinal.size());
        auto add_range = [&](int a, int b) {  // [a, b): chunk-rounded, must sit on canonical cuts
          for (int y = a; y < b;) {
            const int e = piece_end(y, c0, pm.K);
            if (e > b)
              throw std::invalid_argument(
                  "NUMA plan: a segment edge (y=" + std::to_string(b) + ", row " + std::to_string(x) +
                  ") is not on a 4 KiB boundary of the tensor's rows: the plan's phase does not "
                  "match the tensor's address");
            pieces.push_back(y);
            pieces.push_back(e);
            ordinal.push_back(piece_ordinal(y, c0));
            y = e;
          }
        };
        if (plain) {
          add_range(0, pm.K);
        } else {
          for (int s = pm.plan.seg_off[j]; s < pm.plan.seg_off[j + 1]; ++s) {
            const int32_t* g = pm.plan.segs + 3 * int64_t(s);
            if (g[0] != x) continue;
            const int a = ceil32(std::min<int>(g[1], pm.K)), b = ceil32(std::min<int>(g[2], pm.K));
            if (a < b) {
              if (a != 0 && piece_end(a - 1, c0, pm.K) != a)
                throw std::invalid_argument(
                    "NUMA plan: a segment edge (y=" + std::to_string(a) + ", row " + std::to_string(x) +
                    ") is not on a 4 KiB boundary of the tensor's rows: the plan's phase does not "
                    "match the tensor's address");
              add_range(a, b);
            }
          }
        }
        const int np = int(ordinal.size()) - p0;
        if (!np) continue;
        const int rows = (pm.N - x + T_x - 1) / T_x;  // rows x + i*T_x < N
        for (int i0 = 0; i0 < rows; i0 += rows_per_task)
          per_node[j].push_back({j, mi, x, i0, std::min(rows_per_task, rows - i0), p0, np});
      }
    }
  }
}

namespace {
struct ThreadBuf {
  std::vector<float> v;
  float* get(size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
};
thread_local ThreadBuf tl_out;

// Runs one task on the calling thread (scratch: thread-local).
void run_piece_task(const PieceWork& work, const PieceTaskRef& t, const MicroKernel& mk) {
  const PieceMatrix& pm = work.mats[t.mat];
  const int T_x = period_of(pm);
  float* out = tl_out.get(size_t(t.nrows) * t.np * pm.M);
  PieceTask pt;
  pt.w = pm.w + (t.x + int64_t(t.i0) * T_x) * pm.ldw;
  pt.ldw = T_x * pm.ldw;
  pt.nrows = t.nrows;
  pt.pieces = work.pieces.data() + 2 * int64_t(t.p0);
  pt.npieces = t.np;
  pt.K = pm.K;
  pt.M = pm.M;
  pt.I = pm.I;
  pt.out = out;
  mk.piece_dots(pt);
  // each piece's products into its slot of the row (the reduction adds slots in ascending y)
  for (int r = 0; r < t.nrows; ++r) {
    const int64_t n = t.x + int64_t(t.i0 + r) * T_x;
    for (int p = 0; p < t.np; ++p) {
      const float* src = out + (int64_t(r) * t.np + p) * pm.M;
      float* dst = pm.partial + (n * pm.max_pieces + work.ordinal[t.p0 + p]) * pm.M;
      for (int m = 0; m < pm.M; ++m) dst[m] = src[m];
    }
  }
}
}  // namespace

// ---- the piece path ------------------------------------------------------------------------------
// Rows per piece task (Algorithm 2: 32 rows x, x+T_x, ... fill the two W tiles).
constexpr int kPieceTaskRows = 32;

PiecePath::PiecePath(const MoeCall& call, const NumaPlans* numa, bool gate_up, bool down)
    : call_(call), numa_(numa), gate_up_(gate_up), down_(down), nodes_(numa ? numa->nodes : 1),
      mp_gu_(max_pieces(int(call.H))), mp_down_(max_pieces(int(call.I))),
      next_gu_(nodes_), next_down_(nodes_) {
  for (int j = 0; j < nodes_; ++j) { next_gu_[j] = 0; next_down_[j] = 0; }
}

size_t PiecePath::gate_up_partial_bytes(int M) const {
  return gate_up_ ? 2 * size_t(call_.I) * mp_gu_ * size_t(M) * sizeof(float) : 0;
}
size_t PiecePath::down_partial_bytes(int M) const {
  return down_ ? size_t(call_.H) * mp_down_ * size_t(M) * sizeof(float) : 0;
}

void PiecePath::build(const std::vector<ExpertSlot>& slots, const std::vector<float*>& partial_gu,
                      const std::vector<float*>& partial_down, int threads) {
  slots_ = slots;
  if (!gate_up_ && !down_) return;
  const MoeCall& a = call_;
  const int H = int(a.H), I = int(a.I);
  for (size_t s = 0; s < slots.size(); ++s) {
    const int32_t e = slots[s].e;
    const int M = slots[s].M;
    auto plan = [&](int kind) { return numa_ ? numa_->plan(kind, e) : MatrixPlan{1, 0, 4096, nullptr, nullptr}; };
    if (gate_up_) {
      float* pg = partial_gu[s];
      work_gu_.mats.push_back({a.w_gate + e * a.gate_es, a.gate_rs, I, H, M, slots[s].I, pg, mp_gu_, plan(0)});
      work_gu_.mats.push_back({a.w_up + e * a.up_es, a.up_rs, I, H, M, slots[s].I,
                               pg + size_t(I) * mp_gu_ * M, mp_gu_, plan(1)});
    }
    if (down_)
      work_down_.mats.push_back({a.w_down + e * a.down_es, a.down_rs, H, I, M, slots[s].act,
                                 partial_down[s], mp_down_, plan(2)});
  }
  if (gate_up_) work_gu_.build(nodes_, kPieceTaskRows);
  if (down_) work_down_.build(nodes_, kPieceTaskRows);
  stats_ = numa_ && numa_stats().enabled;
  if (stats_) numa_stats_begin(nodes_, threads);
  for (int32_t s = 0; s < int32_t(slots.size()); ++s) {
    if (gate_up_) for (int32_t n0 = 0; n0 < I; n0 += kShapeMultiple) red_gu_.push_back({s, n0});
    if (down_) for (int32_t n0 = 0; n0 < H; n0 += kShapeMultiple) red_down_.push_back({s, n0});
  }
}

// Each of this thread's nodes: bind to the node's CPUs (real nodes), then take its tasks.
void PiecePath::run_pieces(PieceThread& me, const PieceWork& work, int work_id,
                           std::vector<std::atomic<int>>& next, const MicroKernel& mk, FirstError& err) {
  for (int j : me.nodes_) {
    if (numa_ && j < int(numa_->node_cpus.size())) me.affinity_.bind(numa_->node_cpus[j]);
    const auto& q = work.per_node[j];
    for (int i = next[j]++; i < int(q.size()); i = next[j]++)
      err.guard([&] {
        run_piece_task(work, q[i], mk);
        if (stats_) numa_stats_record(work, work_id, q[i], me.thread_);
      });
  }
}

void PiecePath::run_gate_up(PieceThread& me, const MicroKernel& mk, FirstError& err) {
  run_pieces(me, work_gu_, 0, next_gu_, mk, err);
#pragma omp barrier
  // the reduction across nodes (every row's pieces in ascending y), then transformation 2
#pragma omp for schedule(dynamic, 4)
  for (size_t i = 0; i < red_gu_.size(); ++i) {
    err.guard([&] {
      const Red tk = red_gu_[i];
      const PieceMatrix& pg = work_gu_.mats[2 * tk.slot];
      const PieceMatrix& pu = work_gu_.mats[2 * tk.slot + 1];
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
      mk.store_act(slots_[tk.slot].act, int(call_.I), tk.n0, n, M, gu.data(), gu.data() + n * M);
    });
  }
}

void PiecePath::run_down(PieceThread& me, const MicroKernel& mk, FirstError& err) {
  run_pieces(me, work_down_, 1, next_down_, mk, err);
#pragma omp barrier
  // the reduction across nodes, then transformation 3: y rows, token-major
  const int64_t H = call_.H;
#pragma omp for schedule(dynamic, 4)
  for (size_t i = 0; i < red_down_.size(); ++i) {
    err.guard([&] {
      const Red tk = red_down_[i];
      const PieceMatrix& pd = work_down_.mats[tk.slot];
      float* ys = slots_[tk.slot].y;
      for (int j = 0; j < kShapeMultiple; ++j) {
        const int r = tk.n0 + j;
        const int np = row_piece_count(pd.w + r * pd.ldw, pd.K);
        for (int m = 0; m < pd.M; ++m) ys[m * H + r] = reduce_row(pd, r, m, np);
      }
    });
  }
}

void PiecePath::finish() {
  if (stats_) numa_stats_finish({&work_gu_, &work_down_});
}

std::vector<int> nodes_of_thread(int thread, int threads, int nodes) {
  std::vector<int> out;
  if (threads >= nodes) {
    out.push_back(int(int64_t(thread) * nodes / threads));  // contiguous groups, >= 1 thread each
  } else {
    for (int j = thread; j < nodes; j += threads) out.push_back(j);
  }
  return out;
}

void AffinityGuard::bind(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  if (!saved) {
    mask.assign(sizeof(cpu_set_t), 0);
    if (sched_getaffinity(0, sizeof(cpu_set_t), reinterpret_cast<cpu_set_t*>(mask.data())) != 0) return;
    saved = true;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);  // best effort: a refused binding only costs locality
}

AffinityGuard::~AffinityGuard() {
  if (saved) sched_setaffinity(0, sizeof(cpu_set_t), reinterpret_cast<const cpu_set_t*>(mask.data()));
}

// ---- testing counters ----------------------------------------------------------------------------
namespace {
NumaStats g_stats;
std::mutex g_stats_mutex;
using Interval = std::tuple<int32_t, int32_t, int64_t, int32_t, int32_t>;  // work, matrix, row, k0, k1
std::vector<std::vector<Interval>> g_intervals;                            // per thread
}  // namespace

NumaStats& numa_stats() { return g_stats; }

void numa_stats_begin(int nodes, int threads) {
  g_stats.bytes.assign(nodes, 0);
  g_stats.remote_bytes.assign(nodes, 0);
  g_stats.tasks.assign(nodes, 0);
  g_stats.rows_checked = g_stats.rows_bad = 0;
  g_stats.first_error.clear();
  g_intervals.assign(threads, {});
}

void numa_stats_record(const PieceWork& work, int work_id, const PieceTaskRef& t, int thread) {
  const PieceMatrix& pm = work.mats[t.mat];
  const int T_x = period_of(pm);
  const int nodes = int(g_stats.bytes.size());
  int64_t bytes = 0, remote = 0;
  auto& iv = g_intervals[thread];
  for (int r = 0; r < t.nrows; ++r) {
    const int64_t n = t.x + int64_t(t.i0 + r) * T_x;
    for (int p = 0; p < t.np; ++p) {
      const int k0 = work.pieces[2 * (t.p0 + p)], k1 = work.pieces[2 * (t.p0 + p) + 1];
      iv.emplace_back(work_id, t.mat, n, k0, k1);
      bytes += int64_t(k1 - k0) * 2;
      // bytes of [k0, k1) on each page of the model: node = ((phase + offset) / page) mod nodes
      int64_t a = pm.plan.phase_bytes + (n * pm.ldw + k0) * 2, b = a + int64_t(k1 - k0) * 2;
      while (a < b) {
        const int64_t page_end = (a / pm.plan.page_bytes + 1) * pm.plan.page_bytes;
        const int64_t e = std::min(b, page_end);
        if (int((a / pm.plan.page_bytes) % nodes) != t.node) remote += e - a;
        a = e;
      }
    }
  }
  std::lock_guard<std::mutex> g(g_stats_mutex);
  g_stats.bytes[t.node] += bytes;
  g_stats.remote_bytes[t.node] += remote;
  g_stats.tasks[t.node] += 1;
}

void numa_stats_finish(const std::vector<const PieceWork*>& works) {
  std::vector<Interval> all;
  for (auto& v : g_intervals) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  size_t i = 0;
  for (int wi = 0; wi < int(works.size()); ++wi) {
    for (int mi = 0; mi < int(works[wi]->mats.size()); ++mi) {
      const PieceMatrix& pm = works[wi]->mats[mi];
      for (int64_t n = 0; n < pm.N; ++n) {
        int y = 0;
        bool ok = true;
        for (; i < all.size() && std::get<0>(all[i]) == wi && std::get<1>(all[i]) == mi &&
               std::get<2>(all[i]) == n; ++i) {
          if (std::get<3>(all[i]) != y) ok = false;
          y = std::get<4>(all[i]);
        }
        if (y != pm.K) ok = false;
        g_stats.rows_checked++;
        if (!ok) {
          g_stats.rows_bad++;
          if (g_stats.first_error.empty())
            g_stats.first_error = "work " + std::to_string(wi) + " matrix " + std::to_string(mi) +
                                  " row " + std::to_string(n) + ": pieces do not tile [0, " +
                                  std::to_string(pm.K) + ") exactly once";
        }
      }
    }
  }
  if (i != all.size() && g_stats.first_error.empty()) g_stats.first_error = "stray intervals";
  g_intervals.clear();
}

}  // namespace hina
