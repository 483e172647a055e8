"""The one FFN problem definition, shared by the tests, the benchmarks and every backend.

An `FFNProblem` is a model's expert shapes, `tokens_per_expert` T (the paper's Figure 10 x-axis),
the number of active experts A (default: the model's top-k) and a dtype. All T tokens are routed to
the same A experts, each token through all A of them (in a per-token random order of top-k slots),
with random positive routing weights that sum to 1 per token.

Weights are stored as frameworks store them: `w13 [E, 2I, H]` (gate rows then up rows of each expert,
out x in, row-major like nn.Linear), of which `w_gate` and `w_up [E, I, H]` are views, and
`w_down [E, H, I]`.

Cache policy (rotation): the weights must stream from DRAM, never sit in the last-level cache.
If one call's active experts already span at least 4x the LLC, one group of A experts is allocated:
nothing of it survives until the next call. Otherwise R = 1 + ceil(2 * LLC / active_bytes) disjoint
groups of A experts are allocated and calls rotate through them, so at least two LLCs' worth of other
weights stream between two uses of the same expert.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from .errors import UserError
from .models import Model, get_model

DTYPES = {"bf16": torch.bfloat16}
WEIGHT_BYTES = {"bf16": 2.0}


@dataclass(frozen=True)
class FFNProblem:
    model: Model
    tokens_per_expert: int
    active_experts: int
    dtype: str = "bf16"
    seed: int = 0

    @classmethod
    def create(cls, model: str | Model, tokens_per_expert: int, active_experts: int | None = None,
               dtype: str = "bf16", seed: int = 0) -> "FFNProblem":
        m = model if isinstance(model, Model) else get_model(model)
        p = cls(m, int(tokens_per_expert), int(active_experts or m.top_k), dtype, int(seed))
        p.validate()
        return p

    @classmethod
    def custom(cls, hidden_size: int, intermediate_size: int, tokens_per_expert: int,
               active_experts: int, routed_experts: int | None = None, dtype: str = "bf16",
               seed: int = 0) -> "FFNProblem":
        """A problem on a made-up shape (tests, random shapes)."""
        m = Model(f"custom-{hidden_size}x{intermediate_size}", hidden_size, intermediate_size,
                  routed_experts or active_experts, active_experts, 0, 1, 1, 1, 1, 1, "made up")
        return cls.create(m, tokens_per_expert, active_experts, dtype, seed)

    def validate(self) -> None:
        if self.tokens_per_expert < 1:
            raise UserError(f"tokens per expert must be at least 1 (got {self.tokens_per_expert})")
        if self.active_experts < 1:
            raise UserError(f"active experts must be at least 1 (got {self.active_experts})")
        if self.active_experts > self.model.routed_experts:
            raise UserError(f"{self.active_experts} active experts asked, but {self.model.name} has "
                            f"{self.model.routed_experts} routed experts")
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype '{self.dtype}'; known: {', '.join(DTYPES)}")
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
    def T(self) -> int:
        return self.tokens_per_expert

    @property
    def A(self) -> int:
        return self.active_experts

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one call must read: the A active experts' three matrices."""
        return int(self.A * 3 * self.H * self.I * WEIGHT_BYTES[self.dtype])

    @property
    def flops(self) -> int:
        """2 FLOP per multiply-add: T tokens x A experts x (gate + up + down)."""
        return 2 * self.T * self.A * 3 * self.H * self.I

    def rotation_groups(self, llc_bytes: int) -> int:
        active = self.weight_bytes
        if active >= 4 * llc_bytes:
            return 1
        return 1 + math.ceil(2 * llc_bytes / active)

    def allocated_bytes(self, groups: int) -> int:
        return groups * self.weight_bytes + 4 * self.T * self.H * 4

    def key(self) -> dict:
        return {"model": self.model.name, "dtype": self.dtype, "tokens_per_expert": self.T,
                "experts": self.A, "hidden_size": self.H, "intermediate_size": self.I}

    def __str__(self) -> str:
        return f"{self.model.name} T={self.T} A={self.A} {self.dtype}"


def _seed(seed: int, what: str) -> int:
    return (seed * 1_000_003 + sum(ord(c) * 31 ** i for i, c in enumerate(what))) & (2**63 - 1)


@dataclass
class ProblemData:
    """A problem's tensors, materialised: what every in-process backend runs on."""
    problem: FFNProblem
    groups: int
    x: torch.Tensor                 # [T, H] bf16
    w13: torch.Tensor               # [E_alloc, 2I, H]
    w_down: torch.Tensor            # [E_alloc, H, I]
    topk_ids: list[torch.Tensor]    # per rotation group: [T, A] int32
    topk_weights: torch.Tensor      # [T, A] float32, positive, rows sum to 1
    numa: str = "default"           # the policy the weights were placed under
    _reference: dict = field(default_factory=dict, repr=False)

    def placement(self) -> dict:
        """Where the model says w13's pages are (page size, phase, policy), or why it cannot say."""
        from .numa import tensor_placement
        return tensor_placement(self.w13.data_ptr(), self.w13.numel() * self.w13.element_size()).as_row()

    @property
    def w_gate(self) -> torch.Tensor:
        return self.w13[:, : self.problem.I]

    @property
    def w_up(self) -> torch.Tensor:
        return self.w13[:, self.problem.I:]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    def group_experts(self, group: int) -> range:
        A = self.problem.A
        return range(group * A, (group + 1) * A)

    def group_buffers(self, group: int) -> list[tuple[int, int]]:
        """(address, bytes) of the weights group `group` reads: for the same-buffer read probe."""
        e = self.group_experts(group)
        out = []
        for w in (self.w13, self.w_down):
            part = w[e.start:e.stop]
            out.append((part.data_ptr(), part.numel() * part.element_size()))
        return out

    def reference(self, group: int = 0) -> torch.Tensor:
        from .reference import moe_ffn_reference
        if group not in self._reference:
            self._reference[group] = moe_ffn_reference(
                self.x, self.w_gate, self.w_up, self.w_down, self.topk_ids[group], self.topk_weights)
        return self._reference[group]


def fill_bf16(t: torch.Tensor, seed: int, scale: float) -> None:
    """Fill a contiguous bf16 tensor from a counter-based hash (fast, and the same in every process)."""
    from . import _C
    assert t.dtype == torch.bfloat16 and t.is_contiguous()
    _C.fill_bf16(t.data_ptr(), t.numel(), seed, scale, torch.get_num_threads())


def parse_numa_policy(policy: str) -> tuple[str, list[int] | None]:
    """'default' (first touch) | 'interleave' (all nodes, like numactl --interleave=all) |
    'bind:N' -> (mode, nodes). Raises UserError for anything else or a node that does not exist."""
    from .numa import memory_nodes
    p = policy.strip().lower()
    if p in ("default", "interleave"):
        return p, None if p == "default" else memory_nodes()
    if p.startswith("bind:"):
        try:
            n = int(p.split(":", 1)[1])
        except ValueError:
            n = -1
        if n not in memory_nodes():
            raise UserError(f"--numa {policy}: no memory node {p.split(':', 1)[1]} here "
                            f"(nodes: {', '.join(map(str, memory_nodes()))})")
        return "bind", [n]
    raise UserError(f"unknown NUMA policy '{policy}'; known: default, interleave, bind:N")


def _place(t: torch.Tensor, mode: str, nodes: list[int] | None) -> None:
    """Give an untouched tensor's pages a VMA policy (mbind) before the multi-threaded fill touches
    them: interleave over `nodes`, or all on one node (bind = interleave over that one node)."""
    if mode == "default":
        return
    from .numa import interleave_range
    interleave_range(t.data_ptr(), t.numel() * t.element_size(), nodes)


def materialize(problem: FFNProblem, llc_bytes: int | None = None, rotate: bool = True,
                numa: str = "default") -> ProblemData:
    """Allocate and fill a problem's tensors under a NUMA policy (see parse_numa_policy).
    `rotate=False` allocates one group (tests)."""
    mode, nodes = parse_numa_policy(numa)
    from .sysinfo import llc_bytes as detect_llc
    p = problem
    groups = p.rotation_groups(llc_bytes or detect_llc()) if rotate else 1
    E = groups * p.A
    dt = DTYPES[p.dtype]
    w13 = torch.empty(E, 2 * p.I, p.H, dtype=dt)
    w_down = torch.empty(E, p.H, p.I, dtype=dt)
    _place(w13, mode, nodes)
    _place(w_down, mode, nodes)
    # Magnitudes ~ 1/sqrt(fan-in), so activations stay O(1) through the FFN.
    fill_bf16(w13, _seed(p.seed, "w13"), 1.0 / math.sqrt(p.H))
    fill_bf16(w_down, _seed(p.seed, "w_down"), 1.0 / math.sqrt(p.I))
    # Tokens, routing weights and routing order come from the same counter-based hash as the weights
    # (not torch's RNG), so a peer's worker with another torch version builds the identical problem.
    x = torch.empty(p.T, p.H, dtype=dt)
    fill_bf16(x, _seed(p.seed, "x"), 1.0)
    r = torch.empty(groups + 1, p.T, p.A, dtype=torch.bfloat16)
    fill_bf16(r, _seed(p.seed, "routing"), 0.5)
    w = r[0].float().abs() + 0.05
    topk_weights = (w / w.sum(dim=1, keepdim=True)).contiguous()
    ids = []
    for g in range(groups):
        order = torch.argsort(r[g + 1].float(), dim=1, stable=True)
        ids.append((order + g * p.A).to(torch.int32).contiguous())
    data = ProblemData(p, groups, x, w13, w_down, ids, topk_weights)
    data.numa = numa
    return data


def with_tokens(problem: FFNProblem, tokens: int) -> FFNProblem:
    p = replace(problem, tokens_per_expert=tokens)
    p.validate()
    return p
