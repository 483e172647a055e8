"""Decode and extend attention (paper Section 6; SGLang's CPU extend/decode), torch tensors in and out.
Re-exported by hinabench.kernels: `from hinabench.kernels import decode_attention, extend_attention`.

    out = decode_attention(q, k_cache, v_cache, seq_lens, block_table=None)           # one token each
    plan = decode_attention_plan(q, k_cache, v_cache, seq_lens, ...); out = plan()    # checked once, run often
    out = extend_attention(q, k_cache, v_cache, prefix_lens, extend_lens, block_table=None)

The KV cache is read in place, in the framework's layout (never copied or repacked):
  contiguous  k_cache, v_cache [B, h_kv, L, d] (Hugging Face's cache; L >= every sequence's length)
  paged       k_cache, v_cache [num_blocks, block_size, h_kv, d] with block_table [B, max_blocks] int32
              (vLLM/SGLang); any strides with d contiguous, so vLLM-CPU's [num_blocks, h_kv,
              block_size, d] views pass too (head_major=True tells which of the two a 4-D paged cache is).
decode: q [B, h_q, d]; sequence b attends to its keys [0, seq_lens[b]) (its new token's K/V already
        written at position seq_lens[b] - 1). Returns [B, h_q, d] bf16.
extend: q [sum(extend_lens), h_q, d], sequences' tokens one after the other; sequence b has
        prefix_lens[b] cached keys then extend_lens[b] new ones (also already in the cache, at positions
        prefix .. prefix + n - 1); new token t sees keys [0, prefix + t] (causal). Returns q's shape.
GQA: query head i uses KV head i // (h_q // h_kv). sm_scale defaults to 1/sqrt(d).
Errors (ValueError): h_q not a multiple of h_kv, head_dim not a multiple of 16 or above 256 (DeepSeek's
MLA latent, 576, is not supported), a sequence with no keys (l = 0), a block-table entry outside
[0, num_blocks) for the blocks a sequence uses, wrong dtypes or shapes. IsaUnavailable for an ISA
without an attention micro-kernel here (scalar and avx2 today).
"""
from __future__ import annotations

import array
import functools
import itertools
import math
import os

import torch

from .kernels import IsaUnavailable, _module, _resolve, _threads

HEAD_DIM_MULTIPLE = 16
HEAD_DIM_MAX = 256


def attention_isas(isa: str = "avx2") -> list[str]:
    """The attention micro-kernels built into the module that runs `isa`."""
    return list(_module(isa).attention_isas())


def resolve_attention_isa(isa: str = "auto") -> str:
    """`auto`: the first usable real ISA that has an attention micro-kernel (avx2, else scalar)."""
    if isa == "auto":
        isa = os.environ.get("HINA_ATTN_ISA", "").strip() or "auto"
    return _resolve_attention(isa)


@functools.lru_cache(maxsize=None)   # the CPU and the built modules do not change under a running process
def _resolve_attention(isa: str) -> str:
    isa = _resolve(isa, tuple(_module("scalar").attention_isas()))
    if isa not in _module(isa).attention_isas():
        raise IsaUnavailable(f"isa '{isa}' has no attention micro-kernel yet (built: "
                             f"{', '.join(_module(isa).attention_isas())})")
    return isa


def _bf16(name: str, t, dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor")
    if t.device.type != "cpu" or t.dtype != torch.bfloat16:
        raise ValueError(f"{name} must be a bfloat16 CPU tensor (got {t.dtype} on {t.device})")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions (got shape {tuple(t.shape)})")
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        raise ValueError(f"{name} must be contiguous along head_dim (strides {t.stride()})")


def _ints(name: str, t, B: int) -> list[int]:
    """B integers (a list, a tuple or a 1-D integer tensor) as a list of Python ints."""
    if isinstance(t, (list, tuple)) and len(t) == B and all(isinstance(x, int) for x in t):
        return list(t)
    t = torch.as_tensor(t)
    if t.dim() != 1 or t.shape[0] != B or t.dtype.is_floating_point:
        raise ValueError(f"{name} must be {B} integers (got {tuple(t.shape)} {t.dtype})")
    return t.tolist()


class AttentionPlan:
    """One attention call, checked and laid out once; calling it runs the operator into `out` (the same
    tensor every call) and returns it. What a framework does per decode step: the lengths, the block
    table and the strides are the step's metadata, built once and shared by every layer.
    The tensors it was made from are kept alive and must keep their shapes; their contents may change."""

    def __init__(self, fn, out: torch.Tensor, keep: tuple):
        self._fn, self.out, self._keep = fn, out, keep

    def __call__(self) -> torch.Tensor:
        self._fn()
        return self.out


def _plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ql: list[int], kl: list[int],
          block_table, head_major: bool, sm_scale, isa: str, threads, kv_splits: int) -> AttentionPlan:
    # Lengths are checked as Python ints: at a decode step's short contexts a few torch ops here cost
    # as much as the kernel.
    _bf16("q", q, 3)
    _bf16("k_cache", k_cache, 4)
    _bf16("v_cache", v_cache, 4)
    T, h_q, d = q.shape
    B = len(kl)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    if block_table is None:
        Bc, h_kv, L, dk = (int(s) for s in k_cache.shape)
        if Bc < B:
            raise ValueError(f"the contiguous cache holds {Bc} sequences, the call has {B}")
        if max(kl) > L:
            raise ValueError(f"a sequence has {max(kl)} keys, the contiguous cache holds {L}")
        ks, vs = ((t.stride(0), t.stride(2), t.stride(1), 0) for t in (k_cache, v_cache))
        bt_ptr, bt_stride, block_size, num_blocks = 0, 0, 0, 0
    else:
        if head_major:
            nb, h_kv, block_size, dk = (int(s) for s in k_cache.shape)
            ks, vs = ((0, t.stride(2), t.stride(1), t.stride(0)) for t in (k_cache, v_cache))
        else:
            nb, block_size, h_kv, dk = (int(s) for s in k_cache.shape)
            ks, vs = ((0, t.stride(1), t.stride(2), t.stride(0)) for t in (k_cache, v_cache))
        num_blocks = nb
        bt = block_table if isinstance(block_table, torch.Tensor) else torch.as_tensor(block_table)
        if bt.dim() != 2 or bt.shape[0] != B or bt.dtype.is_floating_point:
            raise ValueError(f"block_table must be [B={B}, max_blocks] integers (got {tuple(bt.shape)} {bt.dtype})")
        need = (max(kl) + block_size - 1) // block_size
        if need > bt.shape[1]:
            raise ValueError(f"a sequence of {max(kl)} keys needs {need} blocks of "
                             f"{block_size}; block_table has {bt.shape[1]} columns")
        # The entries a sequence uses are range-checked by the operator (ValueError "... is outside
        # [0, num_blocks)"): torch ops here cost more than a decode step's kernel at short contexts.
        if bt.dtype != torch.int32 or not bt.is_contiguous():
            # clamped first, so that an entry past int32 cannot wrap into range: it stays out of range
            bt = bt.clamp(-1, nb).to(torch.int32).contiguous()
        bt_ptr, bt_stride = bt.data_ptr(), bt.shape[1]
    if dk != d:
        raise ValueError(f"q has head_dim {d}, the cache {dk}")
    if h_q % h_kv:
        raise ValueError(f"h_q = {h_q} is not a multiple of h_kv = {h_kv} (GQA groups must be whole)")
    if d % HEAD_DIM_MULTIPLE or d > HEAD_DIM_MAX or d < 1:
        raise ValueError(f"head_dim {d} is not supported (multiples of {HEAD_DIM_MULTIPLE} up to {HEAD_DIM_MAX}; "
                         "DeepSeek's MLA latent, 576, is not)")
    if min(ql) < 1:
        raise ValueError("every sequence needs at least one query token")
    if min(kl) < 1 or any(k < n for k, n in zip(kl, ql)):
        raise ValueError("a sequence has no keys to attend to (l = 0), or fewer keys than query tokens")
    if sum(ql) != T:
        raise ValueError(f"q has {T} tokens, the lengths say {sum(ql)}")
    isa = resolve_attention_isa(isa)
    threads = _threads(threads)
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    # q_start [B+1], kv_len [B] as int32 (a Python array: no torch op; a decode step's layers each pay it)
    lens = array.array("i", [0, *itertools.accumulate(ql), *kl])
    lens_ptr = lens.buffer_info()[0]
    out = torch.empty(T, h_q, d, dtype=torch.bfloat16)
    fn = functools.partial(
        _module(isa).attention, q=q.data_ptr(), q_ts=q.stride(0), q_hs=q.stride(1), out=out.data_ptr(),
        o_ts=out.stride(0), o_hs=out.stride(1), k=k_cache.data_ptr(), v=v_cache.data_ptr(), k_strides=list(ks),
        v_strides=list(vs), block_table=bt_ptr, bt_stride=bt_stride, block_size=block_size,
        num_blocks=num_blocks, B=B, h_q=h_q, h_kv=h_kv, d=d, q_start=lens_ptr,
        kv_len=lens_ptr + 4 * (B + 1), sm_scale=scale, kv_splits=int(kv_splits), isa=isa, threads=threads)
    return AttentionPlan(fn, out, (q, k_cache, v_cache, bt if block_table is not None else None, lens))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens, *,
                     block_table=None, head_major: bool = False, sm_scale: float | None = None,
                     isa: str = "auto", threads: int | None = None, kv_splits: int = 0) -> torch.Tensor:
    """One new token per sequence; see the module docstring. kv_splits 0: chosen per call."""
    return decode_attention_plan(q, k_cache, v_cache, seq_lens, block_table=block_table, head_major=head_major,
                                 sm_scale=sm_scale, isa=isa, threads=threads, kv_splits=kv_splits)()


def decode_attention_plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens, *,
                          block_table=None, head_major: bool = False, sm_scale: float | None = None,
                          isa: str = "auto", threads: int | None = None, kv_splits: int = 0) -> AttentionPlan:
    """decode_attention checked and laid out once (AttentionPlan): plan() runs it."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q must be [B, h_q, d]")
    B = int(q.shape[0])
    lens = _ints("seq_lens", seq_lens, B)
    return _plan(q, k_cache, v_cache, [1] * B, lens, block_table, head_major, sm_scale, isa, threads, kv_splits)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens, extend_lens, *,
                     block_table=None, head_major: bool = False, sm_scale: float | None = None,
                     isa: str = "auto", threads: int | None = None, kv_splits: int = 0) -> torch.Tensor:
    """n new tokens per sequence over a cached prefix (rectangle + causal triangle, one online softmax)."""
    return extend_attention_plan(q, k_cache, v_cache, prefix_lens, extend_lens, block_table=block_table,
                                 head_major=head_major, sm_scale=sm_scale, isa=isa, threads=threads,
                                 kv_splits=kv_splits)()


def extend_attention_plan(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens,
                          extend_lens, *, block_table=None, head_major: bool = False,
                          sm_scale: float | None = None, isa: str = "auto", threads: int | None = None,
                          kv_splits: int = 0) -> AttentionPlan:
    """extend_attention checked and laid out once (AttentionPlan): plan() runs it."""
    ext = torch.as_tensor(extend_lens)
    B = int(ext.shape[0]) if ext.dim() == 1 else -1
    if B < 1:
        raise ValueError("extend_lens must be a 1-D list of at least one length")
    ext = _ints("extend_lens", ext, B)
    pre = _ints("prefix_lens", prefix_lens, B)
    if min(pre) < 0:
        raise ValueError("prefix_lens must be >= 0")
    return _plan(q, k_cache, v_cache, ext, [p + e for p, e in zip(pre, ext)], block_table, head_major, sm_scale,
                 isa, threads, kv_splits)


def attention_fused_step(enabled: bool | None = None, *, isa: str = "auto") -> bool:
    """Whether `isa`'s attention kernel runs an unmasked chunk as one fused step (scores, online softmax
    and P x V for every query row at once; the AVX-512 BF16 kernel has one) or as three calls (the same
    bits; for tests and ablations); sets it when given, for this process and that ISA's module. Returns
    the setting."""
    return bool(_module(resolve_attention_isa(isa)).attention_fused_step(enabled))


def attention_last_schedule(isa: str = "auto") -> dict:
    """How the last call on this ISA's module was scheduled: tasks, KV splits, query rows per task."""
    return dict(_module(resolve_attention_isa(isa)).attention_last_schedule())
