// Decode and extend attention (paper Section 6; SGLang's CPU extend/decode split), without pybind11.
//
// GQA makes decode attention a small matrix product: the h_q / h_kv query heads that share one KV head
// (the "group", G rows) form a small M operand against that head's K [l, d] (scores, G x l) and V
// [l, d] (probabilities x V, G x d). Extend is the same with n new tokens: M = n * G rows, a
// rectangle over the cached prefix plus a causal triangle over the new tokens, in one online softmax.
//
// Division of labour, as for the FFN (microkernel.h): the driver (ops/attention.cpp) builds tasks per
// (sequence, KV head, query block, KV split) -- every KV head in one task where the cache is
// token-major (a token's heads side by side), so its records are staged in address order -- walks the keys in chunks through the framework's KV
// layout (contiguous or paged via the block table: nothing is copied or repacked), applies the causal
// mask, and merges the splits by their log-sum-exp. The micro-kernel (isa/<isa>/attention_<isa>.cpp)
// does what the instructions force: the query block transformed once into its layout ("transform the
// small operand, not the big one"), the scores, the softmax step with a vector exp2, P x V with the V
// tiles converted on demand, and the final store.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numeric.h"  // bf16_t

namespace hina {

// One call. The queries of sequence b are tokens [q_start[b], q_start[b+1]) of q; there are
// n_b = q_start[b+1] - q_start[b] of them and they are the LAST n_b positions of the sequence's
// kv_len[b] keys (their K/V are already in the cache, as vLLM writes them before attention):
// query token t sits at position p = kv_len[b] - n_b + t and sees keys [0, p] (causal).
// Decode is n_b = 1 for every b.
struct AttnCall {
  const bf16_t* q = nullptr;          // q[token][head][d]: token stride, head stride (elements)
  int64_t q_ts = 0, q_hs = 0;
  bf16_t* out = nullptr;              // same indexing as q
  int64_t o_ts = 0, o_hs = 0;
  // K and V caches, same geometry. Key j of sequence b, KV head h:
  //   contiguous (block_table == nullptr):  base + b * seq_stride + j * tok_stride + h * head_stride
  //   paged: base + block_table[b * bt_stride + j / block_size] * block_stride
  //               + (j % block_size) * tok_stride + h * head_stride
  // ([num_blocks, block_size, h_kv, d] is tok_stride = h_kv*d, head_stride = d; vLLM-CPU's
  //  [num_blocks, h_kv, block_size, d] is tok_stride = d, head_stride = block_size*d: both work.)
  const bf16_t* k = nullptr;
  const bf16_t* v = nullptr;
  int64_t k_seq = 0, k_tok = 0, k_head = 0, k_blk = 0;
  int64_t v_seq = 0, v_tok = 0, v_head = 0, v_blk = 0;
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0;
  int block_size = 0, num_blocks = 0;
  int B = 0, h_q = 0, h_kv = 0, d = 0;
  const int32_t* q_start = nullptr;   // [B + 1]
  const int32_t* kv_len = nullptr;    // [B]
  float sm_scale = 0.f;
  int kv_splits = 0;                  // 0: chosen per call (so batch 1 keeps every thread busy)
  std::string isa;
  int threads = 1;
};

// ---- the micro-kernel table ------------------------------------------------------------------------
// Scores are in log2 units: pack_q folds sm_scale * log2(e) into the packed queries, so the softmax
// uses exp2 and the LSE of a split is m + log2(l).
struct AttnBlocking {
  int chunk_keys;   // keys per chunk (scores tile width; K and V of a chunk stay in L1)
  int block_rows;   // query rows per task at most (whole tokens of G rows each)
  bool stage_strided;  // copy the rows of a strided (token-major) cache into dense buffers first, for
                       // a kernel that reads a row more than once (L1 sets, see run_task): the scalar
                       // one; AMX's tile loads take the stride and read each row once, and the AVX-512
                       // and AVX2 kernels read in place, with the prefetch in pieces (measured faster)
  bool prefetch_l2;    // the next chunk's lines prefetched into L2 (prefetcht1), else into L1 (t0):
                       // see run_task
  int prefetch_steps;  // a head's share of those prefetches cut into this many pieces: 1, all before
                       // its scores; 2, half before the scores and half before P x V; 2n, each of the
                       // two calls cut into n calls over ceil(chunk / n) keys (rounded up to 4), a
                       // piece before each (see run_task)
  int prefetch_order;  // what is prefetched while a head's chunk is computed: 0, a share of the next
                       // chunk's token records (every head's rows of those keys); 1, the next step's
                       // rows in the order they are read (the next head's rows of this chunk, or the
                       // next chunk's first head's). The same for a head-major cache (one head a task).
};

// Rows whose lines a fused step prefetches (AttnMicroKernel::step): n rows of K and of V, the first
// `bytes` of each, into L2 (prefetcht1) or L1; then `next`'s (nullptr: none).
struct AttnPrefetch {
  const bf16_t* const* k;
  const bf16_t* const* v;
  int n, bytes;
  bool l2;
  const AttnPrefetch* next = nullptr;
};

struct AttnMicroKernel {
  const char* isa;       // "scalar", "avx2", ...
  const char* cpu_isa;   // isa_usable() must say yes (nullptr: portable)
  AttnBlocking blocking;
  // The blocking in effect for a call: another for this CPU, or nullptr (or no function): `blocking`.
  // The AVX-512 kernel's follows the FFN kernel's switch (avx512_blocking_zen5(), microkernel.h).
  const AttnBlocking* (*blocking_now)();
  // Transformation 1: rows[r] (d bf16 each) -> qp [nrows, d] fp32 in this kernel's layout, times scale.
  void (*pack_q)(const bf16_t* const* rows, int nrows, int d, float scale, float* qp);
  // S[r * lds + j] = qp_r . K_j   (r < nrows, j < nkeys; keys[j] points at d bf16)
  void (*scores)(const float* qp, int nrows, int d, const bf16_t* const* keys, int nkeys, float* S, int lds);
  // Online softmax over one chunk (Milakov & Gimelshein): per row r, m' = max(m, max_j S), S <- exp2(S - m'),
  // l <- l * exp2(m - m') + sum_j S, and O[r] *= exp2(m - m'). A row whose m' is -inf (all masked) keeps l = 0.
  void (*softmax_step)(float* S, int lds, int nrows, int nkeys, float* m, float* l, float* O, int d);
  // O[r] += sum_j P[r * lds + j] V_j   (O [nrows, d] fp32 in this kernel's layout)
  void (*pv)(const float* P, int lds, int nrows, const bf16_t* const* vals, int nkeys, int d, float* O);
  // O row in this kernel's layout -> natural order fp32, times `scale` (1 / l)
  void (*unpack_o)(const float* O, int d, float scale, float* out);
  // Optional (nullptr: none): scores, softmax_step and pv of one unmasked chunk, fused, for every row
  // at once (no S round trip through memory, the probabilities packed as P x V reads them, O rescaled
  // as P x V loads it), the same bits as the three calls. Returns false, having done nothing, for a
  // shape it does not take (the three calls do it then). `pf` (nullptr: none): the rows of the next
  // step, whose lines it prefetches spread over its work.
  bool (*step)(const float* qp, int nrows, int d, const bf16_t* const* keys, const bf16_t* const* vals, int nkeys,
               float* m, float* l, float* O, const AttnPrefetch* pf);
};

extern const AttnMicroKernel attn_microkernel_scalar;
#if defined(HINA_EMU_AVX512)
extern const AttnMicroKernel attn_microkernel_avx512;   // "avx512-emulated" (SIMDe)
extern const AttnMicroKernel attn_microkernel_avx512_nobf16;   // "avx512-nobf16-emulated"
#elif defined(HINA_EMU_AMX)
extern const AttnMicroKernel attn_microkernel_amx;      // "amx-emulated" (the tile emulator)
#else
extern const AttnMicroKernel attn_microkernel_avx2;
extern const AttnMicroKernel attn_microkernel_avx512;
extern const AttnMicroKernel attn_microkernel_avx512_nobf16;   // "avx512-nobf16" (isa/avx512/dpbf16.h)
extern const AttnMicroKernel attn_microkernel_amx;
#endif

const std::vector<const AttnMicroKernel*>& attn_microkernels();
const AttnMicroKernel& find_attn_microkernel(const std::string& isa);
std::vector<std::string> attn_isas();

// Head dims the kernels take: multiples of 16 up to 256 (DeepSeek's MLA latent, 576/512, is not one).
constexpr int kAttnHeadDimMultiple = 16;
constexpr int kAttnHeadDimMax = 256;

// Runs the operator; throws std::invalid_argument for bad input (a block-table entry out of range,
// kv_len < n_b or kv_len < 1, h_q not a multiple of h_kv, an unsupported head_dim, an unknown ISA).
void attention(const AttnCall& call);

// Whether a micro-kernel's fused step is used where it has one (default true; off: the three calls,
// the same bits; for tests and ablations). Per module, for the whole process.
void set_attn_fused_step(bool on);
bool attn_fused_step();

// How the last call was scheduled (tests and the backend's notes): tasks and KV splits per task.
struct AttnSchedule { int64_t tasks = 0; int splits = 0; int block_rows = 0; };
AttnSchedule attn_last_schedule();

}  // namespace hina
