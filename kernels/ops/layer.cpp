// One decoder layer's decode step (ops/layer.h): the glue in scalar loops, the matrices on the kernels.
#include "ops/layer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/attention.h"

namespace hina {
namespace {

inline float f(bf16_t v) { return bf16_to_f32(v); }
inline bf16_t b(float v) { return f32_to_bf16(v); }

// transformers' RMSNorm on bf16: the mean of squares in fp32 (here summed in double, torch's reduction
// being the closer of the two to the exact sum), x * rsqrt(ms + eps) rounded to bf16, times w rounded.
void rmsnorm(const bf16_t* x, const bf16_t* w, int64_t n, float eps, bf16_t* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(f(x[i])) * f(x[i]);
  const float r = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = b(f(w[i]) * f(b(f(x[i]) * r)));
}

// q * cos + rotate_half(q) * sin, each product and the sum rounded to bf16 (apply_rotary_pos_emb)
void rotary(bf16_t* x, const bf16_t* cos, const bf16_t* sin, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float x1 = f(x[i]), x2 = f(x[i + h]);
    x[i] = b(f(b(x1 * f(cos[i]))) + f(b(-x2 * f(sin[i]))));
    x[i + h] = b(f(b(x2 * f(cos[i + h]))) + f(b(x1 * f(sin[i + h]))));
  }
}

void add(const bf16_t* a, const bf16_t* c, int64_t n, bf16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = b(f(a[i]) + f(c[i]));
}

void project(const DecoderLayer& L, const bf16_t* x, int64_t T, int64_t K, std::vector<LinearWeight> ws,
             int threads) {
  LinearCall c;
  c.x = x; c.T = T; c.K = K; c.ldx = K;
  c.weights = std::move(ws);
  c.isa = L.linear_isa;
  c.threads = threads;
  linear(c);
}

// The router: logits = n2 Wr^T rounded to bf16 (the linear kernel where E is a multiple of 32, else a
// plain loop: Mixtral's 8 x 4096), softmax in fp32, the top k, their weights normalised and rounded as
// the model's router does.
void route(const DecoderLayer& L, const bf16_t* n2, int64_t T, int threads, int32_t* ids, float* weights) {
  const int64_t E = L.E, H = L.H;
  std::vector<bf16_t> logits(size_t(T * E));
  if (E % 32 == 0) {
    project(L, n2, T, H, {{L.router, E, L.ldr, logits.data()}}, threads);
  } else {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        float acc = 0.f;
        const bf16_t* w = L.router + e * L.ldr;
        const bf16_t* x = n2 + t * H;
        for (int64_t i = 0; i < H; ++i) acc += f(x[i]) * f(w[i]);
        logits[size_t(t * E + e)] = b(acc);
      }
  }
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, f(logits[size_t(t * E + e)]));
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(f(logits[size_t(t * E + e)]) - mx));
    for (int64_t e = 0; e < E; ++e) p[size_t(e)] /= sum;
    std::fill(taken.begin(), taken.end(), 0);
    float top = 0.f;
    for (int s = 0; s < L.top_k; ++s) {   // the largest first; ties to the lower id
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[size_t(e)] && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
      taken[size_t(best)] = 1;
      ids[t * L.top_k + s] = int32_t(best);
      top += (weights[t * L.top_k + s] = p[size_t(best)]);
    }
    for (int s = 0; s < L.top_k; ++s) {
      float& w = weights[t * L.top_k + s];
      if (L.norm_topk) w /= top;
      if (L.topk_bf16) w = f(b(w));
    }
  }
}

void check(const DecoderLayer& L, const DecodeStep& s) {
  if (L.H <= 0 || L.h_q <= 0 || L.h_kv <= 0 || L.d <= 0 || L.d % 2 || L.h_q % L.h_kv)
    throw std::invalid_argument("decoder layer: H, h_q, h_kv, d must be positive, d even, h_kv dividing h_q");
  if (L.E <= 0 || L.top_k <= 0 || L.top_k > L.E)
    throw std::invalid_argument("decoder layer: top_k must be in [1, E]");
  if (!(L.in_norm && L.post_norm && L.wq && L.wk && L.wv && L.wo && L.router) || (!L.q_norm != !L.k_norm))
    throw std::invalid_argument("decoder layer: a weight is missing (q_norm and k_norm go together)");
  if (L.experts.H != L.H || L.experts.E != L.E)
    throw std::invalid_argument("decoder layer: the experts' H and E differ from the layer's");
  if (s.B <= 0 || s.pos < 0 || !s.x || !s.out || !s.k_cache || !s.v_cache || !s.cos || !s.sin)
    throw std::invalid_argument("decode step: B must be positive, pos >= 0, every buffer given");
  if (s.pos + 1 > INT32_MAX) throw std::invalid_argument("decode step: cache longer than 2^31 - 1");
}

LayerProfile g_profile;

// The time since the last lap, added to one of the profile's fields (nothing when profiling is off).
struct Lap {
  using clock = std::chrono::steady_clock;
  clock::time_point t = clock::now();
  void operator()(double LayerProfile::*field) {
    if (!g_profile.on) return;
    const clock::time_point now = clock::now();
    g_profile.*field += std::chrono::duration<double>(now - t).count();
    t = now;
  }
};

}  // namespace

LayerProfile& layer_profile() { return g_profile; }

void decoder_layer_decode(const DecoderLayer& L, const DecodeStep& s) {
  check(L, s);
  const int64_t B = s.B, H = L.H, d = L.d, nq = L.h_q * d, nkv = L.h_kv * d;
  const int threads = std::max(1, s.threads);
  std::vector<bf16_t> n(size_t(B * H)), q(size_t(B * nq)), k(size_t(B * nkv)), v(size_t(B * nkv)),
      a(size_t(B * nq)), o(size_t(B * H)), h(size_t(B * H)), y(size_t(B * H));
  Lap lap;
  for (int64_t t = 0; t < B; ++t) rmsnorm(s.x + t * H, L.in_norm, H, L.eps, n.data() + t * H);
  lap(&LayerProfile::norms);
  project(L, n.data(), B, H, {{L.wq, nq, L.ldq, q.data()}, {L.wk, nkv, L.ldk, k.data()}, {L.wv, nkv, L.ldv, v.data()}},
          threads);
  lap(&LayerProfile::qkv);
  for (int64_t t = 0; t < B; ++t) {
    const bf16_t* cos = s.cos + t * s.rope_stride;
    const bf16_t* sin = s.sin + t * s.rope_stride;
    for (int64_t hd = 0; hd < L.h_q; ++hd) {
      bf16_t* r = q.data() + t * nq + hd * d;
      if (L.q_norm) rmsnorm(r, L.q_norm, d, L.eps, r);
      rotary(r, cos, sin, d);
    }
    for (int64_t hd = 0; hd < L.h_kv; ++hd) {
      bf16_t* r = k.data() + t * nkv + hd * d;
      if (L.k_norm) rmsnorm(r, L.k_norm, d, L.eps, r);
      rotary(r, cos, sin, d);
      const int64_t at = t * s.kv_seq + s.pos * s.kv_tok + hd * s.kv_head;
      std::copy(r, r + d, s.k_cache + at);
      std::copy(v.data() + t * nkv + hd * d, v.data() + t * nkv + (hd + 1) * d, s.v_cache + at);
    }
  }
  lap(&LayerProfile::rope);
  // attention over positions [0, pos]: one query token per sequence
  std::vector<int32_t> q_start(size_t(B + 1)), kv_len(size_t(B), int32_t(s.pos + 1));
  for (int64_t t = 0; t <= B; ++t) q_start[size_t(t)] = int32_t(t);
  AttnCall ac;
  ac.q = q.data(); ac.q_ts = nq; ac.q_hs = d;
  ac.out = a.data(); ac.o_ts = nq; ac.o_hs = d;
  ac.k = s.k_cache; ac.v = s.v_cache;
  ac.k_seq = ac.v_seq = s.kv_seq; ac.k_tok = ac.v_tok = s.kv_tok; ac.k_head = ac.v_head = s.kv_head;
  ac.B = int(B); ac.h_q = int(L.h_q); ac.h_kv = int(L.h_kv); ac.d = int(d);
  ac.q_start = q_start.data(); ac.kv_len = kv_len.data();
  ac.sm_scale = L.sm_scale; ac.isa = L.attn_isa; ac.threads = threads;
  attention(ac);
  lap(&LayerProfile::attention);
  project(L, a.data(), B, nq, {{L.wo, H, L.ldo, o.data()}}, threads);
  lap(&LayerProfile::o);
  add(s.x, o.data(), B * H, h.data());
  lap(&LayerProfile::adds);
  for (int64_t t = 0; t < B; ++t) rmsnorm(h.data() + t * H, L.post_norm, H, L.eps, n.data() + t * H);
  lap(&LayerProfile::norms);
  std::vector<int32_t> ids(size_t(B * L.top_k));
  std::vector<float> tw(size_t(B * L.top_k));
  route(L, n.data(), B, threads, ids.data(), tw.data());
  lap(&LayerProfile::router);
  MoeCall mc = L.experts;
  mc.x = n.data(); mc.T = B; mc.ldx = H; mc.k = L.top_k;
  mc.topk_ids = ids.data(); mc.topk_weights = tw.data(); mc.out = y.data(); mc.threads = threads;
  moe_ffn(mc);
  lap(&LayerProfile::experts);
  add(h.data(), y.data(), B * H, s.out);
  lap(&LayerProfile::adds);
  if (g_profile.on) {
    std::vector<int32_t> distinct(ids);
    std::sort(distinct.begin(), distinct.end());
    g_profile.touched.push_back(int(std::unique(distinct.begin(), distinct.end()) - distinct.begin()));
    ++g_profile.calls;
  }
}

void decoder_stack_decode(const std::vector<const DecoderLayer*>& layers, const DecodeStep& step,
                          const std::vector<bf16_t*>& k_caches, const std::vector<bf16_t*>& v_caches) {
  if (layers.empty() || k_caches.size() != layers.size() || v_caches.size() != layers.size())
    throw std::invalid_argument("decoder stack: one K and one V cache per layer, at least one layer");
  const int64_t H = layers[0]->H;
  for (const DecoderLayer* L : layers)
    if (!L || L->H != H) throw std::invalid_argument("decoder stack: every layer must have the same H");
  std::vector<bf16_t> ping(size_t(step.B * H)), pong(size_t(step.B * H));
  DecodeStep s = step;
  for (size_t i = 0; i < layers.size(); ++i) {
    s.k_cache = k_caches[i];
    s.v_cache = v_caches[i];
    s.out = i + 1 == layers.size() ? step.out : (i % 2 ? pong.data() : ping.data());
    decoder_layer_decode(*layers[i], s);
    s.x = s.out;
  }
}

}  // namespace hina
