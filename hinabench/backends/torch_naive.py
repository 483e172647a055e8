"""`torch`: the naive expert loop, as Hugging Face's Mixtral block writes it (bf16 F.linear per expert);
for a dense projection, one bf16 F.linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import register
from .base import Backend


def route(topk_ids: torch.Tensor):
    """(expert, token indices, top-k slots) for each expert that receives a token."""
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        yield e, tok, slot


@register
class TorchNaive(Backend):
    name = "torch"
    description = ("PyTorch naive loop over experts: F.linear(gate), F.linear(up), SiLU*up, F.linear(down), "
                   "index_add; attention: repeat_kv, matmul, softmax (fp32), matmul, as a model file writes it")
    ops = ("ffn", "linear", "attention")

    def supports(self, data) -> None:
        super().supports(data)
        if data.problem.kind == "attention":
            from .torch_attention import check_transient
            check_transient(data.problem, True, self.name)

    def run_attention(self, group: int) -> torch.Tensor:
        """The model file's attention: repeat_kv, matmul, softmax (fp32), matmul (torch_attention.py)."""
        from .torch_attention import naive_attention
        return naive_attention(self.data, group)

    def run_linear(self, group: int) -> torch.Tensor:
        return F.linear(self.data.x, self.data.w[group])

    def run_ffn(self, group: int) -> torch.Tensor:
        d = self.data
        x, w = d.x, d.topk_weights
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for e, tok, slot in route(d.topk_ids[group]):
            xe = x[tok]
            h = F.silu(F.linear(xe, d.w_gate[e])) * F.linear(xe, d.w_up[e])
            y = F.linear(h, d.w_down[e])
            out.index_add_(0, tok, y.float() * w[tok, slot].unsqueeze(1))
        return out.to(x.dtype)
