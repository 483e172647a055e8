"""`hinabench show | targets | figure`: stored rows, printed, judged and drawn (never a live run)."""
from __future__ import annotations

import click

from ..errors import UserError
from . import console, format_option, ints, names


class FigureName(click.ParamType):
    """A name in report.figures.FIGURES (the one list of figures), looked up only when the command runs
    or its help is shown: the figures module imports torch, the CLI does not."""
    name = "figure"

    @staticmethod
    def names() -> list[str]:
        from ..report.figures import FIGURES
        return list(FIGURES)

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(self.names()) + "]"

    def convert(self, value, param, ctx):
        if value not in self.names():
            self.fail(f"unknown figure '{value}'; known: {', '.join(self.names())}", param, ctx)
        return value


@click.command()
@click.argument("name", type=FigureName())
@click.argument("results", nargs=-1, required=True)
@click.option("--out", "out_dir", default=None, help="Directory for the figure (default: beside the results).")
def figure(name, results, out_dir):
    """Draw a paper figure from stored result rows (never from a live run)."""
    from ..report.figures import FIGURES
    paths = FIGURES[name](list(results), out_dir)
    for p in paths:
        click.echo(str(p))


@click.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--model", "models", default=None, help="Only these models, comma-separated.")
@click.option("--backends", default=None,
              help="Only these backends or families, comma-separated (hina matches hina:avx2, ...).")
@click.option("--tokens", default=None, help="Only these T, comma-separated.")
@click.option("--threads", default=None, help="Only these thread counts, comma-separated.")
@click.option("--status", default=None, help="Only rows with these statuses (ok, wrong, unsupported, ...).")
@click.option("--all", "all_runs", is_flag=True,
              help="Every stored run of a point (default: the latest run's row of each point).")
@format_option()
def show(results, models, backends, tokens, threads, status, all_runs, fmt):
    """Print stored result rows, filtered, with the machine and the commands that made them.
    RESULTS: files, folders (every .csv/.parquet under them: results/, results/<machine>/, a Parquet
    dataset) or globs ('results/*/'). Rows of several machines get a machine column. Rows are shown as
    stored: ranks are those of the run that measured them. Damaged rows (a torn write) are left out
    and named; of several runs of one point on one machine the latest is shown (--all: every run,
    with its run id)."""
    from ..harness.store import read_rows, select_rows
    from ..report.render import emit, provenance, reasons, results_view
    problems: list[str] = []
    stored = read_rows(list(results), problems, latest=not all_runs)
    for line in problems:
        click.echo(f"hinabench: note: {line}", err=True)
    rows = select_rows(stored,
                       models=names(models), backends=names(backends),
                       tokens=ints(tokens, "--tokens") if tokens else None,
                       threads=ints(threads, "--threads") if threads else None,
                       statuses=names(status))
    if not rows:
        raise UserError("no stored row matches those filters")
    machines, commands = provenance(rows)
    if fmt == "markdown":
        notes = ["Machine: " + "; ".join(machines) if machines else "Machine: not recorded"]
        notes += [f"Made by: `{c}`" for c in commands]
    else:
        notes = [f"  {line}" for line in reasons(rows)]
        notes += [f"machine: {m}" for m in machines] + [f"made by: {c}" for c in commands]
    from ..harness.suite import _console_out
    emit(rows, fmt, results_view(rows, runs=all_runs), notes=notes, console=_console_out())


@click.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--backend", default="auto", show_default=True,
              help="The hina variant to judge; auto: the best ISA with ok rows (amx, avx512, avx2).")
@click.option("--model", "models", default=None, help="Only these models, comma-separated.")
@click.option("--threads", default=None, help="Only these thread counts, comma-separated.")
@click.option("--quant", is_flag=True, help="The quantized kernels' targets instead (issue 13): INT8 >= 0.85 "
              "of the roofline at T <= 4, >= 1.6x hina BF16 at T = 1, faster than llamacpp:q8_0 and (T >= 8) "
              "every validated INT8 peer; FP8 >= 0.9x INT8 at T <= 4.")
@format_option()
def targets(results, backend, models, threads, quant, fmt):
    """Judge the HiNa-MoE kernel's performance targets on stored rows: efficiency >= 0.90 at T <= 4
    and >= 0.75 at T >= 8; faster than onednn:prepacked; >= the best validated same-bytes peer at
    T <= 4, faster at T >= 8. hina:avx2 has its own set (hinabench/report/targets.py: efficiency by
    regime, >= 0.85x torch's fp32 GEMM from T = 16, >= 1.3x every peer from T = 8, the NUMA variant
    no slower). A comparison that did not run is n/a, never a pass."""
    from ..harness.store import read_rows, select_rows
    from ..report.targets import VIEW, judge, judge_quant
    rows = select_rows(read_rows(list(results)), models=names(models),
                       threads=ints(threads, "--threads") if threads else None)
    from ..report.render import machines_of
    if len(machines_of(rows)) > 1:
        raise UserError(f"targets judges one machine's rows; these are of {len(machines_of(rows))} machines "
                        f"({', '.join(m or 'not recorded' for m in machines_of(rows))}): give one machine's results")
    if backend == "auto":
        ok = {r.get("backend") for r in rows if r.get("status") == "ok"}
        backend = next((b for b in ("hina:amx", "hina:avx512", "hina:avx2") if b in ok), None)
        if backend is None:
            raise UserError("no ok row of hina:amx, hina:avx512 or hina:avx2 in those results")
    verdicts = judge_quant(rows, backend) if quant else judge([r for r in rows if r.get("dtype") in (None, "", "bf16")], backend)
    if not verdicts:
        picked = [f"{flag} {v}" for flag, v in (("--model", models), ("--threads", threads)) if v]
        raise UserError(f"no {'int8 or fp8' if quant else 'bf16'} row of {backend} in those results"
                        + (f" with {', '.join(picked)}" if picked else ""))
    emit_verdicts(verdicts, rows, backend, fmt, VIEW)


def emit_verdicts(verdicts, rows: list[dict], backend: str, fmt: str, view) -> None:
    """Targets' verdicts as rows, then the counts and the machine they were judged on."""
    from ..report.render import emit
    counts = {k: sum(v.verdict == k for v in verdicts) for k in ("pass", "fail", "n/a")}
    machines = sorted({str(r.get("fingerprint") or "") for r in rows if r.get("backend") == backend} - {""})
    tail = [f"{backend}: {counts['pass']} pass, {counts['fail']} fail, {counts['n/a']} n/a "
            f"of {len(verdicts)} targets"] + [f"machine: {m}" for m in machines]
    emit([v.as_row() for v in verdicts], fmt, view, notes=([""] if fmt == "table" else []) + tail,
         console=console())


@click.command()
@click.argument("results", nargs=-1, required=True)
@click.option("--out", "out_dir", default="site", show_default=True, help="Folder for the report (index.html).")
@click.option("--all", "all_runs", is_flag=True,
              help="Tables show every stored run of a point, with its run id (figures draw the latest).")
def report(results, out_dir, all_runs):
    """A static HTML report of stored rows: an index, one page per figure (a panel per machine: the
    figure or why it was not drawn, its caption, commands and fingerprints; then its rows as a table
    that filters and sorts) and every row. RESULTS: files, folders or globs, as for `show`. It needs
    no CDN and no server: open OUT/index.html, or share OUT with `python -m http.server`."""
    from ..report.site import build
    from . import command_line
    res = build(list(results), out_dir, all_runs, command=command_line())
    for line in res["notes"]:
        click.echo(f"hinabench: note: {line}", err=True)
    for name, drawn in res["figures"].items():
        for d in drawn:
            state = "drawn" if d.png is not None else f"not drawn: {d.reason}"
            click.echo(f"{name} [{d.machine or 'machine not recorded'}]: {state}")
    click.echo(f"report: {res['index']}  (share it: python3 -m http.server -d {out_dir} --bind 127.0.0.1)")


COMMANDS = [figure, show, targets, report]
