"""The `hinabench` command: one subcommand per job."""
from __future__ import annotations

import json
import sys

import click

from .errors import UserError


def _ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"{what} must be a comma-separated list of whole numbers (got '{text}')") from None
    if not vals:
        raise UserError(f"{what}: give at least one value")
    return vals


def _command() -> str:
    """The command line that reproduces this invocation (options that differ from their defaults)."""
    import shlex
    ctx = click.get_current_context()
    parts = ["hinabench"] + ctx.command_path.split()[1:]
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if isinstance(p, click.Argument):
            parts += [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        elif v != p.default and v not in (None, False):
            parts += [p.opts[0]] if v is True else [p.opts[0], str(v)]
    return " ".join(shlex.quote(x) for x in parts)


def _console(stderr: bool = False):
    from rich.console import Console
    return Console(stderr=stderr)


class _Group(click.Group):
    """Turns UserError into one line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.echo(f"hinabench: error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hinabench")
def cli():
    """Benchmark Mixture-of-Experts kernels on CPUs against the memory-bandwidth roofline."""


# ---- sysinfo, models -----------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full fingerprint as JSON.")
@click.option("--summary", is_flag=True, help="Print only the one-line summary.")
def sysinfo(as_json, summary):
    """What this machine is: CPU, caches, ISA, NUMA, THP, perf counters, versions."""
    from . import sysinfo as s
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
    t.add_row("machine id", s.machine_id(fp))
    _console().print(t)
    click.echo(s.summary(fp))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """The model registry: expert and attention shapes from each model's public config."""
    from .models import MODELS
    if as_json:
        click.echo(json.dumps([m.as_dict() for m in MODELS.values()], indent=2))
        return
    from rich.table import Table
    t = Table(title="models")
    cols = ["name", "hidden_size", "intermediate_size", "routed_experts", "top_k", "shared_experts",
            "layers", "attention_heads", "kv_heads", "head_dim", "vocab_size"]
    for c in cols + ["expert MiB (bf16)"]:
        t.add_column(c, justify="left" if c == "name" else "right")
    for m in MODELS.values():
        d = m.as_dict()
        t.add_row(*[str(d[c]) for c in cols], f"{m.expert_bytes() / 2**20:.0f}")
    _console().print(t)


# ---- probes -------------------------------------------------------------------------------------
@cli.command()
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: 1 and all usable CPUs).")
@click.option("--size", "size_mib", default=1024, show_default=True, type=int, help="Buffer MiB.")
@click.option("--passes", default=5, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True)
def bandwidth(threads, size_mib, passes, as_json):
    """STREAM-like read bandwidth of this process, per read kernel and thread count."""
    import torch

    from . import probes, sysinfo
    from .problem import fill_bf16
    llc = sysinfo.llc_bytes()
    if size_mib << 20 < 4 * llc:
        raise UserError(f"--size {size_mib} MiB is under 4x the last-level cache ({4 * llc >> 20} MiB): "
                        "it would measure the cache, not DRAM")
    avail = sysinfo.meminfo().get("MemAvailable", 0)
    if avail and (size_mib << 20) > avail:
        raise UserError(f"--size {size_mib} MiB needs more than the {avail >> 20} MiB available")
    buf = torch.empty((size_mib << 20) // 2, dtype=torch.bfloat16)
    fill_bf16(buf, 1, 1.0)
    ts = _ints(threads, "--threads") if threads else sorted({1, len(sysinfo.topology()["usable_cpus"])})
    rows = []
    for t in ts:
        for v in probes.read_variants():
            secs = [probes._C.read_pass([(buf.data_ptr(), buf.numel() * 2)], t, v) for _ in range(passes)]
            gb = [buf.numel() * 2 / s / 1e9 for s in secs]
            rows.append({"threads": t, "kernel": v, "best_gbps": max(gb), "median_gbps": sorted(gb)[len(gb) // 2],
                         "min_gbps": min(gb), "bytes": buf.numel() * 2, "passes": passes})
    _emit(rows, as_json, "read bandwidth (GB/s)")


@cli.command()
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: 1 and all usable CPUs).")
@click.option("--json", "as_json", is_flag=True)
def peak(threads, as_json):
    """Register-only FMA peak per unit (AVX2 FMA, AVX-512 FMA / BF16 dot, AMX BF16) and thread count."""
    from . import _C, probes, sysinfo
    ts = _ints(threads, "--threads") if threads else sorted({1, len(sysinfo.topology()["usable_cpus"])})
    rows = []
    for t in ts:
        for u in _C.peak_units():
            rows.append({"threads": t, "unit": u, "gflops": probes.peak_gflops(t, u)[0],
                         "roofline_unit": u == probes.peak_unit()})
    _emit(rows, as_json, "compute peak (GFLOP/s)")


def _emit(rows, as_json, title):
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table
    t = Table(title=title)
    for k in rows[0]:
        t.add_column(k, justify="right")
    for r in rows:
        t.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()])
    _console().print(t)
    from .sysinfo import summary
    click.echo(summary())


# ---- ffn ----------------------------------------------------------------------------------------
@cli.command()
@click.option("--model", "model_names", default="mixtral-8x7b", show_default=True,
              help="Model(s), comma-separated; see `hinabench models`.")
@click.option("--tokens", default="1,2,4,8,16", show_default=True, help="Tokens per expert T.")
@click.option("--experts", default=None, type=int, help="Active experts A (default: the model's top-k).")
@click.option("--backends", default="all", show_default=True,
              help="Backends or families, comma-separated (e.g. torch,onednn:prepacked,hina), or all.")
@click.option("--dtype", default="bf16", show_default=True)
@click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: all usable CPUs).")
@click.option("--repeats", default=0, type=int, help="Samples per backend per round (default: calibrated).")
@click.option("--rounds", default=3, show_default=True, type=int, help="Interleaved rounds.")
@click.option("--min-time", default=0.3, show_default=True, type=float,
              help="Seconds of samples per backend per round when calibrating.")
@click.option("--warmup", default=2, show_default=True, type=int)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--numa", "numa", default="default", show_default=True,
              help="Memory policies for the weights, comma-separated: default (first touch), "
                   "interleave (all nodes, like numactl --interleave=all), bind:N.")
@click.option("--perf", is_flag=True, help="Count local/remote DRAM loads with perf around the samples.")
@click.option("--out", default=None, help="Results file (.csv or .parquet). Default: results/<machine>/ffn-<model>-<time>.csv")
@click.option("--resume", is_flag=True, help="Skip points already in --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
def ffn(model_names, tokens, experts, backends, dtype, threads, repeats, rounds, min_time, warmup,
        seed, numa, perf, out, resume, as_json):
    """Time the MoE expert FFN of a model on every backend, side by side, validated first."""
    from .suite import Sweep, run_sweep
    sweep = Sweep(models=[m for m in model_names.split(",") if m.strip()], tokens=_ints(tokens, "--tokens"),
                  experts=experts, backends=backends, dtype=dtype,
                  threads=_ints(threads, "--threads") if threads else None, repeats=repeats,
                  rounds=rounds, min_time=min_time, warmup=warmup, seed=seed,
                  numa=[p for p in numa.split(",") if p.strip()], perf=perf)
    run_sweep(sweep, out=out, resume=resume, as_json=as_json, name="ffn", command=_command())


# ---- suites and figures -------------------------------------------------------------------------
@cli.group()
def suite():
    """Declared sweeps (suites/*.toml)."""


@suite.command("run")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--out", default=None, help="Results file (default: results/<machine>/<suite>.csv).")
@click.option("--resume", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def suite_run(path, out, resume, as_json):
    """Run the sweep a suite file declares."""
    from .suite import load_suite, run_sweep
    sweep, name = load_suite(path)
    run_sweep(sweep, out=out, resume=resume, as_json=as_json, name=name, command=_command())


@cli.command()
@click.argument("name", type=click.Choice(["fig10", "fig15"]))
@click.argument("results", nargs=-1, required=True)
@click.option("--out", "out_dir", default=None, help="Directory for the figure (default: beside the results).")
def figure(name, results, out_dir):
    """Draw a paper figure from stored result rows (never from a live run)."""
    from .figures import FIGURES
    paths = FIGURES[name](list(results), out_dir)
    for p in paths:
        click.echo(str(p))


@cli.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--model", "models", default=None, help="Only these models, comma-separated.")
@click.option("--backends", default=None,
              help="Only these backends or families, comma-separated (hina matches hina:avx2, ...).")
@click.option("--tokens", default=None, help="Only these T, comma-separated.")
@click.option("--threads", default=None, help="Only these thread counts, comma-separated.")
@click.option("--status", default=None, help="Only rows with these statuses (ok, wrong, unsupported, ...).")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              show_default=True)
def show(results, models, backends, tokens, threads, status, fmt):
    """Print stored result rows (one or more files), filtered, with the machine and the commands
    that made them. Rows are shown as stored: ranks are those of the run that measured them."""
    from .results import read_rows, select_rows, render_markdown, render_table, reasons
    rows = select_rows(read_rows(list(results)),
                       models=_names(models), backends=_names(backends),
                       tokens=_ints(tokens, "--tokens") if tokens else None,
                       threads=_ints(threads, "--threads") if threads else None,
                       statuses=_names(status))
    if not rows:
        raise UserError("no stored row matches those filters")
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if fmt == "csv":
        import csv as _csv
        w = _csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
        return
    machines = sorted({str(r.get("fingerprint") or r.get("machine") or "") for r in rows} - {""})
    commands = sorted({str(r.get("command") or "") for r in rows} - {""})
    if fmt == "markdown":
        click.echo(render_markdown(rows))
        click.echo()
        click.echo("Machine: " + "; ".join(machines) if machines else "Machine: not recorded")
        for c in commands:
            click.echo(f"Made by: `{c}`")
        return
    from .suite import _console_out
    con = _console_out()
    for (m, dt, a), group in _groups(rows):
        con.print(render_table(group, title=f"{m} {dt} (A={a})"))
    for line in reasons(rows):
        con.print(f"  {line}", style="dim", highlight=False)
    for mach in machines:
        con.print(f"machine: {mach}", style="dim", highlight=False)
    for c in commands:
        con.print(f"made by: {c}", style="dim", highlight=False)


@cli.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--backend", default="auto", show_default=True,
              help="The hina variant to judge; auto: the best ISA with ok rows (amx, avx512, avx2).")
@click.option("--model", "models", default=None, help="Only these models, comma-separated.")
@click.option("--threads", default=None, help="Only these thread counts, comma-separated.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
              show_default=True)
def targets(results, backend, models, threads, fmt):
    """Judge the HiNa-MoE kernel's performance targets on stored rows: efficiency >= 0.90 at T <= 4
    and >= 0.75 at T >= 8; faster than onednn:prepacked; >= the best validated same-bytes peer at
    T <= 4, faster at T >= 8. A comparison that did not run is n/a, never a pass."""
    from .results import read_rows, select_rows
    from .targets import judge, render
    rows = select_rows(read_rows(list(results)), models=_names(models),
                       threads=_ints(threads, "--threads") if threads else None)
    if backend == "auto":
        ok = {r.get("backend") for r in rows if r.get("status") == "ok"}
        backend = next((b for b in ("hina:amx", "hina:avx512", "hina:avx2") if b in ok), None)
        if backend is None:
            raise UserError("no ok row of hina:amx, hina:avx512 or hina:avx2 in those results")
    verdicts = judge(rows, backend)
    if not verdicts:
        raise UserError(f"no row of {backend} in those results")
    if fmt == "json":
        click.echo(json.dumps([v.as_row() for v in verdicts], indent=2))
        return
    counts = {k: sum(v.verdict == k for v in verdicts) for k in ("pass", "fail", "n/a")}
    machines = sorted({str(r.get("fingerprint") or "") for r in rows if r.get("backend") == backend} - {""})
    tail = [f"{backend}: {counts['pass']} pass, {counts['fail']} fail, {counts['n/a']} n/a "
            f"of {len(verdicts)} targets"] + [f"machine: {m}" for m in machines]
    if fmt == "markdown":
        click.echo(render(verdicts, markdown=True))
        click.echo()
        for line in tail:
            click.echo(line)
        return
    from .suite import _console_out
    con = _console_out()
    con.print(render(verdicts))
    for line in tail:
        con.print(line, highlight=False)


def _names(v):
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


def _groups(rows):
    order = []
    by = {}
    for r in rows:
        k = (r.get("model"), r.get("dtype"), r.get("experts"))
        if k not in by:
            by[k] = []
            order.append(k)
        by[k].append(r)
    return [(k, by[k]) for k in order]


def _attach_optional_groups() -> None:
    """Subcommand groups that live in their own modules (numa, env)."""
    import importlib
    for mod, attr in (("numa_cli", "numa"), ("env_cli", "env")):
        try:
            cli.add_command(getattr(importlib.import_module(f"{__package__}.{mod}"), attr))
        except (ImportError, AttributeError):
            pass


_attach_optional_groups()


def main():
    cli(prog_name="hinabench")


if __name__ == "__main__":
    main()
