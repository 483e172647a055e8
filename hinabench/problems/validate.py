"""Validation: how far a backend's output is from the float32 reference, and what is wrong with it.

Every backend is checked on the exact problem it is about to be timed on; tolerances are per dtype
(hinabench/dtypes.py).
"""
from __future__ import annotations

import torch


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
