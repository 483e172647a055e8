"""Memory policies (`--numa`), placing a tensor under one, and the generic remote-traffic model."""
from __future__ import annotations

import mmap
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from hinabench import numa as nm
from hinabench.errors import UserError
from hinabench.numa import placement


def test_parse_policy():
    nodes = nm.memory_nodes()
    assert nm.parse_policy("default") == ("default", None)
    assert nm.parse_policy(" Interleave ") == ("interleave", nodes)
    assert nm.parse_policy(f"bind:{nodes[0]}") == ("bind", [nodes[0]])
    with pytest.raises(UserError, match="unknown NUMA policy 'spread'; known: default, interleave, bind:N"):
        nm.parse_policy("spread")
    with pytest.raises(UserError, match=r"--numa bind:999: no memory node 999 here \(nodes: "):
        nm.parse_policy("bind:999")
    with pytest.raises(UserError, match="no memory node x here"):
        nm.parse_policy("bind:x")


@pytest.mark.parametrize("policy, want", [("default", "default"), ("interleave", "interleave"),
                                          ("bind:first", "interleave")])   # bind: interleave over one node
def test_place_tensor_sets_the_vma_policy_before_the_fill(policy, want):
    policy = policy.replace("first", str(nm.memory_nodes()[0]))
    # a new private anonymous mapping: no VMA policy left on its pages by an earlier test's mbind
    mm = mmap.mmap(-1, 256 * 4096 * 2, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(mm, dtype=torch.bfloat16).view(256, 4096)
    mode, nodes = nm.parse_policy(policy)
    nm.place_tensor(t, mode, nodes)
    t.fill_(1.0)
    p = nm.tensor_placement(t.data_ptr(), t.numel() * 2)
    assert p.policy == want
    if policy.startswith("bind"):
        assert p.node_ids == (nodes[0],)


def test_huge_page_policies_parse_with_their_placement():
    nodes = nm.memory_nodes()
    assert nm.parse_policy("default+thp") == ("default", None) and nm.huge_policy("default+thp")
    assert nm.parse_policy("Interleave+THP") == ("interleave", nodes) and nm.huge_policy("Interleave+THP")
    assert nm.parse_policy(f"bind:{nodes[0]}+thp") == ("bind", [nodes[0]])
    assert not nm.huge_policy("default") and not nm.huge_policy("interleave")
    with pytest.raises(UserError, match="unknown NUMA policy 'spread\\+thp'.*optional \\+thp"):
        nm.parse_policy("spread+thp")


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "absent"
    return text[text.index("[") + 1:text.index("]")]


def _vmstat(key: str) -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return 0


def test_a_thp_policy_puts_the_weights_on_huge_pages_before_the_fill():
    """place(t, 'default+thp') madvises an untouched tensor, so the fill's faults take 2 MiB pages;
    without +thp (THP in madvise mode) they stay 4 KiB. huge_fraction reads it back from smaps."""
    from hinabench.problems.base import place
    if _thp_mode() in ("never", "absent"):
        pytest.skip(f"transparent huge pages: {_thp_mode()}")
    mm = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(mm, dtype=torch.bfloat16)
    place(t, "default+thp")
    before = _vmstat("thp_fault_fallback")
    t.fill_(1.0)
    got = nm.huge_fraction([(t.data_ptr(), t.numel() * 2)])
    if got < 0.5 and _vmstat("thp_fault_fallback") > before:
        pytest.skip("the kernel had no free 2 MiB pages (thp_fault_fallback rose): 4 KiB pages given")
    assert got >= 0.5, got            # the 2 MiB-aligned interior: 7 or 8 of 8 pages
    if _thp_mode() == "madvise":
        mm2 = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        u = torch.frombuffer(mm2, dtype=torch.bfloat16)
        place(u, "default")
        u.fill_(1.0)
        assert nm.huge_fraction([(u.data_ptr(), u.numel() * 2)]) == 0.0


def test_huge_fraction_from_smaps_text():
    smaps = ("7f0000000000-7f0000800000 rw-p 00000000 00:00 0 \n"
             "Rss:                8192 kB\nAnonHugePages:      6144 kB\n"
             "7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 \n"
             "Rss:                2048 kB\nAnonHugePages:         0 kB\n")
    base = 0x7f0000000000
    assert nm.huge_fraction([(base, 8 << 20)], smaps) == 0.75
    assert nm.huge_fraction([(base + (8 << 20), 2 << 20)], smaps) == 0.0
    assert nm.huge_fraction([(base, 10 << 20)], smaps) == pytest.approx(0.6)
    assert nm.huge_fraction([], smaps) == 0.0


def _row(page=4096, phase=0, valid=True, reason=""):
    return {"placement_model_valid": valid, "placement_reason": reason,
            "placement_page_bytes": page, "placement_phase": phase}


def test_remote_model_where_the_model_does_not_apply():
    ffn = [(2, 64, 32, 2), (2, 32, 64, 2, 0)]
    assert nm.remote_model("default", "row-split", ffn, _row()) == {
        "work_partition": "row-split", "remote_fraction_model": None,
        "remote_fraction_basis": "first touch: placement depends on which thread touched each page; not modeled"}
    assert nm.remote_model("interleave", "hina", ffn, _row(valid=False, reason="file-backed")) == {
        "work_partition": "hina", "remote_fraction_model": None,
        "remote_fraction_basis": "placement model does not apply: file-backed"}
    node = nm.memory_nodes()[0]
    cpus = os.sched_getaffinity(0)
    r = nm.remote_model(f"bind:{node}", "row-split", ffn, _row())
    assert r["remote_fraction_model"] == 1 - len(cpus & set(nm.node_cpus(node))) / len(cpus)
    assert r["remote_fraction_basis"] == (f"bind: all weights on node {node}; threads spread over the "
                                          f"{len(cpus)} CPUs of this process")


def _ffn_matrices(H, I, A, dtype):
    """An FFN as hinabench.problem stores it: w13 [A, 2I, H] at the placement's phase, w_down
    [A, H, I] in its own allocation (phase 0)."""
    return [nm.WeightMatrices(A, 2 * I, H, dtype), nm.WeightMatrices(A, H, I, dtype, phase=0)]


@pytest.fixture
def nodes(monkeypatch, request):
    """Pretend this machine has `request.param` memory nodes (only the node count matters here)."""
    monkeypatch.setattr(placement, "memory_nodes", lambda: list(range(request.param)))
    return request.param


@pytest.mark.parametrize("nodes", [2], indirect=True)
def test_remote_model_ffn_paper_case(nodes):
    # Figure 15's oneDNN/IPEX case, as in test_numa: half the bytes remote; the hina partition: none
    r = nm.remote_model("interleave", "row-split", _ffn_matrices(4096, 14336, 2, "bf16"), _row())
    assert r == {"work_partition": "row-split", "remote_fraction_model": pytest.approx(0.5),
                 "remote_fraction_basis": "modeled: interleave over 2 node(s), row-split partition"}
    assert r["remote_fraction_model"] == nm.remote_fraction_model_ffn("row-split", 4096, 14336, 2)
    r = nm.remote_model("interleave", "hina", _ffn_matrices(4096, 14336, 2, 2), _row())
    assert r["remote_fraction_model"] == 0.0


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 4), H=st.integers(1, 24).map(lambda v: 32 * v),
       I=st.integers(1, 24).map(lambda v: 32 * v), A=st.integers(1, 3),
       page=st.sampled_from([4096, 2 * 1024 * 1024]), phase_pages=st.integers(0, 3),
       offset=st.integers(0, 2047), partition=st.sampled_from(nm.PARTITIONS))
def test_remote_model_equals_remote_fraction_model_ffn(nodes, H, I, A, page, phase_pages, offset,
                                                       partition):
    phase = (phase_pages % nodes) * page + 2 * offset
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placement, "memory_nodes", lambda: list(range(nodes)))
        got = nm.remote_model("interleave", partition, _ffn_matrices(H, I, A, "bf16"),
                              _row(page, phase))
    want = nm.remote_fraction_model_ffn(partition, H, I, A, 2, nodes, page, phase)
    assert got["remote_fraction_model"] == want           # exactly: the same sum in the same order
    assert got["work_partition"] == partition
    assert got["remote_fraction_basis"] == f"modeled: interleave over {nodes} node(s), {partition} partition"
