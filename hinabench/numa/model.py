"""The paper's Equations 3-5 (Section 5.2): where each element of an interleaved weight lies, and
each NUMA node's local segments of it. Pure arithmetic: no Linux calls, no torch.

Local segments -- Equations 3-5, generalised from the paper's assumptions (4 KiB pages of 2,048
bf16 elements, a tensor starting on a page of node 0) to any element size, page size and phase (the
tensor's first byte within the interleave cycle; hinabench.numa.linux.tensor_placement finds it for
a real tensor). A segment `(x, y_start, y_end)` is the part of row x of a row-major `[N, K]` weight
that lies in one page; y_end is exclusive (the paper writes `(0, 0~2047)` for our `(0, 0, 2048)`).

Node *indices* 0..n-1 (the paper's id_numa) index the policy's node set in ascending order; with
`--interleave=all` on a two-socket machine index i is node i. `Placement.node_ids` maps them back.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, NamedTuple

PAGE_4K = 4096
PAGE_2M = 2 * 1024 * 1024
PAGE_SIZES = {"4k": PAGE_4K, "2m": PAGE_2M}
# Element sizes of storage formats the model lays out (`hinabench numa plan --dtype int8`) that the
# weight dtype table, hinabench.dtypes, does not list; a name in that table always takes its size.
LAYOUT_ONLY_ELEMENT_BYTES = {"fp16": 2, "fp32": 4, "int8": 1, "fp8": 1}
PARTITIONS = ("hina", "row-split", "per-node-copy", "tp-split")


class Segment(NamedTuple):
    """Data segment (x, y_start ~ y_end) of Section 5.2; y_end exclusive."""
    x: int
    y_start: int
    y_end: int


def element_size(dtype: int | str) -> int:
    """Bytes per element of `dtype`: a number is returned as it is; a name is looked up in the dtype
    table (hinabench.dtypes.element_bytes), else in LAYOUT_ONLY_ELEMENT_BYTES. ValueError for an
    unknown name or one whose elements are not whole bytes."""
    if not isinstance(dtype, str):
        return dtype
    from ..dtypes import DTYPES, element_bytes    # here, not at import: the table imports torch
    from ..errors import UserError
    try:
        size = element_bytes(dtype)
    except UserError:
        key = dtype.strip().lower()
        if key not in LAYOUT_ONLY_ELEMENT_BYTES:
            raise ValueError(f"unknown dtype '{dtype}'; known: "
                             f"{', '.join(sorted({*DTYPES, *LAYOUT_ONLY_ELEMENT_BYTES}))}") from None
        return LAYOUT_ONLY_ELEMENT_BYTES[key]
    if size <= 0 or size != int(size):
        raise ValueError(f"dtype '{dtype}' has {size} bytes per element; the placement model needs "
                         "whole bytes")
    return int(size)


# ---------------------------------------------------------------------------------------------
# Section 5.2: the placement function and its periods
# ---------------------------------------------------------------------------------------------

def elements_per_page(page_bytes: int = PAGE_4K, elem_bytes: int = 2) -> int:
    """Elements per page: the paper's 2,048 (4 KiB / 2-byte bf16)."""
    if page_bytes <= 0 or elem_bytes <= 0 or page_bytes % elem_bytes:
        raise ValueError(f"a page of {page_bytes} B does not hold whole {elem_bytes}-byte elements")
    return page_bytes // elem_bytes


def _validate(N: int, K: int, elem_bytes: int, nodes: int, page_bytes: int, phase: int) -> int:
    """Check the arguments; return the phase in elements, reduced into [0, E * nodes)."""
    if N < 1 or K < 1:
        raise ValueError(f"weight shape must be positive (got N={N}, K={K})")
    if nodes < 1:
        raise ValueError(f"need at least one NUMA node (got {nodes})")
    E = elements_per_page(page_bytes, elem_bytes)
    if phase < 0 or phase % elem_bytes:
        raise ValueError(f"phase must be a non-negative multiple of the element size "
                         f"{elem_bytes} B (got {phase})")
    return (phase // elem_bytes) % (E * nodes)


# Eq. 3 (Section 5.2): the interleave function f(x, y)
def interleave_function(x: int, y: int, K: int, nodes: int, elem_bytes: int = 2,
                        page_bytes: int = PAGE_4K, phase: int = 0) -> int:
    """Eq. 3: f(x, y) = (phase + x*K + y) mod (E * N_numa), E elements per page, phase in bytes."""
    E = elements_per_page(page_bytes, elem_bytes)
    return (phase // elem_bytes + x * K + y) % (E * nodes)


# Eq. 5: the node index of element (x, y)
def node_of(x: int, y: int, K: int, nodes: int, elem_bytes: int = 2, page_bytes: int = PAGE_4K,
            phase: int = 0) -> int:
    """Eq. 5: element (x, y) is on node index id with id*E <= f(x, y) < (id + 1)*E."""
    E = elements_per_page(page_bytes, elem_bytes)
    return interleave_function(x, y, K, nodes, elem_bytes, page_bytes, phase) // E


# Eq. 4: the periods T_x, T_y of f
def interleave_period(K: int, nodes: int, elem_bytes: int = 2,
                      page_bytes: int = PAGE_4K) -> tuple[int, int]:
    """Eq. 4: (T_x, T_y) = (E*N_numa / gcd(K, E*N_numa), E*N_numa). Independent of the phase.

    f(x + T_x, y) = f(x, y) and f(x, y + T_y) = f(x, y); T_x is the smallest such row period.
    """
    if K < 1 or nodes < 1:
        raise ValueError(f"need K >= 1 and nodes >= 1 (got K={K}, nodes={nodes})")
    cycle = elements_per_page(page_bytes, elem_bytes) * nodes
    return cycle // math.gcd(K, cycle), cycle


def _row_segments(x: int, K: int, nodes: int, E: int, phase_e: int) -> Iterable[tuple[int, Segment]]:
    """Row x cut at page boundaries: (node index, segment) for each piece, left to right."""
    start = phase_e + x * K                      # linear element index of (x, 0) in the cycle
    y = 0
    while y < K:
        page = (start + y) // E
        y_end = min(K, (page + 1) * E - start)
        yield page % nodes, Segment(x, y, y_end)
        y = y_end


@dataclass(frozen=True)
class SegmentPlan:
    """T_x, T_y and each node's segments within the first period of x (S_index, Section 5.3; the segments of Section 5.2)."""
    N: int
    K: int
    elem_bytes: int
    nodes: int
    page_bytes: int
    phase: int                                    # bytes, reduced into [0, page_bytes * nodes)
    T_x: int
    T_y: int
    segments: tuple[tuple[Segment, ...], ...]     # segments[node index] = ((x, y_start, y_end), ...)

    @property
    def rows_in_period(self) -> int:
        """Rows listed: min(T_x, N) (the paper assumes T_x < N)."""
        return min(self.T_x, self.N)

    def rows_like(self, x: int) -> range:
        """All rows sharing row x's segments: x, x + T_x, x + 2*T_x, ... < N (Eq. 4)."""
        return range(x, self.N, self.T_x)

    def all_segments(self, node: int) -> Iterable[Segment]:
        """Every segment of node `node` over the whole [N, K] weight, by periodicity in x."""
        for s in self.segments[node]:
            for x in self.rows_like(s.x):
                yield Segment(x, s.y_start, s.y_end)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["segments"] = {str(i): [list(s) for s in segs] for i, segs in enumerate(self.segments)}
        return d


# S_index (Section 5.3) of Section 5.2's segments: Eq. 4's periods, then Eq. 5 per row of the first period
def local_segments(N: int, K: int, elem_bytes: int = 2, nodes: int = 2,
                   page_bytes: int = PAGE_4K, phase: int = 0) -> SegmentPlan:
    """Section 5.2 in two steps: the periods (Eq. 4), then each node's segments for x < T_x (Eq. 5).

    `phase` is where the tensor's first byte falls in the interleave cycle of `nodes` pages, in bytes:
    0 is the paper's assumption (the tensor starts at the beginning of a page of node index 0).
    """
    phase_e = _validate(N, K, elem_bytes, nodes, page_bytes, phase)
    E = elements_per_page(page_bytes, elem_bytes)
    T_x, T_y = interleave_period(K, nodes, elem_bytes, page_bytes)           # Eq. 4
    per_node: list[list[Segment]] = [[] for _ in range(nodes)]
    for x in range(min(T_x, N)):                                             # Eq. 5, x in [0, T_x)
        for node, seg in _row_segments(x, K, nodes, E, phase_e):
            per_node[node].append(seg)
    return SegmentPlan(N, K, elem_bytes, nodes, page_bytes, phase_e * elem_bytes, T_x, T_y,
                       tuple(tuple(s) for s in per_node))


# Algorithm 2's input: S_index as plain ints
@dataclass(frozen=True)
class KernelPlan:
    """What the NUMA-partitioned kernel needs (Algorithm 2): per node, S_index = [(x, y_start,
    y_end), ...] for x < T_x; the kernel walks rows x, x + T_x, ... with the same y-ranges."""
    N: int
    K: int
    T_x: int
    T_y: int
    nodes: int
    page_bytes: int
    phase: int
    elem_bytes: int
    s_index: tuple[tuple[tuple[int, int, int], ...], ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["s_index"] = [[list(s) for s in node] for node in self.s_index]
        return d


def plan_for_kernel(N: int, K: int, nodes: int, page: int | str = PAGE_4K, phase: int = 0,
                    elem_bytes: int = 2) -> KernelPlan:
    """The kernel's input: periods and per-node S_index (plain ints, ready for a C++ binding)."""
    page_bytes = parse_page(page)
    p = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    return KernelPlan(N, K, p.T_x, p.T_y, nodes, page_bytes, p.phase, elem_bytes,
                      tuple(tuple(tuple(s) for s in segs) for segs in p.segments))


def parse_page(page: int | str) -> int:
    if isinstance(page, int):
        if page not in PAGE_SIZES.values():
            raise ValueError(f"page size must be 4 KiB or 2 MiB (got {page} B)")
        return page
    key = str(page).strip().lower()
    if key not in PAGE_SIZES:
        raise ValueError(f"page size must be one of {', '.join(PAGE_SIZES)} (got '{page}')")
    return PAGE_SIZES[key]


# Section 5.2's claim: the nodes' segments tile the weight exactly once
def tiling_errors(plan: SegmentPlan) -> list[str]:
    """Empty if the nodes' segments tile [N, K] exactly once; else what is wrong.

    Rows with the same x mod T_x share segments (Eq. 4), so checking x < min(T_x, N) covers all N.
    """
    errors = []
    for x in range(plan.rows_in_period):
        segs = sorted((s for node in plan.segments for s in node if s.x == x), key=lambda s: s[1])
        y = 0
        for s in segs:
            if s.y_start != y or s.y_end <= s.y_start:
                errors.append(f"row {x}: segment {tuple(s)} after y={y}")
            y = max(y, s.y_end)
        if y != plan.K:
            errors.append(f"row {x}: covered up to {y}, not K={plan.K}")
    return errors


# ---------------------------------------------------------------------------------------------
# Remote-traffic model (issue 5, item 5; Figure 15 where counters are missing)
# ---------------------------------------------------------------------------------------------

def _row_node_elements(plan: SegmentPlan) -> list[list[int]]:
    """counts[r][i]: elements of a row with x mod T_x = r that lie on node index i."""
    counts = [[0] * plan.nodes for _ in range(plan.rows_in_period)]
    for i, segs in enumerate(plan.segments):
        for s in segs:
            counts[s.x][i] += s.y_end - s.y_start
    return counts


def _rows_with_residue(r0: int, r1: int, r: int, T: int) -> int:
    """How many x in [r0, r1) have x mod T == r."""
    def upto(n: int) -> int:          # x in [0, n) with x mod T == r
        return 0 if n <= r else (n - r - 1) // T + 1
    return upto(r1) - upto(r0)


# Figure 15's remote fraction, modelled: Eq. 5 per byte, for each partition
def remote_fraction_model(partition: str, N: int, K: int, elem_bytes: int = 2, nodes: int = 2,
                          page_bytes: int = PAGE_4K, phase: int = 0) -> float:
    """Fraction of an [N, K] weight's bytes that the partition's threads read from a remote node.

    - "hina": each node's threads read only their local segments (Section 5.2) -> 0 under the model
      (computed, not assumed: every segment is checked against Eq. 5).
    - "row-split": output rows split evenly across all threads of all nodes in order, as oneDNN and
      IPEX do; node j's threads hold the j-th contiguous block of rows, [floor(jN/n), floor((j+1)N/n)).
    - "per-node-copy" / "tp-split": KTransformers allocates each node's part on that node -> 0.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition '{partition}'; known: {', '.join(PARTITIONS)}")
    plan = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    if partition in ("per-node-copy", "tp-split") or nodes == 1:
        return 0.0
    E = elements_per_page(page_bytes, elem_bytes)
    phase_e = plan.phase // elem_bytes
    remote = 0
    if partition == "hina":
        for j, segs in enumerate(plan.segments):
            for s in segs:
                first = (phase_e + s.x * K + s.y_start) // E % nodes
                last = (phase_e + s.x * K + s.y_end - 1) // E % nodes
                if first != j or last != j:
                    remote += (s.y_end - s.y_start) * len(plan.rows_like(s.x))
    else:  # row-split
        counts = _row_node_elements(plan)
        T = plan.T_x
        for j in range(nodes):
            r0, r1 = j * N // nodes, (j + 1) * N // nodes
            for r, per_node in enumerate(counts):
                rows = _rows_with_residue(r0, r1, r, T)
                remote += rows * (K - per_node[j])
    return remote / (N * K)


def remote_fraction_model_ffn(partition: str, hidden: int, intermediate: int, experts: int = 1,
                              elem_bytes: int = 2, nodes: int = 2, page_bytes: int = PAGE_4K,
                              phase: int = 0) -> float:
    """Byte-weighted remote fraction over an FFN's w13 [E, 2I, H] and w_down [E, H, I] (row-major,
    as hinabench.problems.ffn stores them): each expert's matrix is partitioned on its own, at the phase
    its offset in the contiguous storage gives it. w13 starts at `phase`, w_down at phase 0
    (a separate allocation; pass the real phases via tensor_placement for a measured layout)."""
    total = remote = 0.0
    for rows, cols, base in ((2 * intermediate, hidden, phase), (hidden, intermediate, 0)):
        mat = rows * cols * elem_bytes
        for e in range(experts):
            f = remote_fraction_model(partition, rows, cols, elem_bytes, nodes, page_bytes,
                                      base + e * mat)
            remote += f * mat
            total += mat
    return remote / total if total else 0.0


def virtual_node_report(N: int, K: int, nodes: int, elem_bytes: int = 2, page: int | str = PAGE_4K,
                        phase: int = 0) -> dict:
    """The model's side of the virtual-node mode: N virtual nodes on one real node."""
    page_bytes = parse_page(page)
    plan = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    errors = tiling_errors(plan)
    return {"virtual_nodes": nodes, "shape": [N, K], "T_x": plan.T_x, "T_y": plan.T_y,
            "segments_per_node": [len(s) for s in plan.segments],
            "tiles_exactly_once": not errors, "tiling_errors": errors[:5],
            "remote_fraction_model_hina": remote_fraction_model("hina", N, K, elem_bytes, nodes,
                                                                page_bytes, phase),
            "remote_fraction_model_row_split": remote_fraction_model("row-split", N, K, elem_bytes,
                                                                     nodes, page_bytes, phase)}
