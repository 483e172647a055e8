"""`hinabench reproduce`: plan, calibrate, run within a budget, report (hinabench/reproduce.py)."""
from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from . import command_line, console, names


@click.command()
@click.option("--budget", default="60m", show_default=True,
              help="Time for the whole run (90s, 45m, 1h30m, or minutes): figures are completed cheapest first.")
@click.option("--quick", is_flag=True, help="A smoke version of every suite: a few minutes.")
@click.option("--out", "out_dir", default="reproduce", show_default=True,
              help="Folder for the results (results/<machine>/<suite>.csv), the plan and the report (site/). "
                   "A second run with the same --out continues it.")
@click.option("--only", default=None, help="Only these figures, comma-separated (fig4,fig10,...).")
@click.option("--backends", default=None, help="Replace the suites' backends (comma-separated names or families).")
@click.option("--threads", default=None, type=click.IntRange(1, None), help="Threads (default: every usable CPU).")
@click.option("--plan-only", is_flag=True, help="Print the plan (with the calibration's estimates) and stop.")
def reproduce(budget, quick, out_dir, only, backends, threads, plan_only):
    """Every paper figure this machine supports, in one command: plan, calibrate, run, report.

    Each figure is marked measured here, modeled here (what is modeled) or not reproducible here
    (why). Suites run in the order that completes the most figures within --budget; every measured
    point is stored at once, so an interrupted or budget-limited run continues with the same --out.
    """
    from .. import reproduce as rp
    from ..report.render import View, emit

    t_start = time.monotonic()
    budget_s = rp.parse_duration(budget)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        from ..errors import UserError
        raise UserError(f"--out {out} is a file, not a folder")
    err = console(stderr=True)
    plan = rp.make_plan(out, quick, names(only), backends, threads)
    state = rp.load_state(out)
    err.print(f"[bold]hinabench reproduce[/]{' --quick' if quick else ''}: {plan.caps.summary}", style=None)
    bnames = rp.all_backends(plan)
    sweeps = any(sp.job is None for sp in plan.suites.values())
    cal = rp.cached_calibration(state, plan, bnames) if sweeps else None
    if sweeps and cal is None:
        prob = rp.calibration_problem(plan)
        err.print(f"calibrating: one point ({prob}), {len(bnames)} backend(s), one round, nothing stored ...")
        cal = rp.calibrate(prob, bnames, plan.threads)
        err.print(f"calibrated in {rp.fmt_duration(cal.wall_s)}: weights materialised at {cal.fill_gbps:.1f} GB/s, "
                  f"read probe {cal.bw_gbps:.1f} GB/s, FMA peak {cal.peak_gflops:.0f} GFLOP/s")
        state["calibration"] = asdict(cal)
    elif cal is not None:
        err.print(f"calibration from {out / rp.STATE} (same machine, threads and backends)")
    rp.estimate(plan, cal)
    rp.schedule(plan, budget_s)
    rows = plan.rows()
    view = View([("figure", "figure", None), ("status", "status", None), ("how, or why not", "detail", None),
                 ("suites", "suites", None), ("rows", "when", None)])
    from rich.console import Console
    emit(rows, "table", view=view, console=Console(width=max(console().width, 180)))
    total = sum(sp.todo_s for sp in plan.suites.values())
    todo_rows = sum(sp.rows_todo for sp in plan.suites.values())
    lines = []
    for sp in (plan.suites[s] for s in plan.order):
        if sp.job is not None:
            lines.append(f"  job {sp.name}: hinabench e2e {sp.job}, "
                         + ("done" if not sp.rows_todo else f"to run, ~{rp.fmt_duration(sp.todo_s)} ({sp.estimated_from})")
                         + f" -> {sp.path}")
            continue
        lines.append(f"  suite {sp.name}: {len(sp.points)} point(s) x {len(sp.names)} backend(s), "
                     f"{sp.rows_done} row(s) stored, {sp.rows_todo} to measure, ~{rp.fmt_duration(sp.todo_s)}"
                     f" -> {sp.path}")
        lines += [f"    left out (memory): {w}" for w in sp.left_out]
    click.echo("\n".join(lines))
    click.echo(f"estimated {rp.fmt_duration(total)} for the {todo_rows} row(s) still to measure; budget "
               f"{rp.fmt_duration(budget_s)}; figures completed within it: "
               f"{', '.join(f for f, ok in plan.fits.items() if ok) or 'none'}"
               + (f"; left for a later run (same --out): {', '.join(f for f, ok in plan.fits.items() if not ok)}"
                  if not all(plan.fits.values()) else ""))
    state.update(plan=rows, planned=time.strftime("%Y-%m-%dT%H:%M:%S%z"), quick=quick, budget_s=budget_s)
    rp.save_state(out, state)
    if plan_only:
        return

    from ..harness.suite import run_sweep
    deadline = t_start + budget_s
    stopped: list[str] = []
    t_run = time.monotonic()

    def admit_for(sp):
        def admit(pt, todo):
            est = rp.estimate_point(cal, pt, todo, sp.sweep.rounds) if cal else 0.0
            if time.monotonic() + est <= deadline:
                return True
            stopped.append(f"{sp.name}: {pt.problem} (~{rp.fmt_duration(est)}) and after")
            return False
        return admit

    cmd = command_line()
    interrupted = False
    for s in plan.order:
        sp = plan.suites[s]
        if sp.rows_todo == 0:
            continue
        if sp.job is not None:
            if time.monotonic() + sp.todo_s > deadline:
                stopped.append(f"{sp.name}: the whole job (~{rp.fmt_duration(sp.todo_s)})")
                continue
            try:
                n, secs = rp.run_job(sp, cmd, click.echo)
            except KeyboardInterrupt:
                interrupted = True
                break
            state.setdefault("jobs", []).append({"name": sp.name, "keywords": sp.job, "rows": n,
                                                 "seconds": round(secs, 1)})
            rp.save_state(out, state)
            continue
        try:
            run_sweep(sp.sweep, str(sp.path), resume=sp.path.exists(), fmt="table", name=s, command=cmd,
                      admit=admit_for(sp))
        except SystemExit as e:      # Ctrl-C inside a sweep: its rows are kept
            if e.code == 130:
                interrupted = True
                break
            raise
        except KeyboardInterrupt:
            interrupted = True
            break
    took = time.monotonic() - t_run
    state.setdefault("runs", []).append({"finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": quick,
                                         "budget_s": budget_s, "estimated_s": round(total, 1),
                                         "measured_s": round(took, 1), "interrupted": interrupted,
                                         "stopped_by_budget": stopped})
    rp.save_state(out, state)
    if stopped:
        click.echo("budget reached before: " + "; ".join(stopped) + f". Run `{cmd}` again to continue.")
    if interrupted:
        click.echo(f"hinabench: interrupted: every point measured so far is kept under {out / 'results'}; "
                   f"run `{cmd}` again to continue", err=True)
    results = out / "results"
    if not any(results.rglob("*.csv")):
        click.echo("no rows were measured, so there is no report")
        sys.exit(130 if interrupted else 0)
    # the plan shown in the report says what is stored now
    after = rp.make_plan(out, quick, names(only), backends, threads, caps=plan.caps)
    rp.estimate(after, cal)
    from ..report.site import build
    res = build([str(results)], out / "site", command=cmd, plan=after.rows(after=True))
    drawn = sorted({n for n, ds in res["figures"].items() for d in ds if d.png is not None})
    click.echo(f"measured for {rp.fmt_duration(took)} (estimated {rp.fmt_duration(total)}); whole run "
               f"{rp.fmt_duration(time.monotonic() - t_start)}")
    click.echo(f"figures drawn: {', '.join(drawn) or 'none'}")
    click.echo(f"report: {res['index']}  (share it: python3 -m http.server -d {out / 'site'} --bind 127.0.0.1)")
    if interrupted:
        sys.exit(130)


COMMANDS = [reproduce]
