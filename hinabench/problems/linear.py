"""One dense projection, y = x W^T (the attention block's QKV and O projections, the LM head).

The paper runs the projection matrix products on the same micro-kernels as the expert FFN; this kind
measures that: `hinabench linear --model qwen3-30b-a3b --proj qkv,o,lm_head --tokens 1,8,64`.
W is [N, K] row-major (nn.Linear's [out, in]), x is [B, K], y is [B, N]; shapes from the model
registry's `projections()`. Rotation groups (problems/base.py) are whole copies of W.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..dtypes import get_dtype
from ..errors import UserError
from ..models import Model, get_model
from .base import Problem, ProblemData, fill_bf16, place, seed_for


@dataclass(frozen=True)
class LinearProblem(Problem):
    kind: ClassVar[str] = "linear"
    key_columns: ClassVar[tuple[str, ...]] = ("model", "dtype", "proj", "batch_tokens")
    columns: ClassVar[tuple[str, ...]] = key_columns + ("out_features", "in_features")

    model: Model
    proj: str
    tokens: int
    dtype: str = "bf16"
    seed: int = 0

    @classmethod
    def create(cls, model: str | Model, proj: str, tokens: int, dtype: str = "bf16",
               seed: int = 0) -> "LinearProblem":
        m = model if isinstance(model, Model) else get_model(model)
        p = cls(m, str(proj).strip().lower(), int(tokens), dtype, int(seed))
        p.validate()
        return p

    @classmethod
    def custom(cls, out_features: int, in_features: int, tokens: int, dtype: str = "bf16",
               seed: int = 0) -> "LinearProblem":
        m = Model(f"custom-{out_features}x{in_features}", in_features, 1, 1, 1, 0, 1, 1, 1, 1, 1, "made up",
                  (("w", out_features, in_features),))
        return cls.create(m, "w", tokens, dtype, seed)

    def validate(self) -> None:
        if self.tokens < 1:
            raise UserError(f"batch tokens must be at least 1 (got {self.tokens})")
        if get_dtype(self.dtype).quantized:
            raise UserError(f"linear has no {self.dtype} path yet: quantized dtypes are for the expert FFN "
                            "(hinabench ffn --dtype int8,fp8)")
        projs = self.model.projections()
        if self.proj not in projs:
            raise UserError(f"{self.model.name} has no projection '{self.proj}'; it has: {', '.join(projs)}")
        if min(projs[self.proj]) < 1:
            raise UserError("projection sizes must be positive")

    @property
    def N(self) -> int:
        return self.model.projections()[self.proj][0]

    @property
    def K(self) -> int:
        return self.model.projections()[self.proj][1]

    @property
    def batch_tokens(self) -> int:
        return self.tokens

    @property
    def weight_bytes(self) -> int:
        return int(self.N * self.K * self.dt.element_bytes)

    @property
    def group_bytes(self) -> int:
        return self.weight_bytes

    @property
    def flops(self) -> int:
        return 2 * self.tokens * self.N * self.K

    def allocated_bytes(self, groups: int) -> int:
        return groups * self.group_bytes + self.tokens * (self.K + self.N) * 8

    def reference_bytes(self) -> int:
        return self.N * self.K * 4 + self.tokens * self.N * 4

    def matrices(self) -> list[tuple]:
        return [(1, self.N, self.K, self.dtype)]

    def key(self) -> dict:
        return {"model": self.model.name, "dtype": self.dtype, "proj": self.proj,
                "batch_tokens": self.tokens, "out_features": self.N, "in_features": self.K}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.model.name, "proj": self.proj, "out_features": self.N,
                "in_features": self.K, "tokens": self.tokens, "dtype": self.dtype, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "LinearProblem":
        m = Model(d["name"], int(d["in_features"]), 1, 1, 1, 0, 1, 1, 1, 1, 1, "from the harness",
                  ((d["proj"], int(d["out_features"]), int(d["in_features"])),))
        return cls.create(m, d["proj"], int(d["tokens"]), d["dtype"], int(d["seed"]))

    def __str__(self) -> str:
        return f"{self.model.name} {self.proj} [{self.N}x{self.K}] B={self.tokens} {self.dtype}"

    def materialize(self, llc_bytes: int | None = None, rotate: bool = True,
                    numa: str = "default") -> "LinearData":
        from ..machine.sysinfo import llc_bytes as detect_llc
        groups = self.rotation_groups(llc_bytes or detect_llc()) if rotate else 1
        dt = self.dt.torch_dtype
        w = torch.empty(groups, self.N, self.K, dtype=dt)
        place(w, numa)
        fill_bf16(w, seed_for(self.seed, f"linear-{self.proj}"), 1.0 / math.sqrt(self.K))
        x = torch.empty(self.tokens, self.K, dtype=dt)
        fill_bf16(x, seed_for(self.seed, "x"), 1.0)
        return LinearData(self, groups, x, numa, w=w)


@dataclass
class LinearData(ProblemData):
    w: torch.Tensor = None          # [groups, N, K]

    def weights(self) -> list[torch.Tensor]:
        return [self.w]

    def group_buffers(self, group: int) -> list[tuple[int, int]]:
        part = self.w[group]
        return [(part.data_ptr(), part.numel() * part.element_size())]

    def compute_reference(self, group: int) -> torch.Tensor:
        return F.linear(self.x.float(), self.w[group].float())
