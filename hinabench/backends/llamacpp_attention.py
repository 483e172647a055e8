"""`llamacpp:fa`: llama.cpp's flash attention (ggml_flash_attn_ext) on ggml's CPU backend, in the
`llamacpp` environment, through ggml's C API (as the FFN peer, backends/llamacpp.py).

What llama.cpp does in a decode or extend step, with its non-unified KV cache (one stream per sequence):
  - its cache keeps, per stream, one row of h_kv x d per cell (token): K and V each [B][L][h_kv][d] bf16
    here (llama.cpp's `--cache-type-k/-v bf16`); the graph views it as [d, h_kv, L, B] and permutes it to
    [d, L, h_kv, B] (llama_kv_cache::get_k/get_v with flash attention: V not transposed);
  - q [d, n, h_q, B] f32 (the projections' output, permuted), one f16 mask [L, n, 1, B] per step:
    0 where query t of sequence b may see cell j (j <= kv_len[b] - n + t), -inf elsewhere (cells past a
    shorter sequence's length, and the causal triangle in extend);
  - ggml_flash_attn_ext(q, k, v, mask, 1/sqrt(d), 0, 0) with F32 accumulation (llama-graph.cpp sets
    GGML_PREC_F32); the result [d, h_q, n, B] f32 is the problem's [B * n, h_q, d] layout.
prepare() copies each rotation group's K and V from the problem's cache (either layout: contiguous or
paged, gathered) into this cell layout in ggml's memory (a second copy: extra_bytes), outside the timed
loop; the read probe runs over that copy. One graph per rotation group.
"""
from __future__ import annotations

from . import register
from .llamacpp import GGML_TYPE, _Api
from ..worker.proxy import WorkerBackend

GGML_TYPE_F16 = 1
GGML_PREC_F32 = 10


@register
class LlamaCppFlashAttn(WorkerBackend):
    name = "llamacpp:fa"
    variant = "fa"
    env_name = "llamacpp"
    module = "llamacpp_attention"
    packages = ("llama-cpp-python", "torch")
    ops = ("attention",)
    description = ("llama.cpp ggml_flash_attn_ext on its own per-sequence cell cache (bf16 K/V, f16 mask), "
                   "ggml's CPU backend, via ggml's C API")


class LlamaCppAttnPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads
        self.ctx = None

    def prepare(self, data) -> None:
        import ctypes as C
        import torch
        from ..worker.protocol import PeerUnsupported
        p = data.problem
        api = self.api = _Api()
        P, I64, SZ = C.c_void_p, C.c_int64, C.c_size_t
        new_4d = api.fn("ggml_new_tensor_4d", P, P, C.c_int, I64, I64, I64, I64)
        permute = api.fn("ggml_permute", P, P, P, C.c_int, C.c_int, C.c_int, C.c_int)
        fa = api.fn("ggml_flash_attn_ext", P, P, P, P, P, P, C.c_float, C.c_float, C.c_float)
        if api.has("ggml_prec_set_acc"):
            set_prec = api.fn("ggml_prec_set_acc", C.c_bool, P, C.c_int)
        else:
            set_prec = api.fn("ggml_flash_attn_ext_set_prec", None, P, C.c_int)
        B, n, h_q, h_kv, d = p.batch, p.q_tokens, p.h_q, p.h_kv, p.head_dim
        if h_q % h_kv:
            raise PeerUnsupported(f"h_q={h_q} is not a multiple of h_kv={h_kv}")
        lens = [int(x) for x in data.kv_lens]
        L = max(lens)
        G = data.groups
        kv_bytes = 2 * G * B * L * h_kv * d * 2
        q_bytes, m_bytes = B * n * h_q * d * 4, B * n * L * 2
        # tensor data, plus per group 5 tensor objects (K, V, their permuted views, the result) and a graph
        mem = (kv_bytes + q_bytes + m_bytes + G * B * n * h_q * d * 4 + api.overhead(3 + 6 * G, G)
               + (64 << 20))
        self.ctx = api.init(api.InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate {mem} bytes")
        ctx = self.ctx
        # the mask: query t of sequence b sees cells j <= lens[b] - n + t
        j = torch.arange(L).view(1, 1, L)
        last = torch.tensor(lens).view(B, 1, 1) - n + torch.arange(n).view(1, n, 1)
        mask = torch.where(j <= last, 0.0, float("-inf")).to(torch.float16).contiguous()   # [B, n, L]
        self.mask = new_4d(ctx, GGML_TYPE_F16, L, n, 1, B)
        C.memmove(api.get_data(self.mask), mask.data_ptr(), mask.numel() * 2)
        self.q = new_4d(ctx, GGML_TYPE["f32"], d, h_q, n, B)       # memory [B][n][h_q][d]: the problem's q
        qf = data.q.float().contiguous()
        C.memmove(api.get_data(self.q), qf.data_ptr(), qf.numel() * 4)
        qv = permute(ctx, self.q, 0, 2, 1, 3)                      # [d, n, h_q, B]
        self.caches, self.graphs, self.outs = [], [], []
        for g in range(G):
            kc = new_4d(ctx, GGML_TYPE["bf16"], d, h_kv, L, B)      # cells: memory [B][L][h_kv][d]
            vc = new_4d(ctx, GGML_TYPE["bf16"], d, h_kv, L, B)
            for b in range(B):
                kk, vv = data.gathered(g, b)                        # [lens[b], h_kv, d]
                row = L * h_kv * d * 2
                for t, src in ((kc, kk), (vc, vv)):
                    s = src.contiguous()
                    C.memmove(api.get_data(t) + b * row, s.data_ptr(), s.numel() * 2)
            k = permute(ctx, kc, 0, 2, 1, 3)                        # [d, L, h_kv, B]
            v = permute(ctx, vc, 0, 2, 1, 3)
            out = fa(ctx, qv, k, v, self.mask, float(d) ** -0.5, 0.0, 0.0)   # [d, h_q, n, B] f32
            set_prec(out, GGML_PREC_F32)
            gf = api.new_graph(ctx)
            api.build(gf, out)
            self.caches.append((kc, vc))
            self.graphs.append(gf)
            self.outs.append(out)
        self.shape = (B * n, h_q, d)

    def run(self, group: int):
        import ctypes
        import torch
        rc = self.api.run_graph(self.ctx, self.graphs[group], self.threads)
        if rc != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned status {rc}")
        out = torch.empty(*self.shape, dtype=torch.float32)
        ctypes.memmove(out.data_ptr(), self.api.get_data(self.outs[group]), out.numel() * 4)
        return out.to(torch.bfloat16)

    def buffers(self):
        """The read probe runs over llama.cpp's copy of each rotation group's K and V."""
        api = self.api
        return [(api.get_data(t), api.nbytes(t)) for kv in self.caches for t in kv]

    def extra_bytes(self) -> int:
        return int(sum(self.api.nbytes(t) for kv in self.caches for t in kv))

    def versions(self) -> dict:
        return {"llamacpp_kv_cache": "per-sequence cells [B][L][h_kv][d] bf16", "llamacpp_fa_prec": "f32"}

    def close(self) -> None:
        if self.ctx:
            self.api.free(self.ctx)
            self.ctx = None


def make_peer(variant: str, threads: int) -> LlamaCppAttnPeer:
    return LlamaCppAttnPeer(variant, threads)
