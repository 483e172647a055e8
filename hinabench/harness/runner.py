"""The measurement loop: validate, then time backends side by side in interleaved rounds.

For one point (a problem of any kind at a thread count, under a NUMA policy), every backend is:
  1. checked for availability, prepared (layout conversion timed apart: `prepare_ms`),
  2. run once on rotation group 0 and compared with the float32 reference (`rel_err`);
     over tolerance -> status `wrong`: still timed, so a wrong-but-fast result is visible, never ranked,
  3. timed in `rounds` rounds; in each round the backends take turns (the order rotates), each doing
     warm-up calls (kept apart), then its samples, one call per sample, rotating through the weight
     groups (see problems/base.py's cache policy), with a read-bandwidth probe over the same weight
     buffers just before and after, and the machine's load from /proc/stat during.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import os
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from .. import __version__, backends as backend_registry
from ..backends.base import Unsupported
from ..errors import UserError
from .loadmeter import other_load
from .measure import RoundPlan
from ..machine.probes import peak_gflops, peak_unit, remember_peak
from ..problems import Problem, ProblemData, diagnose, rel_err
from .points import Point, row_key
from .store import ResultStore, empty_row, rank_rows
from ..machine.sysinfo import fingerprint, machine_id, meminfo, summary
from .stats import bound_ms, summarize, unstable

LOAD_WARNING_CPUS = 0.25


@dataclass
class RunConfig(RoundPlan):
    seed: int = 0
    perf: bool = False           # count DRAM loads (local/remote) with perf around the samples
    numa: str = "default"
    command: str = field(default_factory=lambda: " ".join(shlex.quote(a) for a in
                                                          ["hinabench"] + sys.argv[1:]))
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}")


def memory_needed(problem: Problem, groups: int, backend_names: list[str]) -> int:
    weights = groups * problem.group_bytes
    allocated = problem.allocated_bytes(groups)
    extra = sum(backend_registry.get(n).extra_bytes_estimate(weights, allocated) for n in backend_names)
    return problem.memory_needed(groups, extra)


def check_memory(problem: Problem, groups: int, backend_names: list[str]) -> tuple[list[str], int, int]:
    """(the backends, in order, that fit in memory together, bytes all of them need, bytes available):
    their processes are alive side by side through the interleaved rounds. A point where not even the
    first fits is refused, saying how much is needed."""
    avail = meminfo().get("MemAvailable", 0)
    fit: list[str] = []
    for n in backend_names:
        if avail and memory_needed(problem, groups, fit + [n]) > avail:
            continue
        fit.append(n)
    if backend_names and not fit:
        need = memory_needed(problem, groups, backend_names[:1])
        raise UserError(f"{problem} needs {need / 2**30:.1f} GiB ({groups} weight group(s) of "
                        f"{problem.group_bytes / 2**30:.2f} GiB plus backends' copies), but only "
                        f"{avail / 2**30:.1f} GiB is available (MemAvailable)")
    return fit, memory_needed(problem, groups, backend_names), avail


class _Timed:
    """One backend's state through the rounds of a point."""

    def __init__(self, name: str, row: dict, point: Point):
        self.name, self.row, self.point = name, row, point
        self.backend = None
        self.samples: list[float] = []
        self.probes: list[tuple[float, str]] = []
        self.peaks: list[tuple[float, str]] = []
        self.load: list[float] = []
        self.turns: list[tuple[list[float], list[float], list[float]]] = []   # (samples, GB/s, GFLOP/s) a turn
        self.active = False


def _base_row(point: Point, name: str, cfg: RunConfig, groups: int) -> dict:
    fp = fingerprint()
    problem = point.problem
    row = empty_row(point.op)
    row.update(point.columns())
    cls = backend_registry.get(name)
    row.update(backend=name, rounds=cfg.rounds, warmup=cfg.warmup,
               note=cls.row_note(point.threads) or None,
               tolerance=problem.tolerance, weight_bytes=cls.read_bytes(problem),
               flops=problem.flops, rotation_groups=groups,
               allocated_bytes=problem.allocated_bytes(groups), machine=machine_id(fp),
               fingerprint=summary(fp), hinabench_version=__version__, git_rev=fp["git_rev"],
               command=cfg.command, run_id=cfg.run_id)
    return row


def _fail(t: _Timed, status: str, reason: str) -> None:
    t.row.update(status=status, reason=reason)
    t.active = False


def _fail_from(t: _Timed, e: Exception) -> None:
    """An exception that carries a row status (a worker's `timeout`, `failed`, ...) keeps it."""
    from .store import STATUSES
    status = getattr(e, "status", None)
    if status in STATUSES and status != "ok":
        _fail(t, status, str(getattr(e, "reason", e)))
    else:
        _fail(t, "failed", f"{type(e).__name__}: {e}".splitlines()[0] + _where(e))


# A row whose same-process denominators (read bandwidth, compute peak) moved by more than this
# between its probes is flagged `denominators_moved`: its efficiency is not comparable to others'.
DENOMINATOR_SPREAD = 0.25


def _denominators(row: dict, probes: list, peaks: list, threads: int) -> tuple[float, str]:
    """Fill the roofline's denominators from the row's own probes; return (peak, unit) to judge by."""
    bws = [bw for bw, _ in probes]
    best = max(probes)
    row.update(read_gbps=best[0], read_gbps_min=min(bws), read_probe=best[1])
    if peaks:
        gf = [g for g, _ in peaks]
        peak, unit = max(peaks)
        row.update(peak_gflops_min=min(gf))
    else:                       # a backend whose measure_round took no compute probe: this process's
        peak, unit = peak_gflops(threads, peak_unit(str(row.get("dtype") or "bf16")))
        gf = [peak]
    row["peak_gflops_machine"] = remember_peak(str(row.get("fingerprint")), threads, unit, peak)
    moved = min(bws) < (1 - DENOMINATOR_SPREAD) * max(bws) or min(gf) < (1 - DENOMINATOR_SPREAD) * max(gf)
    row["denominators_moved"] = bool(moved)
    return peak, unit


def _roofline(row: dict, peak: float, unit: str) -> None:
    med = row.get("median_ms")
    bw = row.get("read_gbps")
    row.update(peak_gflops=peak, peak_unit=unit)
    if not med or not bw:
        return
    mem_ms, cmp_ms = bound_ms(row, bw, peak)
    row.update(roofline_ms=max(mem_ms, cmp_ms), bound="memory" if mem_ms >= cmp_ms else "compute")
    if row.get("status") == "wrong":
        return   # a wrong output's bytes and flops were not the problem's: no rates, no efficiency
    row.update(gbps=row["weight_bytes"] / (med * 1e-3) / 1e9, gflops=row["flops"] / (med * 1e-3) / 1e9)
    row.update(pct_bw=row["gbps"] / bw, efficiency=row["roofline_ms"] / med)
    if row["bound"] == "compute":   # the achievable compute ceiling beside the physical one
        from ..machine.probes import gemm_gflops
        row["gemm_gflops"] = gemm_gflops(int(row["threads"]))
        row["pct_gemm"] = row["gflops"] / row["gemm_gflops"]


def _turn_efficiency(row: dict, turns: list) -> None:
    """`efficiency_turn`: each turn's roofline from the probes taken beside its samples (the best of
    its before / after read, its compute peak, else the row's) over that turn's median sample, the
    median over the turns. `efficiency` divides one roofline, from the best probe of every turn, by the
    median of every sample: on a host whose bandwidth drifts between turns it reads the kernel against
    a rate it was not given in most of them; this one pairs each sample with the memory system's rate
    of its minute. Both are stored; the targets judge by `efficiency`."""
    if row.get("status") == "wrong" or not row.get("weight_bytes"):
        return
    effs = []
    for samples, bws, peaks in turns:
        if not samples or not bws:
            continue
        mem_ms, cmp_ms = bound_ms(row, max(bws), max(peaks) if peaks else row.get("peak_gflops"))
        effs.append(max(mem_ms, cmp_ms) / (statistics.median(samples) * 1e3))
    if effs:
        row["efficiency_turn"] = statistics.median(effs)


def _has_path(cls, problem: Problem) -> bool:
    return problem.kind in cls.ops and getattr(problem, "dtype", "bf16") in cls.dtypes


def run_point(problem: Problem, names: list[str], threads: int, cfg: RunConfig,
              store: ResultStore | None = None, skip: set | None = None, progress=None,
              data: ProblemData | None = None, numa: str | None = None) -> list[dict]:
    """Measure `names` on one problem at one thread count under the memory policy `numa` (default:
    cfg.numa); append each row to `store` when done."""
    return run(Point(problem, threads, numa or cfg.numa), names, cfg, store, skip, progress, data)


def run(point: Point, names: list[str], cfg: RunConfig, store: ResultStore | None = None,
        skip: set | None = None, progress=None, data: ProblemData | None = None) -> list[dict]:
    """Measure `names` at one point; append each row to `store` when done."""
    return run_cohort([point], names, cfg, store, skip, progress, [data])


_COHORTS = itertools.count(1)


def cohort_fits(points: list[Point], names: list[str]) -> bool:
    """Whether every point's backends (with a path for it) fit in memory together, their data and
    processes alive side by side through one cohort's rounds (else the points are measured apart)."""
    avail = meminfo().get("MemAvailable", 0)
    need = 0
    for pt in points:
        wanted = [n for n in names if _has_path(backend_registry.get(n), pt.problem)]
        need += memory_needed(pt.problem, pt.problem.rotation_groups(_llc()), wanted)
    return not avail or need <= avail


def run_cohort(points: list[Point], names: list[str], cfg: RunConfig, store: ResultStore | None = None,
               skip: set | None = None, progress=None, datas: list | None = None) -> list[dict]:
    """Measure `names` at several points of one thread count side by side: each point validated on
    its own data, then every (point, backend) takes its turn in the same interleaved rounds, so that
    ratios between the points (one model and T in bf16, int8 and fp8) carry no drift of the host
    between them. Rows of a cohort of more than one point share its `cohort` id. Append each row to
    `store` when its point is done."""
    threads = points[0].threads
    assert all(pt.threads == threads for pt in points), "a cohort has one thread count"
    torch.set_num_threads(threads)
    todos, kept = [], []   # each point's backends still to do; its data, alive through the rounds
    for pt, data in zip(points, datas or [None] * len(points)):
        todo, data = _setup(pt, names, cfg, skip, progress, data)
        todos.append(todo)
        kept.append(data)
    together = [t for todo in todos for t in todo]
    if not together:
        return []
    if sum(1 for todo in todos if any(t.active for t in todo)) > 1:
        cohort = f"{cfg.run_id}:{next(_COHORTS)}"
        for t in together:
            t.row["cohort"] = cohort

    # -- interleaved rounds
    active = [t for t in together if t.active]
    took_turns = {id(t) for t in active}
    plan = RoundPlan(**{k: getattr(cfg, k) for k in RoundPlan.__dataclass_fields__})
    # perf attaches after the validation calls, so every thread pool the backends use exists
    with contextlib.ExitStack() as stack:
        counters = {id(t): stack.enter_context(t.backend.perf_session()) for t in active} if cfg.perf else {}
        _rounds(active, cfg, plan, counters, progress)
    for t in active:
        if id(t) in counters:
            t.row.update(counters[id(t)].result.row())
    if cfg.perf:
        from ..machine.perf import unsupported_row
        for t in together:
            if t.row.get("perf_status") is None:
                t.row.update(unsupported_row(f"not counted: backend status {t.row.get('status')}"))

    # -- statistics, roofline, storage (ranks within each point)
    out = []
    for todo in todos:
        rows = []
        for t in todo:
            r = t.row
            if t.samples and r.get("status") in (None, "ok", "wrong"):
                r.update(summarize(t.samples))
                r["unstable"] = unstable(r)
                peak, unit = _denominators(r, t.probes, t.peaks, threads)
                r["load_other_cpus"] = round(max(t.load), 2) if t.load else None
                r["load_warning"] = bool(t.load and max(t.load) > LOAD_WARNING_CPUS)
                r["status"] = r.get("status") or "ok"
                _roofline(r, peak, unit)
                _turn_efficiency(r, t.turns)
            if r.get("status") is None:     # a row is never stored without a status
                r.update(status="failed", reason="no samples were taken")
            r["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            rows.append(r)
            if t.backend is not None:
                t.backend.close()
        rank_rows(rows)
        for r in rows:
            if store is not None:
                store.append(r)
        out += rows
    if progress is not None:   # the turns of backends that never took one
        progress(None, cfg.rounds * sum(1 for t in together if id(t) not in took_turns))
    del todos, kept, together, active
    gc.collect()
    return out


def _setup(point: Point, names: list[str], cfg: RunConfig, skip: set | None, progress,
           data: ProblemData | None) -> tuple[list[_Timed], ProblemData | None]:
    """One point's backends that are still to do: checked, memory-fitted, prepared and validated on
    its data (materialized here unless given)."""
    problem, threads = point.problem, point.threads
    groups = data.groups if data else problem.rotation_groups(_llc())
    timed = [_Timed(n, _base_row(point, n, cfg, groups), point) for n in names]
    todo = [t for t in timed if not (skip and row_key(t.row) in skip)]
    if progress is not None and len(todo) < len(timed):
        progress(None, cfg.rounds * (len(timed) - len(todo)))
    if not todo:
        return [], data
    load_before = other_load(0.2)
    for t in todo:
        t.row.update(loadavg_before=round(load_before, 2))
    # -- availability and preparation, before any data exists for those that cannot run
    for t in todo:
        cls = backend_registry.get(t.name)
        ok, why = cls.availability()
        if not ok:
            _fail(t, getattr(cls, "missing_status", "unsupported"), why)
            continue
        t.active = True
    # -- memory: the backends that can run, side by side (each peer's process holds its own copies)
    # (those with no path for the problem's kind or dtype take no memory: they become unsupported rows)
    wanted = [t.name for t in todo if t.active and _has_path(backend_registry.get(t.name), problem)]
    fit, need, avail = check_memory(problem, groups, wanted)
    for t in todo:
        if t.active and t.name in wanted and t.name not in fit:
            _fail(t, "unavailable", f"not run beside the other {len(fit)} backend(s) of this point: all "
                                    f"{len(wanted)} together need {need / 2**30:.1f} GiB (their copies of the "
                                    f"weights), {avail / 2**30:.1f} GiB is available; run it with fewer --backends")
    if any(t.active for t in todo) and data is None:
        data = problem.materialize(numa=point.numa)
    placement = data.placement() if data is not None else {}
    huge_here = _huge_fraction(data) if data is not None else None
    for t in todo:
        t.row.update(placement)
        t.row.update(problem.remote_model(point.numa, backend_registry.get(t.name).work_partition, placement))
    # quantized dtypes: the scheme's own error (quantized reference vs BF16 reference), every row; a
    # peer with a scheme of its own (Backend.quant_scheme) is validated against, and carries, that one's
    for t in todo:
        cls = backend_registry.get(t.name)
        if data is None or not hasattr(data, "scheme_quant_err"):
            continue
        scheme = cls.scheme_for(problem)
        if scheme is None or (t.active and data.problem.dtype in cls.dtypes):
            t.row["quant_err"] = data.scheme_quant_err(scheme, 0)
    for t in todo:
        if not t.active:
            continue
        cls = backend_registry.get(t.name)
        try:
            t.backend = cls(threads)
            t0 = time.perf_counter()
            t.backend.prepare(data)
            t.row["prepare_ms"] = (time.perf_counter() - t0) * 1e3
            own = getattr(t.backend, "prepare_ms", None)   # a worker's peer-only preparation time
            if callable(own) and own() is not None:
                t.row["prepare_ms"] = own()
            out = t.backend.run(0)
            scheme = cls.scheme_for(problem)
            ref = data.scheme_reference(scheme, 0) if scheme else data.reference(0)
            err = rel_err(out, ref)
            t.row["rel_err"] = err
            t.row["extra_bytes"] = t.backend.extra_bytes()
            own_pages = getattr(t.backend, "huge_pages", None)   # a worker: its own copies
            frac, why = own_pages() if callable(own_pages) else (huge_here, "")
            t.row["weight_huge_fraction"] = frac
            why = why or _huge_shortfall(point.numa, frac)
            if why:
                t.row["note"] = "; ".join(x for x in (t.row.get("note"), f"huge pages: {why}") if x)
            t.row["versions"] = t.backend.versions()
            if not err <= problem.tolerance:
                tol = problem.tolerance
                note = t.backend.note()
                t.row.update(status="wrong", reason=f"rel_err {err:.3g} > tolerance {tol:g}: "
                                                    f"{diagnose(out, ref, tol)}" + (f"; {note}" if note else ""))
        except Unsupported as e:
            _fail(t, "unsupported", str(e))
        except MemoryError:
            _fail(t, "failed", "out of memory while preparing")
        except Exception as e:  # a backend that raises is a row, and the sweep goes on
            _fail_from(t, e)
        if t.backend is not None and t.row.get("versions") is None:
            try:
                t.row["versions"] = t.backend.versions()
            except Exception:
                pass
    return todo, data


def _rounds(active: list[_Timed], cfg: RunConfig, plan: RoundPlan, counters: dict, progress=None) -> None:
    """Interleaved rounds: the backends take turns, the order rotating from round to round.
    `progress(what, units)` hears of each backend's turn before it starts (units 0) and after (1)."""
    for rnd in range(cfg.rounds):
        k = rnd % max(len(active), 1)
        for t in active[k:] + active[:k]:
            if progress is not None:
                progress(f"{t.point} · {t.name} · round {rnd + 1}/{cfg.rounds}", 0)
            if not t.active:
                if progress is not None:
                    progress(None, 1)
                continue
            try:
                res = t.backend.measure_round(rnd, plan, counters.get(id(t)))
                t.samples += res.samples
                t.probes += res.probes
                t.peaks += res.peaks
                t.load.append(res.other_cpus)
                t.turns.append((res.samples, [bw for bw, _ in res.probes], [g for g, _ in res.peaks]))
            except Exception as e:
                _fail_from(t, e)
            if progress is not None:
                progress(None, 1)


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""


def _llc() -> int:
    from ..machine.sysinfo import llc_bytes
    return llc_bytes()


def _huge_fraction(data) -> float:
    """The share of the problem's weight bytes (every rotation group) on transparent huge pages."""
    from ..numa.linux import huge_fraction
    return huge_fraction(data.buffers())


def _huge_shortfall(policy: str, frac: float | None) -> str:
    """Why a '+thp' point's weights are not (all) on huge pages, or "": the madvise went through but
    the kernel had no free 2 MiB pages to give (it falls back to 4 KiB: /proc/vmstat thp_fault_fallback)."""
    from ..numa.placement import huge_policy
    if not huge_policy(policy) or frac is None or frac >= 0.9:
        return ""
    return (f"asked for, but {frac:.0%} of the bytes got them (the kernel fell back to 4 KiB pages: no "
            f"free 2 MiB pages; see /proc/vmstat thp_fault_fallback)")
