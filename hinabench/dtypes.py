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

    scale_dtype: str | None = None  # the scales' element type (quantized dtypes)
    default_group: int = 0          # int8: K elements per scale unless --group says otherwise

    def scale_bytes(self, rows: int, cols: int, group: int | None = None) -> int:
        """Bytes of scales for a [rows, cols] weight matrix (0 for unscaled dtypes): int8 one per (row,
        group of `group` along cols); fp8 one per 128 x 128 block (DeepSeek-V3's weight_scale_inv)."""
        if self.scale_layout is None:
            return 0
        sb = 4  # fp32 scales
        if self.scale_layout == "row-group":
            g = int(group or self.default_group)
            return rows * (-(-cols // g)) * sb
        return (-(-rows // 128)) * (-(-cols // 128)) * sb

    @property
    def quantized(self) -> bool:
        return self.scale_layout is not None


# BF16 tolerance: the output is rounded to bf16 (relative 2^-9 ~ 0.2% per element), and every kernel
# we know also rounds the intermediate SiLU(gate)*up to bf16 before the down projection (another
# ~0.2%, averaged over I terms); fp32 accumulation order changes little. Good kernels land at
# 0.3-0.6%; 2% leaves room for that and still flags any real bug (a wrong kernel is off by ~100%).
DTYPES: dict[str, DType] = {d.name: d for d in [
    DType("bf16", torch.bfloat16, 2.0, None, 2e-2, ("amx", "avx512", "avx512-nobf16", "avx2", "scalar"),
          "bfloat16 weights and activations, fp32 accumulation"),
    # Quantized dtypes (hinabench/quant.py): the tolerance is against the *quantized* reference
    # (dequantized weights and, for int8, the same activation quantization), which a correct kernel
    # matches up to fp32 order and the output's bf16 rounding (~0.15-0.2%; 5e-3 still flags a kernel that
    # skipped the activation quantization, ~1.5% off); the scheme's own error
    # against the BF16 reference is its own column, quant_err, and judges nothing.
    DType("int8", torch.int8, 1.0, "row-group", 5e-3, ("amx", "avx512", "avx512-nobf16", "avx2"),
          "W8A8 group-wise symmetric int8: weights int8 + fp32 scale per (row, group of g along K); "
          "activations quantized per token and group at run time; int32 accumulation per group",
          scale_dtype="float32", default_group=128),
    DType("fp8", torch.float8_e4m3fn, 1.0, "block-128x128", 5e-3, ("amx", "avx512", "avx512-nobf16", "avx2"),
          "weight-only fp8 e4m3 + fp32 128x128 block scales (DeepSeek-V3 weight_scale_inv); "
          "bf16 activations, fp32 accumulation",
          scale_dtype="float32", default_group=128),
]}


def get_dtype(name: str) -> DType:
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise UserError(f"unknown dtype '{name}'; known: {', '.join(DTYPES)}")
    return DTYPES[key]


def element_bytes(name: str) -> float:
    return get_dtype(name).element_bytes
