"""Memory policies for the weights of a problem (`--numa default|interleave|bind:N`): parsing them,
placing a tensor under one before it is filled, and the remote-traffic model of a backend's work
partition over the weight matrices a problem reads (Section 5; Figure 15 where counters are missing).
"""
from __future__ import annotations

import os
from typing import Iterable, NamedTuple

from ..errors import UserError
from .linux import huge_pages_range, huge_pages_ranges, interleave_range, memory_nodes, node_cpus
from .model import element_size, remote_fraction_model


HUGE_SUFFIX = "+thp"


def huge_policy(policy: str) -> bool:
    """Whether a memory policy asks for transparent huge pages: a '+thp' suffix ('default+thp',
    'interleave+thp', 'bind:0+thp'); without it the weights get whatever THP's mode gives an
    un-advised allocation (in `madvise` mode, as on the development machines: 4 KiB pages)."""
    return policy.strip().lower().endswith(HUGE_SUFFIX)


def parse_policy(policy: str) -> tuple[str, list[int] | None]:
    """'default' (first touch) | 'interleave' (all nodes, like numactl --interleave=all) |
    'bind:N' -> (mode, nodes), each optionally with '+thp' (huge_policy: the weights on 2 MiB pages).
    Raises UserError for anything else or a node that does not exist."""
    p = policy.strip().lower()
    if p.endswith(HUGE_SUFFIX):
        p = p[: -len(HUGE_SUFFIX)]
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
    raise UserError(f"unknown NUMA policy '{policy}'; known: default, interleave, bind:N, each with an "
                    f"optional +thp (weights on transparent huge pages)")


def place_tensor(t, mode: str, nodes: list[int] | None, huge: bool = False) -> None:
    """Give an untouched tensor's pages a VMA policy (mbind) before the multi-threaded fill touches
    them: interleave over `nodes`, or all on one node (bind = interleave over that one node).
    `mode`, `nodes`: what parse_policy returns; "default" leaves the pages to first touch.
    `huge` (huge_policy): also madvise the range for transparent huge pages, so the fill's faults
    allocate 2 MiB pages."""
    if mode != "default":
        interleave_range(t.data_ptr(), t.numel() * t.element_size(), nodes)
    if huge:
        huge_pages_range(t.data_ptr(), t.numel() * t.element_size())


def huge_pages_tensors(tensors, collapse: bool = True) -> str:
    """Put tensors already filled (quantized copies) on transparent huge pages: madvise and
    MADV_COLLAPSE each (Linux 6.1+). "" when done, else the first reason it could not be."""
    return huge_pages_ranges([(t.data_ptr(), t.numel() * t.element_size()) for t in tensors], collapse)


class WeightMatrices(NamedTuple):
    """`count` row-major [N, K] weight matrices stored back to back (e.g. one per active expert),
    the first starting at byte `phase` of the interleave cycle; None: at the phase of the placement
    given to remote_model (the tensor it was measured on). `elem_bytes`: a number or a dtype name."""
    count: int
    N: int
    K: int
    elem_bytes: int | str
    phase: int | None = None


def remote_model(policy: str, partition: str, matrices: Iterable[tuple],
                 placement: dict) -> dict:
    """remote_fraction_model: the share of weight bytes the backend's work partition reads from a
    remote node, under the placement model (Section 5); None where the model does not apply.

    `matrices`: the weights one call reads, as WeightMatrices (or plain tuples in its field order);
    each matrix is partitioned on its own and the fractions are weighted by bytes. `placement`: a
    Placement.as_row() dict (placement_model_valid, placement_reason, placement_page_bytes,
    placement_phase). For an FFN as hinabench.problems.ffn stores it (w13 [E, 2I, H], then w_down
    [E, H, I] in a separate allocation) the matrices are
    [(A, 2I, H, dtype), (A, H, I, dtype, 0)]: remote_fraction_model_ffn's numbers.
    Returns {work_partition, remote_fraction_model, remote_fraction_basis}."""
    mode, nodes = parse_policy(policy)
    out = {"work_partition": partition}
    if mode == "default":
        return {**out, "remote_fraction_model": None,
                "remote_fraction_basis": "first touch: placement depends on which thread touched each page; not modeled"}
    if mode == "bind":
        cpus = os.sched_getaffinity(0)
        local = len(cpus & set(node_cpus(nodes[0])))
        return {**out, "remote_fraction_model": 1 - local / max(len(cpus), 1),
                "remote_fraction_basis": f"bind: all weights on node {nodes[0]}; threads spread over the "
                                         f"{len(cpus)} CPUs of this process"}
    if not placement.get("placement_model_valid"):
        return {**out, "remote_fraction_model": None,
                "remote_fraction_basis": f"placement model does not apply: {placement.get('placement_reason')}"}
    n = len(nodes or memory_nodes())
    page_bytes = int(placement["placement_page_bytes"])
    phase = int(placement["placement_phase"])
    total = remote = 0.0
    for m in (WeightMatrices(*m) for m in matrices):
        eb = element_size(m.elem_bytes)
        size = m.N * m.K * eb
        base = phase if m.phase is None else m.phase
        for e in range(m.count):
            f = remote_fraction_model(partition, m.N, m.K, eb, n, page_bytes, base + e * size)
            remote += f * size
            total += size
    return {**out, "remote_fraction_model": remote / total if total else 0.0,
            "remote_fraction_basis": f"modeled: interleave over {n} node(s), {partition} partition"}
