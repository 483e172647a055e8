"""One backend's turn in one round: warm-ups, calibration, probes, samples.

The same code runs in the harness's process (in-process backends) and inside a peer's worker process
(so every row is judged against a read probe of its own process, over its own weight buffers).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .loadmeter import LoadMeter
from ..machine.probes import peak_probe, read_gbps


@dataclass
class RoundPlan:
    """How to time: plain data, so it can cross a pipe as JSON."""
    rounds: int = 3
    warmup: int = 2              # calls before the first round's samples (the last one calibrates)
    repeats: int = 0             # samples per round; 0 = calibrated from min_time
    min_time: float = 0.3        # seconds of samples per round when calibrating
    min_samples: int = 3
    max_samples: int = 200
    max_time: float = 30.0       # seconds of samples per point: slow backends get fewer samples
                                 # (one per round at least), never a skipped point

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class MeasureState:
    calls: int = 0               # calls so far: they rotate through the weight groups
    call_s: float = 0.0          # the calibrating warm-up call's time
    per_round: int = 0


@dataclass
class RoundResult:
    samples: list[float] = field(default_factory=list)       # seconds, one call each
    probes: list[tuple[float, str]] = field(default_factory=list)   # (GB/s, read kernel) before, after
    other_cpus: float = 0.0
    peaks: list[tuple[float, str]] = field(default_factory=list)    # (GFLOP/s, FMA unit) before, after

    def as_dict(self) -> dict:
        return {"samples": self.samples, "probes": [list(p) for p in self.probes], "other_cpus": self.other_cpus,
                "peaks": [list(p) for p in self.peaks]}

    @classmethod
    def from_dict(cls, d: dict) -> "RoundResult":
        return cls(list(d["samples"]), [(float(a), str(b)) for a, b in d["probes"]], float(d["other_cpus"]),
                   [(float(a), str(b)) for a, b in d.get("peaks", [])])


def measure_round(run: Callable[[int], object], rnd: int, plan: RoundPlan, state: MeasureState,
                  buffers: list[tuple[int, int]], threads: int, groups: int,
                  counter=None, read_probe: Callable[[], tuple[float, str]] | None = None,
                  compute_probe: Callable[[], tuple[float, str]] | None = None,
                  dtype: str = "bf16") -> RoundResult:
    """`counter` (a perf.PerfSession, or None) counts exactly the sample loop. The roofline's
    denominators are the CPU's (a read of `buffers`, the FMA loop) unless a backend whose weights
    live elsewhere (a GPU) gives its own `read_probe` and `compute_probe`: () -> (rate, what)."""
    read_probe = read_probe or (lambda: read_gbps(buffers, threads)[:2])
    compute_probe = compute_probe or (lambda: peak_probe(threads, dtype=dtype))   # the dtype's own unit
    call = state.calls
    if rnd == 0:
        dt = 0.0
        for _ in range(max(plan.warmup, 1)):
            t0 = time.perf_counter()
            run(call % groups)
            dt = time.perf_counter() - t0
            call += 1
            if dt > 1.0:         # a call this long is its own warm-up (and the validation call ran)
                break
        state.call_s = dt
        if plan.repeats:
            state.per_round = plan.repeats
        else:
            n = max(plan.min_samples, min(plan.max_samples, math.ceil(plan.min_time / max(dt, 1e-6))))
            budget = max(1, int(plan.max_time / max(dt * plan.rounds, 1e-6)))
            state.per_round = max(1, min(n, budget))
    elif state.call_s < 1.0:
        run(call % groups)       # re-warm after the other backends' turns (slow calls need none)
        call += 1
    res = RoundResult()
    res.peaks.append(compute_probe())
    res.probes.append(read_probe())
    with LoadMeter() as m:
        if counter is not None:
            counter.enable()
        for _ in range(state.per_round):
            g = call % groups
            t0 = time.perf_counter()
            run(g)
            res.samples.append(time.perf_counter() - t0)
            call += 1
        if counter is not None:
            counter.disable()
    res.other_cpus = m.other_cpus
    res.probes.append(read_probe())
    res.peaks.append(compute_probe())
    state.calls = call
    return res
