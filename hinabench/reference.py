"""The float32 reference every backend is checked against, on the exact problem it is timed on.

out[t] = sum_k topk_weights[t, k] * down_e(SiLU(gate_e(x_t)) * up_e(x_t)),  e = topk_ids[t, k]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Relative L2 error a backend may have against the float32 reference.
# BF16 kernels: the output is rounded to bf16 (relative 2^-9 ~ 0.2% per element), and every kernel
# we know also rounds the intermediate SiLU(gate)*up to bf16 before the down projection (another
# ~0.2%, averaged over I terms); fp32 accumulation order changes little. Good kernels land at
# 0.3-0.6%; 2% leaves room for that and still flags any real bug (a wrong kernel is off by ~100%).
TOLERANCE = {"bf16": 2e-2}


def moe_ffn_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights) -> torch.Tensor:
    """float32 MoE FFN over the experts the tokens use; inputs in any float dtype."""
    T, H = x.shape
    xf = x.float()
    out = torch.zeros(T, w_down.shape[1], dtype=torch.float32)
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = xf[tok]
        g = F.linear(xe, w_gate[e].float())
        u = F.linear(xe, w_up[e].float())
        y = F.linear(F.silu(g) * u, w_down[e].float())
        out.index_add_(0, tok, y * topk_weights[tok, slot].float().unsqueeze(1))
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error ||out - ref|| / ||ref||; inf for NaN/Inf or a shape mismatch."""
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    o = out.float()
    if not torch.isfinite(o).all():
        return float("inf")
    den = torch.linalg.vector_norm(ref).item()
    return torch.linalg.vector_norm(o - ref).item() / max(den, 1e-30)


def diagnose(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> str:
    """What is wrong with an output over tolerance, in a few words, for the row's `reason`: a shape
    mismatch, non-finite values, an all-zero output (a kernel that returned without writing), the
    tokens that are wrong when only some are, else the output's scale against the reference."""
    if tuple(out.shape) != tuple(ref.shape):
        return f"shape {list(out.shape)}, expected {list(ref.shape)}"
    o = out.float()
    bad = int((~torch.isfinite(o)).sum())
    if bad:
        return f"{bad} of {o.numel()} values are NaN or Inf"
    if not bool(o.any()):
        return "the output is all zeros"
    zero_rows = int((~o.any(dim=1)).sum())
    row_err = torch.linalg.vector_norm(o - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1).clamp_min(1e-30)
    wrong = torch.nonzero(row_err > tolerance).flatten().tolist()
    scale = torch.linalg.vector_norm(o).item() / max(torch.linalg.vector_norm(ref).item(), 1e-30)
    parts = []
    if len(wrong) < o.shape[0]:
        parts.append(f"{len(wrong)} of {o.shape[0]} tokens wrong (first: token {wrong[0]})" if wrong
                     else "no single token over tolerance")
    else:
        parts.append(f"every token wrong; |out|/|ref| = {scale:.3g}")
    if zero_rows:
        parts.append(f"{zero_rows} token row(s) all zero")
    return ", ".join(parts)
