"""One decoder layer's decode step as one native call (kernels/ops/layer.h), torch tensors in and out.

    layer = decoder_layer_prepare(experts=moe_ffn_prepare(...), in_norm=..., post_norm=..., wq=..., wk=...,
                                  wv=..., wo=..., router=..., h_q=32, h_kv=4, eps=1e-6, top_k=8, ...)
    out = layer(x, cos, sin, k_cache, v_cache, pos)
    out = PreparedStack([layer0, layer1, ...])(x, cos, sin, k_caches, v_caches, pos)   # every layer, one call

The layer is the Qwen3-MoE / Mixtral decoder layer as transformers writes it (RMSNorm, q/k/v, Qwen3's
per-head q/k RMSNorm when q_norm and k_norm are given, rotary, the KV append, attention, o, the residual,
RMSNorm, the router's softmax and top-k, the experts, the residual), on the HiNa kernels (linear,
decode_attention, moe_ffn) with the glue between them in C++: what hinabench/e2e/dropin_layer.py drops into
transformers. Every weight is read in place (nn.Linear's [N, K] layout, the experts as moe_ffn_prepare or
moe_ffn_quant_prepare laid them out), never copied.

x [B, H] bf16: one new token per sequence; cos, sin [B, d] bf16 (the model's rotary tables at the new
positions); k_cache, v_cache [B, h_kv, L, d] bf16 with d contiguous (Hugging Face's cache; L > pos): the
new token's K and V are written at position `pos` and attention reads positions [0, pos]. Returns [B, H].
"""
from __future__ import annotations

import math

import torch

from .kernels import PreparedMoe, _module, _Prepared, _threads, linear_prepare


def _vector(name: str, t, n: int) -> None:
    if not (isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
            and t.shape == (n,) and t.is_contiguous()):
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a contiguous bfloat16 CPU vector of {n} (got {got})")


def _matrix(name: str, w, shape: tuple[int, int]) -> None:
    if not (isinstance(w, torch.Tensor) and w.dim() == 2 and tuple(w.shape) == shape):
        got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{name} must be {list(shape)} (got {got})")
    if not (w.dtype == torch.bfloat16 and w.device.type == "cpu" and w.stride(1) == 1 and w.stride(0) >= shape[1]):
        raise ValueError(f"{name} must be a bfloat16 CPU tensor with rows contiguous along K (got {w.dtype}, "
                         f"strides {w.stride()})")


class PreparedLayer(_Prepared):
    """decoder_layer_prepare's result: the layer's weights checked once; calling it runs a decode step."""

    def __init__(self, mod, call, weights: tuple, experts: PreparedMoe, H: int, h_kv: int, d: int):
        super().__init__(weights)
        self._mod, self._call, self.experts = mod, call, experts
        self.H, self.h_kv, self.d = H, h_kv, d

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, pos: int, *, threads: int | None = None) -> torch.Tensor:
        return _decode(self, [self._call], x, cos, sin, [k_cache], [v_cache], pos, threads)


class PreparedStack:
    """Prepared layers (decoder_layer_prepare, one module, one H and KV geometry) run in turn as one native
    call: layer i appends to k_caches[i], v_caches[i] at `pos`, its output the next layer's input."""

    def __init__(self, layers: list[PreparedLayer]):
        if not layers or any(not isinstance(p, PreparedLayer) for p in layers):
            raise ValueError("a stack needs at least one PreparedLayer")
        first = layers[0]
        if any((p._mod, p.H, p.h_kv, p.d) != (first._mod, first.H, first.h_kv, first.d) for p in layers):
            raise ValueError("every layer of a stack must share its module, H, h_kv and head dim")
        self.layers = list(layers)
        self._calls = [p._call for p in layers]
        self._mod, self.H, self.h_kv, self.d = first._mod, first.H, first.h_kv, first.d

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_caches: list, v_caches: list,
                 pos: int, *, threads: int | None = None) -> torch.Tensor:
        if not (len(k_caches) == len(v_caches) == len(self.layers)):
            raise ValueError(f"one K and one V cache per layer ({len(self.layers)}), got {len(k_caches)} and {len(v_caches)}")
        return _decode(self, self._calls, x, cos, sin, k_caches, v_caches, pos, threads)


def _decode(prepared, calls, x, cos, sin, k_caches, v_caches, pos, threads) -> torch.Tensor:
    """The step's tensors checked, then the native call over `calls` (one layer's, or a stack's)."""
    B = _check_step(x, cos, sin, k_caches, v_caches, pos, prepared.H, prepared.h_kv, prepared.d)
    out = torch.empty(B, prepared.H, dtype=torch.bfloat16)
    k0 = k_caches[0]
    prepared._mod.decoder_stack_decode(calls, x.data_ptr(), B, cos.data_ptr(), sin.data_ptr(), cos.stride(0),
                                       [k.data_ptr() for k in k_caches], [v.data_ptr() for v in v_caches],
                                       k0.stride(0), k0.stride(2), k0.stride(1), int(pos), out.data_ptr(),
                                       _threads(threads))
    return out


def _check_step(x, cos, sin, k_caches, v_caches, pos, H: int, h_kv: int, d: int) -> int:
    """A decode step's tensors checked (ValueError otherwise); returns B. Every cache must share the first
    K cache's geometry (shape, strides), which the native call uses for all."""
    if not (x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[1] == H and x.shape[0] > 0 and x.is_contiguous()):
        raise ValueError(f"x must be a contiguous bfloat16 [B, {H}] tensor with B >= 1 (got {tuple(x.shape)} {x.dtype})")
    B = x.shape[0]
    for name, t in (("cos", cos), ("sin", sin)):
        if not (t.dtype == torch.bfloat16 and t.shape == (B, d) and t.stride(1) == 1):
            raise ValueError(f"{name} must be bfloat16 [{B}, {d}] with d contiguous (got {tuple(t.shape)} {t.dtype})")
    if cos.stride() != sin.stride():
        raise ValueError("cos and sin must have the same strides")
    if not (0 <= pos < 2**31 - 1):
        raise ValueError(f"pos must be in [0, 2^31 - 1) (got {pos})")
    k0 = k_caches[0]
    if not (k0.dtype == torch.bfloat16 and k0.dim() == 4 and k0.shape[0] == B and k0.shape[1] == h_kv
            and k0.shape[3] == d and k0.stride(3) == 1):
        raise ValueError(f"k_cache must be bfloat16 [{B}, {h_kv}, L, {d}] with d contiguous "
                         f"(got {tuple(k0.shape)} {k0.dtype}, strides {k0.stride()})")
    if k0.shape[2] <= pos:
        raise ValueError(f"k_cache holds {k0.shape[2]} positions: no room for position {pos}")
    shape, strides = k0.shape, k0.stride()
    for name, caches in (("k_cache", k_caches), ("v_cache", v_caches)):
        for c in caches:
            if not (c.dtype == torch.bfloat16 and c.shape == shape and c.stride() == strides):
                raise ValueError(f"{name} must match the first K cache: bfloat16 {tuple(shape)}, strides {strides} "
                                 f"(got {tuple(c.shape)} {c.dtype}, strides {c.stride()})")
    return B


def decoder_layer_prepare(*, experts: PreparedMoe, in_norm, post_norm, wq, wk, wv, wo, router, h_q: int, h_kv: int,
                          eps: float, top_k: int, norm_topk: bool = True, topk_bf16: bool = False, q_norm=None,
                          k_norm=None, sm_scale: float | None = None, attn_isa: str = "auto") -> PreparedLayer:
    """One decoder layer's weights checked once. `experts` (moe_ffn_prepare / moe_ffn_quant_prepare) fixes
    the ISA of the experts and the projections; attention's is resolved from `attn_isa` and must live in
    the same module. norm_topk: the top-k weights divided by their sum; topk_bf16: then rounded to bf16
    (Qwen3's router does; Mixtral's keeps fp32)."""
    from .kernels_attention import resolve_attention_isa
    if not isinstance(experts, PreparedMoe):
        raise ValueError("experts must be what moe_ffn_prepare or moe_ffn_quant_prepare returned")
    H, E = experts.H, experts.E
    if not (h_q > 0 and h_kv > 0 and h_q % h_kv == 0):
        raise ValueError(f"h_q ({h_q}) must be a positive multiple of h_kv ({h_kv})")
    if not (isinstance(wq, torch.Tensor) and wq.dim() == 2 and wq.shape[0] % h_q == 0):
        raise ValueError("wq must be [h_q * d, H]")
    d = wq.shape[0] // h_q
    if d % 2:
        raise ValueError(f"the head dim must be even (got {d})")
    if not (1 <= top_k <= E):
        raise ValueError(f"top_k must be in [1, {E}] (got {top_k})")
    _vector("in_norm", in_norm, H)
    _vector("post_norm", post_norm, H)
    if (q_norm is None) != (k_norm is None):
        raise ValueError("q_norm and k_norm go together")
    if q_norm is not None:
        _vector("q_norm", q_norm, d)
        _vector("k_norm", k_norm, d)
    for name, w, shape in (("wq", wq, (h_q * d, H)), ("wk", wk, (h_kv * d, H)), ("wv", wv, (h_kv * d, H)),
                           ("wo", wo, (H, h_q * d)), ("router", router, (E, H))):
        _matrix(name, w, shape)
    isa = experts._call.isa
    linear_prepare([wq, wk, wv], isa=isa)   # the linear kernel's own checks (multiples of 32)
    linear_prepare([wo], isa=isa)
    attn = resolve_attention_isa(attn_isa)
    mod = _module(isa)
    if _module(attn) is not mod:
        raise ValueError(f"the experts' ISA ({isa}) and attention's ({attn}) live in different modules")
    ptr = lambda t: 0 if t is None else t.data_ptr()   # noqa: E731
    call = mod.DecoderLayer(experts._call, H=H, h_q=h_q, h_kv=h_kv, d=d, eps=float(eps), in_norm=ptr(in_norm),
                            post_norm=ptr(post_norm), q_norm=ptr(q_norm), k_norm=ptr(k_norm),
                            wq=ptr(wq), ldq=wq.stride(0), wk=ptr(wk), ldk=wk.stride(0), wv=ptr(wv), ldv=wv.stride(0),
                            wo=ptr(wo), ldo=wo.stride(0), router=ptr(router), ldr=router.stride(0), E=E,
                            top_k=int(top_k), norm_topk=bool(norm_topk), topk_bf16=bool(topk_bf16),
                            sm_scale=float(1 / math.sqrt(d) if sm_scale is None else sm_scale),
                            linear_isa=isa, attn_isa=attn)
    weights = tuple(w for w in (in_norm, post_norm, q_norm, k_norm, wq, wk, wv, wo, router) if w is not None)
    return PreparedLayer(mod, call, weights + experts.weights, experts, H, h_kv, d)
