"""The dtype table: what every part of hinabench needs to know about a weight dtype, in one place.

The problem (element bytes, the torch dtype it materialises), the reference (tolerance), the kernels
(which ISAs have a micro-kernel for it), the backends and sweeps (which dtypes exist) and the NUMA
model (element bytes per page) all read this table. A new dtype is one entry here plus its
micro-kernels; nothing else enumerates dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import UserError


@dataclass(frozen=True)
class DType:
    name: str
    torch_dtype: torch.dtype        # how weights of this dtype are stored in a torch tensor
    element_bytes: float            # bytes per weight element, scales excluded
    scale_layout: str | None        # None: unscaled; else how the scales are laid out (quantized dtypes)
    tolerance: float                # relative L2 error a backend may have against the fp32 reference
    kernel_isas: tuple[str, ...]    # ISAs with a HiNa micro-kernel for this dtype (kernels/microkernel.h)
    note: str = ""

    def scale_bytes(self, rows: int, cols: int) -> int:
        """Bytes of scales for a [rows, cols] weight matrix (0 for unscaled dtypes)."""
        return 0


# BF16 tolerance: the output is rounded to bf16 (relative 2^-9 ~ 0.2% per element), and every kernel
# we know also rounds the intermediate SiLU(gate)*up to bf16 before the down projection (another
# ~0.2%, averaged over I terms); fp32 accumulation order changes little. Good kernels land at
# 0.3-0.6%; 2% leaves room for that and still flags any real bug (a wrong kernel is off by ~100%).
DTYPES: dict[str, DType] = {d.name: d for d in [
    DType("bf16", torch.bfloat16, 2.0, None, 2e-2, ("amx", "avx512", "avx2", "scalar"),
          "bfloat16 weights and activations, fp32 accumulation"),
]}


def get_dtype(name: str) -> DType:
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise UserError(f"unknown dtype '{name}'; known: {', '.join(DTYPES)}")
    return DTYPES[key]


def element_bytes(name: str) -> float:
    return get_dtype(name).element_bytes
