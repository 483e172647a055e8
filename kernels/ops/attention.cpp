// The attention driver (see attention.h): tasks, the walk through the KV layout, the causal mask,
// the split merge. No ISA flags here: everything that needs vector instructions is a micro-kernel.
#include "ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernel_table.h"  // find_usable, isa_names
#include "ops/parallel.h"

namespace hina {

const std::vector<const AttnMicroKernel*>& attn_microkernels() {
  static const std::vector<const AttnMicroKernel*> table{
      &attn_microkernel_scalar,
#if defined(HINA_EMU_AVX512)
      &attn_microkernel_avx512,
#elif defined(HINA_EMU_AMX)
      &attn_microkernel_amx,
#else
      &attn_microkernel_avx2, &attn_microkernel_avx512, &attn_microkernel_amx,
#endif
  };
  return table;
}

std::vector<std::string> attn_isas() {
  std::vector<std::string> out;
  for (auto* mk : attn_microkernels()) out.push_back(mk->isa);
  return out;
}

const AttnMicroKernel& find_attn_microkernel(const std::string& isa) {
  if (const AttnMicroKernel* mk = find_usable(attn_microkernels(), isa)) return *mk;
  throw std::invalid_argument("no attention micro-kernel for isa '" + isa + "' in this module (it has: " +
                              isa_names(attn_microkernels()) + ")");
}

namespace {

AttnSchedule g_last;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;

// One unit of work: query rows [t0 * G, (t0 + nt) * G) of KV head h of sequence b, keys [k0, k1).
struct Task {
  int b, h, t0, nt;
  int k0, k1;
  int64_t part;   // index of this task's partial slot (splits > 1), else -1
};

struct Scratch {
  std::vector<float> qp, O, S, m, l, row;
  std::vector<const bf16_t*> kp, vp, kn, vn;   // this chunk's rows, the next chunk's
  std::vector<const bf16_t*> ks, vs;           // the staged rows (strided caches)
  std::vector<bf16_t> kbuf, vbuf;              // chunk_keys x d each: dense copies of strided rows
  std::vector<int> limit;
};

void check(const AttnCall& c) {
  auto bad = [](const std::string& s) { throw std::invalid_argument(s); };
  if (c.B < 1) bad("attention needs at least one sequence (B = " + std::to_string(c.B) + ")");
  if (c.h_kv < 1 || c.h_q < 1) bad("h_q and h_kv must be positive");
  if (c.h_q % c.h_kv) bad("h_q = " + std::to_string(c.h_q) + " is not a multiple of h_kv = " + std::to_string(c.h_kv));
  if (c.d < 1 || c.d % kAttnHeadDimMultiple || c.d > kAttnHeadDimMax)
    bad("head_dim " + std::to_string(c.d) + " is not supported (multiples of " + std::to_string(kAttnHeadDimMultiple) +
        " up to " + std::to_string(kAttnHeadDimMax) + ")");
  if (!c.q || !c.out || !c.k || !c.v || !c.q_start || !c.kv_len) bad("a null buffer");
  for (int b = 0; b < c.B; ++b) {
    const int n = c.q_start[b + 1] - c.q_start[b];
    if (n < 1) bad("sequence " + std::to_string(b) + " has no query tokens");
    if (c.kv_len[b] < n) bad("sequence " + std::to_string(b) + " has kv_len " + std::to_string(c.kv_len[b]) +
                             " < its " + std::to_string(n) + " query token(s) (l = 0 has nothing to attend to)");
    if (c.block_table) {
      if (c.block_size < 1) bad("block_size must be positive");
      const int nb = (c.kv_len[b] + c.block_size - 1) / c.block_size;
      for (int i = 0; i < nb; ++i) {
        const int blk = c.block_table[int64_t(b) * c.bt_stride + i];
        if (blk < 0 || blk >= c.num_blocks)
          bad("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(blk) +
              " is outside [0, " + std::to_string(c.num_blocks) + ")");
      }
    }
  }
}

inline const bf16_t* key_at(const AttnCall& c, const bf16_t* base, int64_t seq, int64_t tok, int64_t head,
                            int64_t blk, int b, int h, int j) {
  if (c.block_table) {
    const int64_t block = c.block_table[int64_t(b) * c.bt_stride + j / c.block_size];
    return base + block * blk + int64_t(j % c.block_size) * tok + int64_t(h) * head;
  }
  return base + int64_t(b) * seq + int64_t(j) * tok + int64_t(h) * head;
}

// One task: pack the query block, walk its keys chunk by chunk, one online softmax throughout.
// Writes the normalised output (bf16) directly, or (split tasks) the normalised fp32 rows and their
// LSE (log2 units) to the partial slot.
void run_task(const AttnCall& c, const AttnMicroKernel& mk, const Task& t, Scratch& s,
              float* part_o, float* part_lse) {
  const int G = c.h_q / c.h_kv, d = c.d, rows = t.nt * G;
  const int KC = mk.blocking.chunk_keys;
  const int n_b = c.q_start[t.b + 1] - c.q_start[t.b];
  const int first_pos = c.kv_len[t.b] - n_b;   // position of query token 0
  std::vector<const bf16_t*> qrows(rows);
  for (int r = 0; r < rows; ++r) {
    const int tok = c.q_start[t.b] + t.t0 + r / G, head = t.h * G + r % G;
    qrows[r] = c.q + int64_t(tok) * c.q_ts + int64_t(head) * c.q_hs;
    s.limit[r] = first_pos + t.t0 + r / G;      // the last key this row may see
  }
  mk.pack_q(qrows.data(), rows, d, c.sm_scale * kLog2e, s.qp.data());
  std::fill(s.O.begin(), s.O.begin() + int64_t(rows) * d, 0.f);
  std::fill(s.m.begin(), s.m.begin() + rows, kNegInf);
  std::fill(s.l.begin(), s.l.begin() + rows, 0.f);
  const int min_limit = s.limit[0];
  // a chunk's key and value rows, walked block by block (no division per key)
  auto rows_of = [&](int j0, int nk, const bf16_t** kp, const bf16_t** vp) {
    for (int j = 0; j < nk;) {
      const bf16_t* kb = key_at(c, c.k, c.k_seq, c.k_tok, c.k_head, c.k_blk, t.b, t.h, j0 + j);
      const bf16_t* vb = key_at(c, c.v, c.v_seq, c.v_tok, c.v_head, c.v_blk, t.b, t.h, j0 + j);
      const int run = c.block_table ? std::min(nk - j, c.block_size - (j0 + j) % c.block_size) : nk - j;
      for (int i = 0; i < run; ++i, ++j) {
        kp[j] = kb + int64_t(i) * c.k_tok;
        vp[j] = vb + int64_t(i) * c.v_tok;
      }
    }
  };
  const int row_bytes = d * int(sizeof(bf16_t));
  // A token stride other than d (the [num_blocks, block_size, h_kv, d] paged layout: rows h_kv * d
  // apart, 1 KiB for Qwen3) puts a chunk's rows into a few L1 sets: V, read once per 4-row block, and
  // K were evicted between uses (measured 3x slower than the same keys head-major). Those rows are
  // copied into dense per-thread buffers once per chunk instead.
  const bool stage_k = c.k_tok != d, stage_v = c.v_tok != d;
  if (t.k0 < t.k1) rows_of(t.k0, std::min(KC, t.k1 - t.k0), s.kp.data(), s.vp.data());
  for (int j0 = t.k0; j0 < t.k1; j0 += KC) {
    const int nk = std::min(KC, t.k1 - j0);
    // the next chunk's rows, prefetched while this one is computed (a paged cache jumps between blocks)
    const int nn = std::min(KC, t.k1 - j0 - KC);
    if (nn > 0) {
      rows_of(j0 + KC, nn, s.kn.data(), s.vn.data());
      for (int j = 0; j < nn; ++j)
        for (int off = 0; off < row_bytes; off += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(s.kn[j]) + off);
          __builtin_prefetch(reinterpret_cast<const char*>(s.vn[j]) + off);
        }
    }
    if (stage_k || stage_v) {   // rows of a strided cache: copied once into dense L1 buffers (see Scratch)
      for (int j = 0; j < nk; ++j) {
        if (stage_k) {
          std::memcpy(s.kbuf.data() + int64_t(j) * d, s.kp[j], size_t(row_bytes));
          s.ks[j] = s.kbuf.data() + int64_t(j) * d;
        }
        if (stage_v) {
          std::memcpy(s.vbuf.data() + int64_t(j) * d, s.vp[j], size_t(row_bytes));
          s.vs[j] = s.vbuf.data() + int64_t(j) * d;
        }
      }
    }
    const bf16_t* const* krows = stage_k ? s.ks.data() : s.kp.data();
    const bf16_t* const* vrows = stage_v ? s.vs.data() : s.vp.data();
    mk.scores(s.qp.data(), rows, d, krows, nk, s.S.data(), KC);
    if (j0 + nk - 1 > min_limit) {               // the causal triangle reaches into this chunk
      for (int r = 0; r < rows; ++r) {
        const int first_masked = std::max(0, s.limit[r] + 1 - j0);
        float* Sr = s.S.data() + int64_t(r) * KC;
        for (int j = first_masked; j < nk; ++j) Sr[j] = kNegInf;
      }
    }
    mk.softmax_step(s.S.data(), KC, rows, nk, s.m.data(), s.l.data(), s.O.data(), d);
    mk.pv(s.S.data(), KC, rows, vrows, nk, d, s.O.data());
    if (nn > 0) {
      std::swap(s.kp, s.kn);
      std::swap(s.vp, s.vn);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const float l = s.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (part_o) {
      mk.unpack_o(s.O.data() + int64_t(r) * d, d, inv, part_o + int64_t(r) * d);
      part_lse[r] = l > 0.f ? s.m[r] + std::log2(l) : kNegInf;
    } else {
      mk.unpack_o(s.O.data() + int64_t(r) * d, d, inv, s.row.data());
      const int tok = c.q_start[t.b] + t.t0 + r / G, head = t.h * G + r % G;
      bf16_t* o = c.out + int64_t(tok) * c.o_ts + int64_t(head) * c.o_hs;
      for (int i = 0; i < d; ++i) o[i] = f32_to_bf16(s.row[i]);
    }
  }
}

}  // namespace

AttnSchedule attn_last_schedule() { return g_last; }

void attention(const AttnCall& c) {
  check(c);
  const AttnMicroKernel& mk = find_attn_microkernel(c.isa);
  const int G = c.h_q / c.h_kv, d = c.d;
  const int threads = std::max(1, c.threads);
  const int KC = mk.blocking.chunk_keys;
  const int tok_per_block = std::max(1, mk.blocking.block_rows / G);
  const int max_rows = tok_per_block * G;

  // ---- tasks before splitting: (sequence, KV head, query block), the heads of a sequence adjacent
  struct Base { int b, h, t0, nt, keys; };
  std::vector<Base> base;
  int64_t total_keys = 0;
  for (int b = 0; b < c.B; ++b) {
    const int n_b = c.q_start[b + 1] - c.q_start[b];
    for (int h = 0; h < c.h_kv; ++h)
      for (int t0 = 0; t0 < n_b; t0 += tok_per_block) {
        const int nt = std::min(tok_per_block, n_b - t0);
        const int keys = c.kv_len[b] - n_b + t0 + nt;   // the block's last row sees this many keys
        base.push_back({b, h, t0, nt, keys});
        total_keys += keys;
      }
  }
  // ---- KV splits: enough tasks for every thread (x4 for balance), no split under 4 chunks of keys
  int splits = c.kv_splits;
  if (splits <= 0) {
    const int64_t want = 4 * int64_t(threads);
    splits = base.size() >= size_t(want) || threads == 1 ? 1 : int((want + base.size() - 1) / base.size());
  }
  std::vector<Task> tasks;
  std::vector<int> nsplit(base.size());
  std::vector<int64_t> first(base.size(), -1);   // the first partial slot of a split base task
  int64_t nparts = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const Base& bt = base[i];
    const int chunks = (bt.keys + KC - 1) / KC;
    const int sp = std::max(1, std::min(splits, c.kv_splits > 0 ? chunks : chunks / 4));
    nsplit[i] = sp;
    const int per = (chunks + sp - 1) / sp;        // whole chunks per split
    for (int s = 0; s < sp; ++s) {
      const int k0 = s * per * KC, k1 = std::min(bt.keys, (s + 1) * per * KC);
      if (k0 >= k1) { nsplit[i] = s; break; }
      tasks.push_back({bt.b, bt.h, bt.t0, bt.nt, k0, k1, sp > 1 ? nparts + s : -1});
    }
    if (sp > 1) { first[i] = nparts; nparts += sp; }
  }
  g_last = {int64_t(tasks.size()), splits, max_rows};
  std::vector<float> part_o(size_t(nparts) * max_rows * d), part_lse(size_t(nparts) * max_rows);

  FirstError err;
#pragma omp parallel num_threads(threads)
  {
    Scratch s;
    s.qp.resize(size_t(max_rows + 16) * (d + 32) + 64);   // every kernel's packed layout, with headroom
    s.O.resize(size_t(max_rows) * d);
    s.S.resize(size_t(max_rows) * KC);
    s.m.resize(max_rows);
    s.l.resize(max_rows);
    s.row.resize(d);
    s.kp.resize(KC);
    s.vp.resize(KC);
    s.kn.resize(KC);
    s.vn.resize(KC);
    s.ks.resize(KC);
    s.vs.resize(KC);
    s.kbuf.resize(size_t(KC) * d);
    s.vbuf.resize(size_t(KC) * d);
    s.limit.resize(max_rows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < int64_t(tasks.size()); ++i) {
      err.guard([&] {
        const Task& t = tasks[i];
        float* po = t.part >= 0 ? part_o.data() + size_t(t.part) * max_rows * d : nullptr;
        float* pl = t.part >= 0 ? part_lse.data() + size_t(t.part) * max_rows : nullptr;
        run_task(c, mk, t, s, po, pl);
      });
    }
    // ---- merge the splits of every split base task: out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max)
    if (nparts) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < int64_t(base.size()); ++i) {
        if (first[i] < 0) continue;
        const Base& bt = base[i];
        const int rows = bt.nt * G, sp = nsplit[i];
        for (int r = 0; r < rows; ++r) {
          float mx = kNegInf;
          for (int q = 0; q < sp; ++q) mx = std::max(mx, part_lse[size_t(first[i] + q) * max_rows + r]);
          std::fill(s.row.begin(), s.row.end(), 0.f);
          float wsum = 0.f;
          for (int q = 0; q < sp; ++q) {
            const float lse = part_lse[size_t(first[i] + q) * max_rows + r];
            if (lse == kNegInf) continue;
            const float w = std::exp2(lse - mx);
            wsum += w;
            const float* po = part_o.data() + (size_t(first[i] + q) * max_rows + r) * d;
            for (int k = 0; k < d; ++k) s.row[k] += w * po[k];
          }
          const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
          const int tok = c.q_start[bt.b] + bt.t0 + r / G, head = bt.h * G + r % G;
          bf16_t* o = c.out + int64_t(tok) * c.o_ts + int64_t(head) * c.o_hs;
          for (int k = 0; k < d; ++k) o[k] = f32_to_bf16(s.row[k] * inv);
        }
      }
    }
  }
  err.rethrow();
}

}  // namespace hina
