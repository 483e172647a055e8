"""The kernel's NUMA mode (paper Section 5, Algorithm 2) with *virtual* nodes on this one-node machine.

What holds, and is asserted here: numa="interleave-partitioned" with N virtual nodes is bit-identical
to numa="off" (the plain kernel) for every N, page model (4 KiB, 2 MiB), address phase (offset
views), token count and thread count, on every micro-kernel. Why: both modes sum every dot product as
the same canonical K pieces (cut at the row's 4 KiB address boundaries, rounded up to 32 elements,
each accumulated from zero, added in ascending K; kernels/pieces.h), and a node owns whole pieces.
Also: every weight byte of the active experts is read exactly once across the node groups (the
kernel's own count: bytes per node, and every row's pieces tile [0, K) once), no byte is remote
under the placement model when rows are 64-byte aligned (<= 62 bytes per page boundary otherwise),
numa.remote_fraction_model("hina", ...) is 0, and the result is within the bf16 tolerance of the fp32
reference.
"""
from __future__ import annotations

import functools

import pytest
import torch

from hinabench import kernels, numa
from hinabench.kernels import moe_ffn
from hinabench.problems import FFNProblem, materialize
from hinabench.dtypes import get_dtype
from hinabench.problems import moe_ffn_reference, rel_err

TOL = get_dtype("bf16").tolerance


def need(isa: str) -> None:
    ok, why = kernels.isa_status(isa)
    if not ok:
        pytest.skip(f"{isa}: {why}")


@functools.lru_cache(maxsize=4)
def weights(H: int, I: int, E: int, offset: int):
    """w13 [E, 2I, H] and w_down [E, H, I] as views `offset` elements into their storage (phase)."""
    d = materialize(FFNProblem.custom(H, I, 1, E, seed=H + I + E), rotate=False)
    def shifted(w):
        buf = torch.zeros(w.numel() + offset, dtype=torch.bfloat16)
        v = buf[offset:].view(w.shape)
        v.copy_(w)
        return v
    return shifted(d.w13), shifted(d.w_down)


def routing(T: int, E: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k, generator=g) + 0.05
    return ids, (w / w.sum(1, keepdim=True)).float()


def call(isa, x, w13, wd, ids, tw, threads=2, **kw):
    return moe_ffn(x, None, None, wd, ids, tw, w13=w13, isa=isa, threads=threads, **kw)


def check_case(isa, H, I, E, T, k, nodes, page, offset, threads=2):
    w13, wd = weights(H, I, E, offset)
    x = (torch.randn(T, H, generator=torch.Generator().manual_seed(T)) * 0.5).bfloat16()
    ids, tw = routing(T, E, k, seed=T)
    plain = call(isa, x, w13, wd, ids, tw, threads=threads, numa="off")
    kernels.numa_debug(True, isa)
    try:
        out = call(isa, x, w13, wd, ids, tw, threads=threads, numa="interleave-partitioned",
                   numa_nodes=nodes, numa_page=page)
        st = kernels.numa_stats(isa)
    finally:
        kernels.numa_debug(False, isa)
    what = f"isa={isa} H={H} I={I} E={E} T={T} nodes={nodes} page={page} offset={offset}"
    info = kernels.numa_last_call()
    assert info["mode"] == "interleave-partitioned" and info["nodes"] == nodes, info
    # bit-identical to the plain kernel
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16)), \
        f"{what}: {(out.float() - plain.float()).abs().max().item()} max abs diff vs numa=off"
    if nodes == 1:  # nothing to partition: the plain tasks ran (kernel_plan.setup), said so
        assert info.get("plain") is True, info
        return out
    # and right
    I_ = I
    ref = moe_ffn_reference(x, w13[:, :I_], w13[:, I_:], wd, ids, tw)
    assert rel_err(out, ref) <= TOL, what
    # every weight byte of the active experts read exactly once, by the node groups together
    active = len(torch.unique(ids))
    assert st["rows_bad"] == 0, f"{what}: {st['first_error']}"
    assert st["rows_checked"] == active * (2 * I + H), what
    assert sum(st["bytes"]) == active * 3 * I * H * 2, what
    assert len(st["bytes"]) == nodes, st  # (with 2 MiB pages a small matrix may miss some nodes)
    # local only: none remote under the placement model (64-byte-aligned rows), else <= 62 B per
    # page boundary the rows cross (the 32-element chunk straddling it goes with its first element)
    page_bytes = numa.parse_page(page)
    if (offset * 2) % 64 == 0:
        assert sum(st["remote_bytes"]) == 0, (what, st)
    else:
        crossings = active * 3 * I * H * 2 // 4096 + active * (2 * I + H)
        assert sum(st["remote_bytes"]) <= 62 * crossings, (what, st)
    for w, N, K in ((w13[0], 2 * I, H), (wd[0], H, I)):
        phase = w.data_ptr() % (page_bytes * nodes)
        assert numa.remote_fraction_model("hina", N, K, 2, nodes, page_bytes, phase) == 0.0
    return out


# (H, I, E, k): Table-3-like shapes (Qwen3-30B-A3B's 2048 x 768, K = 768 and 7168/1536 not multiples
# of 2048, so rows of one matrix have different 4 KiB cuts) with few experts
SHAPES = [(2048, 768, 4, 2), (1536, 512, 3, 2), (7168, 256, 2, 1)]


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("T", [1, 2, 6, 33])  # AVX2: decode tiles of 8, 4 and 2 rows; blocked
def test_avx2_virtual_nodes_bit_identical(nodes, T):
    need("avx2")
    for i, (H, I, E, k) in enumerate(SHAPES):
        page = "4k" if (i + T + nodes) % 2 else "2m"
        offset = (0, 32, 8)[(i + nodes) % 3]  # 0, 64 B (torch's page phase) and 16 B (misaligned)
        check_case("avx2", H, I, E, T, k, nodes, page, offset)


@pytest.mark.parametrize("isa,nodes,T,page,offset", [
    ("scalar", 2, 1, "4k", 32),
    ("scalar", 3, 4, "2m", 8),
    ("avx512-emulated", 2, 1, "4k", 0),
    ("avx512-emulated", 3, 5, "2m", 32),
    ("amx-emulated", 2, 1, "2m", 32),
    ("amx-emulated", 3, 4, "4k", 0),      # 3 nodes: row classes end in blocks of < 32 rows
    ("amx-emulated", 8, 33, "4k", 8),
])
def test_other_paths_virtual_nodes_bit_identical(isa, nodes, T, page, offset):
    need(isa)
    check_case(isa, 2048, 768, 3, T, 2, nodes, page, offset)


# Tokens an expert ~ T * k / E over SHAPES (E = 4, 3, 2): T = 1: one B tile; 20 (10-13): one or two;
# 40 (20-27): two B tiles; 100 (50-67) and 120 (60-80): several 32-token steps per W block sharing
# K chunks (algorithm1_steps); 300 (150-200): the steps one after the other, above kStepsMaxM
@pytest.mark.parametrize("isa,T", [(i, t) for i in ("amx-emulated", "amx") for t in (1, 20, 40, 100)]
                         + [("amx", 120), ("amx", 300)])
def test_amx_fused_rows_of_differing_cuts_bit_identical(isa, T):
    """AMX's fused tasks take rows whose piece cuts differ (MicroKernel::mixed_cuts: one pass over K,
    the accumulators stored, flushed and reloaded at every row's cut), so numa="off" no longer sends
    Qwen3's W_down (K = 768) or a 7168-wide W_gate (rows with up to four cuts) down the piece path.
    The partitioned kernel still takes the piece path: the two must agree bit for bit, with one token
    step per W block or several (the K-chunked order with its accumulators spilled per chunk)."""
    need(isa)
    for i, (H, I, E, k) in enumerate(SHAPES):
        check_case(isa, H, I, E, T, k, 2, "4k", (0, 32, 8)[i])


@pytest.mark.parametrize("isa", ["avx512", "avx512-nobf16", "amx"])
def test_real_isas_where_present(isa):
    need(isa)
    for nodes in (1, 2, 3):
        check_case(isa, 2048, 768, 4, 4, 2, nodes, "4k", 32)


def test_threads_and_node_groups_do_not_change_the_result():
    need("avx2")
    outs = [check_case("avx2", 1536, 512, 3, 4, 2, n, "4k", 32, threads=t)
            for n, t in ((3, 1), (3, 2), (2, 1), (1, 2))]
    for o in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0].view(torch.int16))


def test_mixtral_shape_one_expert():
    """K = 4096 and 14336 (multiples of 2048: the plain kernel's fused path) against the piece path."""
    need("avx2")
    d = materialize(FFNProblem.create("mixtral-8x7b", 2, 1), rotate=False)
    plain = moe_ffn(d.x, None, None, d.w_down, d.topk_ids[0], d.topk_weights, w13=d.w13, isa="avx2",
                    threads=2, numa="off")
    for nodes in (2, 3):
        out = moe_ffn(d.x, None, None, d.w_down, d.topk_ids[0], d.topk_weights, w13=d.w13,
                      isa="avx2", threads=2, numa="interleave-partitioned", numa_nodes=nodes)
        assert torch.equal(out.view(torch.int16), plain.view(torch.int16)), nodes


def test_auto_on_one_node_is_off_and_bad_values():
    need("avx2")
    w13, wd = weights(1536, 512, 3, 0)
    x = torch.randn(2, 1536).bfloat16()
    ids, tw = routing(2, 3, 2)
    out = call("avx2", x, w13, wd, ids, tw)  # numa="auto" (default)
    if len(numa.memory_nodes()) < 2:
        assert kernels.numa_last_call()["mode"] == "off"
    assert torch.equal(out, call("avx2", x, w13, wd, ids, tw, numa="off"))
    with pytest.raises(ValueError, match="numa must be"):
        call("avx2", x, w13, wd, ids, tw, numa="interleave")
    with pytest.raises(ValueError, match="numa_nodes"):
        call("avx2", x, w13, wd, ids, tw, numa="interleave-partitioned", numa_nodes=0)
    # numa_nodes given: "auto" partitions over that many (virtual) nodes
    call("avx2", x, w13, wd, ids, tw, numa="auto", numa_nodes=2)
    assert kernels.numa_last_call()["virtual"] is True


def test_numa_backends_registered():
    from hinabench import backends
    for n, isa in (("hina:avx2-numa", "avx2"), ("hina:avx512-numa", "avx512"), ("hina:amx-numa", "amx")):
        cls = backends.get(n)
        assert cls.work_partition == "hina"
        assert cls.availability()[0] == kernels.isa_status(kernels.isa_variant(isa))[0]
    assert backends.get("hina:avx2").work_partition == "row-split"
    if kernels.isa_status("avx2")[0]:
        d = materialize(FFNProblem.custom(1536, 512, 3, 2, routed_experts=4, seed=5), rotate=False)
        a, b = backends.get("hina:avx2")(2), backends.get("hina:avx2-numa")(2)
        a.prepare(d)
        b.prepare(d)
        assert torch.equal(a.run(0).view(torch.int16), b.run(0).view(torch.int16))
        assert kernels.numa_last_call()["nodes"] == len(numa.memory_nodes())
