"""The measurement loop: validate, then time backends side by side in interleaved rounds.

For one point (a problem at a thread count), every backend is:
  1. checked for availability, prepared (layout conversion timed apart: `prepare_ms`),
  2. run once on rotation group 0 and compared with the float32 reference (`rel_err`);
     over tolerance -> status `wrong`: still timed, so a wrong-but-fast result is visible, never ranked,
  3. timed in `rounds` rounds; in each round the backends take turns (the order rotates), each doing
     warm-up calls (kept apart), then its samples, one call per sample, rotating through the weight
     groups (see problem.py's cache policy), with a read-bandwidth probe over the same weight
     buffers just before and after, and the machine's load from /proc/stat during.
"""
from __future__ import annotations

import gc
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field

import torch

from . import __version__, backends as backend_registry
from .backends.base import Unsupported
from .errors import UserError
from .loadmeter import other_load
from .measure import RoundPlan
from .probes import peak_gflops
from .problem import FFNProblem, ProblemData, materialize
from .reference import TOLERANCE, diagnose, rel_err
from .results import ResultStore, empty_row, point_key, rank_rows
from .sysinfo import fingerprint, machine_id, meminfo, summary
from .stats import summarize, unstable

LOAD_WARNING_CPUS = 0.25


@dataclass
class RunConfig(RoundPlan):
    seed: int = 0
    perf: bool = False           # count DRAM loads (local/remote) with perf around the samples
    numa: str = "default"
    command: str = field(default_factory=lambda: " ".join(shlex.quote(a) for a in
                                                          ["hinabench"] + sys.argv[1:]))


def memory_needed(problem: FFNProblem, groups: int, backend_names: list[str]) -> int:
    weights = groups * problem.weight_bytes
    extra = sum(backend_registry.get(n).extra_bytes_estimate(weights) for n in backend_names)
    reference = 3 * problem.H * problem.I * 4 * 2      # float32 copies of one expert, transient
    return problem.allocated_bytes(groups) + extra + reference + (256 << 20)


def check_memory(problem: FFNProblem, groups: int, backend_names: list[str]) -> None:
    need = memory_needed(problem, groups, backend_names)
    avail = meminfo().get("MemAvailable", 0)
    if avail and need > avail:
        raise UserError(f"{problem} needs {need / 2**30:.1f} GiB ({groups} weight group(s) of "
                        f"{problem.weight_bytes / 2**30:.2f} GiB plus backends' copies), but only "
                        f"{avail / 2**30:.1f} GiB is available (MemAvailable)")


class _Timed:
    """One backend's state through the rounds of a point."""

    def __init__(self, name: str, row: dict):
        self.name, self.row = name, row
        self.backend = None
        self.samples: list[float] = []
        self.probes: list[tuple[float, str]] = []
        self.load: list[float] = []
        self.active = False


def _base_row(problem: FFNProblem, name: str, threads: int, cfg: RunConfig, groups: int) -> dict:
    fp = fingerprint()
    row = empty_row()
    row.update(problem.key())
    factor = backend_registry.get(name).weight_bytes_factor
    row.update(backend=name, threads=threads, numa=cfg.numa, rounds=cfg.rounds, warmup=cfg.warmup,
               tolerance=TOLERANCE.get(problem.dtype), weight_bytes=int(problem.weight_bytes * factor),
               flops=problem.flops, rotation_groups=groups,
               allocated_bytes=groups * problem.weight_bytes, machine=machine_id(fp),
               fingerprint=summary(fp), hinabench_version=__version__, git_rev=fp["git_rev"],
               command=cfg.command)
    return row


def _fail(t: _Timed, status: str, reason: str) -> None:
    t.row.update(status=status, reason=reason)
    t.active = False


def _fail_from(t: _Timed, e: Exception) -> None:
    """An exception that carries a row status (a worker's `timeout`, `failed`, ...) keeps it."""
    from .results import STATUSES
    status = getattr(e, "status", None)
    if status in STATUSES and status != "ok":
        _fail(t, status, str(getattr(e, "reason", e)))
    else:
        _fail(t, "failed", f"{type(e).__name__}: {e}".splitlines()[0] + _where(e))


def _roofline(row: dict, peak: float, unit: str) -> None:
    med = row.get("median_ms")
    bw = row.get("read_gbps")
    row.update(peak_gflops=peak, peak_unit=unit)
    if not med or not bw:
        return
    mem_ms = row["weight_bytes"] / (bw * 1e9) * 1e3
    cmp_ms = row["flops"] / (peak * 1e9) * 1e3
    row.update(roofline_ms=max(mem_ms, cmp_ms), bound="memory" if mem_ms >= cmp_ms else "compute",
               gbps=row["weight_bytes"] / (med * 1e-3) / 1e9, gflops=row["flops"] / (med * 1e-3) / 1e9)
    row.update(pct_bw=row["gbps"] / bw, efficiency=row["roofline_ms"] / med)


def run_point(problem: FFNProblem, names: list[str], threads: int, cfg: RunConfig,
              store: ResultStore | None = None, skip: set | None = None, progress=None,
              data: ProblemData | None = None) -> list[dict]:
    """Measure `names` on one problem at one thread count; append each row to `store` when done."""
    torch.set_num_threads(threads)
    groups = data.groups if data else problem.rotation_groups(_llc())
    timed = [_Timed(n, _base_row(problem, n, threads, cfg, groups)) for n in names]
    todo = [t for t in timed if not (skip and point_key(t.row) in skip)]
    if not todo:
        return []
    check_memory(problem, groups, [t.name for t in todo])
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
    if any(t.active for t in todo) and data is None:
        data = materialize(problem, numa=cfg.numa)
    placement = data.placement() if data is not None else {}
    for t in todo:
        t.row.update(placement)
        t.row.update(_remote_model(cfg.numa, backend_registry.get(t.name).work_partition, problem, placement))
    ref = data.reference(0) if data is not None else None
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
            err = rel_err(out, ref)
            t.row["rel_err"] = err
            t.row["extra_bytes"] = t.backend.extra_bytes()
            t.row["versions"] = t.backend.versions()
            if not err <= TOLERANCE[problem.dtype]:
                tol = TOLERANCE[problem.dtype]
                t.row.update(status="wrong", reason=f"rel_err {err:.3g} > tolerance {tol:g}: "
                                                    f"{diagnose(out, ref, tol)}")
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

    # -- interleaved rounds
    active = [t for t in todo if t.active]
    plan = RoundPlan(**{k: getattr(cfg, k) for k in RoundPlan.__dataclass_fields__})
    # perf attaches after the validation calls, so every thread pool the backends use exists
    counters = {id(t): _start_perf(t) for t in active} if cfg.perf else {}
    for rnd in range(cfg.rounds):
        k = rnd % max(len(active), 1)
        for t in active[k:] + active[:k]:
            if not t.active:
                continue
            try:
                res = t.backend.measure_round(rnd, plan, counters.get(id(t)))
                t.samples += res.samples
                t.probes += res.probes
                t.load.append(res.other_cpus)
            except Exception as e:
                _fail_from(t, e)

    for t in active:
        if id(t) in counters:
            counters[id(t)].__exit__(None, None, None)
            t.row.update(counters[id(t)].result.row())
    if cfg.perf:
        from .perf import unsupported_row
        for t in todo:
            if t.row.get("perf_status") is None:
                t.row.update(unsupported_row(f"not counted: backend status {t.row.get('status')}"))

    # -- statistics, roofline, storage
    peak, unit = peak_gflops(threads)
    rows = []
    for t in todo:
        r = t.row
        if t.samples and r.get("status") in (None, "ok", "wrong"):
            r.update(summarize(t.samples))
            r["unstable"] = unstable(r)
            bws = [bw for bw, _ in t.probes]
            best = max(t.probes)
            r.update(read_gbps=best[0], read_gbps_min=min(bws), read_probe=best[1])
            r["load_other_cpus"] = round(max(t.load), 2) if t.load else None
            r["load_warning"] = bool(t.load and max(t.load) > LOAD_WARNING_CPUS)
            r["status"] = r.get("status") or "ok"
            _roofline(r, peak, unit)
        r["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        rows.append(r)
        if t.backend is not None:
            t.backend.close()
    rank_rows(rows)
    for r in rows:
        if store is not None:
            store.append(r)
        if progress is not None:
            progress()
    del data, timed, todo, active
    gc.collect()
    return rows


def _start_perf(t: _Timed):
    session = t.backend.perf_session()
    session.__enter__()
    return session


def _remote_model(policy: str, partition: str, problem: FFNProblem, placement: dict) -> dict:
    """remote_fraction_model: the share of weight bytes the backend's work partition reads from a
    remote node, under the placement model (Section 5); None where the model does not apply."""
    from .numa import memory_nodes, node_cpus, remote_fraction_model_ffn
    from .problem import parse_numa_policy
    mode, nodes = parse_numa_policy(policy)
    out = {"work_partition": partition}
    if mode == "default":
        return {**out, "remote_fraction_model": None,
                "remote_fraction_basis": "first touch: placement depends on which thread touched each page; not modeled"}
    if mode == "bind":
        cpus = os.sched_getaffinity(0)
        local = len(cpus & set(node_cpus(nodes[0])))
        return {**out, "remote_fraction_model": 1 - local / max(len(cpus), 1),
                "remote_fraction_basis": f"bind: all weights on node {nodes[0]}; threads spread over the "
                                         f"{len(cpus)} CPUs of this process"}
    if not placement.get("placement_model_valid"):
        return {**out, "remote_fraction_model": None,
                "remote_fraction_basis": f"placement model does not apply: {placement.get('placement_reason')}"}
    n = len(nodes or memory_nodes())
    f = remote_fraction_model_ffn(partition, problem.H, problem.I, problem.A, nodes=n,
                                  page_bytes=int(placement["placement_page_bytes"]),
                                  phase=int(placement["placement_phase"]))
    return {**out, "remote_fraction_model": f,
            "remote_fraction_basis": f"modeled: interleave over {n} node(s), {partition} partition"}


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""


def _llc() -> int:
    from .sysinfo import llc_bytes
    return llc_bytes()
