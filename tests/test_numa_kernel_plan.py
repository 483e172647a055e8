"""hinabench.numa.kernel_plan: the plan arrays the NUMA-partitioned kernel receives, decoded and
checked against the address arithmetic (every row's [0, K) split exactly once over the nodes, each
piece inside one page of its node), plus the mode checks, the caches and the last-call record."""
from __future__ import annotations

import math
import mmap

import pytest
import torch

from hinabench import numa as nm
from hinabench.numa import kernel_plan as kp

E, I, H = 2, 96, 2080          # 2080 bf16 = 4160 B rows: pieces cross page edges at varying y


def _fresh(*shape):
    """A bf16 tensor in a new private anonymous mapping: no memory policy left on its pages by an
    earlier test's mbind (a VMA policy outlives the tensor when malloc keeps the pages)."""
    mm = mmap.mmap(-1, 2 * math.prod(shape), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mm, dtype=torch.bfloat16).view(*shape)


def _mats(place=None, fresh=False):
    new = _fresh if fresh else (lambda *shape: torch.empty(*shape, dtype=torch.bfloat16))
    w13, w_down = new(E, 2 * I, H), new(E, H, I)
    if place:
        for t in (w13, w_down):
            nm.place_tensor(t, *nm.parse_policy(place))
    w13.fill_(1.0)
    w_down.fill_(1.0)
    return w13[:, :I], w13[:, I:], w_down


def _check_arrays(mats, nodes, arrays, phases=None):
    """Decode (mat_plan, plan_hdr, seg_off, segs) and check them; `phases[kind]` = (storage start,
    its phase), None: the phase is the address's (virtual nodes)."""
    mat_plan, hdr, seg_off, segs = (a.tolist() for a in arrays)
    hdr = [hdr[i:i + 4] for i in range(0, len(hdr), 4)]
    segs = [tuple(segs[i:i + 3]) for i in range(0, len(segs), 3)]
    assert len(mat_plan) == 3 * E
    for kind, m in enumerate(mats):
        _, N, K = m.shape
        ldw = m.stride(1)
        for e in range(E):
            T_x, phase, page, off = hdr[mat_plan[kind * E + e]]
            addr = m.data_ptr() + 2 * e * m.stride(0)
            cycle = page * nodes
            if phases is None or phases[kind] is None:
                assert phase == addr % cycle
            else:
                start, start_phase = phases[kind]
                assert phase == (start_phase + addr - start) % cycle
            for x in range(N):
                pieces = []
                for j in range(nodes):
                    for sx, y0, y1 in segs[seg_off[off + j]:seg_off[off + j + 1]]:
                        if sx != x % T_x:
                            continue
                        first = (phase + 2 * (x * ldw + y0)) // page
                        last = (phase + 2 * (x * ldw + y1 - 1)) // page
                        assert first == last and first % nodes == j, (kind, e, x, j, y0, y1)
                        pieces.append((y0, y1))
                pieces.sort()
                assert pieces[0][0] == 0 and pieces[-1][1] == K
                assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), (kind, e, x, pieces)


def test_modes_and_bad_arguments():
    mats = _mats()
    assert kp.setup("off", None, None, mats) is None
    with pytest.raises(ValueError, match="numa must be one of auto, off, interleave-partitioned"):
        kp.setup("interleave", None, None, mats)
    with pytest.raises(ValueError, match="numa_nodes must be a positive int"):
        kp.setup("interleave-partitioned", 0, None, mats)
    if len(kp.real_nodes()) < 2:
        assert kp.setup("auto", None, None, mats) is None     # one node: nothing to partition
    assert kp.real_nodes() == tuple(nm.memory_nodes())


@pytest.mark.parametrize("nodes, page", [(2, "4k"), (3, "4k"), (4, "2m"), (5, None)])
def test_virtual_nodes_plan_tiles_every_row(nodes, page):
    if nodes == len(kp.real_nodes()):
        pytest.skip("as many virtual nodes as real ones: not virtual")
    mats = _mats()
    nodes_out, arrays, cpus, info = kp.setup("interleave-partitioned", nodes, page, mats)
    page_bytes = nm.parse_page(page or "4k")
    assert nodes_out == nodes and cpus == []
    assert info == {"mode": "interleave-partitioned", "nodes": nodes, "virtual": True,
                    "page_bytes": page_bytes, "bound": False, "reason": ""}
    _check_arrays(mats, nodes, arrays)
    again = kp.setup("interleave-partitioned", nodes, page, mats)[1]
    assert all(a is b for a, b in zip(arrays, again))                # PLAN_CACHE hit


@pytest.mark.parametrize("place", [None, "interleave"])
def test_real_nodes_follow_the_measured_placement(place):
    real = kp.real_nodes()
    # placements are cached by (address, bytes): a tensor freed by an earlier test and re-made at
    # the same address under another policy would get the old one (the weights are meant to live on)
    kp.storage_placement.cache_clear()
    mats = _mats(place, fresh=True)
    nodes, arrays, cpus, info = kp.setup("interleave-partitioned", len(real), None, mats)
    assert nodes == len(real) and info["virtual"] is False
    assert len(cpus) == len(real) and info["bound"] == any(cpus)
    pls = [kp.storage_placement(*kp.storage_span(m)) for m in mats]
    if place == "interleave":
        assert all(p.valid for p in pls) and info["reason"] == ""
        assert info["page_bytes"] == pls[0].page_bytes
        _check_arrays(mats, nodes, arrays, [(kp.storage_span(m)[0], p.phase) for m, p in zip(mats, pls)])
    else:                                                # first touch: not an interleave
        assert not any(p.valid for p in pls)
        assert info["reason"].startswith("placement model invalid (memory policy is 'default', not "
                                         "interleave")
        assert info["reason"].endswith("): segments from the address model")
        assert info["page_bytes"] == 4096
        _check_arrays(mats, nodes, arrays)


def test_record_and_last_call():
    kp.record({"mode": "interleave-partitioned", "nodes": 2})
    got = kp.last_call()
    assert got == {"mode": "interleave-partitioned", "nodes": 2}
    got["nodes"] = 7                                     # a copy
    kp.record({"mode": "off"})
    assert kp.last_call() == {"mode": "off"}
