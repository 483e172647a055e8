"""`kt:*`: KTransformers' CPU MoE operators (kt-kernel 0.7.2), run in the `kt` environment.

kt-kernel's wheel carries six builds of its extension (amx, avx512_bf16/vnni/vbmi/base, avx2) and loads
the best this CPU can run; its high-level KTMoEWrapper wants a CUDA stream, so this adapter uses the
low-level `kt_kernel_ext` API: a CPUInfer thread pool, a moe.MOEConfig over BF16 weight pointers,
load_weights_task (the operator packs its own copy: counted in extra_bytes) and forward_task.
- `kt:amxbf16`   moe.AMXBF16_MOE: AMX tiles, or its AVX-512-BF16 fallback, where kt loads an AVX-512 build
- `kt:avx2bf16`  moe.AVX2BF16_MOE: the BF16 operator of kt's AVX2 build
- `kt:llamafile` moe.MOE: the llamafile (sgemm) operator on BF16 ggml tensors
- `kt:fp8`       moe.AVX2FP8_MOE: the FP8 operator of kt's AVX2 build, on the problem's own fp8 e4m3
                 weights and fp32 128x128 block scales (hinabench.quant, DeepSeek-V3's weight_scale_inv;
                 bf16 scales give NaN on this build). kt's AVX2 build has no INT8 class (its INT8 MoE,
                 AMXInt8_MOE, the paper's Figure 11 peer, is in the AMX build only): no `kt` int8 row here.
- `kt:amxfp8`    moe.AMXFP8_MOE: the FP8 operator of kt's AMX build, on the same weights and scales as
                 `kt:fp8` (first run on an AMX Xeon, 2026-12-01)
- `kt:amxint8`   moe.AMXInt8_MOE: the INT8 operator of kt's AMX build (the paper's Figure 11 peer), given
                 the BF16 weights as KTransformers' own loader does without a converted checkpoint: it
                 quantizes them itself at load, one scale per output row, and the activations per token
                 (W8A8, per-channel). Its rows are int8 rows validated against that scheme's reference,
                 not hina's group-wise one, with the gate/up outputs and SiLU(gate)*up rounded to bf16
                 before the re-quantization as kt stores them (quant_scheme "int8-channel+bf16gu+bf16h":
                 2.4e-3 from it on Qwen3's shape, 9.9e-3 from the fp32-intermediate one; 2026-12-01).
A class the loaded build does not have is an `unsupported` row naming the build.
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


class _Kt(WorkerBackend):
    env_name = "kt"
    module = "kt"
    packages = ("kt-kernel", "torch")
    # BF16: contiguous gate/up copies (2/3 of the weights) and kt's packed copy (1), at least (the AMX
    # operator takes more, measured below)
    extra_copy_factor = 1.7

    @classmethod
    def row_note(cls, threads: int) -> str:
        """kt's CPUInfer busy-waits in three places: the caller spins in sync(), its task-queue thread
        polls without sleeping, and the pool's workers spin between jobs. With `threads` workers that is
        threads + 1 busy threads (the queue thread is worker 0, the caller spins beside it): on as many
        CPUs as threads, the kernel's threads are time-sliced by the scheduler, so a call's time moves in
        whole scheduler ticks (measured on the 2-vCPU development VM: kt:avx2bf16 at 2 threads called
        directly in its env, no worker protocol, lands on multiples of 4 ms; at 1 thread it does not)."""
        import os
        if threads >= len(os.sched_getaffinity(0)):
            return ("kt's CPUInfer spins a submitting thread and a task-queue thread beside its worker pool: "
                    f"{threads + 1} busy threads on {threads} CPU(s), so call times step in scheduler ticks "
                    "(kt's design, not the harness's: seen in direct calls too)")
        return ""


@register
class KtAmxBf16(_Kt):
    name = "kt:amxbf16"
    variant = "amxbf16"
    # measured: its worker peaks at 7.6 GiB for Mixtral's 2.0 GiB of weights (3 groups; 2026-12-01),
    # its own copy included; the main job's kt:amxbf16 was OOM-killed with lower estimates
    extra_copy_factor = 2.8
    description = "KTransformers kt-kernel moe.AMXBF16_MOE (AMX, or AVX-512-BF16 without AMX) on its packed copy"


@register
class KtAvx2Bf16(_Kt):
    name = "kt:avx2bf16"
    variant = "avx2bf16"
    description = "KTransformers kt-kernel moe.AVX2BF16_MOE (its AVX2 build's BF16 operator) on its packed copy"


@register
class KtLlamafile(_Kt):
    name = "kt:llamafile"
    variant = "llamafile"
    extra_copy_factor = 0.7   # contiguous gate/up copies; it reads the ggml tensors it was given
    description = "KTransformers kt-kernel moe.MOE: llamafile sgemm on BF16 ggml tensors"


@register
class KtFp8(_Kt):
    name = "kt:fp8"
    variant = "fp8"
    dtypes = ("fp8",)
    extra_copy_factor = 2.0   # contiguous copies of the fp8 bytes, and its packed copy
    description = ("KTransformers kt-kernel moe.AVX2FP8_MOE (its AVX2 build's FP8 operator) on the problem's "
                   "fp8 e4m3 weights with 128x128 fp32 block scales, on its packed copy")


@register
class KtAmxFp8(_Kt):
    name = "kt:amxfp8"
    variant = "amxfp8"
    dtypes = ("fp8",)
    extra_copy_factor = 2.0
    description = ("KTransformers kt-kernel moe.AMXFP8_MOE (its AMX build's FP8 operator, DeepSeek-V3's 128x128 "
                   "block scales) on the problem's fp8 e4m3 weights, on its packed copy")


@register
class KtAmxInt8(_Kt):
    name = "kt:amxint8"
    variant = "amxint8"
    dtypes = ("int8",)
    quant_scheme = "int8-channel+bf16gu+bf16h"
    extra_copy_factor = 2.4   # contiguous bf16 gate/up copies (4/3 of the int8 bytes), its int8 packed copy
    description = ("KTransformers kt-kernel moe.AMXInt8_MOE (its AMX build's INT8 W8A8 operator): the BF16 "
                   "weights quantized by kt at load, per output row, activations per token; on its packed copy")


# ---- worker side ----------------------------------------------------------------------------------
_FP8 = ("fp8", "amxfp8")   # the same weights and scales: e4m3 bytes, [E, N/128, K/128] fp32 block scales
_CLASSES = {"amxbf16": "AMXBF16_MOE", "avx2bf16": "AVX2BF16_MOE", "llamafile": "MOE", "fp8": "AVX2FP8_MOE",
            "amxfp8": "AMXFP8_MOE", "amxint8": "AMXInt8_MOE"}


class KtPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        import kt_kernel
        from ..worker.protocol import PeerUnsupported
        k = kt_kernel.kt_kernel_ext
        self.build = kt_kernel.__cpu_variant__
        cls_name = _CLASSES.get(self.variant)
        if cls_name is None:
            raise PeerUnsupported(f"kt has no variant '{self.variant}'")
        cls = getattr(k.moe, cls_name, None)
        if cls is None:
            raise PeerUnsupported(f"kt-kernel loaded its '{self.build}' build for this CPU, which has no "
                                  f"moe.{cls_name}")
        p, E = data.problem, data.num_experts
        if self.variant == "llamafile" and (p.I % 256 or p.H % 256):
            raise PeerUnsupported(f"kt's llamafile operator needs H and I divisible by 256 (QK_K): "
                                  f"H={p.H}, I={p.I}")
        self.data = data
        cfg = k.moe.MOEConfig(E, p.A, p.H, p.I)
        if self.variant in _FP8:
            if getattr(data, "q13", None) is None or p.dtype != "fp8":
                raise PeerUnsupported(f"kt:{self.variant} runs fp8 problems only")
            I = p.I
            # kt reads gate, up and down as separate contiguous [E, N, K] bytes and [E, N/128, K/128] scales
            self.gate = data.q13.q[:, :I].contiguous().view(torch.uint8)
            self.up = data.q13.q[:, I:].contiguous().view(torch.uint8)
            self.down = data.qdown.q.contiguous().view(torch.uint8)
            self.scales = [data.q13.scale[:, : I // 128].contiguous(), data.q13.scale[:, I // 128:].contiguous(),
                           data.qdown.scale.contiguous()]
            cfg.quant_config.bits = 8
            cfg.quant_config.group_size = 128
            cfg.quant_config.zero_point = False
            cfg.gate_scale, cfg.up_scale, cfg.down_scale = (s.data_ptr() for s in self.scales)
        else:
            # kt reads gate and up as separate [E, I, H] arrays: ours are views into w13 [E, 2I, H]
            self.gate = data.w_gate.contiguous()
            self.up = data.w_up.contiguous()
            self.down = data.w_down
        self.cpu = k.CPUInfer(self.threads)
        cfg.pool = self.cpu.backend_
        cfg.max_len = max(p.T, 32)
        cfg.gate_proj, cfg.up_proj, cfg.down_proj = (self.gate.data_ptr(), self.up.data_ptr(),
                                                     self.down.data_ptr())
        if self.variant == "llamafile":
            bf16 = k.kvcache.ggml_type.BF16
            cfg.gate_type = cfg.up_type = cfg.down_type = cfg.hidden_type = bf16
            cfg.m_block = 32
            cfg.group_min_len = 10
            cfg.group_max_len = max(p.T, 32)
        self.cfg = cfg
        self.moe = cls(cfg)
        self.map = torch.arange(E, dtype=torch.int64)
        self.cpu.submit(self.moe.load_weights_task(self.map.data_ptr()))
        self.cpu.sync()
        self.ids = [t.to(torch.int64).contiguous() for t in data.topk_ids]
        self.weights = data.topk_weights.float().contiguous()
        self.x = data.x.contiguous()
        self.out = torch.empty_like(self.x)
        self.bsz = torch.tensor([p.T], dtype=torch.int32)

    def run(self, group: int):
        ids = self.ids[group]
        self.cpu.submit(self.moe.forward_task(self.bsz.data_ptr(), ids.shape[1], ids.data_ptr(),
                                              self.weights.data_ptr(), self.x.data_ptr(),
                                              self.out.data_ptr(), False))
        self.cpu.sync()
        return self.out

    def extra_bytes(self) -> int:
        # the contiguous gate/up copies we hand it; the operators' own packed copies (AMX/AVX2 BF16
        # repack at load_weights) are not visible from Python: counted as one more copy of the weights
        # for those, none for llamafile (which reads the ggml tensors it was given)
        if self.variant in _FP8:   # our contiguous copies (bytes + scales), and its packed copy of them
            ours = self.gate.numel() + self.up.numel() + self.down.numel() + sum(4 * s.numel() for s in self.scales)
            return 2 * ours
        ours = 2 * self.gate.numel() * 2
        per = 1 if self.variant == "amxint8" else 2   # bytes per weight of its packed copy
        packed = 0 if self.variant == "llamafile" else (self.data.w13.numel() + self.data.w_down.numel()) * per
        return ours + packed

    def versions(self) -> dict:
        import kt_kernel
        return {"kt_kernel_build": kt_kernel.__cpu_variant__,
                "kt_int8_kernel": str(getattr(kt_kernel, "__int8_kernel__", ""))}


def make_peer(variant: str, threads: int) -> KtPeer:
    return KtPeer(variant, threads)
