// One decoder layer's decode step as one native call: the HiNa kernels (linear, attention, moe_ffn)
// and the glue between them (RMSNorms, Qwen3's q/k norms, rotary, the KV-cache append, the router's
// softmax and top-k, the residual adds), without pybind11.
//
// Why: at batch 1 a Qwen3-30B-A3B layer's kernels take ~4.0 ms on 2 cores of the AMX Xeon, and
// transformers' Python around them (the norms, rotary, views, the drop-ins' wrappers, the router) another
// ~1 ms, which no kernel can win back (hinabench/e2e/dropin_layer.py). Here that glue is a few microseconds
// of scalar loops on vectors of H or h * d elements.
//
// What it computes is the Qwen3-MoE / Mixtral decoder layer as transformers writes it, its bf16 roundings
// included (each torch op on bf16 tensors rounds its result):
//   n  = RMSNorm_in(x)                       fp32 sum of squares, x * rsqrt(ms + eps) -> bf16, * w -> bf16
//   q, k, v = n Wq^T, n Wk^T, n Wv^T          (linear)
//   q, k = RMSNorm_q(q), RMSNorm_k(k) per head (Qwen3 only: q_norm / k_norm set)
//   q, k = q * cos + rotate_half(q) * sin    (three roundings, as transformers' apply_rotary_pos_emb)
//   K/V cache [pos] = k, v                   (the framework's buffers, written in place)
//   a  = attention(q, K[0..pos], V[0..pos])  (attention)
//   h  = x + a Wo^T
//   n2 = RMSNorm_post(h)
//   p  = softmax(n2 Wr^T) in fp32; top-k; / their sum (norm_topk); -> bf16 (topk_bf16, Qwen3)
//   out = h + moe_ffn(n2, top-k)             (moe_ffn)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "numeric.h"
#include "ops/moe_ffn.h"

namespace hina {

struct DecoderLayer {
  int64_t H = 0, h_q = 0, h_kv = 0, d = 0;
  float eps = 1e-6f;                              // every RMSNorm of the layer
  const bf16_t* in_norm = nullptr;                // [H]
  const bf16_t* post_norm = nullptr;              // [H]
  const bf16_t* q_norm = nullptr;                 // [d], or nullptr (no q/k norms)
  const bf16_t* k_norm = nullptr;                 // [d]
  // projections in nn.Linear's layout [N, K], rows contiguous, row stride ld*
  const bf16_t* wq = nullptr; int64_t ldq = 0;    // [h_q * d, H]
  const bf16_t* wk = nullptr; int64_t ldk = 0;    // [h_kv * d, H]
  const bf16_t* wv = nullptr; int64_t ldv = 0;    // [h_kv * d, H]
  const bf16_t* wo = nullptr; int64_t ldo = 0;    // [H, h_q * d]
  const bf16_t* router = nullptr; int64_t ldr = 0;  // [E, H]
  int64_t E = 0;
  int top_k = 0;
  bool norm_topk = true;                          // top-k weights divided by their sum
  bool topk_bf16 = false;                         // top-k weights rounded to bf16 (Qwen3's router)
  MoeCall experts;                                // the weights' fields (hinabench.kernels.moe_ffn_prepare)
  float sm_scale = 0.f;
  std::string linear_isa, attn_isa;               // the experts' ISA is experts.isa
};

struct DecodeStep {
  const bf16_t* x = nullptr;                      // [B, H] contiguous: one new token per sequence
  int64_t B = 0;
  const bf16_t* cos = nullptr;                    // [B, d], row stride rope_stride
  const bf16_t* sin = nullptr;
  int64_t rope_stride = 0;
  // K and V caches: sequence b, position j, KV head h at base + b * kv_seq + j * kv_tok + h * kv_head
  bf16_t* k_cache = nullptr;
  bf16_t* v_cache = nullptr;
  int64_t kv_seq = 0, kv_tok = 0, kv_head = 0;
  int64_t pos = 0;                                // where the new token's K/V go (the cache's length before)
  bf16_t* out = nullptr;                          // [B, H] contiguous
  int threads = 1;
};

// Throws std::invalid_argument for bad shapes (and what the kernels throw).
void decoder_layer_decode(const DecoderLayer& layer, const DecodeStep& step);

// Every layer of a decoder stack in turn (step.x into the first, each output into the next, the last into
// step.out); layer i appends to k_caches[i] / v_caches[i], all with step's strides and position.
void decoder_stack_decode(const std::vector<const DecoderLayer*>& layers, const DecodeStep& step,
                          const std::vector<bf16_t*>& k_caches, const std::vector<bf16_t*>& v_caches);

// Where the calls' time goes, summed over the calls made while `on` (hinabench.e2e.measure.block_timers):
// seconds in the RMSNorms (input and post-attention), q/k/v, the q/k norms + rotary + the KV append,
// attention, o, the router (logits, softmax, top-k), the experts, the residual adds; calls; and each
// call's distinct experts.
struct LayerProfile {
  bool on = false;
  double norms = 0, qkv = 0, rope = 0, attention = 0, o = 0, router = 0, experts = 0, adds = 0;
  int64_t calls = 0;
  std::vector<int> touched;
};
LayerProfile& layer_profile();

}  // namespace hina
