"""`hinabench numa check`: allocate a weight under MPOL_INTERLEAVE, ask the kernel where each page
is (move_pages), and compare with the placement model."""
from __future__ import annotations

import ctypes

from .linux import (MADV_HUGEPAGE, MADV_NOHUGEPAGE, MAP_ANONYMOUS, MAP_PRIVATE, MPOL_INTERLEAVE,
                    MPOL_MF_STRICT, PROT_READ, PROT_WRITE, memory_nodes, numa_api, page_nodes,
                    tensor_placement)
from .model import PAGE_2M, PAGE_4K, parse_page


def check_placement(N: int, K: int, elem_bytes: int = 2, nodes: list[int] | None = None,
                    page: int | str = PAGE_4K, max_mismatches: int = 8) -> dict:
    """Allocate an [N, K] weight (mmap anonymous + mbind MPOL_INTERLEAVE over `nodes`), touch it,
    ask the kernel where every 4 KiB page is (move_pages with nodes=NULL), and compare with the
    placement model. With 2 MiB requested the buffer is 2 MiB-aligned and madvised MADV_HUGEPAGE;
    the page size actually seen is read back from smaps and is what the model uses."""
    page_bytes = parse_page(page)
    nodes = sorted(nodes or memory_nodes())
    nbytes = N * K * elem_bytes
    if N < 1 or K < 1:
        raise ValueError(f"weight shape must be positive (got {N}x{K})")
    api = numa_api()
    libc = api.libc
    length = (nbytes + PAGE_2M - 1) // PAGE_2M * PAGE_2M
    map_len = length + PAGE_2M
    base = libc.mmap(None, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        start = (base + PAGE_2M - 1) // PAGE_2M * PAGE_2M
        libc.madvise(start, length, MADV_HUGEPAGE if page_bytes == PAGE_2M else MADV_NOHUGEPAGE)
        api.mbind(start, length, MPOL_INTERLEAVE, nodes, MPOL_MF_STRICT)
        ctypes.memset(start, 1, nbytes)                                  # first touch: fault in
        placement = tensor_placement(start, nbytes)
        addrs = list(range(start, start + nbytes, PAGE_4K))
        seen = page_nodes(addrs)
        mismatches, absent, by_node = [], 0, {}
        for a, s in zip(addrs, seen):
            if s < 0:
                absent += 1
                continue
            by_node[s] = by_node.get(s, 0) + 1
            want = placement.model_node(a) if placement.valid else None
            if want is not None and s != want and len(mismatches) < max_mismatches:
                mismatches.append({"offset": a - start, "kernel": s, "model": want})
        n_mis = sum(1 for a, s in zip(addrs, seen)
                    if s >= 0 and placement.valid and s != placement.model_node(a))
        return {"shape": [N, K], "elem_bytes": elem_bytes, "bytes": nbytes,
                "nodes": nodes, "page_requested": page_bytes, "page_seen": placement.page_bytes,
                "policy": placement.policy, "numa_api": api.via,
                "pages_checked": len(addrs) - absent, "pages_absent": absent,
                "pages_per_node": {str(k): v for k, v in sorted(by_node.items())},
                "mismatches": n_mis, "first_mismatches": mismatches,
                "placement_model_valid": placement.valid, "placement_reason": placement.reason,
                "phase": placement.phase}
    finally:
        libc.munmap(base, map_len)
