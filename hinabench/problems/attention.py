"""Decode and extend attention over a bf16 KV cache (paper Section 6; SGLang's CPU extend/decode).

    hinabench attn --model qwen3-30b-a3b --phase decode --context 1024,4096 --batch 1,4 --layout paged

phase    decode: one new token per sequence attends to its `context` keys (its own K/V already in the
         cache, as vLLM writes them before attention); extend: `extend` new tokens over a cached prefix
         of `context` keys (the new tokens' K/V also in the cache after the prefix), causal.
layout   contiguous: Hugging Face's cache, K and V [B, h_kv, L, d] each;
         paged: vLLM/SGLang blocks, K and V [num_blocks, block_size, h_kv, d] each, and a block table
         [B, max_blocks] int32 whose entries are a shuffled permutation (no two neighbours adjacent).
ragged   sequence b has context - (context // 2) * b // (B - 1) keys (context down to context / 2);
         otherwise all B have `context`.
Bytes    the KV bytes one call must read: sum over sequences of keys x h_kv x d x 2 (K, V) x 2 bytes
         (`weight_bytes`, the roofline's memory term); flops: 4 x h_q x d per (query, visible key) pair.
Cache    rotation groups (problems/base.py) are whole KV caches (one per layer, in a model): at short
         contexts calls rotate over enough caches that the KV streams from DRAM, as in a decode step.
Reference: fp32 SDPA on the gathered (un-paged) K and V with GQA expansion (repeat_interleave), one
         sequence at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..dtypes import get_dtype
from ..errors import UserError
from ..models import Model, get_model
from .base import Problem, ProblemData, fill_bf16, place, seed_for

PHASES = ("decode", "extend")
LAYOUTS = ("contiguous", "paged")
BLOCK_SIZES = (16, 32, 64, 128)
DEFAULT_BLOCK_SIZE = 32    # vLLM-CPU's attention takes multiples of 32 only


@dataclass(frozen=True)
class AttentionProblem(Problem):
    kind: ClassVar[str] = "attention"
    key_columns: ClassVar[tuple[str, ...]] = ("model", "dtype", "phase", "layout", "block_size", "batch",
                                              "context", "extend", "ragged")
    columns: ClassVar[tuple[str, ...]] = key_columns + ("h_q", "h_kv", "head_dim", "kv_tokens")

    model: Model
    phase: str
    batch: int
    context: int
    extend: int = 1            # query tokens per sequence (decode: 1)
    layout: str = "paged"
    block_size: int = DEFAULT_BLOCK_SIZE   # paged only (0 for contiguous)
    ragged: bool = False
    dtype: str = "bf16"
    seed: int = 0
    lengths: tuple[int, ...] | None = None  # explicit per-sequence contexts (tests); overrides ragged

    @classmethod
    def create(cls, model: str | Model, phase: str, batch: int, context: int, extend: int | None = None,
               layout: str = "paged", block_size: int | None = None, ragged: bool = False,
               dtype: str = "bf16", seed: int = 0, lengths=None) -> "AttentionProblem":
        m = model if isinstance(model, Model) else get_model(model)
        phase = str(phase).strip().lower()
        layout = str(layout).strip().lower()
        if extend is None:
            extend = 1 if phase == "decode" else 128
        if block_size is None:
            block_size = DEFAULT_BLOCK_SIZE if layout == "paged" else 0
        if layout == "contiguous":
            block_size = 0
        p = cls(m, phase, int(batch), int(context), int(extend), layout, int(block_size), bool(ragged), dtype,
                int(seed), tuple(int(x) for x in lengths) if lengths is not None else None)
        p.validate()
        return p

    @classmethod
    def custom(cls, h_q: int, h_kv: int, head_dim: int, lengths, phase: str = "decode", extend: int = 1,
               layout: str = "paged", block_size: int = 16, seed: int = 0) -> "AttentionProblem":
        m = _shape_model(f"custom-{h_q}x{h_kv}x{head_dim}", h_q, h_kv, head_dim)
        lengths = [int(x) for x in lengths]
        return cls.create(m, phase, len(lengths), max(lengths), extend, layout, block_size, len(set(lengths)) > 1,
                          "bf16", seed, lengths)

    def validate(self) -> None:
        get_dtype(self.dtype)
        why = self.model.attention_unsupported()
        if why:
            raise UserError(f"{self.model.name}: {why}")
        if self.phase not in PHASES:
            raise UserError(f"phase must be one of {', '.join(PHASES)} (got '{self.phase}')")
        if self.layout not in LAYOUTS:
            raise UserError(f"layout must be one of {', '.join(LAYOUTS)} (got '{self.layout}')")
        if self.batch < 1:
            raise UserError(f"batch must be at least 1 (got {self.batch})")
        if self.phase == "decode" and self.context < 1:
            raise UserError(f"decode needs a context of at least 1 key (got {self.context})")
        if self.phase == "extend" and self.context < 0:
            raise UserError(f"extend needs a prefix of at least 0 keys (got {self.context})")
        if self.phase == "decode" and self.extend != 1:
            raise UserError("decode has one new token per sequence (--extend is for --phase extend)")
        if self.extend < 1:
            raise UserError(f"extend needs at least 1 new token (got {self.extend})")
        if self.layout == "paged" and self.block_size < 1:
            raise UserError(f"block_size must be positive (got {self.block_size})")
        if self.lengths is not None and (len(self.lengths) != self.batch or min(self.lengths) < (
                1 if self.phase == "decode" else 0)):
            raise UserError(f"lengths must be {self.batch} contexts, each >= 1 (decode) or >= 0 (extend)")

    # ---- shapes --------------------------------------------------------------------------------------
    @property
    def h_q(self) -> int:
        return self.model.attention_heads

    @property
    def h_kv(self) -> int:
        return self.model.kv_heads

    @property
    def head_dim(self) -> int:
        return self.model.head_dim

    @property
    def q_tokens(self) -> int:
        """Query tokens per sequence (decode 1, extend n)."""
        return 1 if self.phase == "decode" else self.extend

    def contexts(self) -> list[int]:
        """Per sequence: the keys before its query tokens (decode: its keys minus its new one... see
        kv_lens; here the `context` axis value per sequence)."""
        if self.lengths is not None:
            return list(self.lengths)
        if not self.ragged or self.batch == 1:
            return [self.context] * self.batch
        return [self.context - (self.context // 2) * b // (self.batch - 1) for b in range(self.batch)]

    def kv_lens(self) -> list[int]:
        """Keys each sequence's last query sees: decode `context` (the new token's K/V included),
        extend prefix + n."""
        extra = 0 if self.phase == "decode" else self.extend
        return [c + extra for c in self.contexts()]

    @property
    def batch_tokens(self) -> int:
        return self.batch * self.q_tokens

    @property
    def kv_tokens(self) -> int:
        return sum(self.kv_lens())

    @property
    def weight_bytes(self) -> int:
        """KV bytes one call reads: every visible key's K and V row of every KV head, once."""
        return int(self.kv_tokens * self.h_kv * self.head_dim * 2 * self.dt.element_bytes)

    @property
    def flops(self) -> int:
        """QK^T and PV: 2 x 2 x d per (query head, visible key); causal pairs only."""
        n = self.q_tokens
        pairs = sum(n * (L - n) + n * (n + 1) // 2 for L in self.kv_lens())
        return 4 * self.h_q * self.head_dim * pairs

    def blocks_per_seq(self) -> list[int]:
        return [math.ceil(L / self.block_size) for L in self.kv_lens()] if self.layout == "paged" else []

    @property
    def group_bytes(self) -> int:
        row = self.h_kv * self.head_dim * 2 * int(self.dt.element_bytes)   # K and V of one token
        if self.layout == "paged":
            return sum(self.blocks_per_seq()) * self.block_size * row
        return self.batch * max(self.kv_lens()) * row

    @property
    def tolerance(self) -> float:
        return self.dt.tolerance

    def allocated_bytes(self, groups: int) -> int:
        return groups * self.group_bytes + 2 * self.batch_tokens * self.h_q * self.head_dim * 2

    def reference_bytes(self) -> int:
        L = max(self.kv_lens())
        return 2 * L * self.h_kv * self.head_dim * 4 + self.q_tokens * self.h_q * L * 4 * 2 \
            + self.batch_tokens * self.h_q * self.head_dim * 4

    def matrices(self) -> list[tuple]:
        return []

    def remote_model(self, policy: str, partition: str, placement: dict) -> dict:
        return {"work_partition": partition, "remote_fraction_model": None,
                "remote_fraction_basis": "not modeled for a KV cache (the placement model is for weight matrices)"}

    # ---- identity ------------------------------------------------------------------------------------
    def key(self) -> dict:
        return {"model": self.model.name, "dtype": self.dtype, "phase": self.phase, "layout": self.layout,
                "block_size": self.block_size, "batch": self.batch, "context": self.context,
                "extend": self.q_tokens if self.phase == "extend" else 0, "ragged": self.ragged,
                "h_q": self.h_q, "h_kv": self.h_kv, "head_dim": self.head_dim, "kv_tokens": self.kv_tokens}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.model.name, "h_q": self.h_q, "h_kv": self.h_kv,
                "head_dim": self.head_dim, "phase": self.phase, "batch": self.batch, "context": self.context,
                "extend": self.extend, "layout": self.layout, "block_size": self.block_size,
                "ragged": self.ragged, "dtype": self.dtype, "seed": self.seed,
                "lengths": list(self.lengths) if self.lengths is not None else None}

    @classmethod
    def from_dict(cls, d: dict) -> "AttentionProblem":
        m = _shape_model(d["name"], int(d["h_q"]), int(d["h_kv"]), int(d["head_dim"]))
        return cls.create(m, d["phase"], int(d["batch"]), int(d["context"]), int(d["extend"]), d["layout"],
                          int(d["block_size"]), bool(d["ragged"]), d["dtype"], int(d["seed"]), d.get("lengths"))

    def __str__(self) -> str:
        what = f"l={self.context}" if self.phase == "decode" else f"prefix={self.context} n={self.extend}"
        lay = f"paged/{self.block_size}" if self.layout == "paged" else "contiguous"
        return (f"{self.model.name} attn {self.phase} B={self.batch}{' ragged' if self.ragged else ''} {what} "
                f"{lay} [{self.h_q}q/{self.h_kv}kv x {self.head_dim}] {self.dtype}")

    # ---- data ----------------------------------------------------------------------------------------
    def materialize(self, llc_bytes: int | None = None, rotate: bool = True,
                    numa: str = "default") -> "AttentionData":
        from ..machine.sysinfo import llc_bytes as detect_llc
        groups = self.rotation_groups(llc_bytes or detect_llc()) if rotate else 1
        dt = self.dt.torch_dtype
        h_kv, d = self.h_kv, self.head_dim
        kv_lens = self.kv_lens()
        q = torch.empty(self.batch_tokens, self.h_q, d, dtype=dt)
        fill_bf16(q, seed_for(self.seed, "attn-q"), 1.0)
        if self.layout == "paged":
            per_group = sum(self.blocks_per_seq())
            shape = (groups * per_group, self.block_size, h_kv, d)
        else:
            shape = (groups, self.batch, h_kv, max(kv_lens), d)
        k = torch.empty(shape, dtype=dt)
        v = torch.empty(shape, dtype=dt)
        place(k, numa)
        place(v, numa)
        fill_bf16(k, seed_for(self.seed, "attn-k"), 1.0)
        fill_bf16(v, seed_for(self.seed, "attn-v"), 1.0)
        tables = None
        if self.layout == "paged":
            gen = torch.Generator().manual_seed(seed_for(self.seed, "attn-blocks") & 0x7FFFFFFF)
            nb = self.blocks_per_seq()
            width = max(nb)
            tables = torch.zeros(groups, self.batch, width, dtype=torch.int32)
            for g in range(groups):   # the group's own blocks, in a shuffled order
                perm = torch.randperm(per_group, generator=gen).to(torch.int32) + g * per_group
                at = 0
                for b, n in enumerate(nb):
                    tables[g, b, :n] = perm[at: at + n]
                    at += n
        return AttentionData(self, groups, q, numa, k=k, v=v, block_tables=tables,
                             kv_lens=torch.tensor(kv_lens, dtype=torch.int32),
                             q_lens=torch.full((self.batch,), self.q_tokens, dtype=torch.int32))


def _shape_model(name: str, h_q: int, h_kv: int, head_dim: int) -> Model:
    """A registry-shaped Model carrying only what attention reads (the FFN fields are placeholders)."""
    return Model(name, h_q * head_dim, 1, 1, 1, 0, 1, h_q, h_kv, head_dim, 1, "attention shape only")


@dataclass
class AttentionData(ProblemData):
    k: torch.Tensor = None              # paged [groups * blocks, block_size, h_kv, d]; contiguous [groups, B, h_kv, L, d]
    v: torch.Tensor = None
    block_tables: torch.Tensor | None = None   # [groups, B, max_blocks] int32 (paged)
    kv_lens: torch.Tensor = None        # [B] int32: keys the last query of each sequence sees
    q_lens: torch.Tensor = None         # [B] int32: query tokens per sequence

    @property
    def q(self) -> torch.Tensor:
        return self.x

    def cache(self, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(K, V, block table or None) of rotation group `group`, as the kernels take them."""
        if self.block_tables is None:
            return self.k[group], self.v[group], None
        return self.k, self.v, self.block_tables[group]

    def prefix_lens(self) -> torch.Tensor:
        return (self.kv_lens - self.q_lens).to(torch.int64)

    def weights(self) -> list[torch.Tensor]:
        return [self.k, self.v]

    def group_buffers(self, group: int) -> list[tuple[int, int]]:
        p = self.problem
        if self.block_tables is None:
            return [(t[group].data_ptr(), t[group].numel() * t[group].element_size()) for t in (self.k, self.v)]
        per = sum(p.blocks_per_seq())
        out = []
        for t in (self.k, self.v):
            blk = t[0].numel() * t.element_size()
            out.append((t.data_ptr() + group * per * blk, per * blk))
        return out

    def gathered(self, group: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence b's keys and values, un-paged: [L, h_kv, d] each (views or copies)."""
        L = int(self.kv_lens[b])
        k, v, table = self.cache(group)
        if table is None:
            return k[b, :, :L].transpose(0, 1), v[b, :, :L].transpose(0, 1)
        bs = self.problem.block_size
        ids = table[b, : (L + bs - 1) // bs].long()
        return (k[ids].reshape(-1, k.shape[2], k.shape[3])[:L], v[ids].reshape(-1, v.shape[2], v.shape[3])[:L])

    def slots(self, group: int, b: int) -> torch.Tensor:
        """Sequence b's token slots in the paged cache of rotation group `group` (block id * block_size +
        offset, int64 [L], in the order of `gathered`): where a framework's cache writer (vLLM's, IPEX's
        reshape_and_cache) puts each key and value, so a peer's own cache keeps the same block tables."""
        L, bs = int(self.kv_lens[b]), self.problem.block_size
        pos = torch.arange(L)
        return self.block_tables[group][b, pos // bs].long() * bs + pos % bs

    def compute_reference(self, group: int) -> torch.Tensor:
        p = self.problem
        G, d = p.h_q // p.h_kv, p.head_dim
        out = torch.empty(self.x.shape[0], p.h_q, d, dtype=torch.float32)
        starts = [0] + torch.cumsum(self.q_lens, 0).tolist()
        for b in range(p.batch):
            k, v = self.gathered(group, b)
            L, n = int(self.kv_lens[b]), int(self.q_lens[b])
            out[starts[b]: starts[b + 1]] = sdpa_reference(self.x[starts[b]: starts[b + 1]], k, v, L - n, G)
        return out


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, G: int) -> torch.Tensor:
    """fp32 attention of q [n, h_q, d] over k, v [L, h_kv, d] (L = prefix + n), GQA-expanded, causal:
    query t sees keys [0, prefix + t]. Returns [n, h_q, d] float32."""
    n, h_q, d = q.shape
    L = k.shape[0]
    qf = q.float().transpose(0, 1)                                  # [h_q, n, d]
    kf = k.float().repeat_interleave(G, dim=1).transpose(0, 1)      # [h_q, L, d]
    vf = v.float().repeat_interleave(G, dim=1).transpose(0, 1)
    s = torch.matmul(qf, kf.transpose(1, 2)) / math.sqrt(d)          # [h_q, n, L]
    pos = torch.arange(L).unsqueeze(0) > (prefix + torch.arange(n)).unsqueeze(1)
    s.masked_fill_(pos, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), vf).transpose(0, 1).contiguous()
