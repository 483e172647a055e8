"""Quantization as the framework's offline step: BF16 expert weights in, quantized weights + scales out.

Two schemes (hinabench/dtypes.py has their table entries):

  int8  group-wise symmetric: q int8 [E, N, K] (the framework's out x in layout, rows contiguous along
        K, no repacking) and one fp32 scale per (row, group of g along K), scale [E, N, K/g];
        w ~ q * scale, scale = max|w over the group| / 127, q = round-half-even(w * 127 / amax) in
        [-127, 127] (never -128). The activations' [-127, 127] is what the AVX2 kernel's sign trick
        relies on (|w| <= 128 times |x| <= 127, twice, stays below 2^15).
        W8A8: activations are quantized the same way at run time, per token and group of g along K
        (`quantize_act`), and the SiLU(gate)*up intermediate again before the down projection.
        Per-channel (`quantize_int8_channel`): the group is all of K, one scale per row; the scheme
        the int8 peers use (vLLM-CPU/SGLang's INT8 W8A8, KTransformers' AMXInt8_MOE), activations per
        token over all of K. Their rows are validated against this scheme's quantized reference.
  fp8   e4m3 (torch.float8_e4m3fn) with 128 x 128 block scales, DeepSeek-V3's checkpoint format:
        q [E, N, K] and `weight_scale_inv` fp32 [E, ceil(N/128), ceil(K/128)] that multiplies:
        w ~ q * scale_inv, scale_inv = max|w over the block| / 448. Weight-only (W8A16): the
        activations stay bf16.

Everything is vectorised torch (one expert at a time, to bound the fp32 temporaries) and
deterministic: the same BF16 weights give the same bytes in every process.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import UserError

INT8_GROUPS = (32, 64, 128)
INT8_DEFAULT_GROUP = 128
INT8_QMAX = 127.0
FP8_BLOCK = 128
FP8_MAX = 448.0   # the largest finite float8_e4m3fn
_ROWS = 2048      # rows quantized at once (a multiple of FP8_BLOCK)


@dataclass
class QuantWeight:
    """One quantized weight tensor [E, N, K] and its scales (see the module docstring)."""
    scheme: str               # "int8" | "fp8"
    q: torch.Tensor           # int8 or float8_e4m3fn [E, N, K], contiguous
    scale: torch.Tensor       # fp32: int8 [E, N, K/g]; fp8 [E, ceil(N/128), ceil(K/128)]
    group: int                # int8: g along K; fp8: the block edge (128)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.q.shape)

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads: the quantized weights and their scales."""
        return self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()

    def expert(self, e: int) -> "QuantWeight":
        return QuantWeight(self.scheme, self.q[e:e + 1], self.scale[e:e + 1], self.group)

    def rows(self, r0: int, r1: int) -> "QuantWeight":
        """Rows [r0, r1) of every expert (views; for int8 any rows, for fp8 whole 128-row blocks)."""
        if self.scheme == "fp8":
            if r0 % FP8_BLOCK:
                raise ValueError("fp8 rows must start on a 128-row block")
            s = self.scale[:, r0 // FP8_BLOCK: -(-r1 // FP8_BLOCK)]
        else:
            s = self.scale[:, r0:r1]
        return QuantWeight(self.scheme, self.q[:, r0:r1], s, self.group)

    def dequantize(self, e: int | None = None) -> torch.Tensor:
        """fp32 weights q * scale, [E, N, K] (or [N, K] for one expert e)."""
        q = self.q if e is None else self.q[e:e + 1]
        s = self.scale if e is None else self.scale[e:e + 1]
        out = _dequant(self.scheme, q, s, self.group)
        return out if e is None else out[0]


def _inv(qmax: float, amax: torch.Tensor) -> torch.Tensor:
    """qmax / amax, correctly rounded (0 where amax is 0). Not `qmax / amax` with a Python scalar:
    torch computes scalar / tensor as scalar * reciprocal(tensor), off by an ulp now and then, which
    moves bf16 activations that land on a .5 tie (x = amax / 2 is common) to the other integer."""
    return torch.where(amax > 0, torch.full_like(amax, qmax) / amax, torch.zeros_like(amax))


def check_group(group: int) -> int:
    g = int(group)
    if g not in INT8_GROUPS:
        raise UserError(f"int8 group size must be one of {', '.join(map(str, INT8_GROUPS))} (got {group})")
    return g


def _as3(w: torch.Tensor) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or w.dim() not in (2, 3):
        raise ValueError("weights must be a [N, K] or [E, N, K] tensor")
    if not w.is_floating_point():
        raise ValueError(f"weights to quantize must be floating point (got {w.dtype})")
    return w if w.dim() == 3 else w.unsqueeze(0)


def quantize_int8(w: torch.Tensor, group: int = INT8_DEFAULT_GROUP) -> QuantWeight:
    """Group-wise symmetric int8 of w [E, N, K] (or [N, K]); K must be a multiple of `group`."""
    return _quantize_int8(_as3(w), check_group(group))


def quantize_int8_channel(w: torch.Tensor) -> QuantWeight:
    """Per-channel symmetric int8 of w [E, N, K]: one fp32 scale per output row (a group of all K), the
    scheme of vLLM-CPU's INT8 W8A8 MoE (SGLang's kernel) and KTransformers' AMXInt8_MOE, whose
    activations are quantized per token over all of K (`quantize_act` with group = K)."""
    w3 = _as3(w)
    return _quantize_int8(w3, w3.shape[2])


def _quantize_int8(w3: torch.Tensor, g: int) -> QuantWeight:
    E, N, K = w3.shape
    if K % g:
        raise ValueError(f"the group size {g} does not divide K={K}")
    q = torch.empty(E, N, K, dtype=torch.int8)
    scale = torch.empty(E, N, K // g, dtype=torch.float32)
    for e in range(E):   # one expert and _ROWS rows at a time: the fp32 temporaries stay small
        for r0 in range(0, N, _ROWS):
            r1 = min(N, r0 + _ROWS)
            wf = w3[e, r0:r1].float().view(r1 - r0, K // g, g)
            amax = wf.abs().amax(dim=2)
            scale[e, r0:r1] = amax / INT8_QMAX
            inv = _inv(INT8_QMAX, amax)
            q[e, r0:r1] = torch.round(wf * inv.unsqueeze(2)).clamp_(-INT8_QMAX, INT8_QMAX).view(r1 - r0, K).to(torch.int8)
    return QuantWeight("int8", q, scale, g)


def quantize_fp8(w: torch.Tensor) -> QuantWeight:
    """float8_e4m3fn with 128 x 128 block scales (DeepSeek-V3's `weight_scale_inv`), w [E, N, K]."""
    w3 = _as3(w)
    E, N, K = w3.shape
    B = FP8_BLOCK
    nb, kb = -(-N // B), -(-K // B)
    q = torch.empty(E, N, K, dtype=torch.float8_e4m3fn)
    scale = torch.empty(E, nb, kb, dtype=torch.float32)
    for e in range(E):
        for r0 in range(0, N, _ROWS):        # _ROWS is a multiple of 128: whole row blocks
            r1 = min(N, r0 + _ROWS)
            nbc = -(-(r1 - r0) // B)
            wf = F.pad(w3[e, r0:r1].float(), (0, kb * B - K, 0, nbc * B - (r1 - r0)))   # partial blocks: 0
            blocks = wf.view(nbc, B, kb, B)
            amax = blocks.abs().amax(dim=(1, 3))
            scale[e, r0 // B: r0 // B + nbc] = amax / FP8_MAX
            inv = _inv(FP8_MAX, amax)
            qb = (blocks * inv[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX)
            q[e, r0:r1] = qb.view(nbc * B, kb * B)[:r1 - r0, :K].to(torch.float8_e4m3fn)
    return QuantWeight("fp8", q, scale, B)


def quantize(w: torch.Tensor, scheme: str, group: int = INT8_DEFAULT_GROUP) -> QuantWeight:
    if scheme == "int8":
        return quantize_int8(w, group)
    if scheme == "fp8":
        return quantize_fp8(w)
    raise UserError(f"no quantization scheme '{scheme}' (known: int8, fp8)")


def _dequant(scheme: str, q: torch.Tensor, s: torch.Tensor, group: int) -> torch.Tensor:
    E, N, K = q.shape
    if scheme == "int8":
        return (q.float().view(E, N, K // group, group) * s.unsqueeze(3)).view(E, N, K)
    B = FP8_BLOCK
    full = s.repeat_interleave(B, dim=1)[:, :N].repeat_interleave(B, dim=2)[:, :, :K]
    return q.float() * full


def quantize_act(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's activation quantization, per token (row) and group of `group` along K: (q int8 [T, K],
    scale fp32 [T, K/group]). The kernels compute the same: amax, inv = 127 / amax (fp32), q =
    round-half-even(x * inv) (0 where amax = 0), scale = amax / 127."""
    T, K = x.shape
    xf = x.float().view(T, K // group, group)
    amax = xf.abs().amax(dim=2)
    inv = _inv(INT8_QMAX, amax)
    q = torch.round(xf * inv.unsqueeze(2)).clamp_(-INT8_QMAX, INT8_QMAX)
    return q.view(T, K).to(torch.int8), amax / INT8_QMAX


def fake_quant_act(x: torch.Tensor, group: int) -> torch.Tensor:
    """x after W8A8's activation quantization, as fp32 (q * scale)."""
    q, s = quantize_act(x, group)
    T, K = q.shape
    return (q.float().view(T, K // group, group) * s.unsqueeze(2)).view(T, K)


def moe_ffn_quant_reference(x: torch.Tensor, w_gate: QuantWeight, w_up: QuantWeight, w_down: QuantWeight,
                            topk_ids: torch.Tensor, topk_weights: torch.Tensor, bf16_gate_up: bool = False,
                            bf16_h: bool = False, bf16_w: bool = False, bf16_y: bool = False) -> torch.Tensor:
    """The quantized reference, fp32: dequantized weights and, for int8 (W8A8), the same activation
    quantization as the kernels (x per token/group before gate and up; SiLU(gate)*up per token/group
    before down). fp8 is weight-only: x and the intermediate stay as they are (fp32).
    `bf16_gate_up`, `bf16_h`: the gate/up outputs, the intermediate SiLU(gate)*up, rounded to bf16 as a
    kernel that stores them in bf16 does before re-quantizing (hina keeps them fp32; a peer may not, and
    W8A8's re-quantization turns that rounding into whole quantization steps: ~1% of the output);
    `bf16_w`: the dequantized weights rounded to bf16, as a kernel that unpacks fp8 to bf16 computes on;
    `bf16_y`: each expert's weighted output rounded to bf16 before the experts' sum."""
    T, H = x.shape
    w8a8 = w_gate.scheme == "int8"
    g, g_down = w_gate.group, w_down.group   # the activations' groups: as the weights' along K
    xf = fake_quant_act(x, g) if w8a8 else x.float()
    out = torch.zeros(T, w_down.shape[1], dtype=torch.float32)
    ids = topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        xe = xf[tok]
        wg, wu, wd = w_gate.dequantize(e), w_up.dequantize(e), w_down.dequantize(e)
        if bf16_w:
            wg, wu, wd = wg.bfloat16().float(), wu.bfloat16().float(), wd.bfloat16().float()
        gate, up = F.linear(xe, wg), F.linear(xe, wu)
        if bf16_gate_up:
            gate, up = gate.bfloat16().float(), up.bfloat16().float()
        h = F.silu(gate) * up
        if bf16_h:
            h = h.bfloat16().float()
        if w8a8:
            h = fake_quant_act(h, g_down)
        y = F.linear(h, wd) * topk_weights[tok, slot].float().unsqueeze(1)
        if bf16_y:
            y = y.bfloat16().float()
        out.index_add_(0, tok, y)
    return out
