"""`onednn`: torch's oneDNN (mkldnn) linear, in the two ways a framework can use it.

- `onednn:runtime`   weights stay in the framework's layout; oneDNN converts them to its blocked
                      layout inside every call (the paper's "runtime conversion").
- `onednn:prepacked` weights converted once in prepare() with torch.ops.mkldnn._reorder_linear_weight
                      (a second copy of every expert: counted in extra_bytes), then
                      torch.ops.mkldnn._linear_pointwise (the paper's "pre-conversion").
Gate and up run as one GEMM over the fused w13[e] = [2I, H]. A dense projection (`linear`) is one
oneDNN linear over W [N, K].
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
    ops = ("ffn", "linear")

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return _probe(cls.prepacked)

    def prepare(self, data) -> None:
        super().prepare(data)
        ok, why = _probe(self.prepacked)
        if not ok:
            raise Unsupported(why)
        T = data.problem.batch_tokens
        pack = (lambda w: torch.ops.mkldnn._reorder_linear_weight(w, T)) if self.prepacked else (lambda w: w)
        if data.problem.kind == "linear":
            self.w = [pack(data.w[g]) for g in range(data.groups)]
            return
        self.w13 = [pack(data.w13[e]) for e in range(data.num_experts)]
        self.w2 = [pack(data.w_down[e]) for e in range(data.num_experts)]

    def run_linear(self, group: int) -> torch.Tensor:
        return _linear(self.data.x, self.w[group])

    def run_ffn(self, group: int) -> torch.Tensor:
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
        return sum(w.numel() * w.element_size() for w in self.data.weights())

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated: int, problem_bytes_allocated: int = 0) -> int:
        return weight_bytes_allocated if cls.prepacked else 0

    def versions(self) -> dict[str, str]:
        from ..machine.sysinfo import onednn_version
        return {"torch": torch.__version__, "onednn": onednn_version()}

    def close(self) -> None:
        self.w13 = self.w2 = self.w = None
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
