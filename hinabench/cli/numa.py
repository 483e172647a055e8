"""`hinabench numa ...`: the interleave model's plan, and its check against the kernel.

The lead attaches this group to the main CLI with `cli.add_command(numa)`.
"""
from __future__ import annotations

import json
import re

import click
from rich.console import Console
from rich.table import Table

from .. import numa as nm
from ..errors import UserError

# --dtype: the weight dtype table's names (hinabench.dtypes; not imported here: it imports torch,
# which the CLI's start-up does without) and the model's layout-only ones; sizes from nm.element_size.
DTYPE_CHOICES = tuple(sorted({"bf16", *nm.LAYOUT_ONLY_ELEMENT_BYTES}))


def _shape(value: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(-?\d+)\s*[xX*,]\s*(-?\d+)\s*", value or "")
    if not m:
        raise UserError(f"--shape must look like NxK, e.g. 14336x4096 (got '{value}')")
    N, K = int(m.group(1)), int(m.group(2))
    if N < 1 or K < 1:
        raise UserError(f"--shape needs positive N and K (got {N}x{K})")
    return N, K


def _nodes_list(value: str) -> list[int] | None:
    if value in (None, "", "all"):
        return None
    try:
        return nm.parse_cpulist(value)
    except ValueError:
        raise UserError(f"--nodes must be 'all' or a list like 0,1 or 0-3 (got '{value}')")


def _segments_table(plan: nm.SegmentPlan, title: str) -> Table:
    E = plan.page_bytes // plan.elem_bytes
    t = Table(title=title)
    t.add_column("node")
    t.add_column("x", justify="right")
    t.add_column("y_start", justify="right")
    t.add_column("y_end", justify="right")
    t.add_column("elements", justify="right")
    for node, segs in enumerate(plan.segments):
        for s in segs:
            t.add_row(str(node), str(s.x), str(s.y_start), str(s.y_end), str(s.y_end - s.y_start))
    t.caption = (f"y_end exclusive; {E} elements per page; rows x + k*T_x (< N) share row x's "
                 "segments")
    return t


@click.group()
def numa():
    """NUMA: interleave-aware partitioning (paper Section 5) and its placement model."""


@numa.command()
@click.option("--shape", required=True, help="weight [N, K] as NxK (K: the reduction dimension)")
@click.option("--nodes", "nodes", type=int, default=2, show_default=True, help="NUMA nodes")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="bf16",
              show_default=True)
@click.option("--page", type=click.Choice(sorted(nm.PAGE_SIZES)), default="4k", show_default=True)
@click.option("--phase", type=int, default=0, show_default=True,
              help="bytes: where the tensor starts in the interleave cycle (0: a page of node 0)")
@click.option("--max-rows", type=int, default=64, show_default=True,
              help="print segments of at most this many rows of the period (JSON: all)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def plan(shape, nodes, dtype, page, phase, max_rows, as_json):
    """Periods T_x, T_y (Eq. 4) and each node's segments in the first period of x (Eq. 5)."""
    N, K = _shape(shape)
    if nodes < 1:
        raise UserError(f"--nodes must be at least 1 (got {nodes})")
    eb = nm.element_size(dtype)
    try:
        p = nm.local_segments(N, K, eb, nodes, nm.PAGE_SIZES[page], phase)
        rf = {part: nm.remote_fraction_model(part, N, K, eb, nodes, nm.PAGE_SIZES[page], phase)
              for part in nm.PARTITIONS}
    except ValueError as e:
        raise UserError(str(e))
    if as_json:
        d = p.to_dict()
        d["dtype"] = dtype
        d["remote_fraction_model"] = rf
        click.echo(json.dumps(d))
        return
    con = Console()
    con.print(f"[bold]{N}x{K} {dtype}[/], {nodes} node(s), {page} pages, phase {p.phase} B: "
              f"T_x = {p.T_x}, T_y = {p.T_y}")
    shown = nm.SegmentPlan(**{**p.__dict__, "segments": tuple(
        tuple(s for s in segs if s.x < max_rows) for segs in p.segments)})
    title = "segments per node, x < T_x" + ("" if p.rows_in_period <= max_rows
                                             else f" (rows < {max_rows} of {p.rows_in_period})")
    con.print(_segments_table(shown, title))
    con.print("modeled remote fraction: " + ", ".join(f"{k} {v:.3f}" for k, v in rf.items()))


@numa.command()
@click.option("--shape", default="1024x6144", show_default=True, help="weight [N, K] as NxK")
@click.option("--nodes", "nodes", default="all", show_default=True,
              help="nodes to interleave over: 'all' or a list like 0,1")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="bf16",
              show_default=True)
@click.option("--page", type=click.Choice(sorted(nm.PAGE_SIZES)), default="4k", show_default=True,
              help="2m: 2 MiB-aligned buffer with MADV_HUGEPAGE (the page size seen is reported)")
@click.option("--virtual-nodes", type=int, default=None,
              help="also model N virtual nodes on this machine: tiling and remote fraction")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def check(shape, nodes, dtype, page, virtual_nodes, as_json):
    """Allocate a weight under MPOL_INTERLEAVE, ask the kernel where each page is (move_pages),
    and compare with the placement model."""
    N, K = _shape(shape)
    eb = nm.element_size(dtype)
    node_list = _nodes_list(nodes)
    if virtual_nodes is not None and virtual_nodes < 1:
        raise UserError(f"--virtual-nodes must be at least 1 (got {virtual_nodes})")
    try:
        res = nm.check_placement(N, K, eb, node_list, page)
        if virtual_nodes:
            res["virtual"] = nm.virtual_node_report(N, K, virtual_nodes, eb, page)
            if dtype == "bf16":
                res["virtual"]["kernel"] = kernel_virtual_check(N, K, virtual_nodes, page)
    except ValueError as e:
        raise UserError(str(e))
    except OSError as e:
        raise UserError(f"numa check: {e}")
    if as_json:
        click.echo(json.dumps(res))
    else:
        con = Console()
        t = Table(title=f"numa check: {N}x{K} {dtype} under MPOL_INTERLEAVE")
        t.add_column("what")
        t.add_column("value")
        rows = [("nodes", ",".join(map(str, res["nodes"]))), ("policy seen", res["policy"]),
                ("page size requested / seen", f"{res['page_requested']} / {res['page_seen']} B"),
                ("pages checked (4 KiB, move_pages)", str(res["pages_checked"])),
                ("pages per node (kernel)", ", ".join(f"node{k}: {v}" for k, v in
                                                       res["pages_per_node"].items())),
                ("mismatches vs model", str(res["mismatches"])),
                ("placement_model_valid", str(res["placement_model_valid"])
                 + (f" ({res['placement_reason']})" if res["placement_reason"] else "")),
                ("via", res["numa_api"])]
        for r in rows:
            t.add_row(*r)
        con.print(t)
        for m in res["first_mismatches"]:
            con.print(f"  mismatch at +{m['offset']:#x}: kernel node {m['kernel']}, "
                      f"model node {m['model']}")
        if len(res["nodes"]) == 1:
            con.print("one node: every page must be on it; the model's node arithmetic is only "
                      "tested against the kernel on a multi-node machine")
        v = res.get("virtual")
        if v:
            con.print(f"virtual nodes: {v['virtual_nodes']}, T_x = {v['T_x']}, T_y = {v['T_y']}, "
                      f"segments per node {v['segments_per_node']}; tile [N, K] exactly once: "
                      f"{v['tiles_exactly_once']}; modeled remote fraction: hina "
                      f"{v['remote_fraction_model_hina']:.3f}, row-split "
                      f"{v['remote_fraction_model_row_split']:.3f}")
        kv = (v or {}).get("kernel")
        if kv:
            con.print(f"kernel ({kv['isa']}), an FFN with H={kv['hidden_size']}, I={kv['intermediate_size']}, "
                      f"T={kv['tokens']}, {kv['experts']} experts: {virtual_nodes} virtual node(s) vs the plain "
                      f"kernel: bit-identical {kv['bit_identical']}; rel_err vs float32 reference "
                      f"{kv['rel_err']:.2e}; weight bytes read {kv['bytes_read']} of {kv['weight_bytes']}, "
                      f"remote under the model {kv['remote_bytes']}")
    kv = (res.get("virtual") or {}).get("kernel") or {}
    if kv and not (kv["bit_identical"] and kv["remote_bytes"] == 0 and kv["rows_bad"] == 0):
        raise SystemExit(1)
    if res["mismatches"] or (res.get("virtual") and not res["virtual"]["tiles_exactly_once"]):
        raise SystemExit(1)


def kernel_virtual_check(N: int, K: int, virtual_nodes: int, page: str, tokens: int = 4,
                         experts: int = 2) -> dict:
    """Run the HiNa kernel's NUMA-partitioned mode with `virtual_nodes` virtual nodes on this machine
    against its plain mode, on an FFN whose gate/up weights are [N, K] (H = K, I = N): the results
    must be bit-identical, every weight byte read once, none remote under the placement model."""
    import torch

    from .. import kernels
    from ..problems import FFNProblem, materialize
    from ..problems import rel_err
    if N % 32 or K % 32:
        raise ValueError("the kernel check needs N and K multiples of 32")
    d = materialize(FFNProblem.custom(K, N, tokens, experts), rotate=False)
    args = (d.x, d.w_gate, d.w_up, d.w_down, d.topk_ids[0], d.topk_weights)
    isa = kernels.resolve_isa("auto")
    plain = kernels.moe_ffn(*args, numa="off")
    kernels.numa_debug(True, isa)
    try:
        part = kernels.moe_ffn(*args, numa="interleave-partitioned", numa_nodes=virtual_nodes, numa_page=page)
        stats = kernels.numa_stats(isa)
    finally:
        kernels.numa_debug(False, isa)
    read, remote = sum(stats["bytes"]), sum(stats["remote_bytes"])   # per node
    return {"isa": isa, "hidden_size": K, "intermediate_size": N, "tokens": tokens, "experts": experts,
            "bit_identical": bool(torch.equal(plain.view(torch.int16), part.view(torch.int16))),
            "rel_err": rel_err(part, d.reference(0)), "weight_bytes": d.problem.weight_bytes,
            "bytes_read": read, "remote_bytes": remote, "rows_bad": stats["rows_bad"]}
