"""The MoE expert FFN problem (paper Section 4), shared by the tests, the benchmarks and every backend.

An `FFNProblem` is a model's expert shapes, a routing mode, the number of active experts per token A
(default: the model's top-k) and a dtype. Two token counts are named apart:
  - `batch_tokens` B: the rows of x one call takes (x.shape[0]);
  - `tokens_per_expert` T: the tokens each active expert receives (the paper's Figure 10 x-axis).
Routing modes:
  - `same-experts` (the default, Figure 10's definition): all B tokens go to the same A experts, each
    token through all A of them (in a per-token random order of top-k slots), so T = B;
  - `router`: a model's gate, seeded: softmax top-A over random logits across all E routed experts, so
    each expert receives a different number of tokens; `tokens_per_expert` is then their mean over the
    experts that receive any (B * A / touched), a float.
Routing weights are positive and sum to 1 per token.

Weights are stored as frameworks store them: `w13 [E, 2I, H]` (gate rows then up rows of each expert,
out x in, row-major like nn.Linear), of which `w_gate` and `w_up [E, I, H]` are views, and
`w_down [E, H, I]`. A rotation group (problems/base.py) is A experts (same-experts) or all E (router).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..dtypes import get_dtype
from ..errors import UserError
from ..models import Model, get_model
from .base import FILL_LAWS, Problem, ProblemData, fill_bf16, place, seed_for

ROUTINGS = ("same-experts", "router")


@dataclass(frozen=True)
class FFNProblem(Problem):
    kind: ClassVar[str] = "ffn"
    key_columns: ClassVar[tuple[str, ...]] = ("model", "dtype", "routing", "batch_tokens",
                                              "tokens_per_expert", "experts", "quant_group", "fill")
    # quant_group: K elements per scale (int8: 32/64/128; fp8: the 128x128 block's edge; empty for
    # bf16); scale_dtype: the scales' type; quant_err: the quantized reference's relative L2 error
    # against the BF16 reference (the scheme's own error, the same for every backend of a point)
    columns: ClassVar[tuple[str, ...]] = key_columns + ("hidden_size", "intermediate_size", "scale_dtype",
                                                        "quant_err")
    key_defaults: ClassVar[dict] = {"routing": "same-experts", "fill": "binades"}   # batch_tokens: = T

    model: Model
    tokens: int                    # same-experts: T = B; router: B
    active_experts: int
    dtype: str = "bf16"
    seed: int = 0
    routing: str = "same-experts"
    group: int = 0                 # quantized dtypes: K elements per scale (0 for bf16)
    fill: str = "binades"          # how weights and tokens are drawn (problems.base.FILL_LAWS)
    _routing_cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    @classmethod
    def create(cls, model: str | Model, tokens: int | None = None, active_experts: int | None = None,
               dtype: str = "bf16", seed: int = 0, routing: str = "same-experts", *,
               tokens_per_expert: int | None = None, group: int | None = None,
               fill: str = "binades") -> "FFNProblem":
        """`tokens`: batch tokens B (= T under same-experts); `tokens_per_expert` is its alias there.
        `group`: int8's K elements per scale (default 128); fp8's is its 128x128 block. `fill`: how the
        weights and tokens are drawn (problems.base.FILL_LAWS)."""
        if tokens is None:
            tokens = tokens_per_expert
        if tokens is None:
            raise UserError("give the number of tokens")
        m = model if isinstance(model, Model) else get_model(model)
        dt = get_dtype(dtype)
        g = int(group) if group else dt.default_group
        if fill not in FILL_LAWS:
            raise UserError(f"unknown fill '{fill}' (one of: {', '.join(FILL_LAWS)})")
        p = cls(m, int(tokens), int(active_experts or m.top_k), dt.name, int(seed), routing, g, fill)
        p.validate()
        return p

    @classmethod
    def custom(cls, hidden_size: int, intermediate_size: int, tokens: int | None = None,
               active_experts: int = 1, routed_experts: int | None = None, dtype: str = "bf16",
               seed: int = 0, routing: str = "same-experts", *,
               tokens_per_expert: int | None = None, group: int | None = None,
               fill: str = "binades") -> "FFNProblem":
        """A problem on a made-up shape (tests, random shapes)."""
        m = Model(f"custom-{hidden_size}x{intermediate_size}", hidden_size, intermediate_size,
                  routed_experts or active_experts, active_experts, 0, 1, 1, 1, 1, 1, "made up")
        return cls.create(m, tokens, active_experts, dtype, seed, routing, tokens_per_expert=tokens_per_expert,
                          group=group, fill=fill)

    def validate(self) -> None:
        if self.tokens < 1:
            what = "tokens per expert" if self.routing == "same-experts" else "batch tokens"
            raise UserError(f"{what} must be at least 1 (got {self.tokens})")
        if self.active_experts < 1:
            raise UserError(f"active experts must be at least 1 (got {self.active_experts})")
        if self.active_experts > self.model.routed_experts:
            raise UserError(f"{self.active_experts} active experts asked, but {self.model.name} has "
                            f"{self.model.routed_experts} routed experts")
        dt = get_dtype(self.dtype)
        if dt.quantized:
            from ..quant import FP8_BLOCK, check_group
            if dt.name == "int8":
                g = check_group(self.group)
                if self.H % g or self.I % g:
                    raise UserError(f"the int8 group size {g} must divide H={self.H} and I={self.I}")
            elif self.group != FP8_BLOCK:
                raise UserError(f"fp8 scales are {FP8_BLOCK}x{FP8_BLOCK} blocks (--group {self.group} given)")
            elif self.I % FP8_BLOCK:
                raise UserError(f"fp8 needs I={self.I} to be a multiple of {FP8_BLOCK} (whole gate/up blocks)")
        elif self.group:
            raise UserError(f"--group is for quantized dtypes (int8); {self.dtype} has no scales")
        if self.routing not in ROUTINGS:
            raise UserError(f"unknown routing '{self.routing}'; known: {', '.join(ROUTINGS)}")
        if self.model.hidden_size < 1 or self.model.intermediate_size < 1:
            raise UserError("hidden and intermediate sizes must be positive")

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def H(self) -> int:
        return self.model.hidden_size

    @property
    def I(self) -> int:  # noqa: E743 - the paper's name
        return self.model.intermediate_size

    @property
    def A(self) -> int:
        """Experts per token: the routing's top-k (A slots per token in topk_ids)."""
        return self.active_experts

    @property
    def batch_tokens(self) -> int:
        return self.tokens

    @property
    def T(self) -> int:
        """Rows of x (batch tokens): what a backend sizes its activations by."""
        return self.tokens

    @property
    def experts_per_group(self) -> int:
        return self.A if self.routing == "same-experts" else self.model.routed_experts

    def routing_ids(self) -> torch.Tensor:
        """topk_ids [B, A] int32 within one group (experts 0 .. experts_per_group-1), from the seed."""
        hit = self._routing_cache.get("ids")
        if hit is None:
            hit = self._routing_cache["ids"] = _router_ids(self) if self.routing == "router" else None
        return hit

    def touched_experts(self) -> int:
        """Distinct experts one call reads."""
        if self.routing == "same-experts":
            return self.A
        return int(torch.unique(self.routing_ids()).numel())

    @property
    def tokens_per_expert(self) -> float | int:
        if self.routing == "same-experts":
            return self.tokens
        return round(self.tokens * self.A / self.touched_experts(), 2)

    def expert_bytes(self) -> int:
        """One expert's three matrices as a kernel reads them: the weights, and their scales."""
        dt = self.dt
        return int(3 * self.H * self.I * dt.element_bytes + dt.scale_bytes(2 * self.I, self.H, self.group)
                   + dt.scale_bytes(self.H, self.I, self.group))

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one call must read: the touched experts' three matrices."""
        return self.touched_experts() * self.expert_bytes()

    @property
    def group_bytes(self) -> int:
        return self.experts_per_group * self.expert_bytes()

    @property
    def flops(self) -> int:
        """2 FLOP per multiply-add: B tokens x A experts each x (gate + up + down)."""
        return 2 * self.tokens * self.A * 3 * self.H * self.I

    def allocated_bytes(self, groups: int) -> int:
        # a quantized problem also keeps its BF16 source weights (the BF16 reference, quant_err)
        source = self.experts_per_group * 3 * self.H * self.I * 2 if self.dt.quantized else 0
        return groups * (self.group_bytes + source) + 4 * self.tokens * self.H * 4

    def reference_bytes(self) -> int:
        return 3 * self.H * self.I * 4 * 2      # float32 copies of one expert, transient

    def matrices(self) -> list[tuple]:
        """w13 [n, 2I, H] from the placement's phase, then w_down [n, H, I] (its own allocation, so
        its own page phase: 0); n = the experts one call reads."""
        n = self.touched_experts()
        return [(n, 2 * self.I, self.H, self.dtype), (n, self.H, self.I, self.dtype, 0)]

    # ---- identity ----------------------------------------------------------------------------------
    def key(self) -> dict:
        return {"model": self.model.name, "dtype": self.dtype, "routing": self.routing,
                "batch_tokens": self.tokens, "tokens_per_expert": self.tokens_per_expert,
                "experts": self.A, "quant_group": self.group or None, "hidden_size": self.H,
                "intermediate_size": self.I, "scale_dtype": self.dt.scale_dtype, "fill": self.fill}

    def to_dict(self) -> dict:
        m = self.model
        return {"kind": self.kind, "name": m.name, "hidden_size": m.hidden_size,
                "intermediate_size": m.intermediate_size, "routed_experts": m.routed_experts,
                "top_k": m.top_k, "tokens": self.tokens, "active_experts": self.active_experts,
                "dtype": self.dtype, "seed": self.seed, "routing": self.routing, "group": self.group,
                "fill": self.fill}

    @classmethod
    def from_dict(cls, d: dict) -> "FFNProblem":
        m = Model(d["name"], int(d["hidden_size"]), int(d["intermediate_size"]), int(d["routed_experts"]),
                  int(d["top_k"]), 0, 1, 1, 1, 1, 1, "from the harness")
        tokens = d.get("tokens", d.get("tokens_per_expert"))
        return cls.create(m, int(tokens), int(d["active_experts"]), d["dtype"], int(d["seed"]),
                          d.get("routing", "same-experts"), group=int(d.get("group") or 0) or None,
                          fill=d.get("fill") or "binades")

    def __str__(self) -> str:
        dt = f"{self.dtype} g{self.group}" if self.dtype == "int8" else self.dtype
        if self.fill != "binades":
            dt += f" {self.fill} fill"
        if self.routing == "same-experts":
            return f"{self.model.name} T={self.tokens} A={self.A} {dt}"
        return f"{self.model.name} B={self.tokens} router top-{self.A} {dt}"

    # ---- data --------------------------------------------------------------------------------------
    def materialize(self, llc_bytes: int | None = None, rotate: bool = True,
                    numa: str = "default") -> "FFNData":
        return materialize(self, llc_bytes, rotate, numa)


def _router_ids(p: FFNProblem) -> torch.Tensor:
    """A model's gate, seeded: softmax top-A over random logits across the E routed experts."""
    E = p.model.routed_experts
    logits = torch.empty(p.tokens, E, dtype=torch.bfloat16)
    fill_bf16(logits, seed_for(p.seed, "router"), 2.0)
    probs = torch.softmax(logits.float(), dim=1)
    # ties broken by expert index (stable), so every process picks the same experts
    order = torch.argsort(-probs, dim=1, stable=True)[:, : p.A]
    return order.to(torch.int32).contiguous()


@dataclass
class FFNData(ProblemData):
    """An FFN problem's tensors (see ProblemData)."""
    w13: torch.Tensor = None               # [E_alloc, 2I, H]
    w_down: torch.Tensor = None            # [E_alloc, H, I]
    topk_ids: list = None                  # per rotation group: [B, A] int32
    topk_weights: torch.Tensor = None      # [B, A] float32, positive, rows sum to 1
    # quantized dtypes (hinabench.quant): the kernels' weights, quantized offline from w13 / w_down,
    # which stay as the BF16 source (the BF16 reference that quant_err measures the scheme against)
    q13: "QuantWeight" = None              # [E_alloc, 2I, H]
    qdown: "QuantWeight" = None            # [E_alloc, H, I]

    @property
    def w_gate(self) -> torch.Tensor:
        return self.w13[:, : self.problem.I]

    @property
    def w_up(self) -> torch.Tensor:
        return self.w13[:, self.problem.I:]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def experts_per_group(self) -> int:
        return self.problem.experts_per_group

    def weights(self) -> list[torch.Tensor]:
        if self.q13 is not None:
            return [self.q13.q, self.qdown.q]
        return [self.w13, self.w_down]

    def group_experts(self, group: int) -> range:
        n = self.experts_per_group
        return range(group * n, (group + 1) * n)

    def group_buffers(self, group: int) -> list[tuple[int, int]]:
        e = self.group_experts(group)
        out = []
        tensors = (self.w13, self.w_down) if self.q13 is None else \
            (self.q13.q, self.q13.scale, self.qdown.q, self.qdown.scale)
        for w in tensors:
            part = w[e.start:e.stop]
            out.append((part.data_ptr(), part.numel() * part.element_size()))
        return out

    def compute_reference(self, group: int) -> torch.Tensor:
        """The reference a backend must match: for quantized dtypes the quantized one (dequantized
        weights, and W8A8's activation quantization), else the BF16 weights' fp32 reference."""
        if self.q13 is not None:
            from ..quant import moe_ffn_quant_reference
            I = self.problem.I
            return moe_ffn_quant_reference(self.x, self.q13.rows(0, I), self.q13.rows(I, 2 * I), self.qdown,
                                           self.topk_ids[group], self.topk_weights)
        return self.reference_bf16(group)

    def reference_bf16(self, group: int = 0) -> torch.Tensor:
        """The fp32 reference on the BF16 (source) weights (cached: every scheme's quant_err reads it)."""
        key = ("bf16", group)
        if key not in self._reference:
            self._reference[key] = moe_ffn_reference(self.x, self.w_gate, self.w_up, self.w_down,
                                                     self.topk_ids[group], self.topk_weights)
        return self._reference[key]

    def quant_err(self, group: int = 0) -> float | None:
        """The scheme's own error: the quantized reference against the BF16 reference (rel. L2)."""
        if self.q13 is None:
            return None
        from .validate import rel_err
        return rel_err(self.reference(group), self.reference_bf16(group))

    # A peer that quantizes in a scheme of its own (Backend.quant_scheme) is validated against that
    # scheme's quantized reference, and its quant_err is that scheme's: "wrong" stays "the kernel is wrong".
    def scheme_reference(self, scheme: str | None, group: int = 0) -> torch.Tensor:
        if scheme is None:
            return self.reference(group)
        key = (scheme, group)
        if key not in self._reference:
            # "<base>[+bf16w][+bf16gu][+bf16h][+bf16y]": base "int8-channel" (per-channel W8A8) or the
            # problem's own dtype, with what the kernel rounds to bf16: the dequantized weights, the gate/up
            # outputs, the intermediate SiLU(gate)*up, each expert's weighted output
            # (hinabench.quant.moe_ffn_quant_reference)
            from ..quant import moe_ffn_quant_reference, quantize_int8_channel
            base, *rounded = scheme.split("+")
            if base not in ("int8-channel", self.problem.dtype) or self.q13 is None or \
                    (base == "int8-channel" and self.problem.dtype != "int8") or \
                    not set(rounded) <= {"bf16w", "bf16gu", "bf16h", "bf16y"}:
                raise ValueError(f"no reference for scheme '{scheme}' on a {self.problem.dtype} problem")
            I = self.problem.I
            ids = self.topk_ids[group].long()
            if base == "int8-channel":
                ex = self.group_experts(group)   # only the experts this group's calls route to
                q13 = quantize_int8_channel(self.w13[ex.start:ex.stop])
                qd = quantize_int8_channel(self.w_down[ex.start:ex.stop])
                ids = ids - ex.start
            else:
                q13, qd = self.q13, self.qdown
            self._reference[key] = moe_ffn_quant_reference(
                self.x, q13.rows(0, I), q13.rows(I, 2 * I), qd, ids, self.topk_weights,
                bf16_gate_up="bf16gu" in rounded, bf16_h="bf16h" in rounded, bf16_w="bf16w" in rounded,
                bf16_y="bf16y" in rounded)
        return self._reference[key]

    def scheme_quant_err(self, scheme: str | None, group: int = 0) -> float | None:
        if scheme is None:
            return self.quant_err(group)
        from .validate import rel_err
        return rel_err(self.scheme_reference(scheme, group), self.reference_bf16(group))


def materialize(problem: FFNProblem, llc_bytes: int | None = None, rotate: bool = True,
                numa: str = "default") -> FFNData:
    """Allocate and fill a problem's tensors under a NUMA policy (hinabench.numa.placement.parse_policy).
    `rotate=False` allocates one group (tests)."""
    from ..machine.sysinfo import llc_bytes as detect_llc
    p = problem
    groups = p.rotation_groups(llc_bytes or detect_llc()) if rotate else 1
    n = p.experts_per_group
    E = groups * n
    dt = torch.bfloat16   # the source weights and x are bf16; quantized dtypes quantize them below
    w13 = torch.empty(E, 2 * p.I, p.H, dtype=dt)
    w_down = torch.empty(E, p.H, p.I, dtype=dt)
    place(w13, numa)
    place(w_down, numa)
    # Magnitudes ~ 1/sqrt(fan-in), so activations stay O(1) through the FFN.
    fill_bf16(w13, seed_for(p.seed, "w13"), 1.0 / math.sqrt(p.H), p.fill)
    fill_bf16(w_down, seed_for(p.seed, "w_down"), 1.0 / math.sqrt(p.I), p.fill)
    # Tokens, routing weights and routing order come from the same counter-based hash as the weights
    # (not torch's RNG), so a peer's worker with another torch version builds the identical problem.
    B = p.tokens
    x = torch.empty(B, p.H, dtype=dt)
    fill_bf16(x, seed_for(p.seed, "x"), 1.0, p.fill)
    r = torch.empty(groups + 1, B, p.A, dtype=torch.bfloat16)
    fill_bf16(r, seed_for(p.seed, "routing"), 0.5)
    w = r[0].float().abs() + 0.05
    topk_weights = (w / w.sum(dim=1, keepdim=True)).contiguous()
    ids = []
    for g in range(groups):
        if p.routing == "same-experts":
            order = torch.argsort(r[g + 1].float(), dim=1, stable=True)
        else:
            order = p.routing_ids()
        ids.append((order + g * n).to(torch.int32).contiguous())
    data = FFNData(p, groups, x, numa, w13=w13, w_down=w_down, topk_ids=ids, topk_weights=topk_weights)
    if p.dt.quantized:   # the framework's offline step (hinabench.quant); placed like the source
        from ..quant import quantize
        data.q13 = quantize(w13, p.dtype, p.group)
        data.qdown = quantize(w_down, p.dtype, p.group)
        from ..numa.placement import huge_pages_tensors, huge_policy
        if huge_policy(numa):   # the quantized copies are new allocations, filled already
            huge_pages_tensors([data.q13.q, data.q13.scale, data.qdown.q, data.qdown.scale])
    return data


def moe_ffn_reference(x, w_gate, w_up, w_down, topk_ids, topk_weights) -> torch.Tensor:
    """float32 MoE FFN over the experts the tokens use; inputs in any float dtype.

    out[t] = sum_k topk_weights[t, k] * down_e(SiLU(gate_e(x_t)) * up_e(x_t)),  e = topk_ids[t, k]
    """
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
