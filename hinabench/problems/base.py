"""What every problem kind shares: the `Problem` contract, materialised data, the fill and the cache policy.

A problem kind (llama.cpp's test-backend-ops case, in our words) is one class that knows
  - its key: the columns it adds to a result row and which of them identify a point (`key()`);
  - what one call reads and computes: `weight_bytes`, `bytes_read`, `flops`;
  - how to build its tensors (`materialize`), from a counter-based hash, so any process with any torch
    builds the identical problem from its seed;
  - its float32 reference and the tolerance a backend must meet on it;
  - how much memory a run needs (`memory_needed`) and its remote-DRAM traffic model (`remote_model`);
  - how to cross a worker's pipe (`to_dict` / `from_dict`).
The harness (runner, store, sweeps) reads only this contract; FFN and linear are two kinds of it.

Cache policy (rotation), shared by every kind: the weights must stream from DRAM, never sit in the
last-level cache. If one call's weights already span at least 4x the LLC, one group is allocated:
nothing of it survives until the next call. Otherwise R = 1 + ceil(2 * LLC / group_bytes) disjoint
groups are allocated and calls rotate through them, so at least two LLCs' worth of other weights stream
between two uses of the same weights.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..dtypes import DType, get_dtype


def seed_for(seed: int, what: str) -> int:
    """A per-tensor seed: the problem's seed mixed with the tensor's name."""
    return (seed * 1_000_003 + sum(ord(c) * 31 ** i for i, c in enumerate(what))) & (2**63 - 1)


# How a problem's values are drawn (kernels/fill.cpp): "binades", magnitudes within (scale/4, 2 scale),
# random signs (the default: no zeros, no tiny values, every kernel's fast path); "normal", a bell curve of
# standard deviation `scale` over many binades, as trained weights and activations are (costs that depend
# on the values, such as denormals, show there and not in "binades").
FILL_LAWS = ("binades", "normal")


def fill_bf16(t: torch.Tensor, seed: int, scale: float, law: str = "binades") -> None:
    """Fill a contiguous bf16 tensor from a counter-based hash (fast, and the same in every process)."""
    from ..native import load
    _C = load("_C")
    assert t.dtype == torch.bfloat16 and t.is_contiguous()
    _C.fill_bf16(t.data_ptr(), t.numel(), seed, scale, torch.get_num_threads(), law)


def rotation_groups(call_bytes: int, group_bytes: int, llc_bytes: int) -> int:
    """How many disjoint weight groups calls rotate through (see the module docstring)."""
    if call_bytes >= 4 * llc_bytes:
        return 1
    return 1 + math.ceil(2 * llc_bytes / max(group_bytes, 1))


class Problem(ABC):
    """One benchmark problem: a frozen dataclass in each kind (see the module docstring)."""
    kind: ClassVar[str]                    # the `op` column: "ffn", "linear", ...
    key_columns: ClassVar[tuple[str, ...]]  # row columns that, with op/backend/threads/numa, name a point
    columns: ClassVar[tuple[str, ...]]      # every row column this kind fills (key_columns first)
    key_defaults: ClassVar[dict] = {}       # values of key columns in rows stored before they existed

    dtype: str
    seed: int

    # ---- identity ----------------------------------------------------------------------------------
    @abstractmethod
    def key(self) -> dict:
        """This problem's row columns (`columns`), as values."""

    @abstractmethod
    def to_dict(self) -> dict:
        """Plain data that `from_dict` turns back into the same problem (crosses a worker's pipe)."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict) -> "Problem":
        ...

    # ---- sizes -------------------------------------------------------------------------------------
    @property
    def dt(self) -> DType:
        return get_dtype(self.dtype)

    @property
    @abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of weights one call must read (the roofline's memory term)."""

    @property
    def bytes_read(self) -> int:
        """All bytes one call must stream from DRAM (weights, and KV or activations where they matter)."""
        return self.weight_bytes

    @property
    @abstractmethod
    def flops(self) -> int:
        """2 FLOP per multiply-add over the whole call."""

    @property
    @abstractmethod
    def group_bytes(self) -> int:
        """Bytes of one rotation group's weights (what is allocated per group)."""

    @property
    @abstractmethod
    def batch_tokens(self) -> int:
        """Rows of the activation one call takes (x.shape[0])."""

    @property
    def tolerance(self) -> float:
        return self.dt.tolerance

    def rotation_groups(self, llc_bytes: int) -> int:
        return rotation_groups(self.weight_bytes, self.group_bytes, llc_bytes)

    def allocated_bytes(self, groups: int) -> int:
        return groups * self.group_bytes

    @abstractmethod
    def reference_bytes(self) -> int:
        """Transient bytes the float32 reference takes."""

    def memory_needed(self, groups: int, extra_bytes: int = 0) -> int:
        """Bytes a run needs: what materialize allocates (weight groups and activations), the
        transient reference, the backends' own copies (`extra_bytes`), and headroom."""
        return self.allocated_bytes(groups) + self.reference_bytes() + extra_bytes + (256 << 20)

    # ---- data --------------------------------------------------------------------------------------
    @abstractmethod
    def materialize(self, llc_bytes: int | None = None, rotate: bool = True,
                    numa: str = "default") -> "ProblemData":
        ...

    @abstractmethod
    def matrices(self) -> list[tuple]:
        """The row-major weight matrices one call reads, for the NUMA traffic model:
        (count, N, K, dtype[, page phase]) (hinabench.numa.placement.WeightMatrices)."""

    def remote_model(self, policy: str, partition: str, placement: dict) -> dict:
        """remote_fraction_model and its basis: the share of weight bytes the backend's work partition
        reads from a remote node under the placement model (Section 5)."""
        from ..numa.placement import remote_model
        return remote_model(policy, partition, self.matrices(), placement)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.key().items())


@dataclass
class ProblemData:
    """A problem's tensors, materialised: what every in-process backend runs on."""
    problem: Problem
    groups: int
    x: torch.Tensor
    numa: str = "default"           # the policy the weights were placed under
    _reference: dict = field(default_factory=dict, repr=False)

    def weights(self) -> list[torch.Tensor]:
        """The weight tensors (all groups), for the placement model and the read probe."""
        raise NotImplementedError

    def placement(self) -> dict:
        """Where the model says the first weight tensor's pages are, or why it cannot say."""
        from ..numa import tensor_placement
        w = self.weights()[0]
        return tensor_placement(w.data_ptr(), w.numel() * w.element_size()).as_row()

    def group_buffers(self, group: int) -> list[tuple[int, int]]:
        """(address, bytes) of the weights group `group` reads: for the same-buffer read probe."""
        raise NotImplementedError

    def buffers(self) -> list[tuple[int, int]]:
        """(address, bytes) of the weights every rotation group reads: what the read probe streams and
        what a '+thp' policy's page share is measured over."""
        return [b for g in range(self.groups) for b in self.group_buffers(g)]

    def compute_reference(self, group: int) -> torch.Tensor:
        raise NotImplementedError

    def reference(self, group: int = 0) -> torch.Tensor:
        """The float32 reference output of a call on `group` (cached)."""
        if group not in self._reference:
            self._reference[group] = self.compute_reference(group)
        return self._reference[group]


def place(t: torch.Tensor, numa: str) -> None:
    """Give an untouched tensor's pages the policy `numa` before the multi-threaded fill touches them."""
    from ..numa.placement import huge_policy, parse_policy, place_tensor
    mode, nodes = parse_policy(numa)
    place_tensor(t, mode, nodes, huge=huge_policy(numa))
