"""What the NUMA-partitioned HiNa kernel receives (Section 5, Algorithm 2): per weight matrix and
expert, the periods and each node's local segments (Eq. 5, from hinabench.numa.model) as flat int
arrays, the nodes' CPUs, and a record of how the last call ran (kernels.numa_last_call).

    setup(numa, numa_nodes, numa_page, (w_gate, w_up, w_down)) -> None (run plain) or
        (nodes, (mat_plan, plan_hdr, seg_off, segs), node_cpus, info)

Real nodes: the segments follow each matrix's measured placement (tensor_placement: page size and
phase of its storage). Virtual nodes (numa_nodes given and different from the real node count): the
placement is modelled by address, as if interleaved over that many nodes, and no thread is bound.
Plans are cached (by weight address, shape and strides), placements by storage span, segments by
shape and phase. Torch is needed only for the arrays and is imported there.
"""
from __future__ import annotations

import functools

from .linux import memory_nodes, node_cpus, tensor_placement
from .model import parse_page, plan_for_kernel

NUMA_MODES = ("auto", "off", "interleave-partitioned")
_last: dict = {"mode": "off"}


def record(info: dict) -> None:
    """Remember how a call ran (what last_call() returns): {"mode": "off"}, or setup()'s info."""
    _last.clear()
    _last.update(info)


def last_call() -> dict:
    """How the last call ran: mode, and for the partitioned mode nodes, virtual, page_bytes, bound,
    reason."""
    return dict(_last)


@functools.lru_cache(maxsize=1)
def real_nodes() -> tuple[int, ...]:
    """The memory nodes of this machine (read once per process)."""
    return tuple(memory_nodes())


@functools.lru_cache(maxsize=256)
def storage_placement(address: int, nbytes: int):
    """tensor_placement of a storage span, cached (the weights do not move between calls)."""
    return tensor_placement(address, nbytes)


@functools.lru_cache(maxsize=4096)
def segments(N: int, ldw: int, K: int, nodes: int, page_bytes: int, phase: int):
    """(T_x, per-node ((x, y_start, y_end), ...)) for an [N, ldw] row-major matrix, clipped to y < K."""
    p = plan_for_kernel(N, ldw, nodes, page=page_bytes, phase=phase)
    segs = tuple(tuple((x, y0, min(y1, K)) for x, y0, y1 in node if y0 < K) for node in p.s_index)
    return p.T_x, segs


def storage_span(w) -> tuple[int, int]:
    """(address, bytes) of a tensor's whole storage (what the placement is read for)."""
    st = w.untyped_storage()
    return st.data_ptr(), st.nbytes()


PLAN_CACHE: dict = {}


def plans(mats, E: int, nodes: int, page_bytes: int, placements):
    """Flat arrays for the kernel: mat_plan [3E], plan_hdr [P, 4], seg_off, segs (int tensors).
    mats = (w_gate, w_up, w_down) [E, N, K] views; placements[i] = (storage start, phase of that
    start in the interleave cycle) or None (virtual: the phase is the address's)."""
    import torch
    key = (tuple((m.data_ptr(), tuple(m.shape), tuple(m.stride())) for m in mats), nodes, page_bytes,
           placements)
    hit = PLAN_CACHE.get(key)
    if hit is not None:
        return hit
    cycle = page_bytes * nodes
    plan_ids: dict = {}
    hdr: list[int] = []
    seg_off: list[int] = []
    segs: list[int] = []
    mat_plan: list[int] = []
    for kind, m in enumerate(mats):
        _, N, K = (int(v) for v in m.shape)
        es, ldw = int(m.stride(0)), int(m.stride(1))
        for e in range(E):
            addr = m.data_ptr() + 2 * e * es
            if placements[kind] is None:
                phase = addr % cycle
            else:
                start, start_phase = placements[kind]
                phase = (start_phase + addr - start) % cycle
            pkey = (N, ldw, K, phase)
            if pkey not in plan_ids:
                T_x, per_node = segments(N, max(ldw, K), K, nodes, page_bytes, phase)
                plan_ids[pkey] = len(plan_ids)
                hdr.extend((T_x, phase, page_bytes, len(seg_off)))
                for node in per_node:
                    seg_off.append(len(segs) // 3)
                    for t in node:
                        segs.extend(t)
                seg_off.append(len(segs) // 3)
            mat_plan.append(plan_ids[pkey])
    out = (torch.tensor(mat_plan, dtype=torch.int32), torch.tensor(hdr, dtype=torch.int64),
           torch.tensor(seg_off, dtype=torch.int32), torch.tensor(segs or [0, 0, 0], dtype=torch.int32))
    if len(PLAN_CACHE) > 64:
        PLAN_CACHE.clear()
    PLAN_CACHE[key] = out
    return out


def setup(numa: str, numa_nodes: int | None, numa_page: str | None, mats):
    """None (run plain) or (nodes, plan arrays, node_cpus, info) for the partitioned kernel. On one
    node info["plain"] is True: Algorithm 2 has nothing to partition there (every piece is local), so
    the kernel runs the plain tasks -- the same sums, bit for bit, without the piece tasks' reduction
    (the plan and the placement are still read and recorded)."""
    if numa not in NUMA_MODES:
        raise ValueError(f"numa must be one of {', '.join(NUMA_MODES)} (got {numa!r})")
    if numa == "off":
        return None
    real = real_nodes()
    if numa_nodes is not None and not (isinstance(numa_nodes, int) and numa_nodes >= 1):
        raise ValueError(f"numa_nodes must be a positive int (got {numa_nodes!r})")
    virtual = numa_nodes is not None and numa_nodes != len(real)
    if numa == "auto" and numa_nodes is None and len(real) < 2:
        return None  # one node: nothing to partition (cheap: no smaps read)
    nodes = numa_nodes or len(real)
    placements, page, reason = [None, None, None], numa_page, ""
    cpus: list[list[int]] = []
    if not virtual:
        pls = [storage_placement(*storage_span(m)) for m in mats]
        ok = all(p.valid and len(p.node_ids) == nodes for p in pls)
        if numa == "auto" and not (ok and nodes >= 2):
            return None
        if ok and len({p.page_bytes for p in pls}) == 1:
            page = page or pls[0].page_bytes
            placements = [(storage_span(m)[0], p.phase) for m, p in zip(mats, pls)]
            node_ids = pls[0].node_ids
        else:
            reason = "; ".join(sorted({p.reason or "page sizes differ" for p in pls if not p.valid} or
                                      {"placements differ"}))
            reason = f"placement model invalid ({reason}): segments from the address model"
            node_ids = real
        for n in node_ids:
            try:
                cpus.append(node_cpus(n))
            except OSError:
                cpus.append([])
    page_bytes = parse_page(page or "4k")
    arrays = plans(mats, int(mats[0].shape[0]), nodes, page_bytes, tuple(placements))
    info = {"mode": "interleave-partitioned", "nodes": nodes, "virtual": virtual,
            "page_bytes": page_bytes, "bound": bool(cpus and any(cpus)), "reason": reason}
    if nodes == 1:
        info["plain"] = True
    return nodes, arrays, cpus, info
