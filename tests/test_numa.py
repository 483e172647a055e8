"""The interleave placement model and Section 5's segments (Equations 3-5), against brute force."""
from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hinabench import numa as nm

# ---- the paper's numbers (Section 5.2: 4 KiB pages, phase 0, bf16, two nodes) -------------------


@pytest.mark.parametrize("K, T_x", [(4096, 1), (14336, 2), (2048, 2), (768, 16), (6144, 2)])
def test_paper_periods(K, T_x):
    assert nm.interleave_period(K, nodes=2, elem_bytes=2, page_bytes=4096) == (T_x, 4096)


def test_figure_7b_segments():
    p = nm.local_segments(N=8, K=6144, elem_bytes=2, nodes=2, page_bytes=4096, phase=0)
    assert (p.T_x, p.T_y) == (2, 4096)
    assert [tuple(s) for s in p.segments[0]] == [(0, 0, 2048), (0, 4096, 6144), (1, 2048, 4096)]
    assert [tuple(s) for s in p.segments[1]] == [(0, 2048, 4096), (1, 0, 2048), (1, 4096, 6144)]
    # Section 5.2: "the first 2,048 elements of row 0 are on NUMA 0, ... of row 1 are on NUMA 1"
    assert nm.node_of(0, 0, 6144, 2) == 0 and nm.node_of(1, 0, 6144, 2) == 1
    # Figure 8(b): elements 0~2047 of row 0 and of row 2 both sit on node 0
    assert nm.node_of(2, 0, 6144, 2) == 0


def test_elements_per_page_is_the_papers_2048():
    assert nm.elements_per_page(4096, 2) == 2048
    assert nm.elements_per_page(nm.PAGE_2M, 1) == 2 * 1024 * 1024


def test_plan_for_kernel_is_plain_ints():
    k = nm.plan_for_kernel(14336, 6144, nodes=2, page="4k", phase=0)
    assert (k.T_x, k.T_y, k.nodes) == (2, 4096, 2)
    assert k.s_index[0] == ((0, 0, 2048), (0, 4096, 6144), (1, 2048, 4096))
    assert all(type(v) is int for node in k.s_index for s in node for v in s)
    assert k.to_dict()["s_index"][1][0] == [0, 2048, 4096]


@pytest.mark.parametrize("bad", [dict(N=0, K=8), dict(N=8, K=0), dict(N=8, K=8, nodes=0),
                                 dict(N=8, K=8, phase=3), dict(N=8, K=8, phase=-2)])
def test_bad_input_raises_value_error(bad):
    with pytest.raises(ValueError):
        nm.local_segments(**{"nodes": 2, **bad})


def test_element_size_comes_from_the_dtype_table():
    from hinabench import dtypes
    assert nm.element_size("bf16") == dtypes.element_bytes("bf16") == 2
    assert nm.element_size(3) == 3 and nm.element_size(1) == 1      # numbers pass as they are
    assert nm.element_size("int8") == 1 and nm.element_size("fp32") == 4   # layout-only names
    with pytest.raises(ValueError, match="unknown dtype 'q4'"):
        nm.element_size("q4")


# ---- properties, across shapes (multiples of 32), 1-8 nodes, both page sizes, random phases -----

def _node_map(N, K, eb, nodes, page, phase):
    """Brute force: the node index of every element, straight from the address arithmetic."""
    lin = np.arange(N * K, dtype=np.int64).reshape(N, K) * eb + phase
    return (lin // page) % nodes


@st.composite
def layouts(draw, max_rows=128, max_cols=4096):
    N = 32 * draw(st.integers(1, max_rows // 32))
    K = 32 * draw(st.integers(1, max_cols // 32))
    nodes = draw(st.integers(1, 8))
    eb = draw(st.sampled_from([1, 2]))
    page = draw(st.sampled_from([nm.PAGE_4K, nm.PAGE_2M]))
    phase = eb * draw(st.integers(0, nodes * page // eb - 1))
    return N, K, eb, nodes, page, phase


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_element_in_exactly_one_nodes_segments(layout):
    N, K, eb, nodes, page, phase = layout
    plan = nm.local_segments(N, K, eb, nodes, page, phase)
    cover = np.zeros((N, K), dtype=np.int16)
    for j in range(nodes):
        for s in plan.all_segments(j):
            cover[s.x, s.y_start:s.y_end] += 1
    assert (cover == 1).all()
    assert nm.tiling_errors(plan) == []


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_every_segment_within_one_page_of_its_node(layout):
    N, K, eb, nodes, page, phase = layout
    plan = nm.local_segments(N, K, eb, nodes, page, phase)
    truth = _node_map(N, K, eb, nodes, page, phase)
    for j in range(nodes):
        for s in plan.all_segments(j):
            first = phase + (s.x * K + s.y_start) * eb
            last = phase + (s.x * K + s.y_end - 1) * eb
            assert first // page == last // page                  # one page
            assert (first // page) % nodes == j                    # of node j (Eq. 5)
            assert (truth[s.x, s.y_start:s.y_end] == j).all()      # brute force agrees


@settings(max_examples=100, deadline=None)
@given(layouts(max_rows=4096, max_cols=32768), st.data())
def test_periodicity_claims(layout, data):
    N, K, eb, nodes, page, phase = layout
    T_x, T_y = nm.interleave_period(K, nodes, eb, page)
    E = page // eb
    assert T_y == E * nodes
    x = data.draw(st.integers(0, 10 * T_x))
    y = data.draw(st.integers(0, K - 1))
    f = nm.interleave_function(x, y, K, nodes, eb, page, phase)
    assert nm.interleave_function(x + T_x, y, K, nodes, eb, page, phase) == f      # Eq. 4, rows
    assert nm.interleave_function(x, y + T_y, K, nodes, eb, page, phase) == f      # Eq. 4, cols
    assert nm.interleave_function(x + T_x, y + T_y, K, nodes, eb, page, phase) == f
    # T_x is the smallest row period: no proper divisor of it is one
    assert (T_x * K) % T_y == 0
    for p in (q for q in range(2, int(math.isqrt(T_x)) + 2) if T_x % q == 0):
        assert ((T_x // p) * K) % T_y != 0
    if T_x > 1 and all(T_x % q for q in range(2, int(math.isqrt(T_x)) + 1)):   # T_x prime
        assert K % T_y != 0


@settings(max_examples=40, deadline=None)
@given(layouts(max_rows=256, max_cols=2048))
def test_remote_fraction_model_against_brute_force(layout):
    N, K, eb, nodes, page, phase = layout
    truth = _node_map(N, K, eb, nodes, page, phase)
    remote = 0
    for j in range(nodes):                    # row split: node j holds rows [jN/n, (j+1)N/n)
        rows = truth[j * N // nodes:(j + 1) * N // nodes]
        remote += int((rows != j).sum())
    got = nm.remote_fraction_model("row-split", N, K, eb, nodes, page, phase)
    assert got == pytest.approx(remote / (N * K), abs=1e-12)
    for part in ("hina", "per-node-copy", "tp-split"):
        assert nm.remote_fraction_model(part, N, K, eb, nodes, page, phase) == 0.0
    if nodes == 1:
        assert got == 0.0


def test_remote_fraction_row_split_two_nodes_is_half():
    # Figure 15's oneDNN/IPEX case: with 4 KiB interleave about half the weight bytes are remote
    assert nm.remote_fraction_model("row-split", 14336, 4096, 2, 2) == 0.5
    assert nm.remote_fraction_model_ffn("row-split", 4096, 14336, experts=2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        nm.remote_fraction_model("magic", 32, 32)


def test_virtual_nodes_tile_and_are_local():
    for n in (1, 2, 3, 4, 8):
        r = nm.virtual_node_report(256, 768, n)
        assert r["tiles_exactly_once"] and r["remote_fraction_model_hina"] == 0.0


# ---- Linux: placement detection (synthetic smaps) ----------------------------------------------

def _smaps(start, end, perms="rw-p", path="", **fields):
    head = f"{start:x}-{end:x} {perms} 00000000 00:00 0          {path}\n"
    body = "".join(f"{k}: {v // 1024} kB\n" for k, v in
                   {"Size": end - start, "Rss": end - start, **fields}.items())
    return head + body


IL2 = ("interleave", [0, 1])


def test_placement_anonymous_4k_phase_is_the_address():
    start = 0x7f0000001000
    text = _smaps(start, start + 64 * 4096, AnonHugePages=0)
    p = nm.tensor_placement(start + 4096 + 64, 8 * 4096, text, IL2)
    assert p.valid and p.page_bytes == 4096
    ilx = (start + 4096) >> 12
    assert p.phase == (ilx % 2) * 4096 + 64
    assert p.model_node(start + 4096) == [0, 1][ilx % 2]


def test_placement_thp_in_unaligned_vma_uses_the_kernels_formula():
    start = 0x7f0000100000                          # 1 MiB past a 2 MiB boundary
    end = start + 9 * nm.PAGE_2M
    lo = (start + nm.PAGE_2M - 1) // nm.PAGE_2M * nm.PAGE_2M
    text = _smaps(start, end, AnonHugePages=8 * nm.PAGE_2M)
    p = nm.tensor_placement(lo, 4 * nm.PAGE_2M, text, IL2)
    assert p.valid and p.page_bytes == nm.PAGE_2M
    # get_vma_policy: (vm_pgoff >> 9) + ((addr - vm_start) >> 21) -- one less than addr >> 21 here
    assert p.interleave_index(lo) == (start >> 12 >> 9) + ((lo - start) >> 21) == (lo >> 21) - 1
    assert p.interleave_index(lo + nm.PAGE_2M + 5) == p.interleave_index(lo) + 1


@pytest.mark.parametrize("kind, text_kw, words", [
    ("file", dict(path="/models/mixtral.safetensors", perms="r--s"), "allocation order"),
    ("shmem", dict(path="/memfd:weights (deleted)", perms="rw-s"), "inode"),
    ("mixed", dict(AnonHugePages=nm.PAGE_2M), "mixed page sizes"),
])
def test_placement_not_modelled_is_reported(kind, text_kw, words):
    start = 0x7f0000000000
    text = _smaps(start, start + 8 * nm.PAGE_2M, **text_kw)
    p = nm.tensor_placement(start + 4096, 4096 * 10, text, IL2)
    assert not p.valid and words in p.reason
    assert p.as_row()["placement_model_valid"] is False


def test_placement_spanning_vmas_or_not_interleaved():
    start = 0x55d000000000                      # e.g. [heap] grown by brk: two adjacent VMAs
    text = _smaps(start, start + 4 * 4096, path="[heap]", AnonHugePages=0) + \
        _smaps(start + 4 * 4096, start + 16 * 4096, AnonHugePages=0)
    p = nm.tensor_placement(start + 4096 + 64, 8 * 4096, text, IL2)
    assert p.valid and p.phase == ((start + 4096) >> 12) % 2 * 4096 + 64     # ilx = addr >> 12
    assert "not (wholly) mapped" in nm.tensor_placement(start, 32 * 4096, text, IL2).reason
    thp = _smaps(start, start + 2 * nm.PAGE_2M, AnonHugePages=2 * nm.PAGE_2M) + \
        _smaps(start + 2 * nm.PAGE_2M, start + 4 * nm.PAGE_2M, AnonHugePages=2 * nm.PAGE_2M)
    p = nm.tensor_placement(start + nm.PAGE_2M, 2 * nm.PAGE_2M, thp, IL2)
    assert not p.valid and "several VMAs" in p.reason
    p = nm.tensor_placement(start, 4096, text, ("default", [0]))
    assert not p.valid and "not interleave" in p.reason


# ---- Linux: the kernel's answer on this machine ------------------------------------------------

def test_move_pages_every_page_on_this_machines_node():
    nodes = nm.memory_nodes()
    res = nm.check_placement(64, 6144, 2)
    assert res["pages_checked"] == 64 * 6144 * 2 // 4096 and res["pages_absent"] == 0
    assert res["placement_model_valid"] and res["mismatches"] == 0
    assert res["policy"] == "interleave" and res["page_seen"] == 4096
    if len(nodes) == 1:
        assert res["pages_per_node"] == {str(nodes[0]): res["pages_checked"]}


def test_move_pages_through_raw_syscalls_and_task_policy():
    """Task policy (what numactl --interleave sets), raw syscalls (no libnuma)."""
    api = nm.NumaApi(use_libnuma=False)
    libc = api.libc
    size = 128 * 4096
    base = libc.mmap(None, size, nm.PROT_READ | nm.PROT_WRITE, nm.MAP_PRIVATE | nm.MAP_ANONYMOUS,
                     -1, 0)
    try:
        libc.madvise(base, size, nm.MADV_NOHUGEPAGE)
        with nm.memory_policy("interleave"):
            ctypes.memset(base, 1, size)                     # faulted in under the task policy
            p = nm.tensor_placement(base + 64, size - 64)
        assert api.get_mempolicy(None)[0] == nm.MPOL_DEFAULT       # restored after the block
        assert p.valid, p.reason
        addrs = list(range(base, base + size, 4096))
        seen = api.move_pages_query(addrs)
        assert all(s in nm.memory_nodes() for s in seen)
        assert all(s == p.model_node(a) for a, s in zip(addrs, seen))
    finally:
        libc.munmap(base, size)


def test_torch_tensor_placement_under_interleave_is_modelled():
    """A torch tensor faulted in under an interleave task policy sits in private anonymous memory
    (malloc: [heap] or an mmap chunk), so the detector models it: the policy and node set in force,
    no reason, 4 KiB pages, and the kernel agrees page by page. Only with THP "always" may its VMA
    mix 2 MiB and 4 KiB pages (or the tensor span VMAs with huge pages): then it must say so."""
    torch = pytest.importorskip("torch")
    with nm.memory_policy("interleave"):
        t = torch.empty(64, 4096, dtype=torch.bfloat16)
        t.fill_(1.0)
        p = nm.tensor_placement(t.data_ptr(), t.numel() * 2)
    assert p.policy == "interleave" and p.backing == "anonymous-private", p
    assert p.node_ids == tuple(nm.memory_nodes())
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp_always = "[always]" in f.read()
    except OSError:
        thp_always = False
    if thp_always and not p.valid:
        assert "mixed page sizes" in p.reason or "several VMAs" in p.reason, p.reason
        return
    assert p.valid and p.reason == "", p.reason
    if not thp_always:
        assert p.page_bytes == 4096
    if len(p.node_ids) == 1:
        assert p.phase == t.data_ptr() % p.page_bytes      # one node: only the offset in the page
    addrs = list(range(t.data_ptr() // 4096 * 4096, t.data_ptr() + t.numel() * 2, 4096))
    assert nm.page_nodes(addrs) == [p.model_node(a) for a in addrs]


def test_interleave_range_then_multithreaded_touch():
    torch = pytest.importorskip("torch")
    t = torch.empty(256, 4096, dtype=torch.bfloat16)
    nm.interleave_range(t.data_ptr(), t.numel() * 2)
    t.fill_(1.0)                                            # torch's threads fault the pages in
    p = nm.tensor_placement(t.data_ptr(), t.numel() * 2)
    assert p.policy == "interleave"
    assert p.valid or "page sizes" in p.reason or "several VMAs" in p.reason, p.reason
