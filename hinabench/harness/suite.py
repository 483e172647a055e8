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

import itertools
import sys
import time
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import click

from .. import backends as backend_registry
from ..errors import UserError
from ..models import get_model
from ..problems import AttentionProblem, FFNProblem, LinearProblem, Problem, get_kind
from .points import Point
from .runner import DENOMINATOR_SPREAD, LOAD_WARNING_CPUS


@dataclass
class Sweep:
    """A sweep's axes and how to time it. Points are the product of the axes, in this order: numa
    policy, model, dtype, the kind's own axis (routing for the FFN, projection for linear), tokens,
    threads."""
    models: list[str]
    tokens: list[int]
    op: str = "ffn"                    # the problem kind (hinabench/problems)
    experts: int | None = None         # ffn: active experts per token (default: the model's top-k)
    routing: list[str] | None = None   # ffn: same-experts (default), router
    fill: str = "binades"              # ffn: how weights and tokens are drawn (binades, normal)
    proj: list[str] | None = None      # linear: projections (default: every one of the model's)
    # attention (tokens = batch B, sequences): phases, KV layouts, contexts l (decode: keys; extend:
    # the cached prefix), new tokens n (extend), the paged block size, ragged batches
    phase: list[str] | None = None     # decode (default), extend
    layout: list[str] | None = None    # paged (default), contiguous
    context: list[int] | None = None   # default 1024, 4096
    extend: list[int] | None = None    # extend's new tokens (default 128)
    block_size: int | None = None      # paged (default 32: vLLM-CPU's attention takes multiples of 32)
    ragged: bool = False
    backends: str = "all"
    dtype: list[str] | str = "bf16"
    group: int | None = None           # int8: K elements per scale (32, 64, 128; default 128)
    threads: list[int] | None = None
    repeats: int = 0
    rounds: int = 3
    min_time: float = 0.3
    warmup: int = 2
    seed: int = 0
    numa: list[str] | None = None      # memory policies: default, interleave, bind:N
    perf: bool = False
    wait_quiet: float = 0.0            # seconds a point may wait for the other processes to go quiet
    dtypes_apart: bool = False         # measure each dtype's point on its own (default: side by side)

    @property
    def dtypes(self) -> list[str]:
        return [self.dtype] if isinstance(self.dtype, str) else list(self.dtype)

    def _kind_axis(self, model) -> list[dict]:
        if self.op == "ffn":
            return [{"routing": r} for r in (self.routing or ["same-experts"])]
        if self.op == "linear":
            return [{"proj": p} for p in (self.proj or list(model.projections()))]
        if self.op == "attention":
            out = []
            for ph, lay, ctx in itertools.product(self.phase or ["decode"], self.layout or ["paged"],
                                                  self.context or [1024, 4096]):
                for n in ([1] if ph == "decode" else (self.extend or [128])):
                    out.append({"phase": ph, "layout": lay, "context": ctx, "extend": n})
            return out
        return [{}]

    def _problem(self, model, dtype: str, tokens: int, extra: dict) -> Problem:
        if self.op == "ffn":
            from ..dtypes import get_dtype
            group = self.group if get_dtype(dtype).name == "int8" else None
            return FFNProblem.create(model, tokens, self.experts, dtype, self.seed, extra["routing"], group=group,
                                     fill=self.fill)
        if self.op == "linear":
            return LinearProblem.create(model, extra["proj"], tokens, dtype, self.seed)
        if self.op == "attention":
            return AttentionProblem.create(model, extra["phase"], tokens, extra["context"], extra["extend"],
                                           extra["layout"], self.block_size, self.ragged, dtype, self.seed)
        raise UserError(f"no sweep for problem kind '{self.op}'")

    def problems(self) -> list[Problem]:
        """Every point's problem, validated before anything is measured."""
        if not self.models:
            raise UserError("give at least one model")
        get_kind(self.op)
        if self.group is not None:
            from ..dtypes import get_dtype
            if "int8" not in {get_dtype(d).name for d in self.dtypes}:
                raise UserError(f"group (--group) sets int8's scale groups, and this sweep has no int8 (dtype "
                                f"{', '.join(self.dtypes)}): add int8 to the dtypes, or leave the group out")
        out = []
        for m in self.models:
            model = get_model(m)
            for dt, extra, t in itertools.product(self.dtypes, self._kind_axis(model), self.tokens):
                out.append(self._problem(model, dt, t, extra))
        return out

    def points(self, threads: list[int]) -> list[Point]:
        """The product of every axis; validated before anything is measured."""
        return [Point(p, t, pol) for pol, p, t in
                itertools.product(self.numa or ["default"], self.problems(), threads)]


# The suite file's schema: top-level keys, and each [sweep] key's type ("ints": a list of whole numbers,
# "names": a list of strings or one string, "name": a string, "int", "float", "bool").
SUITE_TOP = {"name": "name", "sweep": "table"}
SWEEP_SCHEMA = {"models": "names", "tokens": "ints", "op": "name", "experts": "int", "routing": "names", "fill": "name",
                "proj": "names", "phase": "names", "layout": "names",
                "context": "ints", "extend": "ints", "block_size": "int", "ragged": "bool", "batch": "ints",
                "backends": "names", "dtype": "names", "group": "int", "threads": "ints", "repeats": "int",
                "rounds": "int", "min_time": "float", "warmup": "int", "seed": "int", "numa": "names",
                "perf": "bool", "wait_quiet": "float", "dtypes_apart": "bool"}
BOUNDS = {"rounds": (1, None), "repeats": (0, None), "warmup": (0, None), "experts": (1, None),
          "min_time": (1e-9, None), "tokens": (1, None),
          "batch": (1, None), "context": (0, None), "extend": (1, None), "block_size": (1, None), "threads": (1, None), "wait_quiet": (0, None)}


def _typed(key: str, v, kind: str) -> tuple[object, str]:
    """(the value in the Sweep's type, "") or (None, what is wrong)."""
    def is_int(x):
        return isinstance(x, int) and not isinstance(x, bool)
    if kind == "ints":
        vals = v if isinstance(v, list) else None
        if vals is None or not vals or not all(is_int(x) for x in vals):
            return None, f"'{key}' must be a list of whole numbers, like {key} = [1, 2, 4] (got {v!r})"
        lo, _ = BOUNDS.get(key, (None, None))
        if lo is not None and min(vals) < lo:
            return None, f"'{key}' values must be at least {lo} (got {min(vals)})"
        return vals, ""
    if kind == "names":
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            return None, f"'{key}' must be a list of names, like {key} = [\"a\", \"b\"] (got {v!r})"
        return v, ""
    if kind == "name":
        return (v, "") if isinstance(v, str) else (None, f"'{key}' must be a string (got {v!r})")
    if kind == "bool":
        return (v, "") if isinstance(v, bool) else (None, f"'{key}' must be true or false (got {v!r})")
    if kind in ("int", "float"):
        ok = is_int(v) if kind == "int" else (isinstance(v, (int, float)) and not isinstance(v, bool))
        if not ok:
            return None, f"'{key}' must be {'a whole number' if kind == 'int' else 'a number'} (got {v!r})"
        lo, _ = BOUNDS.get(key, (None, None))
        if lo is not None and v < lo:
            return None, f"'{key}' must be at least {lo} (got {v!r})"
        return v, ""
    return v, ""


def _near(name: str, known) -> str:
    import difflib
    m = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean '{m[0]}'?)" if m else ""


def load_suite(path: str) -> tuple[Sweep, str]:
    """A suite file, validated against its schema: every problem reported, one line each."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"no suite file at {path}")
    try:
        doc = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {e}") from None
    problems = [f"unknown top-level key or section '{k}'{_near(k, SUITE_TOP)}; known: name, [sweep]"
                for k in doc if k not in SUITE_TOP]
    raw = doc.get("sweep", {})
    if not isinstance(raw, dict):
        problems.append("'sweep' must be a [sweep] section")
        raw = {}
    s: dict = {}
    unknown = sorted(k for k in raw if k not in SWEEP_SCHEMA)
    if unknown:
        hints = "".join(_near(k, SWEEP_SCHEMA) for k in unknown)
        problems.append(f"unknown [sweep] keys {unknown}{hints}; known: {', '.join(SWEEP_SCHEMA)}")
    for k, v in raw.items():
        if k not in SWEEP_SCHEMA:
            continue
        val, why = _typed(k, v, SWEEP_SCHEMA[k])
        if why:
            problems.append(why)
        else:
            s[k] = val
    if "batch" in s:                    # attention's name for the tokens axis (sequences B)
        if "tokens" in raw:
            problems.append("give either 'batch' or 'tokens', not both")
        s["tokens"] = s.pop("batch")
    for req in ("models", "tokens"):
        if req == "tokens" and "batch" in raw:
            continue
        if req not in raw and "sweep" in doc:
            problems.append(f"[sweep] needs '{req}'")
    if "sweep" not in doc:
        problems.append("no [sweep] section")
    if "name" in doc and not isinstance(doc["name"], str):
        problems.append(f"'name' must be a string (got {doc['name']!r})")
    if problems:
        raise UserError(f"{path}: " + ("\n  ".join([f"{len(problems)} problem(s):"] + problems)
                                       if len(problems) > 1 else problems[0]))
    if isinstance(s.get("backends"), list):
        s["backends"] = ",".join(s["backends"])
    known = {f.name for f in fields(Sweep)}
    assert set(s) <= known, set(s) - known
    return Sweep(**s), doc.get("name", p.stem)


def default_out(name: str, models: list[str]) -> Path:
    from ..machine.sysinfo import machine_id
    stamp = time.strftime("%Y%m%d-%H%M%S")
    tag = models[0] if len(models) == 1 else f"{len(models)}models"
    return Path("results") / machine_id() / f"{name}-{tag}-{stamp}.csv"


def plan_sweep(sweep: Sweep) -> tuple[list[Point], list[str]]:
    """The points and backends of `sweep` on this machine (threads default to its usable CPUs),
    validated before anything is measured."""
    from ..machine.sysinfo import check_threads, topology
    from ..numa.placement import parse_policy

    threads = sweep.threads or [len(topology()["usable_cpus"])]
    check_threads(threads)
    for pol in sweep.numa or ["default"]:
        parse_policy(pol)
    points = sweep.points(threads)
    names = backend_registry.resolve(sweep.backends, op=sweep.op)
    explicit = sweep.backends.strip() not in ("", "all")
    named = {b.strip() for b in sweep.backends.split(",")} if explicit else set()
    kept = []
    for n in names:
        cls = backend_registry.get(n)
        # a backend named explicitly must have a path for one of the sweep's dtypes at least (for the
        # others, --dtype bf16,int8,fp8, its rows say `unsupported` with the reason); a member of a
        # named family (torch -> torch:dequant) without any is left out
        if explicit and not any(dt in cls.dtypes for dt in sweep.dtypes):
            if n in named:
                dts = ", ".join(sweep.dtypes)
                raise UserError(f"backend {n} has no {dts} path (it has: {', '.join(cls.dtypes)})")
            continue
        kept.append(n)
    return points, kept


def run_config(sweep: Sweep, command: str = "", run_id: str = ""):
    """How the runner times the sweep's points (the command and run id every row carries)."""
    from .runner import RunConfig
    cfg = RunConfig(rounds=sweep.rounds, warmup=sweep.warmup, repeats=sweep.repeats,
                    min_time=sweep.min_time, seed=sweep.seed, perf=sweep.perf)
    if command:
        cfg.command = command
    if run_id:
        cfg.run_id = run_id
    return cfg


def run_sweep(sweep: Sweep, out: str | None, resume: bool, fmt: str, name: str,
              command: str = "", admit=None) -> list[dict]:
    """Measure every point of `sweep` into the results file `out`; print the rows in `fmt`.
    `admit(point, backends_to_do)`, when given, is asked before each point with rows still to measure;
    False ends the sweep there (a time budget: `hinabench reproduce`), the rows so far kept."""
    from ..machine.sysinfo import summary
    from ..report.render import emit, reasons
    from . import runner
    from .store import ResultStore

    points, names = plan_sweep(sweep)
    if resume and not out:
        raise UserError("--resume needs --out FILE (the results file to continue)")
    store = ResultStore(out or default_out(name, sweep.models), op=sweep.op)
    existed = store.path.exists() and store.path.stat().st_size > 0
    store.open_for_append()
    err = _console_err()
    if store.repaired:
        click.echo(f"hinabench: note: {store.repaired}", err=True)
    skip = store.done_keys() if resume else set()
    if existed and not resume:
        click.echo(f"hinabench: note: {store.path} has rows already: this run appends its own (run id in "
                   f"every row); readers show the latest run of each point, `hinabench show --all` every run",
                   err=True)
    if resume and names and all(pt.key(n) in skip for pt in points for n in names):
        click.echo(f"hinabench: nothing to do: all {len(points) * len(names)} row(s) of this sweep are "
                   f"already in {store.path}", err=True)
        store.close()
        return []
    cfg = run_config(sweep, command)
    quiet = fmt != "table"
    rows: list[dict] = []
    progress = None
    try:
        if not quiet:
            err.print(f"[bold]hinabench {name}[/]: {len(points)} point(s) x {len(names)} backend(s) -> {store.path}")
            err.print(summary(), style="dim")
        if not quiet and sys.stderr.isatty():
            from rich.progress import Progress
            progress = Progress(console=err, transient=True)
            # one unit per backend per round: the ETA comes from the turns measured so far
            task = progress.add_task("measuring", total=len(points) * len(names) * sweep.rounds)
            progress.start()
        def note(text):
            if not quiet:
                err.print(f"hinabench: note: {text}", style="yellow")
        for group in measure_groups(points, names, sweep, skip, note):
            if admit is not None and not _admitted(admit, group, names, skip):
                break
            if progress is not None:
                progress.update(task, description=str(group[0]) +
                                (f" (+{len(group) - 1} dtype(s) side by side)" if len(group) > 1 else ""))
            if sweep.wait_quiet > 0:
                waited, load = wait_quiet(sweep.wait_quiet)
                if load > LOAD_WARNING_CPUS:
                    click.echo(f"hinabench: note: {group[0]}: still {load:.2f} other CPUs busy after waiting "
                               f"{waited:.0f} s; measuring anyway (its rows will say load_warning)", err=True)
            rows += runner.run_cohort(group, names, cfg, store=store, skip=skip,
                                      progress=_ticker(progress, task) if progress else None)
    except KeyboardInterrupt:
        if progress is not None:
            progress.stop()
        kept = max(store.appended, store.rows_of_run(cfg.run_id) if store.kind == "csv" else 0)
        click.echo(f"hinabench: interrupted: {kept} row(s) kept in {store.path} by this run; "
                   f"run again with --out {store.path} --resume to continue", err=True)
        sys.exit(130)
    finally:
        if progress is not None:
            progress.stop()
        store.close()
    if quiet:
        emit(rows, fmt)
        return rows
    notes = [f"  {line}" for line in reasons(rows)]
    warn = [r for r in rows if r.get("load_warning")]
    if warn:
        notes.append(f"warning: another process competed for the CPUs during {len(warn)} row(s) "
                     f"(load_other_cpus > {LOAD_WARNING_CPUS}): their timings are suspect and their eff is "
                     f"not comparable with other rows' (--wait-quiet SECONDS waits for a quiet machine)")
    moved = [r for r in rows if r.get("denominators_moved")]
    if moved:
        notes.append(f"warning: {len(moved)} row(s) saw their same-process bandwidth or compute peak move by "
                     f"more than {DENOMINATOR_SPREAD:.0%} between probes: their eff is not comparable")
    unstable = [r for r in rows if r.get("unstable")]
    if unstable:
        notes.append(f"warning: {len(unstable)} row(s) unstable (MAD > 10% of median)")
    notes.append(f"rows written to {store.path}")
    emit(rows, "table", notes=notes, console=_console_out())
    return rows


def measure_groups(points, names, sweep, skip, note) -> list[list]:
    """The sweep's points in the groups measured together: the dtypes of one model, T, thread count and
    policy side by side in the same rounds (runner.run_cohort), unless `dtypes_apart` or their data and
    backends do not fit in memory together (then one by one, and `note(text)` hears why)."""
    from . import runner
    from .points import cohorts
    out = []
    for group in cohorts(points) if not sweep.dtypes_apart else [[pt] for pt in points]:
        todo = [pt for pt in group if any(pt.key(n) not in skip for n in names)]
        if len(todo) > 1 and not runner.cohort_fits(todo, names):
            note(f"{todo[0]}: the {len(todo)} dtypes of this point do not fit in memory together: measured "
                 f"one after another (their ratios are not side by side)")
            out += [[pt] for pt in group]
        else:
            out.append(group)
    return out


def _admitted(admit, group, names, skip) -> bool:
    """`admit` (a time budget) asked for each point of a cohort with rows still to measure."""
    for pt in group:
        todo = [n for n in names if pt.key(n) not in skip]
        if todo and not admit(pt, todo):
            return False
    return True


def _ticker(progress, task):
    def tick(what, units):
        if what:
            progress.update(task, description=what)
        if units:
            progress.advance(task, units)
    return tick


def wait_quiet(timeout: float, poll: float = 0.5) -> tuple[float, float]:
    """Wait until other processes use under LOAD_WARNING_CPUS of the CPUs, at most `timeout` seconds.
    Returns (seconds waited, the last load seen)."""
    from .loadmeter import other_load
    t0 = time.monotonic()
    load = other_load(poll)
    while load > LOAD_WARNING_CPUS and time.monotonic() - t0 < timeout:
        load = other_load(poll)
    return time.monotonic() - t0, load


def _console_err():
    from rich.console import Console
    return Console(stderr=True)


def _console_out():
    from rich.console import Console
    return Console(width=200)
