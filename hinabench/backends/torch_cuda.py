"""`torch-cuda`: the `torch` backend's expert loop (Hugging Face's Mixtral block: bf16 F.linear per
expert, SiLU*up, index_add) on a CUDA device, for Figure 1's CPU-vs-GPU throughput by batch.

Weights, tokens and routing are copied to the device once in prepare (not timed as calls). One call
is the loop on the device plus the copy of its [B, H] output back to the host, which waits for the
device: the time a host-side caller sees. Its roofline is the device's, measured beside its samples
like the CPU's: a read of its own weight buffers on the device (an amax over them) and a bf16 matmul
(the CPU's read probe and FMA loop would judge a GPU by the wrong memory). Without CUDA (no device,
or a torch built without it: the README's pinned CPU build) every row is `unsupported` with the reason.
"""
from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F

from . import register
from .base import Backend
from .torch_naive import route


def cuda_missing() -> str:
    """Why CUDA cannot be used in this process, or '' when it can."""
    if torch.version.cuda is None:
        return (f"no CUDA device: torch {torch.__version__} is built without CUDA (a CPU build; "
                f"torch-cuda needs a CUDA build of torch on a machine with an NVIDIA GPU)")
    if not torch.cuda.is_available():
        return (f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none "
                f"(torch.cuda.is_available() is False)")
    return ""


@register
class TorchCuda(Backend):
    name = "torch-cuda"
    description = ("PyTorch naive loop over experts on a CUDA device, bf16 (the torch backend's code): "
                   "F.linear(gate), F.linear(up), SiLU*up, F.linear(down), index_add; output copied back")
    ops = ("ffn",)
    device = "cuda"        # the tests run the same code with "cpu" to check it where no GPU exists
    probe_n = 8192         # the square bf16 matmul of the compute probe
    probe_reps = 3

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        why = cuda_missing() if cls.device.startswith("cuda") else ""
        return (not why), why

    @classmethod
    def note(cls, threads: int) -> str:
        return ("runs on the GPU: its roofline is the device's own read probe and bf16 matmul peak; "
                "threads is the host's")

    def prepare(self, data) -> None:
        super().prepare(data)
        dev = torch.device(self.device)
        self.w13 = data.w13.to(dev)
        self.w_down = data.w_down.to(dev)
        self.x = data.x.to(dev)
        self.topk_weights = data.topk_weights.to(dev)
        self.topk_ids = [ids.to(dev) for ids in data.topk_ids]
        self._sync()

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def run_ffn(self, group: int) -> torch.Tensor:
        I = self.data.problem.I
        x, w = self.x, self.topk_weights
        w_gate, w_up = self.w13[:, :I], self.w13[:, I:]
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        for e, tok, slot in route(self.topk_ids[group]):
            xe = x[tok]
            h = F.silu(F.linear(xe, w_gate[e])) * F.linear(xe, w_up[e])
            y = F.linear(h, self.w_down[e])
            out.index_add_(0, tok, y.float() * w[tok, slot].unsqueeze(1))
        return out.to(x.dtype).cpu()     # the copy back waits for the device

    # ---- the device's roofline, measured beside the samples -----------------------------------------
    def _group_weights(self) -> list[torch.Tensor]:
        d = self.data
        out = []
        for g in range(d.groups):
            e = d.group_experts(g)
            out += [self.w13[e.start:e.stop], self.w_down[e.start:e.stop]]
        return out

    def read_probe(self) -> tuple[float, str]:
        """GB/s of one read of every weight group on the device (amax over each), best of a few."""
        ws = self._group_weights()
        total = sum(w.numel() * w.element_size() for w in ws)
        best = float("inf")
        for _ in range(self.probe_reps):
            self._sync()
            t0 = time.perf_counter()
            for w in ws:
                torch.amax(w)
            self._sync()
            best = min(best, time.perf_counter() - t0)
        return total / best / 1e9, f"{self.device}-amax"

    def compute_probe(self) -> tuple[float, str]:
        """GFLOP/s of a square bf16 matmul on the device, best of a few."""
        n = self.probe_n
        a = torch.ones(n, n, dtype=torch.bfloat16, device=self.device)
        best = float("inf")
        for _ in range(self.probe_reps):
            self._sync()
            t0 = time.perf_counter()
            torch.mm(a, a)
            self._sync()
            best = min(best, time.perf_counter() - t0)
        return 2 * n ** 3 / best / 1e9, f"{self.device}-bf16-matmul"

    def measure_round(self, rnd, plan, counter=None):
        from ..harness.measure import MeasureState, measure_round
        if getattr(self, "_state", None) is None:
            self._state = MeasureState()
        return measure_round(self.run, rnd, plan, self._state, [], self.threads, self.data.groups, counter,
                             read_probe=self.read_probe, compute_probe=self.compute_probe)

    def versions(self) -> dict[str, str]:
        v = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        if self.device.startswith("cuda") and torch.cuda.is_available():
            v["device"] = torch.cuda.get_device_name(torch.device(self.device))
        return v

    def close(self) -> None:
        for k in ("w13", "w_down", "x", "topk_weights", "topk_ids"):
            self.__dict__.pop(k, None)
        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        super().close()


# torch's grouped matrix product (public from 2.10, torch._grouped_mm before), or None
GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


@register
class TorchCudaGrouped(TorchCuda):
    """The same weights and routing on the device through torch's grouped matrix product: the
    token-expert pairs sorted by expert, then one grouped_mm for gate/up and one for down over every
    expert of the call, SiLU*up between, index_add of the weighted rows (transformers' `grouped_mm`
    experts implementation, the form a framework runs on a GPU). The per-expert loop (`torch-cuda`)
    launches a few small kernels and synchronises with the host per expert, which bounds it on models
    of many small experts (Qwen3-30B-A3B: up to 128 per call); this is the GPU's fairer side there."""
    name = "torch-cuda:grouped"
    description = ("PyTorch grouped_mm over the experts on a CUDA device, bf16 (transformers' grouped_mm "
                   "experts): pairs sorted by expert, grouped_mm(gate_up), SiLU*up, grouped_mm(down), "
                   "index_add; output copied back")

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        ok, why = super().availability()
        if ok and GROUPED_MM is None:
            return False, (f"torch {torch.__version__} has no grouped_mm (torch.nn.functional.grouped_mm or "
                           f"torch._grouped_mm)")
        return ok, why

    def run_ffn(self, group: int) -> torch.Tensor:
        I = self.data.problem.I
        x = self.x
        ex = self.data.group_experts(group)                  # this group's experts, ids made local
        ids = self.topk_ids[group].long() - ex.start         # [B, A]
        A = ids.shape[1]
        eid, perm = torch.sort(ids.reshape(-1))
        tok = perm // A
        offs = torch.cumsum(torch.bincount(eid, minlength=len(ex)), 0, dtype=torch.int32)
        h = GROUPED_MM(x[tok], self.w13[ex.start:ex.stop].transpose(-2, -1), offs=offs)          # [S, 2I]
        act = F.silu(h[:, :I]) * h[:, I:]
        y = GROUPED_MM(act, self.w_down[ex.start:ex.stop].transpose(-2, -1), offs=offs)          # [S, H]
        w = self.topk_weights.reshape(-1)[perm].unsqueeze(1)
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, tok, y.float() * w)
        return out.to(x.dtype).cpu()


def device_name(versions) -> str:
    """The device a torch-cuda row ran on, from its `versions` cell (JSON), or ''."""
    try:
        v = json.loads(versions) if isinstance(versions, str) else (versions or {})
        return str(v.get("device") or "")
    except (ValueError, AttributeError):
        return ""
