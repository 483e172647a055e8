"""`ipex:paged-attn`: IPEX 2.8's paged attention ops on its own paged cache, in the `ipex` environment.

Which ops: `ipex.llm.modules.PagedAttention` (the ops IPEX's vLLM integration calls):
- decode: `torch.ops.torch_ipex.single_query_cached_kv_attention(out, q [B, h_q, d], key_cache,
  value_cache, head_mapping [h_q], scale, block_tables, context_lens, block_size, max_context_len, ...)`;
- extend: `torch.ops.torch_ipex.flash_attn_varlen_func(out, q [tokens, h_q, d], key_cache, value_cache,
  cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale, is_causal=True, block_tables, ...)`:
  the new tokens' K/V already in the cache, as vLLM writes them before attention.
Its cache is `[num_blocks, h_kv, block_size, d]` (per block, head-major: the layout its documentation
gives). prepare() writes the problem's K and V into it with IPEX's own writer
(`torch.ops.torch_ipex.reshape_and_cache`, slot = block * block_size + offset) at the same block ids,
so the same block tables serve (a second copy of the KV: extra_bytes), outside the timed loop.
Only the paged layout: IPEX's contiguous decode path (`IndirectAccessKVCache`,
`masked_multihead_self_attention`) keeps its own beam-indexed cache inside its model code, not an op
over a framework's `[B, h_kv, L, d]` cache. IPEX takes bf16 only with AVX-512 (its prepack/brgemm paths).
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


@register
class IpexPagedAttn(WorkerBackend):
    name = "ipex:paged-attn"
    variant = "attn"
    env_name = "ipex"
    module = "ipex_attention"
    packages = ("intel-extension-for-pytorch", "torch")
    ops = ("attention",)
    description = ("IPEX 2.8 PagedAttention: single_query_cached_kv_attention (decode) / flash_attn_varlen_func "
                   "(extend) on its own paged cache [blocks, h_kv, block_size, d]")


class IpexAttnPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        import intel_extension_for_pytorch  # noqa: F401  (registers torch.ops.torch_ipex)
        from ..worker.protocol import PeerUnsupported
        p = data.problem
        if p.layout != "paged":
            raise PeerUnsupported("IPEX's attention ops read a paged cache; its contiguous decode path "
                                  "(IndirectAccessKVCache) lives inside its model code, not an op over [B, h_kv, L, d]")
        if hasattr(torch.cpu, "_is_avx512_supported") and not torch.cpu._is_avx512_supported():
            raise PeerUnsupported("IPEX takes bf16 only with AVX-512 (its prepack/brgemm paths)")
        ops = torch.ops.torch_ipex
        self.data = data
        bs, nb = p.block_size, data.k.shape[0]
        self.key_cache = torch.zeros(nb, p.h_kv, bs, p.head_dim, dtype=torch.bfloat16)
        self.value_cache = torch.zeros_like(self.key_cache)
        for g in range(data.groups):   # IPEX's own writer, slot = block * bs + offset
            for b in range(p.batch):
                keys, vals = data.gathered(g, b)                                        # [L, h_kv, d]
                ops.reshape_and_cache(keys.contiguous(), vals.contiguous(), self.key_cache, self.value_cache,
                                      data.slots(g, b).to(torch.int32), "auto", 1.0, 1.0)
        self.scale = float(p.head_dim) ** -0.5
        G = p.h_q // p.h_kv
        self.head_mapping = (torch.arange(p.h_q, dtype=torch.int32) // G).contiguous()
        self.context_lens = data.kv_lens.to(torch.int32).contiguous()
        self.max_len = int(data.kv_lens.max())
        self.tables = [data.block_tables[g].to(torch.int32).contiguous() for g in range(data.groups)]
        self.decode = bool((data.q_lens == 1).all())
        cq = torch.zeros(p.batch + 1, dtype=torch.int32)
        cq[1:] = torch.cumsum(data.q_lens, 0)
        ck = torch.zeros(p.batch + 1, dtype=torch.int32)
        ck[1:] = torch.cumsum(data.kv_lens, 0)
        self.cu_q, self.cu_kv, self.max_q = cq, ck, int(data.q_lens.max())
        self.out = torch.empty_like(data.q)

    def run(self, group: int):
        import torch
        ops = torch.ops.torch_ipex
        if self.decode:
            ops.single_query_cached_kv_attention(self.out, self.data.q, self.key_cache, self.value_cache,
                                                 self.head_mapping, self.scale, self.tables[group],
                                                 self.context_lens, self.data.problem.block_size, self.max_len,
                                                 None, -1, 1.0, 1.0, -1.0)
        else:
            ops.flash_attn_varlen_func(self.out, self.data.q, self.key_cache, self.value_cache, self.cu_q,
                                       self.cu_kv, self.max_q, self.max_len, self.scale, True,
                                       self.tables[group], None, -1, -1, "auto", 1.0, 1.0, -1.0)
        return self.out

    def buffers(self):
        """The read probe runs over IPEX's own copy of each rotation group's blocks."""
        p = self.data.problem
        per = sum(p.blocks_per_seq())
        out = []
        for t in (self.key_cache, self.value_cache):
            blk = t[0].numel() * t.element_size()
            out += [(t.data_ptr() + g * per * blk, per * blk) for g in range(self.data.groups)]
        return out

    def extra_bytes(self) -> int:
        return 2 * self.key_cache.numel() * self.key_cache.element_size()

    def versions(self) -> dict:
        import torch
        return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_peer(variant: str, threads: int) -> IpexAttnPeer:
    return IpexAttnPeer(variant, threads)
