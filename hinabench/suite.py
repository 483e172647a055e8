"""Sweeps as data: a `Sweep` (from CLI options or a suites/*.toml file) becomes result rows.

A suite file:
    name = "fig10"
    [sweep]
    models = ["mixtral-8x7b", "deepseek-v3"]
    tokens = [1, 2, 4, 8, 16]
    backends = "all"            # or a list / comma-separated string
    threads = [2]               # omitted: all usable CPUs
    dtype = "bf16"
    rounds = 3
"""
from __future__ import annotations

import json
import sys
import time
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import click

from . import backends as backend_registry
from .errors import UserError
from .models import get_model
from .problem import FFNProblem


@dataclass
class Sweep:
    models: list[str]
    tokens: list[int]
    experts: int | None = None
    backends: str = "all"
    dtype: str = "bf16"
    threads: list[int] | None = None
    repeats: int = 0
    rounds: int = 3
    min_time: float = 0.3
    warmup: int = 2
    seed: int = 0
    numa: list[str] | None = None      # memory policies: default, interleave, bind:N
    perf: bool = False

    def problems(self) -> list[FFNProblem]:
        """Every point's problem, validated before anything is measured."""
        if not self.models:
            raise UserError("give at least one model")
        return [FFNProblem.create(get_model(m), t, self.experts, self.dtype, self.seed)
                for m in self.models for t in self.tokens]


def load_suite(path: str) -> tuple[Sweep, str]:
    p = Path(path)
    if not p.exists():
        raise UserError(f"no suite file at {path}")
    try:
        doc = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from None
    s = dict(doc.get("sweep", {}))
    known = {f.name for f in fields(Sweep)}
    unknown = set(s) - known
    if unknown:
        raise UserError(f"{path}: unknown [sweep] keys {sorted(unknown)}; known: {sorted(known)}")
    if isinstance(s.get("backends"), list):
        s["backends"] = ",".join(s["backends"])
    if isinstance(s.get("models"), str):
        s["models"] = [s["models"]]
    if isinstance(s.get("numa"), str):
        s["numa"] = [s["numa"]]
    for req in ("models", "tokens"):
        if req not in s:
            raise UserError(f"{path}: [sweep] needs '{req}'")
    return Sweep(**s), doc.get("name", p.stem)


def default_out(name: str, models: list[str]) -> Path:
    from .sysinfo import machine_id
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = models[0] if len(models) == 1 else f"{len(models)}models"
    return Path("results") / machine_id() / f"{name}-{tag}-{stamp}.csv"


def run_sweep(sweep: Sweep, out: str | None, resume: bool, as_json: bool, name: str,
              command: str = "") -> list[dict]:
    from .results import ResultStore, reasons, render_table
    from .runner import RunConfig, run_point
    from .sysinfo import summary, topology

    problems = sweep.problems()
    names = backend_registry.resolve(sweep.backends)
    explicit = sweep.backends.strip() not in ("", "all")
    for n in names:
        cls = backend_registry.get(n)
        if explicit and sweep.dtype not in cls.dtypes:
            raise UserError(f"backend {n} has no {sweep.dtype} path (it has: {', '.join(cls.dtypes)})")
    threads = sweep.threads or [len(topology()["usable_cpus"])]
    ncpu = len(topology()["usable_cpus"])
    if any(t < 1 or t > ncpu for t in threads):
        raise UserError(f"--threads must be between 1 and {ncpu} (the CPUs this process may use)")
    from .problem import parse_numa_policy
    policies = sweep.numa or ["default"]
    for pol in policies:
        parse_numa_policy(pol)
    if resume and not out:
        raise UserError("--resume needs --out FILE (the results file to continue)")
    store = ResultStore(out or default_out(name, sweep.models))
    store.check_writable()
    skip = store.done_keys() if resume else set()
    cfg = RunConfig(rounds=sweep.rounds, warmup=sweep.warmup, repeats=sweep.repeats,
                    min_time=sweep.min_time, seed=sweep.seed, perf=sweep.perf)
    if command:
        cfg.command = command
    err = _console_err()
    if not as_json:
        err.print(f"[bold]hinabench {name}[/]: {len(problems)} point(s) x {len(threads)} thread count(s) x "
                  f"{len(names)} backend(s) -> {store.path}")
        err.print(summary(), style="dim")
    rows: list[dict] = []
    total = len(problems) * len(threads) * len(names) * len(policies)
    progress = None
    if not as_json and sys.stderr.isatty():
        from rich.progress import Progress
        progress = Progress(console=err, transient=True)
        task = progress.add_task("measuring", total=total)
        progress.start()
    try:
        for pol in policies:
            cfg.numa = pol
            for p in problems:
                for t in threads:
                    if progress is not None:
                        progress.update(task, description=f"{p} threads={t} numa={pol}")
                    rows += run_point(p, names, t, cfg, store=store, skip=skip,
                                      progress=(lambda: progress.advance(task)) if progress else None)
    except KeyboardInterrupt:
        if progress is not None:
            progress.stop()
        click.echo(f"hinabench: interrupted: {len(rows)} row(s) kept in {store.path}; "
                   f"run again with --out {store.path} --resume to continue", err=True)
        sys.exit(130)
    finally:
        if progress is not None:
            progress.stop()
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return rows
    out_console = _console_out()
    for m in sweep.models:
        mrows = [r for r in rows if r["model"] == get_model(m).name]
        if mrows:
            out_console.print(render_table(mrows, title=f"{m} {sweep.dtype} (A={mrows[0]['experts']})"))
    for line in reasons(rows):
        out_console.print(f"  {line}", style="dim", highlight=False)
    warn = [r for r in rows if r.get("load_warning")]
    if warn:
        out_console.print(f"[yellow]warning:[/] another process competed for the CPUs during "
                          f"{len(warn)} row(s) (load_other_cpus > 0.25): their timings are suspect")
    unstable = [r for r in rows if r.get("unstable")]
    if unstable:
        out_console.print(f"[yellow]warning:[/] {len(unstable)} row(s) unstable (MAD > 10% of median)")
    out_console.print(f"rows written to {store.path}", style="dim")
    return rows


def _console_err():
    from rich.console import Console
    return Console(stderr=True)


def _console_out():
    from rich.console import Console
    return Console(width=200)
