"""hina: the HiNa-MoE expert-FFN kernel (paper Section 4), one backend per real ISA.

No weight work at all: `prepare` only checks the weights (the prepared call a framework keeps per
layer; the -numa variants' plan from where their pages are), never copies or converts them, and `run`
reads them in place in the framework's layout (w13 [E, 2I, H] and w_down [E, H, I], rows contiguous; a projection's W [N, K]).
See hinabench/kernels.py. A dense projection (`linear`) is the driver's single-matrix case: the same
gather of the tokens and the same micro-kernels, W read in place.
The "-numa" variants run the kernel's NUMA mode (numa="interleave-partitioned", Section 5) on the
real nodes; their `work_partition` is "hina" (the remote-traffic model's partition). On a machine
with one node that mode has nothing to partition and runs the plain tasks (numa/kernel_plan.py).
"""
from __future__ import annotations

import torch

from .. import kernels
from ..dtypes import DTYPES
from . import register
from .base import Backend, Unsupported


class _Hina(Backend):
    isa: str = ""
    numa: str = "off"  # the plain variants never partition, whatever the weights' placement
    ops = ("ffn", "linear", "attention")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.isa:   # the dtypes with a micro-kernel for this ISA (hinabench/dtypes.py)
            cls.dtypes = tuple(d for d, t in DTYPES.items() if cls.isa in t.kernel_isas)

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        ok, why = kernels.isa_status(kernels.isa_variant(cls.isa))   # hina:avx512 without AVX512_BF16:
        return ok, why                                                   # its avx512-nobf16 build

    def supports(self, data) -> None:
        super().supports(data)
        p = data.problem
        if p.kind == "attention":
            from ..kernels_attention import HEAD_DIM_MAX, HEAD_DIM_MULTIPLE
            if self.numa != "off":
                raise Unsupported(f"{self.name}: the NUMA-partitioned mode is for the expert FFN only")
            if p.head_dim % HEAD_DIM_MULTIPLE or p.head_dim > HEAD_DIM_MAX:
                raise Unsupported(f"hina attention takes head_dim multiples of {HEAD_DIM_MULTIPLE} up to "
                                  f"{HEAD_DIM_MAX} (got {p.head_dim})")
            try:
                kernels.resolve_attention_isa(self.isa)
            except kernels.IsaUnavailable as e:
                raise Unsupported(str(e)) from None
            return
        dims = {"H": p.H, "I": p.I} if p.kind == "ffn" else {"N": p.N, "K": p.K}
        if any(v % kernels.SHAPE_MULTIPLE for v in dims.values()):
            got = ", ".join(f"{k}={v}" for k, v in dims.items())
            raise Unsupported(f"hina needs {' and '.join(dims)} to be multiples of {kernels.SHAPE_MULTIPLE} "
                              f"(got {got})")
        if p.kind == "linear" and self.numa != "off":
            raise Unsupported(f"{self.name}: the NUMA-partitioned mode is for the expert FFN only")
        if p.dt.quantized and self.numa != "off":
            raise Unsupported(f"{self.name}: quantized weights ({p.dtype}) run the plain kernel only "
                              "(Algorithm 2's piece path is bf16's)")

    def prepare(self, data) -> None:
        super().prepare(data)  # checks only: no packing, no conversion, no copy
        # attention: every rotation group's call checked and laid out here, outside the timed loop (as
        # vLLM's scheduler metadata is for vllm:attn): what a framework builds once per decode step
        self._plans = [self._attention_plan(g) for g in range(data.groups)] if data.problem.kind == "attention" else []
        # ffn and linear: the weights checked and laid out once here too (kernels.moe_ffn_prepare /
        # moe_ffn_quant_prepare / linear_prepare: what a framework keeps per layer, as hinabench's
        # drop-in does), so a sample times the call a decode step makes: the tokens' checks and the
        # kernel, not the weights' checks again (~20-40 us a call with warm caches, more after a
        # layer's weights streamed through them; against Qwen3-30B-A3B's ~1.4 ms INT8 call).
        self._moe = self._ffn_prepared() if data.problem.kind == "ffn" else None
        self._lin = ([kernels.linear_prepare([w], isa=self.isa) for w in data.w]
                     if data.problem.kind == "linear" else [])

    def _ffn_prepared(self):
        d = self.data
        if d.q13 is not None:   # int8 / fp8: the quantized weights and their scales, read in place
            return kernels.moe_ffn_quant_prepare(d.q13, d.qdown, isa=self.isa)
        return kernels.moe_ffn_prepare(None, None, d.w_down, w13=d.w13, isa=self.isa, **self._numa_args())

    def _attention_plan(self, group: int):
        d = self.data
        k, v, table = d.cache(group)
        if d.problem.phase == "decode":
            return kernels.decode_attention_plan(d.q, k, v, d.kv_lens, block_table=table, isa=self.isa,
                                                 threads=self.threads)
        return kernels.extend_attention_plan(d.q, k, v, d.prefix_lens(), d.q_lens, block_table=table, isa=self.isa,
                                             threads=self.threads)

    def run_linear(self, group: int) -> torch.Tensor:
        return self._lin[group](self.data.x, threads=self.threads)[0]

    def run_attention(self, group: int) -> torch.Tensor:
        """Decode or extend attention on the cache of rotation group `group`, read in place."""
        return self._plans[group]()

    def run_ffn(self, group: int) -> torch.Tensor:
        d = self.data
        return self._moe(d.x, d.topk_ids[group], d.topk_weights, threads=self.threads)

    def _numa_args(self) -> dict:
        return {"numa": self.numa}

    def extra_bytes(self) -> int:
        return 0  # the scratch (packed tokens, activations, y rows: O(T*k*(H+I)) bytes) is not weights

    def versions(self) -> dict[str, str]:
        v = {**super().versions(), "hina_isa": kernels.isa_variant(self.isa), "hina_numa": self.numa}
        if v["hina_isa"] in ("avx512", "amx"):   # the AVX-512 tiles' blocking (amx: up to 4 tokens an
            v["hina_avx512_blocking"] = kernels.avx512_blocking()   # expert; kernels.avx512_blocking)
        return v


class _HinaNuma(_Hina):
    """Algorithm 2 (Section 5): threads grouped and bound per real NUMA node, each group reading only
    its node's pages of the interleaved weights; partials reduced across nodes. Bit-identical to the
    plain variant. On one node it is the plain kernel's arithmetic plus the partition logic (the
    piece path: per-piece partials, then the reduction)."""
    numa = "interleave-partitioned"
    work_partition = "hina"
    ops = ("ffn", "linear")        # attention has no NUMA mode

    def _numa_args(self) -> dict:
        from ..numa.kernel_plan import real_nodes
        return {"numa": self.numa, "numa_nodes": len(real_nodes())}


@register
class HinaAvx2(_Hina):
    name = "hina:avx2"
    isa = "avx2"
    description = ("HiNa-MoE general-layout kernel, AVX2+FMA micro-kernel (bf16 W converted in "
                   "registers, fp32 FMA; int8 W8A8 by vpmaddwd, fp8 e4m3 unpacked in registers), no "
                   "weight repacking")


@register
class HinaAvx512(_Hina):
    name = "hina:avx512"
    isa = "avx512"
    description = ("HiNa-MoE general-layout kernel, AVX-512 BF16 (vdpbf16ps) micro-kernel, no weight repacking; "
                   "on CPUs without AVX512_BF16 its avx512-nobf16 build (vdpbf16ps's arithmetic in AVX-512F)")


class _ThreeCalls(_Hina):
    """An attention kernel with its fused step switched off: every chunk as the three calls (scores, the
    online-softmax step, P x V) it replaces, the same bits. An ablation row beside the kernel itself
    (kernels.attention_fused_step)."""
    ops = ("attention",)

    def run_attention(self, group: int) -> torch.Tensor:
        was = kernels.attention_fused_step(isa=self.isa)   # per call: another backend in this process may
        kernels.attention_fused_step(False, isa=self.isa)   # run between two of ours
        try:
            return self._plans[group]()
        finally:
            kernels.attention_fused_step(was, isa=self.isa)

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "hina_attn_fused_step": "off"}


@register
class HinaAvx2ThreeCalls(_ThreeCalls):
    """hina:avx2's attention without its fused step (since 2026-12-07), for the machines it was not
    measured on."""
    name = "hina:avx2-3calls"
    isa = "avx2"
    description = "hina:avx2's attention without its fused step (the three calls per chunk; the same bits): an ablation"


@register
class HinaAvx512ThreeCalls(_ThreeCalls):
    """hina:avx512's attention without its fused step, for the machines the step was not measured on."""
    name = "hina:avx512-3calls"
    isa = "avx512"
    description = "hina:avx512's attention without its fused step (the three calls per chunk; the same bits): an ablation"


@register
class HinaAmx(_Hina):
    name = "hina:amx"
    isa = "amx"
    description = ("HiNa-MoE general-layout kernel, AMX-BF16 micro-kernel (Algorithm 1: W as tile A in "
                   "its own layout, I VNNI-packed in the gather), no weight repacking")


@register
class HinaAvx2Numa(_HinaNuma):
    name = "hina:avx2-numa"
    isa = "avx2"
    description = "hina:avx2 with interleave-aware task partitioning (paper Section 5, Algorithm 2)"


@register
class HinaAvx512Numa(_HinaNuma):
    name = "hina:avx512-numa"
    isa = "avx512"
    description = "hina:avx512 with interleave-aware task partitioning (paper Section 5, Algorithm 2)"


@register
class HinaAmxNuma(_HinaNuma):
    name = "hina:amx-numa"
    isa = "amx"
    description = "hina:amx with interleave-aware task partitioning (paper Section 5, Algorithm 2)"
