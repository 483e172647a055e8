"""`hinabench reproduce`: every paper figure this machine supports, in one command.

1. Plan. Each figure and table of the paper is assessed against this machine and this hinabench:
   *measured here* (its rows are timed here), *modeled here* (timed here, but part of what it shows
   comes from a model: said what) or *not reproducible here* (the reason: no GPU, one NUMA node, no
   HBM, no perf counters, or a hinabench part that does not exist yet).
2. Calibrate. One real point (the plan's smallest, every backend of the plan, one round) is timed:
   how fast weights are materialised, each backend's setup (its worker, its preparation) and one
   timed turn. Every planned point's time is estimated from it with the roofline of that point
   (latency scales with max(bytes / bandwidth, FLOPs / peak)), and the calibration is kept in
   DIR/reproduce.json so that a second run does not repeat it.
3. Schedule. Figures are taken cheapest-first by the time still needed for the suites they need
   (a suite that serves two figures counts once), so a budget completes as many figures as it can;
   the next figure's suite then uses what is left, point by point. Points that need more memory
   than the machine has are left out, said so.
4. Run. Each suite writes DIR/results/<machine>/<suite>.csv with resume: a second `reproduce`
   with the same --out measures only what is missing. Ctrl-C keeps every point already measured.
5. Report. `hinabench report` of DIR/results into DIR/site, with the plan on its index page.

The suites are the ones in suites/*.toml (same axes); `--quick` uses a few-minute version of each.
"""
from __future__ import annotations

import importlib.util
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError, writable_folder

MEASURED, MODELED, NOT_HERE = "measured here", "modeled here", "not reproducible here"

# The backends of --quick: the project's own kernel, the framework's naive loop and the best peer
# we know on CPUs (a family name means each of its variants; one that cannot run here costs a row).
QUICK_BACKENDS = "hina,torch,vllm:vec"


@dataclass(frozen=True)
class SuiteSpec:
    """The Sweep axes of a suite (hinabench.harness.suite.Sweep keywords), full and --quick; or, with
    kind "e2e", the keywords of an end-to-end job (hinabench.e2e.run.E2EConfig), which runs whole:
    it is estimated by `prior_s` (full, quick) until this --out has timed it once."""
    full: dict
    quick: dict
    kind: str = "sweep"
    prior_s: tuple[float, float] = (0.0, 0.0)


SUITES: dict[str, SuiteSpec] = {
    # suites/fig10.toml: Figure 10's models (mixtral-8x7b first: the paper's lead model), T 1..256
    "fig10": SuiteSpec(
        full=dict(models=["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "mixtral-8x22b", "qwen3-235b-a22b"],
                  tokens=[1, 2, 4, 8, 16, 32, 64, 128, 256], backends="all", rounds=3),
        quick=dict(models=["qwen3-30b-a3b"], tokens=[1, 8], backends=QUICK_BACKENDS, rounds=2,
                   min_time=0.1, warmup=1)),
    # suites/fig15.toml: the remote fraction at decode, weights interleaved
    "fig15": SuiteSpec(
        full=dict(models=["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"], tokens=[1], backends="all",
                  numa=["interleave"], perf=True, rounds=3),
        quick=dict(models=["qwen3-30b-a3b"], tokens=[1], backends=QUICK_BACKENDS, numa=["interleave"],
                   perf=True, rounds=1, min_time=0.1, warmup=1)),
    # suites/fig11.toml: the quantized FFN, hina against every peer with an int8/fp8 path here
    "fig11": SuiteSpec(
        full=dict(models=["mixtral-8x7b", "qwen3-30b-a3b"], tokens=[1, 2, 4, 8, 16], dtype=["bf16", "int8", "fp8"],
                  group=128, backends="hina:avx2,hina:avx512,hina:amx,torch:dequant,kt:fp8,llamacpp:q8_0", rounds=3),
        quick=dict(models=["qwen3-30b-a3b"], tokens=[1, 8], dtype=["bf16", "int8", "fp8"], group=128,
                   backends="hina,torch:dequant,kt:fp8", rounds=2, min_time=0.1, warmup=1)),
    # suites/attn.toml and attn-extend.toml: decode and extend attention (tokens = batch B)
    "attn": SuiteSpec(
        full=dict(op="attention", models=["qwen3-30b-a3b", "mixtral-8x7b"], phase=["decode"],
                  layout=["paged", "contiguous"], context=[1024, 4096, 16384, 32768], tokens=[1, 4, 16],
                  backends="all", rounds=3),
        quick=dict(op="attention", models=["qwen3-30b-a3b"], phase=["decode"], layout=["paged"],
                   context=[1024, 4096], tokens=[1], backends="hina,torch:sdpa,vllm:attn", rounds=2,
                   min_time=0.1, warmup=1)),
    "attn-extend": SuiteSpec(
        full=dict(op="attention", models=["qwen3-30b-a3b", "mixtral-8x7b"], phase=["extend"], layout=["paged"],
                  context=[4096], extend=[128, 512], tokens=[1], backends="all", rounds=3),
        quick=dict(op="attention", models=["qwen3-30b-a3b"], phase=["extend"], layout=["paged"], context=[1024],
                   extend=[128], tokens=[1], backends="hina,torch:sdpa", rounds=2, min_time=0.1, warmup=1)),
    # Figures 12-14 and Table 4: `hinabench e2e` on synthetic-weight checkpoints (two depths: per-layer cost)
    "e2e": SuiteSpec(
        kind="e2e", prior_s=(2400.0, 300.0),
        full=dict(models=["qwen3-30b-a3b"], layers=[2, 4], prompt=128, gen=32, batches=[1, 4],
                  engines=["hina", "hf", "hina+l", "vllm", "llamacpp", "hina+a", "hina+l+a", "ipex", "kt"],
                  prefill=[512, 1024], prefill_engines=["hina", "hina+l"], rounds=2),
        quick=dict(models=["qwen3-30b-a3b"], layers=[1, 2], prompt=32, gen=8, batches=[1],
                   engines=["hina", "hf"], prefill=[128], prefill_engines=["hina"], rounds=1)),
    # Figure 1's CPU and GPU sides: a real batch (router routing) of Mixtral-8x7B
    "fig1": SuiteSpec(
        full=dict(models=["mixtral-8x7b"], routing=["router"], tokens=[1, 4, 16, 64, 256], backends="all",
                  rounds=3),
        quick=dict(models=["mixtral-8x7b"], routing=["router"], tokens=[1, 16], backends="hina,torch,torch-cuda",
                   rounds=2, min_time=0.1, warmup=1)),
}


# ---- what this machine and this hinabench can do --------------------------------------------------
@dataclass
class Capabilities:
    summary: str
    machine: str
    numa_nodes: int
    cuda: tuple[bool, str]
    perf: tuple[bool, str]
    hbm: tuple[bool, str]
    dtypes: tuple[str, ...]
    kinds: tuple[str, ...]
    figures: tuple[str, ...]
    e2e: bool

    @classmethod
    def here(cls) -> "Capabilities":
        import torch

        from . import problems
        from .dtypes import DTYPES
        from .machine import sysinfo
        from .report.figures import FIGURES
        fp = sysinfo.fingerprint()
        nodes = fp["numa_nodes"]
        cuda = (True, "") if torch.cuda.is_available() else (
            False, f"no CUDA device (torch {torch.__version__}"
                   + (" is a CPU build)" if torch.version.cuda is None else " finds no NVIDIA GPU)"))
        cpuless = [n["node"] for n in nodes if not n["cpus"] and n["mem_bytes"] > 0]
        hbm = (True, f"CPU-less NUMA node(s) {cpuless} with memory (HBM in flat mode)") if cpuless else (
            False, "no HBM: no CPU-less NUMA node with memory (a Xeon Max in flat mode shows its HBM so)")
        return cls(summary=sysinfo.summary(fp), machine=sysinfo.machine_id(fp), numa_nodes=len(nodes),
                   cuda=cuda, perf=(bool(fp["perf_hw_counters"]), fp["perf_reason"] or ""), hbm=hbm,
                   dtypes=tuple(DTYPES), kinds=tuple(problems.KINDS), figures=tuple(FIGURES),
                   e2e=importlib.util.find_spec("hinabench.e2e") is not None)


# ---- the paper's figures --------------------------------------------------------------------------
@dataclass
class Assessment:
    status: str
    detail: str
    suites: tuple[str, ...] = ()
    draw: str | None = None          # the figures.FIGURES entry that draws it


@dataclass(frozen=True)
class PaperFigure:
    id: str
    title: str

    def assess(self, c: Capabilities) -> Assessment:
        return ASSESS[self.id](c)


PAPER = [PaperFigure(*f) for f in [
    ("fig1", "Fig. 1  CPU vs GPU FFN decode throughput by batch (Mixtral-8x7B)"),
    ("fig4", "Fig. 4  memory-bandwidth utilisation of existing methods' MoE FFN, 1 and 2 NUMA nodes"),
    ("fig10", "Fig. 10 FFN latency vs tokens per expert, per model, against the peers"),
    ("fig11", "Fig. 11 INT8 FFN speedup over KTransformers"),
    ("fig12", "Fig. 12 end-to-end decode speed at batch 1 vs vLLM-CPU, IPEX, KTransformers"),
    ("fig13", "Fig. 13 batch decode throughput and the FFN's share of runtime"),
    ("fig14", "Fig. 14 decode ablation (+m micro-kernels and partitioning, +a attention)"),
    ("fig15", "Fig. 15 remote share of the weights' DRAM traffic (interleaved pages)"),
    ("fig16", "Fig. 16 FFN on an HBM CPU (Xeon Max 9462)"),
    ("table4", "Table 4 prefill throughput by input length (Qwen2-57B-A14B)"),
    ("attn", "Sec. 6  decode GQA attention as small matrix products (latency and GB/s vs context)"),
]]

E2E_MISSING = ("hinabench has no end-to-end engine yet (whole-model decode/prefill with the kernels dropped "
               "into transformers, timed against vLLM-CPU and llama.cpp: issue 15)")


def _fig1(c):
    if c.cuda[0]:
        return Assessment(MEASURED, "the CPU backends and torch-cuda on this machine's GPU", ("fig1",), "fig1")
    return Assessment(NOT_HERE, f"{c.cuda[1]}: the GPU half needs a CUDA machine (its rows merge with "
                                f"this machine's in `hinabench report`)")


def _fig4(c):
    if c.numa_nodes >= 2:
        return Assessment(MEASURED, f"bars at decode T for every backend; one node (default policy) and "
                                    f"{c.numa_nodes} nodes (weights interleaved)", ("fig10", "fig15"), "fig4")
    return Assessment(MEASURED, "the one-node bars (each backend's GB/s over the same-process read probe at "
                                "decode T); the paper's two-node bars need >= 2 NUMA nodes (this machine has 1)",
                      ("fig10",), "fig4")


def _fig10(c):
    return Assessment(MEASURED, "every backend that runs here, validated, against the roofline", ("fig10",), "fig10")


def _fig11(c):
    if "int8" in c.dtypes and "fig11" in c.figures and "fig11" in SUITES:
        return Assessment(MEASURED, "hina INT8 over the best validated INT8 peer", ("fig11",), "fig11")
    return Assessment(NOT_HERE, "hinabench has no INT8 expert-FFN kernel yet (issue 13)")


E2E_HOW = {
    "fig12": "decode at batch 1 per engine (hf, hina, hina+l, vllm; llamacpp, ipex, kt say why not), per layer "
             "from two depths of a synthetic-weight Qwen3-30B-A3B checkpoint",
    "fig13": "batch decode throughput, and the experts' share of a decode step (forward hooks)",
    "fig14": "the ablation baseline (hf) -> +m (HiNa FFN), +m+l (and the dense projections), +m+a (and HiNa "
             "decode attention), +m+l+a (all three)",
    "table4": "prefill tokens/s by prompt length, CPU engines (--quick: P = 128 only)",
}


def _e2e(fig):
    def f(c):
        if c.e2e and fig in c.figures and "e2e" in SUITES:
            return Assessment(MEASURED, E2E_HOW[fig], ("e2e",), fig)
        return Assessment(NOT_HERE, E2E_MISSING)
    return f


def _fig15(c):
    if c.numa_nodes >= 2 and c.perf[0]:
        return Assessment(MEASURED, "perf's remote-DRAM load counters around each backend's samples",
                          ("fig15",), "fig15")
    why = ("one NUMA node: the weights' pages are placed as if interleaved over 2 nodes and the remote "
           "share modeled (Section 5's placement model x each backend's work partition)"
           if c.numa_nodes < 2 else
           f"perf's DRAM counters do not work here ({c.perf[1] or 'no hardware counters'}): the remote "
           f"share is modeled from the pages' real placement and each backend's work partition")
    return Assessment(MODELED, why, ("fig15",), "fig15")


def _fig16(c):
    if c.hbm[0]:
        return Assessment(MEASURED, f"Figure 10's sweep on this HBM machine ({c.hbm[1]})", ("fig10",), "fig10")
    return Assessment(NOT_HERE, c.hbm[1])


def _attn(c):
    if "attention" in c.kinds and "attn" in c.figures and "attn" in SUITES:
        return Assessment(MEASURED, "decode (paged and contiguous KV) and extend attention, hina against "
                                    "torch's SDPA, vLLM-CPU's own op and llama.cpp's flash attention, against the "
                                    "KV-bytes roofline",
                          ("attn", "attn-extend"), "attn")
    return Assessment(NOT_HERE, "hinabench has no attention kernel yet (issue 14)")


ASSESS = {"fig1": _fig1, "fig4": _fig4, "fig10": _fig10, "fig11": _fig11, "fig12": _e2e("fig12"),
          "fig13": _e2e("fig13"), "fig14": _e2e("fig14"), "fig15": _fig15, "fig16": _fig16,
          "table4": _e2e("table4"), "attn": _attn}


# ---- budget ---------------------------------------------------------------------------------------
def parse_duration(text: str) -> float:
    """'90s', '60m', '1h30m', '2h' or a bare number of minutes -> seconds."""
    t = str(text).strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", t):
        t += "m"
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s)?", t)
    if not t or not m or not any(m.groups()):
        raise UserError(f"--budget '{text}' is not a duration: write 90s, 45m, 1h30m or a number of minutes")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    secs = h * 3600 + mi * 60 + s
    if secs <= 0:
        raise UserError("--budget must be more than zero")
    return secs


def fmt_duration(s: float) -> str:
    s = max(0.0, float(s))
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


# ---- calibration and estimates --------------------------------------------------------------------
@dataclass
class Calibration:
    fingerprint: str
    backends: list[str]
    threads: int
    point: str
    alloc_bytes: int               # what the calibration point materialised
    fill_gbps: float               # weights materialised per second
    roof_s: float                  # the calibration point's roofline time
    per_backend: dict = field(default_factory=dict)   # name -> {setup_s, prepare_s, turn_s, lat_s, status}
    bw_gbps: float = 0.0
    peak_gflops: float = 0.0
    wall_s: float = 0.0


def _roof_s(problem, bw_gbps: float, peak_gflops: float) -> float:
    return max(problem.bytes_read / (bw_gbps * 1e9), problem.flops / (peak_gflops * 1e9))


def calibrate(problem, names: list[str], threads: int) -> Calibration:
    """Time one real point of the plan (one round, nothing stored): materialisation, and each
    backend's setup and timed turn."""
    import gc

    from .harness import runner
    from .harness.points import Point
    from .machine.sysinfo import llc_bytes, summary

    t0 = time.perf_counter()
    groups = problem.rotation_groups(llc_bytes())
    data = problem.materialize()
    t_fill = time.perf_counter() - t0
    alloc = problem.allocated_bytes(groups)
    turns: dict[str, float] = {}
    state = {"name": None, "t": 0.0}

    def progress(what, units):
        if what:
            name = what.split(" · ")[1] if " · " in what else None
            state.update(name=name, t=time.perf_counter())
        elif units and state["name"]:
            turns[state["name"]] = turns.get(state["name"], 0.0) + time.perf_counter() - state["t"]
            state["name"] = None

    cfg = runner.RunConfig(rounds=1, warmup=2, min_time=0.3, command="hinabench reproduce (calibration)")
    t1 = time.perf_counter()
    rows = runner.run(Point(problem, threads), names, cfg, store=None, progress=progress, data=data)
    wall = time.perf_counter() - t1
    del data
    gc.collect()
    ok = [r for r in rows if r.get("read_gbps")]
    bw = max((float(r["read_gbps"]) for r in ok), default=10.0)
    peak = max((float(r.get("peak_gflops") or 0) for r in ok), default=0.0) or 100.0
    per: dict[str, dict] = {}
    for r in rows:
        n = r["backend"]
        prep = float(r.get("prepare_ms") or 0) / 1e3
        per[n] = {"status": r.get("status"), "prepare_s": prep, "turn_s": turns.get(n, 0.0),
                  "lat_s": float(r.get("median_ms") or 0) / 1e3}   # live rows: no median without samples
    # What the turns and the backends' own preparation do not explain (workers starting, validation
    # calls, the reference) is a fixed setup cost, shared out among the backends that got that far.
    explained = sum(p["turn_s"] + p["prepare_s"] for p in per.values())
    from . import backends as registry
    started = [n for n in per if registry.get(n).availability()[0]]   # the others stop before any setup
    rest = max(0.0, wall - explained)
    for n in per:
        per[n]["setup_s"] = rest / len(started) if n in started else 0.0
    return Calibration(fingerprint=summary(), backends=list(names), threads=threads, point=str(problem),
                       alloc_bytes=alloc, fill_gbps=alloc / max(t_fill, 1e-3) / 1e9,
                       roof_s=_roof_s(problem, bw, peak), per_backend=per, bw_gbps=bw, peak_gflops=peak,
                       wall_s=wall + t_fill)


def estimate_point(cal: Calibration, point, names: list[str], rounds: int) -> float:
    """Seconds one point of `names` takes, from the calibration: materialising its weights, each
    backend's setup (fixed) and preparation (with the bytes), and `rounds` turns whose calls scale with
    the point's roofline."""
    from .machine.sysinfo import llc_bytes
    p = point.problem
    alloc = p.allocated_bytes(p.rotation_groups(llc_bytes()))
    scale = alloc / max(cal.alloc_bytes, 1)
    roof = _roof_s(p, cal.bw_gbps, cal.peak_gflops) / max(cal.roof_s, 1e-9)
    t = alloc / (cal.fill_gbps * 1e9) if cal.fill_gbps > 0 else 0.0
    fallback = max(cal.per_backend.values(), key=lambda b: b["setup_s"] + b["turn_s"], default=None)
    for n in names:
        b = cal.per_backend.get(n) or fallback
        if not b:
            continue
        t += b["setup_s"] + b["prepare_s"] * scale
        # a turn: min_time of calls or a few calls when one is longer, plus the probes beside it
        t += rounds * max(b["turn_s"], b["turn_s"] + 3 * b["lat_s"] * (roof - 1))
    return t


# ---- the plan -------------------------------------------------------------------------------------
@dataclass
class SuitePlan:
    name: str
    sweep: object                  # harness.suite.Sweep
    path: Path
    points: list = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)     # points that do not fit in memory, said why
    todo_s: float = 0.0            # estimated seconds of the rows still to measure
    rows_todo: int = 0
    rows_done: int = 0
    job: dict | None = None        # an e2e job's E2EConfig keywords (sweep is None then)
    threads: int = 0               # the job's threads
    estimated_from: str = ""       # a job's estimate: "as measured before" or "a prior: not calibrated"
    done: set = field(default_factory=set)


@dataclass
class Plan:
    caps: Capabilities
    quick: bool
    threads: int
    out: Path
    figures: list[tuple[PaperFigure, Assessment]]
    suites: dict[str, SuitePlan]
    order: list[str] = field(default_factory=list)       # suites in the order they run
    fits: dict[str, bool] = field(default_factory=dict)  # figure -> completes within the budget
    calibration: Calibration | None = None
    budget_s: float = 0.0

    def rows(self, after: bool = False) -> list[dict]:
        """The plan as rows (printed, stored beside the results, shown in the report). `after`: the
        state once a run is over (what is stored, what is left) rather than what this run will do."""
        out = []
        for f, a in self.figures:
            est = sum(self.suites[s].todo_s for s in a.suites if s in self.suites)
            todo = sum(self.suites[s].rows_todo for s in a.suites if s in self.suites)
            done = sum(self.suites[s].rows_done for s in a.suites if s in self.suites)
            if a.status == NOT_HERE:
                when = ""
            elif todo == 0:
                when = f"all {done} row(s) stored"
            elif after:
                when = (f"{done} row(s) stored, {todo} still to measure or retry (failed, timeout), "
                        f"~{fmt_duration(est)}: run reproduce again with the same --out")
            else:
                when = ("this run" if self.fits.get(f.id) else "partly this run / a later one") + \
                       f": ~{fmt_duration(est)}"
            out.append({"figure": f.id, "title": f.title, "status": a.status, "detail": a.detail,
                        "suites": ", ".join(a.suites), "when": when})
        return out


def _sweep(name: str, quick: bool, backends: str | None, threads: int):
    from .harness.suite import Sweep
    kw = dict((SUITES[name].quick if quick else SUITES[name].full))
    if backends:
        kw["backends"] = backends
    kw["threads"] = [threads]
    return Sweep(**kw)


def make_plan(out: Path, quick: bool, only: list[str] | None = None, backends: str | None = None,
              threads: int | None = None, caps: Capabilities | None = None) -> Plan:
    """Assess every paper figure, and lay out the suites of those that can be made here (their
    points, those that do not fit in memory, the rows already stored)."""
    from .harness import runner
    from .harness.store import ResultStore
    from .harness.suite import plan_sweep
    from .machine.sysinfo import check_threads, llc_bytes, meminfo, topology

    caps = caps or Capabilities.here()
    known = [f.id for f in PAPER]
    if only:
        bad = [o for o in only if o not in known]
        if bad:
            raise UserError(f"unknown figure(s) {bad}; known: {', '.join(known)}")
    threads = threads or len(topology()["usable_cpus"])
    check_threads([threads])
    figures = [(f, f.assess(caps)) for f in PAPER if not only or f.id in only]
    suites: dict[str, SuitePlan] = {}
    avail = meminfo().get("MemAvailable", 0)
    llc = llc_bytes()
    for _, a in figures:
        if a.status == NOT_HERE:
            continue
        for s in a.suites:
            if s in suites:
                continue
            if SUITES[s].kind == "e2e":
                suites[s] = _job_plan(s, quick, out, caps.machine, threads)
                continue
            sweep = _sweep(s, quick, backends, threads)
            points, names = plan_sweep(sweep)
            sp = SuitePlan(s, sweep, out / "results" / caps.machine / f"{s}.csv", names=names)
            done = set()
            if sp.path.exists():
                done = ResultStore(sp.path, op=sweep.op).done_keys()
            for pt in points:
                need = runner.memory_needed(pt.problem, pt.problem.rotation_groups(llc), names[:1])  # the rest: rows that say so
                if avail and need > avail:
                    sp.left_out.append(f"{pt.problem}: needs {need / 2**30:.1f} GiB, "
                                       f"{avail / 2**30:.1f} GiB available")
                    continue
                sp.points.append(pt)
                todo = [n for n in names if pt.key(n) not in done]
                sp.rows_todo += len(todo)
                sp.rows_done += len(names) - len(todo)
            sp.done = done
            suites[s] = sp
    return Plan(caps=caps, quick=quick, threads=threads, out=out, figures=figures, suites=suites)


def _job_plan(name: str, quick: bool, out: Path, machine: str, threads: int) -> SuitePlan:
    """An e2e job: done when this --out holds its rows from a finished run of the same keywords."""
    kw = dict(SUITES[name].quick if quick else SUITES[name].full)
    sp = SuitePlan(name, None, out / "results" / machine / f"{name}.csv", job=kw, names=list(kw["engines"]))
    state = load_state(out)
    finished = [j for j in state.get("jobs", []) if j.get("name") == name and j.get("keywords") == kw]
    if finished and sp.path.exists():
        sp.rows_done = int(finished[-1].get("rows", 1))
    else:
        sp.rows_todo = 1
    sp.threads = threads
    return sp


def job_estimate(sp: SuitePlan, quick: bool, state: dict) -> tuple[float, str]:
    """An e2e job's time, and where it comes from: what this --out measured for it last, else the prior."""
    past = [j["seconds"] for j in state.get("jobs", []) if j.get("name") == sp.name and j.get("keywords") == sp.job]
    if past:
        return past[-1], "as measured before"
    return SUITES[sp.name].prior_s[1 if quick else 0], "a prior: not calibrated"


def run_job(sp: SuitePlan, command: str, echo) -> tuple[int, float]:
    """Run an e2e job into its results file; (rows, seconds)."""
    from .e2e.engines import expand
    from .e2e.run import E2EConfig, run_e2e
    from .harness.store import ResultStore
    kw = dict(sp.job)
    kw["engines"] = expand(kw["engines"])
    kw["prefill_engines"] = expand(kw["prefill_engines"])
    cfg = E2EConfig(**kw, threads=sp.threads, command=command)
    store = ResultStore(sp.path, op="e2e")
    store.open_for_append()
    t0 = time.monotonic()
    rows = run_e2e(cfg, store, echo=echo)
    return len(rows), time.monotonic() - t0


def estimate(plan: Plan, cal: Calibration | None) -> None:
    """Fill in each suite's estimated time for the rows it still has to measure."""
    plan.calibration = cal
    state = load_state(plan.out)
    for sp in plan.suites.values():
        sp.todo_s = 0.0
        if sp.job is not None:
            if sp.rows_todo:
                sp.todo_s, sp.estimated_from = job_estimate(sp, plan.quick, state)
            continue
        if cal is None:
            continue
        for pt in sp.points:
            todo = [n for n in sp.names if pt.key(n) not in sp.done]
            if todo:
                sp.todo_s += estimate_point(cal, pt, todo, sp.sweep.rounds)


def schedule(plan: Plan, budget_s: float) -> None:
    """Order the suites so that the budget completes the most figures: cheapest figure first by the
    time its suites still need (a suite serving two figures counts once); the rest after, for
    whatever time is left."""
    plan.budget_s = budget_s
    todo = [(f, a) for f, a in plan.figures if a.status != NOT_HERE]
    order: list[str] = []
    left = budget_s
    fits: dict[str, bool] = {}
    while todo:
        def marginal(fa):
            return sum(plan.suites[s].todo_s for s in fa[1].suites if s not in order)
        todo.sort(key=marginal)
        f, a = todo.pop(0)
        cost = marginal((f, a))
        fits[f.id] = cost <= left
        if fits[f.id]:
            left -= cost
        order += [s for s in a.suites if s not in order]
    plan.order, plan.fits = order, fits


# ---- state kept beside the results ----------------------------------------------------------------
STATE = "reproduce.json"


def load_state(out: Path) -> dict:
    p = out / STATE
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def save_state(out: Path, state: dict) -> None:
    writable_folder(out)
    tmp = out / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, default=str))
    tmp.replace(out / STATE)


def cached_calibration(state: dict, plan: Plan, names: list[str]) -> Calibration | None:
    c = state.get("calibration")
    if not c:
        return None
    try:
        cal = Calibration(**c)
    except TypeError:
        return None
    same = (cal.fingerprint.split(", hinabench ")[0] == plan.caps.summary.split(", hinabench ")[0]
            and cal.threads == plan.threads and set(names) <= set(cal.backends))
    return cal if same else None


def calibration_problem(plan: Plan):
    """The plan's smallest FFN point (least memory to materialise)."""
    from .machine.sysinfo import llc_bytes
    pts = [pt for sp in plan.suites.values() if sp.job is None and sp.sweep.op == "ffn" for pt in sp.points]
    if not pts:   # a plan of other kinds only: a small FFN point stands in
        from .models import get_model
        from .problems import FFNProblem
        return FFNProblem.create(get_model("qwen3-30b-a3b"), 1, None, "bf16", 0, "same-experts")
    return min(pts, key=lambda pt: pt.problem.allocated_bytes(pt.problem.rotation_groups(llc_bytes()))).problem


def all_backends(plan: Plan) -> list[str]:
    """The backends of the plan's sweeps that the calibration times: those with an FFN path (the
    calibration point is an FFN; another kind's backends are estimated like the costliest of these)."""
    from . import backends as registry
    return list(dict.fromkeys(n for sp in plan.suites.values() if sp.job is None for n in sp.names
                              if "ffn" in registry.get(n).ops))


__all__ = ["PAPER", "SUITES", "Capabilities", "Plan", "make_plan", "calibrate", "estimate", "schedule", "run_job",
           "parse_duration", "fmt_duration", "load_state", "save_state", "cached_calibration",
           "calibration_problem", "all_backends"]
