// The attention driver (see attention.h): tasks, the walk through the KV layout, the causal mask,
// the split merge. No ISA flags here: everything that needs vector instructions is a micro-kernel.
#include "ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernel_table.h"  // find_usable, isa_names
#include "ops/parallel.h"
#include "scratch.h"   // ThreadScratch

namespace hina {

const std::vector<const AttnMicroKernel*>& attn_microkernels() {
  static const std::vector<const AttnMicroKernel*> table{
      &attn_microkernel_scalar,
#if defined(HINA_EMU_AVX512)
      &attn_microkernel_avx512, &attn_microkernel_avx512_nobf16,
#elif defined(HINA_EMU_AMX)
      &attn_microkernel_amx,
#else
      &attn_microkernel_avx2, &attn_microkernel_avx512, &attn_microkernel_avx512_nobf16, &attn_microkernel_amx,
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
std::atomic<bool> g_fused_step{true};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.4426950408889634f;

// One unit of work: query rows [t0 * G, (t0 + nt) * G) of KV heads [h, h + nh) of sequence b, keys
// [k0, k1). A head-major cache (each head's rows dense) takes one head per task; a token-major one
// ([.., tok, h_kv, d]: a token's heads side by side) takes every head, so a chunk's K and V are read as
// whole token records, in address order, and staged head by head (see run_task).
struct Task {
  int b, h, nh, t0, nt;
  int k0, k1;
  int64_t part;   // index of this task's partial slot (splits > 1), else -1
};

struct Scratch {
  // the micro-kernels' fp32 buffers, 64-byte aligned (scratch.h): a 32-byte load of the packed queries
  // that straddled two cache lines (a std::vector's 16-byte alignment) made the AVX2 scores 1.3x slower
  ThreadScratch<float> qp{nullptr, 0}, O{nullptr, 0}, S{nullptr, 0}, m{nullptr, 0}, l{nullptr, 0}, row{nullptr, 0};
  std::vector<const bf16_t*> kp, vp, kn, vn;   // this chunk's rows, the next chunk's
  std::vector<const bf16_t*> pk, pv;           // the next head's rows (a fused step's prefetch)
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

// A software prefetch GCC 12 keeps: after a rewrite of run_task's loop over the next chunk's records
// (a lambda called per head), its __builtin_prefetch calls were gone from the object (no prefetch
// instruction in the function; the cause was not pinned down). An asm statement cannot be dropped.
// Into L1 (prefetcht0) or L2 (prefetcht1): AttnBlocking::prefetch_l2.
inline void prefetch_line(const char* p, bool l2) {
  if (l2) __asm__ volatile("prefetcht1 %0" ::"m"(*p));
  else __asm__ volatile("prefetcht0 %0" ::"m"(*p));
}

inline const bf16_t* key_at(const AttnCall& c, const bf16_t* base, int64_t seq, int64_t tok, int64_t head,
                            int64_t blk, int b, int h, int j) {
  if (c.block_table) {
    const int64_t block = c.block_table[int64_t(b) * c.bt_stride + j / c.block_size];
    return base + block * blk + int64_t(j % c.block_size) * tok + int64_t(h) * head;
  }
  return base + int64_t(b) * seq + int64_t(j) * tok + int64_t(h) * head;
}

// Per-head state of a task lives at head index hh: packed queries at qp + hh * qstride, O at
// O + hh * rows * d, m and l at hh * rows. Task row r of head hh is query token t0 + r / G, q head
// (h + hh) * G + r % G.
inline int64_t q_stride(int rows, int d) { return int64_t(rows + 16) * (d + 32) + 64; }  // every kernel's layout, with headroom

// One task: pack the query blocks, walk its keys chunk by chunk, one online softmax per head throughout.
// Writes the normalised output (bf16) directly, or (split tasks) the normalised fp32 rows and their
// LSE (log2 units) to the partial slot (head-major: head hh's rows at hh * rows).
void run_task(const AttnCall& c, const AttnMicroKernel& mk, const AttnBlocking& bl, const Task& t, Scratch& s,
              float* part_o, float* part_lse) {
  const int G = c.h_q / c.h_kv, d = c.d, rows = t.nt * G;
  const int KC = bl.chunk_keys;
  const int n_b = c.q_start[t.b + 1] - c.q_start[t.b];
  const int first_pos = c.kv_len[t.b] - n_b;   // position of query token 0
  const int64_t qs = q_stride(rows, d);
  std::vector<const bf16_t*> qrows(rows);
  for (int hh = 0; hh < t.nh; ++hh) {
    for (int r = 0; r < rows; ++r) {
      const int tok = c.q_start[t.b] + t.t0 + r / G, head = (t.h + hh) * G + r % G;
      qrows[r] = c.q + int64_t(tok) * c.q_ts + int64_t(head) * c.q_hs;
    }
    mk.pack_q(qrows.data(), rows, d, c.sm_scale * kLog2e, s.qp.p + hh * qs);
  }
  for (int r = 0; r < rows; ++r) s.limit[r] = first_pos + t.t0 + r / G;      // the last key this row may see
  std::fill(s.O.p, s.O.p + int64_t(t.nh) * rows * d, 0.f);
  std::fill(s.m.p, s.m.p + int64_t(t.nh) * rows, kNegInf);
  std::fill(s.l.p, s.l.p + int64_t(t.nh) * rows, 0.f);
  const int min_limit = s.limit[0];
  // a chunk's key and value rows of head h, walked block by block (no division per key)
  auto rows_of = [&](int h, int j0, int nk, const bf16_t** kp, const bf16_t** vp) {
    for (int j = 0; j < nk;) {
      const bf16_t* kb = key_at(c, c.k, c.k_seq, c.k_tok, c.k_head, c.k_blk, t.b, h, j0 + j);
      const bf16_t* vb = key_at(c, c.v, c.v_seq, c.v_tok, c.v_head, c.v_blk, t.b, h, j0 + j);
      const int run = c.block_table ? std::min(nk - j, c.block_size - (j0 + j) % c.block_size) : nk - j;
      for (int i = 0; i < run; ++i, ++j) {
        kp[j] = kb + int64_t(i) * c.k_tok;
        vp[j] = vb + int64_t(i) * c.v_tok;
      }
    }
  };
  const int row_bytes = d * int(sizeof(bf16_t));
  const bool pf_l2 = bl.prefetch_l2;
  const int rec_bytes = t.nh > 1 && c.k_head == d ? t.nh * row_bytes : row_bytes;   // a token's record
  // A token stride other than d (the [num_blocks, block_size, h_kv, d] paged layout: rows h_kv * d
  // apart, 1 KiB for Qwen3) puts a chunk's rows into a few L1 sets: V, read once per 4-row block, and
  // K were evicted between uses (measured 3x slower than the same keys head-major). A kernel that
  // wants it (AttnBlocking::stage_strided) has those rows copied into dense per-thread buffers once per
  // chunk instead, head-major; a task of every head reads each token's heads in one pass (the token
  // record, h_kv * d contiguous when k_head == d). The AVX-512 and AVX2 kernels no longer do (Zen 4,
  // 2026-12-03): with the prefetch cut into 4 pieces (below) their rows are read in place, and the
  // copy, a memcpy call per 256-byte row, took half the time of a Mixtral-8x7B step whose KV sat in
  // L3 (perf: 50% of the samples in memmove; 1.39 ms staged against 0.69 unstaged, l = 4096).
  const bool stage_k = bl.stage_strided && c.k_tok != d;
  const bool stage_v = bl.stage_strided && c.v_tok != d;
  const int64_t stage_head = int64_t(KC) * d;   // staged rows of one head
  // s.kp / s.vp: this chunk's rows of head t.h, found once: the first chunk's here, every later one's
  // as the previous chunk's "next" rows (the two buffers swap at the end of a chunk)
  if (t.k0 < t.k1) rows_of(t.h, t.k0, std::min(KC, t.k1 - t.k0), s.kp.data(), s.vp.data());
  for (int j0 = t.k0; j0 < t.k1; j0 += KC) {
    const int nk = std::min(KC, t.k1 - j0);
    // the next chunk's rows (first head's; a token record is contiguous), prefetched while this one is
    // computed, every line of them, a share before each head's step. Measured on the AMX kernel, Qwen3
    // shapes, 4096 keys streamed from DRAM, contiguous / paged: every line 0.51 / 0.60 ms, the first
    // line of each row 0.65 / 0.66, none 0.67 / 0.69; shared over the heads (paged) 0.58-0.59 ms, all
    // before the first head 0.61-0.62. Into L1 there (AMX: prefetch_l2 false). On Zen 4 (32 KiB L1D;
    // 2026-12-02, 2 threads, batch-1 decode, KV from DRAM, the builds' modules side by side in one
    // process, 5 rounds) into L1 was the slowest choice for the AVX-512 and AVX2 kernels, whose chunk
    // (32 keys x every head's K and V: 64 KiB for Qwen3-30B-A3B) does not fit L1: against it, into L2
    // 0.82-0.97x the time (Qwen3-30B-A3B and Mixtral-8x7B, l = 1024 and 16384, paged and contiguous;
    // AVX2 0.82-0.95x, one case 1.04x), into L3 (prefetcht2) 0.82-0.96x, none 0.84-0.95x (the best
    // paged, the worst contiguous). Tried and not kept there: chunks of 16 keys (0.97-1.08x); the
    // staging copy as fixed 32-byte moves instead of a memcpy call per row (1.03-1.06x the time).
    // A chunk that is staged (strided rows copied first, see above: the paged cache) prefetches
    // nothing: the copy reads the records in address order, a block's tokens contiguous, and against
    // the L2 prefetch Qwen3 / Mixtral paged l = 1024, 4096, 16384 took 0.94-0.96x the time (AVX-512),
    // 0.95-1.00x (AVX2).
    // A head's share is cut into AttnBlocking::prefetch_steps pieces, issued between the kernel's
    // calls: a burst of prefetches waits for the core's miss buffers (perf on Zen 4: a sixth of a
    // step's samples on the prefetch instructions, 256 of them per chunk of one head), a piece between
    // the calls waits less. On Zen 4 (2026-12-03, AVX-512, 2 threads, batch-1 decode, KV from DRAM,
    // the variants side by side in one process, 5 rounds; Qwen3-30B-A3B and Mixtral-8x7B): contiguous,
    // l = 4096, 4 steps against 1 took 0.83-0.97x the time, 2 steps 0.92-1.03x, 8 steps (calls of 8
    // keys) 0.86-1.05x, 16 (4 keys) 1.25-1.38x; paged (unstaged), l = 1024 / 4096 / 16384, 4 steps
    // against 2 0.87-1.00x, against the staged copy 0.74-0.95x. Two or four chunks ahead instead of
    // one: no better. Every second line only, every fourth, or a row's first: 1.6-2.1x the time, as
    // with no prefetch at all (the hardware prefetchers do not carry these streams here).
    // AttnBlocking::prefetch_order 1 (the AVX-512 kernel's Zen 5 blocking, measured there: see
    // attention_avx512.cpp) prefetches the next step's rows instead: the next head's rows of this chunk
    // while a head is computed, the next chunk's first head's during the last head, so that a
    // token-major chunk (every head's rows: 64 KiB of K and of V for Mixtral-8x7B) is not all in
    // flight ahead of the head that reads it.
    const int nn = std::min(KC, t.k1 - j0 - KC);
    if (nn > 0) rows_of(t.h, j0 + KC, nn, s.kn.data(), s.vn.data());
    const int steps = std::max(1, bl.prefetch_steps);
    const int calls = steps > 1 ? steps / 2 : 1;                       // calls of scores and of P x V
    const int sub = std::max(4, ((nk + calls - 1) / calls + 3) & ~3);  // keys per call
    const int npieces = t.nh * steps;
    // keys [from, to) of KV head h, `bytes` from each row's start. The rows' addresses from the layout,
    // not read back from s.kn / s.vn: the same addresses (checked in a scratch build), but on Zen 4's
    // contiguous cache 0.81-0.90x the time (AVX-512; AVX2 0.74-0.84x; two copies of each build
    // alternated, then again); why the pointer form was slower was not found (on Zen 5, in a trial of
    // a fused step, too: 0.79x the time from the layout, paged Mixtral-8x7B)
    auto prefetch_keys = [&](int h, int from, int to, int bytes) {
      for (int j = from; j < to; ++j) {
        const char* kr = reinterpret_cast<const char*>(key_at(c, c.k, c.k_seq, c.k_tok, c.k_head, c.k_blk, t.b, h, j));
        const char* vr = reinterpret_cast<const char*>(key_at(c, c.v, c.v_seq, c.v_tok, c.v_head, c.v_blk, t.b, h, j));
        for (int off = 0; off < bytes; off += 64) {
          prefetch_line(kr + off, pf_l2);
          prefetch_line(vr + off, pf_l2);
        }
      }
    };
    auto prefetch_piece = [&](int i) {   // piece i of the next chunk's rows (every head's pieces in turn)
      if (stage_k || stage_v) return;   // a staged chunk: no prefetch (above)
      if (bl.prefetch_order == 1 && t.nh > 1) {   // piece i % steps of the next step's rows (a head-major
                                                  // cache, one head a task: the same rows as order 0)
        const int hh = i / steps, li = i % steps;
        int hn = hh + 1, jn = j0, n = nk;
        if (hn == t.nh) hn = 0, jn = j0 + KC, n = nn;
        prefetch_keys(t.h + hn, jn + li * n / steps, jn + (li + 1) * n / steps, row_bytes);
        return;
      }
      prefetch_keys(t.h, j0 + KC + i * nn / npieces, j0 + KC + (i + 1) * nn / npieces, rec_bytes);
    };
    if (stage_k || stage_v) {   // rows of a strided cache: copied once into dense buffers (see above),
                                // token by token: in address order
      for (int j = 0; j < nk; ++j)
        for (int hh = 0; hh < t.nh; ++hh) {
          if (stage_k)
            std::memcpy(s.kbuf.data() + hh * stage_head + int64_t(j) * d, s.kp[j] + int64_t(hh) * c.k_head,
                        size_t(row_bytes));
          if (stage_v)
            std::memcpy(s.vbuf.data() + hh * stage_head + int64_t(j) * d, s.vp[j] + int64_t(hh) * c.v_head,
                        size_t(row_bytes));
        }
    }
    for (int hh = 0; hh < t.nh; ++hh) {
      int piece = hh * steps;
      const bf16_t* const* krows = s.kp.data();
      const bf16_t* const* vrows = s.vp.data();
      if (hh > 0 && !(stage_k && stage_v)) rows_of(t.h + hh, j0, nk, s.kp.data(), s.vp.data());
      if (stage_k) {
        for (int j = 0; j < nk; ++j) s.ks[j] = s.kbuf.data() + hh * stage_head + int64_t(j) * d;
        krows = s.ks.data();
      }
      if (stage_v) {
        for (int j = 0; j < nk; ++j) s.vs[j] = s.vbuf.data() + hh * stage_head + int64_t(j) * d;
        vrows = s.vs.data();
      }
      float* O = s.O.p + int64_t(hh) * rows * d;
      if (mk.step && j0 + nk - 1 <= min_limit) {   // no key of the chunk masked: the kernel's fused step,
                                                   // where it takes the shape, given the rows to prefetch
        AttnPrefetch pf{s.kn.data(), s.vn.data(), nn, row_bytes, pf_l2}, first{};   // the next chunk's (first head's)
        if (stage_k || stage_v) {
          pf.n = 0;
        } else if (t.nh > 1 && bl.prefetch_order == 1) {   // the next step's rows: the next head's of this chunk
          if (hh + 1 < t.nh) {
            rows_of(t.h + hh + 1, j0, nk, s.pk.data(), s.pv.data());
            pf = {s.pk.data(), s.pv.data(), nk, row_bytes, pf_l2};
          }
        } else if (t.nh > 1) {   // order 0: this head's share of the next chunk's token records, and in a
                                 // task's first chunk (nothing of it prefetched) the next head's rows first
          const int lo = hh * nn / t.nh, hi = (hh + 1) * nn / t.nh;
          pf = {s.kn.data() + lo, s.vn.data() + lo, hi - lo, rec_bytes, pf_l2};
          if (j0 == t.k0 && hh + 1 < t.nh) {
            rows_of(t.h + hh + 1, j0, nk, s.pk.data(), s.pv.data());
            first = pf;
            pf = {s.pk.data(), s.pv.data(), nk, row_bytes, pf_l2, &first};
          }
        }
        if (mk.step(s.qp.p + hh * qs, rows, d, krows, vrows, nk, s.m.p + hh * rows, s.l.p + hh * rows, O,
                    pf.n > 0 ? &pf : nullptr))
          continue;
      }
      for (int j = 0; j < nk; j += sub) {
        if (steps > 1 || j == 0) prefetch_piece(piece++);
        mk.scores(s.qp.p + hh * qs, rows, d, krows + j, std::min(sub, nk - j), s.S.p + j, KC);
      }
      if (j0 + nk - 1 > min_limit) {               // the causal triangle reaches into this chunk
        for (int r = 0; r < rows; ++r) {
          const int first_masked = std::max(0, s.limit[r] + 1 - j0);
          float* Sr = s.S.p + int64_t(r) * KC;
          for (int j = first_masked; j < nk; ++j) Sr[j] = kNegInf;
        }
      }
      mk.softmax_step(s.S.p, KC, rows, nk, s.m.p + hh * rows, s.l.p + hh * rows, O, d);
      for (int j = 0; j < nk; j += sub) {
        if (steps > 1) prefetch_piece(piece++);
        mk.pv(s.S.p + j, KC, rows, vrows + j, std::min(sub, nk - j), d, O);
      }
      while (piece < (hh + 1) * steps) prefetch_piece(piece++);   // a short last chunk's calls are fewer
    }
    std::swap(s.kp, s.kn);   // the next chunk's rows of head t.h become this chunk's
    std::swap(s.vp, s.vn);
  }
  for (int hh = 0; hh < t.nh; ++hh)
    for (int r = 0; r < rows; ++r) {
      const int i = hh * rows + r;
      const float l = s.l.p[i];
      const float inv = l > 0.f ? 1.f / l : 0.f;
      if (part_o) {
        mk.unpack_o(s.O.p + int64_t(i) * d, d, inv, part_o + int64_t(i) * d);
        part_lse[i] = l > 0.f ? s.m.p[i] + std::log2(l) : kNegInf;
      } else {
        mk.unpack_o(s.O.p + int64_t(i) * d, d, inv, s.row.p);
        const int tok = c.q_start[t.b] + t.t0 + r / G, head = (t.h + hh) * G + r % G;
        bf16_t* o = c.out + int64_t(tok) * c.o_ts + int64_t(head) * c.o_hs;
        for (int k = 0; k < d; ++k) o[k] = f32_to_bf16(s.row.p[k]);
      }
    }
}

}  // namespace

AttnSchedule attn_last_schedule() { return g_last; }
void set_attn_fused_step(bool on) { g_fused_step = on; }
bool attn_fused_step() { return g_fused_step; }

// Decode on AMX with query groups of at most 4 rows (Mixtral-8x7B's G = 4) runs the AVX-512 kernel, as
// the FFN does for few tokens an expert (moe_ffn.cpp, kAmxFfnFewMaxM). On a 2-vCPU Xeon with AMX (family
// 6 model 207, 2026-12-06; results/intel-f6m207-2t-1n/attn-amx.csv, both kernels in one run, interleaved
// rounds), Mixtral l = 1024 / 4096 / 16384, batch 1 and 4, contiguous and paged: the AVX-512 kernel took
// 0.72-0.95x the AMX kernel's time (0.72-0.81x at l >= 4096); with Qwen3-30B-A3B's G = 8 the AMX kernel
// stays ahead (the AVX-512 kernel 1.06-1.40x its time). Extend (several query tokens a sequence) keeps the
// tiles. The emulated AMX build ("amx-emulated") runs the tiles for every G.
// Since 2026-12-06 the kernel taken is the AVX-512 one without vdpbf16ps ("avx512-nobf16": bf16 widened
// into fp32 FMAs, isa/avx512/dpbf16.h): on this Xeon a zmm vdpbf16ps issues once every two cycles, a
// quarter of the fp32 FMA's flops (`hinabench peak`, 2 threads: 215 against 432 GFLOP/s; the other AMX
// CPUs not measured). Side by side in one process (the ISAs alternated in blocks of 40 calls, 30 rounds,
// KV rotated past the L3, Mixtral-8x7B batch 1): contiguous l = 1024 / 4096 / 16384 0.92 / 0.97 / 0.98x
// the time of the BF16 kernel, paged 0.95 / 0.98 / 0.995x; with the KV in the L3 (l = 16384, one cache)
// 0.90x. Qwen3-30B-A3B's G = 8 keeps the tiles (this kernel 1.04-1.12x their time there, the BF16 one
// 1.10-1.17x).
constexpr int kAmxAttnFewRows = 4;
constexpr const char* kAmxAttnFewIsa = "avx512-nobf16";

void attention(const AttnCall& c) {
  check(c);
  int max_tokens = 1;                           // query tokens of the longest sequence (decode: 1)
  for (int b = 0; b < c.B; ++b) max_tokens = std::max(max_tokens, c.q_start[b + 1] - c.q_start[b]);
  // The named ISA is looked up (and refused where the CPU lacks it) first, as the FFN's bf16_microkernel.
  const AttnMicroKernel& named = find_attn_microkernel(c.isa);
  const AttnMicroKernel& mk = c.isa == "amx" && max_tokens == 1 && c.h_q / c.h_kv <= kAmxAttnFewRows
                                  ? find_attn_microkernel(kAmxAttnFewIsa)
                                  : named;
  const AttnBlocking* now = mk.blocking_now ? mk.blocking_now() : nullptr;
  const AttnBlocking& bl = now ? *now : mk.blocking;
  AttnMicroKernel kernel = mk;   // the call's copy: without its fused step when that is switched off
  if (!g_fused_step) kernel.step = nullptr;
  const int G = c.h_q / c.h_kv, d = c.d;
  const int threads = std::max(1, c.threads);
  const int KC = bl.chunk_keys;
  const int tok_per_block = std::max(1, bl.block_rows / G);

  // ---- tasks before splitting: (sequence, KV head or every head, query block), a sequence's adjacent.
  // Every head per task where the cache is token-major (heads side by side in a token's record, as
  // SGLang's and vLLM's [num_blocks, block_size, h_kv, d]): the staging copy then reads whole records.
  const bool token_major = (c.k_tok != d && c.k_head == d) || (c.v_tok != d && c.v_head == d);
  const int nh = token_major ? c.h_kv : 1;
  const int max_rows = std::min(tok_per_block, max_tokens) * G;   // query rows of one head in a task
  const int max_slot = nh * max_rows;           // rows of a task's partial slot (every head)
  struct Base { int b, h, t0, nt, keys; };
  std::vector<Base> base;
  for (int b = 0; b < c.B; ++b) {
    const int n_b = c.q_start[b + 1] - c.q_start[b];
    for (int h = 0; h < c.h_kv; h += nh)
      for (int t0 = 0; t0 < n_b; t0 += tok_per_block) {
        const int nt = std::min(tok_per_block, n_b - t0);
        const int keys = c.kv_len[b] - n_b + t0 + nt;   // the block's last row sees this many keys
        base.push_back({b, h, t0, nt, keys});
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
      tasks.push_back({bt.b, bt.h, nh, bt.t0, bt.nt, k0, k1, sp > 1 ? nparts + s : -1});
    }
    if (sp > 1) { first[i] = nparts; nparts += sp; }
  }
  g_last = {int64_t(tasks.size()), splits, max_rows};
  // the splits' partial rows, written by their tasks before the merge reads them: not zero-filled,
  // and kept by the calling thread across calls (grown, never shrunk)
  // (thread_local: the OpenMP threads below use these pointers, never the calling thread's vectors)
  static thread_local std::vector<float> part_o_buf, part_lse_buf;
  if (part_o_buf.size() < size_t(nparts) * max_slot * d) part_o_buf.resize(size_t(nparts) * max_slot * d);
  if (part_lse_buf.size() < size_t(nparts) * max_slot) part_lse_buf.resize(size_t(nparts) * max_slot);
  float* const part_o = part_o_buf.data();
  float* const part_lse = part_lse_buf.data();

  FirstError err;
#pragma omp parallel num_threads(threads)
  {
    // Per thread and kept across calls: sized up, never down, and not re-filled (every buffer is
    // written before it is read). With the partial buffers above, allocating and zero-filling them per
    // call was most of the operator's fixed cost: ~25 -> ~16 us a call on 64 keys (Python's included).
    static thread_local Scratch s;
    auto grow = [](auto& v, size_t n) { if (v.size() < n) v.resize(n); };
    s.qp.get(size_t(nh) * q_stride(max_rows, d));
    s.O.get(size_t(max_slot) * d);
    s.S.get(size_t(max_rows) * KC);
    s.m.get(max_slot);
    s.l.get(max_slot);
    s.row.get(d);
    for (auto* v : {&s.kp, &s.vp, &s.kn, &s.vn, &s.ks, &s.vs, &s.pk, &s.pv}) grow(*v, KC);
    if (bl.stage_strided) {
      grow(s.kbuf, size_t(nh) * KC * d);
      grow(s.vbuf, size_t(nh) * KC * d);
    }
    grow(s.limit, max_rows);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < int64_t(tasks.size()); ++i) {
      err.guard([&] {
        const Task& t = tasks[i];
        float* po = t.part >= 0 ? part_o + size_t(t.part) * max_slot * d : nullptr;
        float* pl = t.part >= 0 ? part_lse + size_t(t.part) * max_slot : nullptr;
        run_task(c, kernel, bl, t, s, po, pl);
      });
    }
    // ---- merge the splits of every split base task: out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max)
    if (nparts) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < int64_t(base.size()); ++i) {
        if (first[i] < 0) continue;
        const Base& bt = base[i];
        const int rows = bt.nt * G, sp = nsplit[i];
        for (int hr = 0; hr < nh * rows; ++hr) {
          const int hh = hr / rows, r = hr % rows;
          float mx = kNegInf;
          for (int q = 0; q < sp; ++q) mx = std::max(mx, part_lse[size_t(first[i] + q) * max_slot + hr]);
          std::fill(s.row.p, s.row.p + d, 0.f);
          float wsum = 0.f;
          for (int q = 0; q < sp; ++q) {
            const float lse = part_lse[size_t(first[i] + q) * max_slot + hr];
            if (lse == kNegInf) continue;
            const float w = std::exp2(lse - mx);
            wsum += w;
            const float* po = part_o + (size_t(first[i] + q) * max_slot + hr) * d;
            for (int k = 0; k < d; ++k) s.row.p[k] += w * po[k];
          }
          const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
          const int tok = c.q_start[bt.b] + bt.t0 + r / G, head = (bt.h + hh) * G + r % G;
          bf16_t* o = c.out + int64_t(tok) * c.o_ts + int64_t(head) * c.o_hs;
          for (int k = 0; k < d; ++k) o[k] = f32_to_bf16(s.row.p[k] * inv);
        }
      }
    }
  }
  err.rethrow();
}

}  // namespace hina
