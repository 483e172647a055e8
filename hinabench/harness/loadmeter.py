"""How busy the machine was, from /proc/stat, with this process's own CPU time taken out."""
from __future__ import annotations

import os
import time


def _stat() -> tuple[float, float]:
    """(busy seconds, total seconds) summed over all CPUs."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    total = sum(fields[:8])
    return (total - idle) / hz, total / hz


def _own() -> float:
    t = os.times()
    return t.user + t.system


class LoadMeter:
    """`with LoadMeter() as m: ...` then m.other_cpus: CPUs' worth of work by other processes."""

    def __enter__(self):
        self.busy0, _ = _stat()
        self.own0, self.t0 = _own(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy1, _ = _stat()
        wall = max(time.perf_counter() - self.t0, 1e-6)
        other = (busy1 - self.busy0) - (_own() - self.own0)
        self.other_cpus = max(0.0, other / wall)
        return False


def other_load(seconds: float = 0.25) -> float:
    with LoadMeter() as m:
        time.sleep(seconds)
    return m.other_cpus
