"""`onednn`: torch's oneDNN (mkldnn) linear, in the two ways a framework can use it.

- `onednn:runtime`   weights stay in the framework's layout; oneDNN converts them to its blocked
                      layout inside every call (the paper's "runtime conversion").
- `onednn:prepacked` weights converted once in prepare() with torch.ops.mkldnn._reorder_linear_weight
                      (a second copy of every expert: counted in extra_bytes), then
                      torch.ops.mkldnn._linear_pointwise (the paper's "pre-conversion").
Gate and up run as one GEMM over the fused w13[e] = [2I, H].
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import register
from .base import Backend, Unsupported
from .torch_naive import route


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


@functools.lru_cache(maxsize=None)
def _probe(prepacked: bool) -> tuple[bool, str]:
    """oneDNN refuses bf16 on CPUs without AVX512-BW/VL/DQ or AVX-NE-CONVERT: ask it, once."""
    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    w = torch.ones(32, 64, dtype=torch.bfloat16)
    try:
        if prepacked:
            w = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        _linear(x, w)
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[0]
        return False, f"oneDNN bf16 linear is not supported on this CPU: {msg}"
    return True, ""


class _OneDNN(Backend):
    prepacked = False

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return _probe(cls.prepacked)

    def prepare(self, data) -> None:
        super().prepare(data)
        ok, why = _probe(self.prepacked)
        if not ok:
            raise Unsupported(why)
        self.w13 = [data.w13[e] for e in range(data.num_experts)]
        self.w2 = [data.w_down[e] for e in range(data.num_experts)]
        if self.prepacked:
            T = data.problem.T
            self.w13 = [torch.ops.mkldnn._reorder_linear_weight(w, T) for w in self.w13]
            self.w2 = [torch.ops.mkldnn._reorder_linear_weight(w, T) for w in self.w2]

    def run(self, group: int) -> torch.Tensor:
        d = self.data
        x, w, I = d.x, d.topk_weights, d.problem.I
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for e, tok, slot in route(d.topk_ids[group]):
            gu = _linear(x[tok], self.w13[e])
            h = F.silu(gu[:, :I]) * gu[:, I:]
            y = _linear(h, self.w2[e])
            out.index_add_(0, tok, y.float() * w[tok, slot].unsqueeze(1))
        return out.to(x.dtype)

    def extra_bytes(self) -> int:
        if not self.prepacked or self.data is None:
            return 0
        return self.data.w13.numel() * 2 + self.data.w_down.numel() * 2

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated: int) -> int:
        return weight_bytes_allocated if cls.prepacked else 0

    def versions(self) -> dict[str, str]:
        from ..sysinfo import onednn_version
        return {"torch": torch.__version__, "onednn": onednn_version()}

    def close(self) -> None:
        self.w13 = self.w2 = None
        super().close()


@register
class OneDNNRuntime(_OneDNN):
    name = "onednn:runtime"
    description = "oneDNN linear on plain weights: layout conversion inside every call"
    prepacked = False


@register
class OneDNNPrepacked(_OneDNN):
    name = "onednn:prepacked"
    description = "oneDNN linear on weights reordered once in prepare (a second copy of the experts)"
    prepacked = True
