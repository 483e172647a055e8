"""torch's attention paths on the `attention` problem kind, in the harness's own process.

- `torch:sdpa`  F.scaled_dot_product_attention(q, k, v, enable_gqa=True) in bf16 (decode: no mask;
                extend: an explicit boolean mask, the prefix rectangle plus the causal triangle, since
                is_causal aligns the triangle top-left).
- `torch`       (the naive backend, torch_naive.py) runs `naive_attention`: what a model file writes
                (Hugging Face's eager_attention_forward): repeat_kv, matmul, + mask, softmax in fp32
                cast back to bf16, matmul.
Neither has a paged kernel: on the paged layout every call first gathers each sequence's blocks through
its block table (index_select, as a framework without a paged kernel must), inside the timed call.
A ragged batch runs one sequence at a time.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from . import register
from .base import Backend, Unsupported


# torch's paths allocate what the KV cache never needs: gathered blocks (paged), and G-expanded K and V
# (repeat_kv in the model file; SDPA's math fallback expands the same way), and the naive path's fp32
# scores. Points whose transient exceeds this are `unsupported` rows (the machine has 24 GiB for three
# engineers), with the size in the reason.
TRANSIENT_LIMIT = int(float(os.environ.get("HINABENCH_TORCH_ATTN_MAX_GIB", "3")) * 2**30)


def transient_bytes(p, naive: bool) -> int:
    """Bytes one call of torch's path allocates beyond the problem's tensors (an upper bound)."""
    G = p.h_q // p.h_kv
    kv = p.kv_tokens * p.h_kv * p.head_dim * 2 * 2
    out = kv if p.layout == "paged" else 0                 # the gathered copy
    out += kv * G                                          # K and V expanded to h_q heads
    if naive:
        out += p.batch * p.h_q * p.q_tokens * max(p.kv_lens()) * (4 + 2)   # fp32 scores, bf16 probabilities
    return out


def check_transient(p, naive: bool, name: str) -> None:
    need = transient_bytes(p, naive)
    if need > TRANSIENT_LIMIT:
        raise Unsupported(f"{name} would allocate ~{need / 2**30:.1f} GiB per call (gathered and G-expanded K/V"
                          f"{', fp32 scores' if naive else ''}), over HINABENCH_TORCH_ATTN_MAX_GIB = "
                          f"{TRANSIENT_LIMIT / 2**30:g}")


def _gather(data, group: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's K and V as [h_kv, L, d] bf16 (a view for the contiguous cache, a gather for paged)."""
    p = data.problem
    L = int(data.kv_lens[b])
    k, v, table = data.cache(group)
    if table is None:
        return k[b, :, :L], v[b, :, :L]
    bs = p.block_size
    ids = table[b, : (L + bs - 1) // bs]
    kk = k.index_select(0, ids).reshape(-1, p.h_kv, p.head_dim)[:L]
    vv = v.index_select(0, ids).reshape(-1, p.h_kv, p.head_dim)[:L]
    return kk.transpose(0, 1), vv.transpose(0, 1)


def _batched(data, group: int):
    """(q [B, h_q, n, d], k, v [B, h_kv, L, d], prefix) when every sequence has the same lengths; else None."""
    p = data.problem
    if len(set(data.kv_lens.tolist())) != 1:
        return None
    B, n = p.batch, p.q_tokens
    L = int(data.kv_lens[0])
    k, v, table = data.cache(group)
    if table is None:
        kk, vv = k[:, :, :L], v[:, :, :L]
    else:
        bs = p.block_size
        ids = table[:, : (L + bs - 1) // bs].reshape(-1)
        kk = k.index_select(0, ids).reshape(B, -1, p.h_kv, p.head_dim)[:, :L].transpose(1, 2)
        vv = v.index_select(0, ids).reshape(B, -1, p.h_kv, p.head_dim)[:, :L].transpose(1, 2)
    q = data.q.reshape(B, n, p.h_q, p.head_dim).transpose(1, 2)
    return q, kk, vv, L - n


def _mask(n: int, L: int, prefix: int) -> torch.Tensor:
    """[n, L] bool, True where query t may see key j: j <= prefix + t."""
    return torch.arange(L).unsqueeze(0) <= (prefix + torch.arange(n)).unsqueeze(1)


def _per_sequence(data, group: int, fn) -> torch.Tensor:
    p = data.problem
    out = torch.empty_like(data.q)
    at = 0
    for b in range(p.batch):
        n = int(data.q_lens[b])
        k, v = _gather(data, group, b)
        q = data.q[at: at + n].transpose(0, 1).unsqueeze(0)
        o = fn(q, k.unsqueeze(0), v.unsqueeze(0), int(data.kv_lens[b]) - n)
        out[at: at + n] = o[0].transpose(0, 1)
        at += n
    return out


def sdpa_attention(data, group: int) -> torch.Tensor:
    def fn(q, k, v, prefix):
        n, L = q.shape[2], k.shape[2]
        mask = None if n == 1 else _mask(n, L, prefix)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return _run(data, group, fn)


def naive_attention(data, group: int) -> torch.Tensor:
    def fn(q, k, v, prefix):
        G = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(G, dim=1)       # repeat_kv
        v = v.repeat_interleave(G, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(q.shape[-1]))
        n, L = q.shape[2], k.shape[2]
        if n > 1:
            w = w.masked_fill(~_mask(n, L, prefix), float("-inf"))
        w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(w, v)
    return _run(data, group, fn)


def _run(data, group: int, fn) -> torch.Tensor:
    p = data.problem
    same = _batched(data, group)
    if same is None:
        return _per_sequence(data, group, fn)
    q, k, v, prefix = same
    o = fn(q, k, v, prefix)                      # [B, h_q, n, d]
    return o.transpose(1, 2).reshape(p.batch * p.q_tokens, p.h_q, p.head_dim)


@register
class TorchSdpa(Backend):
    name = "torch:sdpa"
    description = ("torch F.scaled_dot_product_attention(enable_gqa=True), bf16; an explicit mask for extend; "
                   "paged blocks gathered per call")
    ops = ("attention",)

    def supports(self, data) -> None:
        super().supports(data)
        check_transient(data.problem, False, self.name)

    def run_attention(self, group: int) -> torch.Tensor:
        return sdpa_attention(self.data, group)
