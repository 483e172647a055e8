"""`hinabench sysinfo | models | bandwidth | peak`: what this machine is and can do."""
from __future__ import annotations

import json
import os

import click

from ..errors import UserError
from . import console, format_option, ints


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full fingerprint as JSON.")
@click.option("--summary", is_flag=True, help="Print only the one-line summary.")
def sysinfo(as_json, summary):
    """What this machine is: CPU, caches, ISA, NUMA, THP, perf counters, versions."""
    from ..machine import sysinfo as s
    fp = s.fingerprint()
    if as_json:
        click.echo(s.to_json(fp))
        return
    if summary:
        click.echo(s.summary(fp))
        return
    from rich.table import Table
    t = Table(show_header=False, title="hinabench sysinfo")
    c, topo = fp["cpu"], fp["topology"]
    t.add_row("CPU", f"{c['vendor']} {c['model_name']} (family {c['family']}, model {c['model']})")
    t.add_row("cores / threads", f"{topo['sockets']} socket(s), {topo['cores']} cores, {topo['threads']} threads")
    t.add_row("caches", ", ".join(f"{k} {v >> 10} KiB" for k, v in fp["caches"].items()))
    t.add_row("ISA", " ".join(f"{k}={'yes' if v else 'no'}" for k, v in fp["isa"].items()
                              if isinstance(v, bool) and k != "amx_usable"))
    t.add_row("AMX tile data (OS)", fp["isa"]["amx_os_permission"])
    for n in fp["numa_nodes"]:
        t.add_row(f"NUMA node {n['node']}", f"CPUs {n['cpus']}, {n['mem_bytes'] / 2**30:.1f} GiB")
    t.add_row("transparent huge pages", fp["thp"])
    t.add_row("perf hw counters", "yes" if fp["perf_hw_counters"] else f"no: {fp['perf_reason']}")
    t.add_row("versions", f"linux {fp['kernel']}, python {fp['python']}, torch {fp['torch']}, "
                          f"oneDNN {fp['onednn']}, hinabench {fp['hinabench']} ({fp['git_rev']})")
    overridden = bool(os.environ.get(s.MACHINE_ID_ENV, "").strip())
    t.add_row("machine id", s.machine_id(fp) + (f" (from ${s.MACHINE_ID_ENV})" if overridden else ""))
    console().print(t)
    click.echo(s.summary(fp))


@click.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """The model registry: expert and attention shapes from each model's public config."""
    from ..models import MODELS
    if as_json:
        click.echo(json.dumps([m.as_dict() for m in MODELS.values()], indent=2))
        return
    from rich.table import Table
    t = Table(title="models (H hidden, I expert intermediate, E routed experts, h_q/h_kv heads, d head dim)")
    cols = [("name", "name"), ("H", "hidden_size"), ("I", "intermediate_size"), ("E", "routed_experts"),
            ("top-k", "top_k"), ("shared", "shared_experts"), ("layers", "layers"), ("h_q", "attention_heads"),
            ("h_kv", "kv_heads"), ("d", "head_dim"), ("attn", "attention"), ("rope θ", "rope_theta"),
            ("qk-norm", "qk_norm"), ("vocab", "vocab_size")]
    for head, _ in cols + [("expert MiB", None), ("projections (N x K)", None)]:
        t.add_column(head, justify="left" if head in ("name", "projections (N x K)") else "right",
                     no_wrap=head == "name")
    for m in MODELS.values():
        d = m.as_dict()
        projs = ", ".join(f"{k} {n}x{kk}" for k, (n, kk) in m.projections().items())
        t.add_row(*[str(d[c]) for _, c in cols], f"{m.expert_bytes() / 2**20:.0f}", projs)
    console().print(t)


# ---- probes -------------------------------------------------------------------------------------
def _dram_buffer(size_mib):
    """A bf16 buffer of `size_mib` MiB (default: 1024, or 4x the last-level cache where that is more),
    filled with 1.0, refused when it would sit in the cache or does not fit the memory available."""
    import torch

    from ..machine import sysinfo
    from ..problems import fill_bf16
    llc = sysinfo.llc_bytes()
    if size_mib is None:
        size_mib = max(1024, -(-4 * llc // (256 << 20)) * 256)    # 4x the LLC, in whole 256 MiB
    if size_mib << 20 < 4 * llc:
        raise UserError(f"--size {size_mib} MiB is under 4x the last-level cache ({4 * llc >> 20} MiB): "
                        "it would measure the cache, not DRAM")
    avail = sysinfo.meminfo().get("MemAvailable", 0)
    if avail and (size_mib << 20) > avail:
        raise UserError(f"--size {size_mib} MiB needs more than the {avail >> 20} MiB available")
    buf = torch.empty((size_mib << 20) // 2, dtype=torch.bfloat16)
    fill_bf16(buf, 1, 1.0)
    return buf


def _threads(threads):
    from ..machine import sysinfo
    if not threads:
        return sorted({1, len(sysinfo.topology()["usable_cpus"])})
    ts = ints(threads, "--threads")
    sysinfo.check_threads(ts)
    return ts


@click.command()
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: 1 and all usable CPUs).")
@click.option("--size", "size_mib", default=None, type=click.IntRange(1, None),
              help="Buffer MiB (default: 1024, or 4x the last-level cache where that is more).")
@click.option("--passes", default=5, show_default=True, type=click.IntRange(1, 1000))
@format_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
def bandwidth(threads, size_mib, passes, fmt, as_json):
    """STREAM-like read bandwidth of this process, per read kernel and thread count."""
    from ..machine import probes
    from ..harness.stats import median
    buf = _dram_buffer(size_mib)
    ts = _threads(threads)
    rows = []
    for t in ts:
        for v in probes.read_variants():
            secs = [probes._C.read_pass([(buf.data_ptr(), buf.numel() * 2)], t, v) for _ in range(passes)]
            gb = [buf.numel() * 2 / s / 1e9 for s in secs]
            rows.append({"threads": t, "kernel": v, "best_gbps": max(gb), "median_gbps": median(gb),
                         "min_gbps": min(gb), "bytes": buf.numel() * 2, "passes": passes})
    _emit(rows, "json" if as_json else fmt, "read bandwidth (GB/s)")


@click.command()
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: 1 and all usable CPUs).")
@format_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
def peak(threads, fmt, as_json):
    """Register-only FMA peak per unit (AVX2 FMA, AVX-512 FMA / BF16 dot, AMX BF16) and thread count: the
    physical compute ceiling; and beside it torch's fp32 GEMM rate (2048x4096x4096), the achievable one."""
    from ..native import load
    _C = load("_C")
    from ..machine import probes
    ts = _threads(threads)
    rows = []
    m, n, k = probes.GEMM_SHAPE
    for t in ts:
        for u in _C.peak_units():
            rows.append({"threads": t, "unit": u, "ceiling": "physical (register-only loop)",
                         "gflops": probes.peak_gflops(t, u)[0], "roofline_unit": u == probes.peak_unit()})
        rows.append({"threads": t, "unit": f"torch fp32 GEMM {m}x{n}x{k}", "ceiling": "achievable (a tuned GEMM)",
                     "gflops": probes.gemm_gflops(t), "roofline_unit": False})
    _emit(rows, "json" if as_json else fmt, "compute peak (GFLOP/s)")


@click.command()
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: 1 and all usable CPUs).")
@click.option("--work", default="0,1,2,4,8,16", show_default=True,
              help="Rounds of 8 FMAs (128 FLOP) per 64-byte line: 2 FLOP per byte a round; 0 is the stream alone.")
@click.option("--ahead", default="0,4096", show_default=True,
              help="Software prefetch distance in bytes (prefetcht1, one line per line); 0: the hardware's alone.")
@click.option("--size", "size_mib", default=None, type=click.IntRange(1, None),
              help="Buffer MiB (default: 1024, or 4x the last-level cache where that is more).")
@click.option("--passes", default=3, show_default=True, type=click.IntRange(1, 1000))
@format_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
def overlap(threads, work, ahead, size_mib, passes, fmt, as_json):
    """Whether a core's compute hides under its memory stream: a read of a DRAM-sized buffer with WORK
    FMAs per line that wait for the line's values, against the same loop on an L1-resident buffer (compute
    alone) and the read alone. overlap = 1: the pair runs at the slower of the two rates; 0: their times
    add up (1/R = 1/B + 1/C), which caps a kernel whose compute is as long as its stream at half the read
    bandwidth."""
    from ..machine import probes
    from ..harness.stats import median
    works, aheads = ints(work, "--work"), ints(ahead, "--ahead")
    for what, vals in (("--work", works), ("--ahead", aheads)):
        if min(vals) < 0:
            raise UserError(f"{what} values must be >= 0 (got {min(vals)})")
    buf = _dram_buffer(size_mib)
    addr, nbytes = buf.data_ptr(), buf.numel() * 2
    rows = []
    for t in _threads(threads):
        for a in aheads:
            stream, compute = {}, {}
            for w in works:
                stream[w] = median([probes.stream_work_gbps(addr, nbytes, t, w, a) for _ in range(passes)])
                compute[w] = median([probes.compute_only_gbps(addr, t, w) for _ in range(passes)])
            base = stream[0] if 0 in stream else median(
                [probes.stream_work_gbps(addr, nbytes, t, 0, a) for _ in range(passes)])
            for w in works:
                serial = 1 / (1 / base + 1 / compute[w])
                rows.append({"threads": t, "ahead": a, "work": w, "flop_per_byte": 2 * w,
                             "compute_gbps": compute[w], "stream_gbps": base, "combined_gbps": stream[w],
                             "serial_gbps": serial,
                             "overlap": None if w == 0 else round(probes.overlap_fraction(base, compute[w], stream[w]), 2)})
    _emit(rows, "json" if as_json else fmt, "overlap of compute and the memory stream (GB/s of lines)")


def _emit(rows, fmt, title):
    from ..machine.sysinfo import summary
    from ..report.render import emit, plain_view
    view = plain_view(rows)
    view.cells = lambda r: [f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()]
    view.title = lambda r: title
    emit(rows, fmt, view, notes=[summary()] if fmt in ("table", "markdown") else [], console=console())


COMMANDS = [sysinfo, models, bandwidth, peak, overlap]
