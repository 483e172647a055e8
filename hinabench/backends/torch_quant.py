"""`torch:dequant`: the framework's own quantized path with no kernel of its own, as a naive
Hugging Face-style loop would run a quantized checkpoint on a CPU: per call and per expert, the
int8 / fp8 weights are dequantized (q * scale, fp32) and multiplied with F.linear; for int8 (W8A8)
the activations are quantized per token and group first, as the scheme says (hinabench.quant). It
reads the quantized bytes (and scales) every call, so it is judged on them; it is the quantized
reference's arithmetic, timed.

torch's own int8 CPU op, aten._weight_int8pack_mm, takes one scale per output channel: the
group-wise scheme (one scale per 32-128 weights of a row) cannot be expressed in it, so it is not a
peer on the same weights (see hinabench/quant.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant import fake_quant_act
from . import register
from .base import Backend
from .torch_naive import route


@register
class TorchDequant(Backend):
    name = "torch:dequant"
    description = ("PyTorch loop over experts on quantized weights: per call dequantize (q * scale, fp32), "
                   "W8A8 activation quantization for int8, F.linear, SiLU*up, index_add")
    dtypes = ("int8", "fp8")
    ops = ("ffn",)

    def run_ffn(self, group: int) -> torch.Tensor:
        d = self.data
        p = d.problem
        I = p.I
        w8a8 = p.dtype == "int8"
        x = fake_quant_act(d.x, p.group) if w8a8 else d.x.float()
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        gate, up = d.q13.rows(0, I), d.q13.rows(I, 2 * I)
        for e, tok, slot in route(d.topk_ids[group]):
            xe = x[tok]
            h = F.silu(F.linear(xe, gate.dequantize(e))) * F.linear(xe, up.dequantize(e))
            if w8a8:
                h = fake_quant_act(h, p.group)
            y = F.linear(h, d.qdown.dequantize(e))
            out.index_add_(0, tok, y * d.topk_weights[tok, slot].unsqueeze(1))
        return out.to(torch.bfloat16)

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated: int, problem_bytes_allocated: int = 0) -> int:
        return 0   # the per-call fp32 copies are transient (one matrix of one expert at a time)
