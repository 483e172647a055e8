"""Sample statistics, pyperf-style: median with MAD and percentiles, warm-ups kept apart."""
from __future__ import annotations

import statistics


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(xs: list[float]) -> float:
    """The median (the one place hinabench takes one)."""
    return statistics.median(xs) if xs else float("nan")


def summarize(samples_s: list[float]) -> dict:
    """Seconds in, milliseconds out: median, min, mean, MAD, p10, p90, n."""
    ms = [x * 1e3 for x in samples_s]
    if not ms:
        return {}
    med = median(ms)
    return {
        "median_ms": med, "min_ms": min(ms), "mean_ms": statistics.fmean(ms),
        "mad_ms": median([abs(x - med) for x in ms]),
        "p10_ms": percentile(ms, 0.10), "p90_ms": percentile(ms, 0.90), "samples": len(ms),
    }


def unstable(summary: dict, threshold: float = 0.10) -> bool:
    """pyperf's warning: the spread is large against the median."""
    return bool(summary) and summary["mad_ms"] > threshold * summary["median_ms"]


def bound_ms(row: dict, gbps: float, gflops: float | None) -> tuple[float, float]:
    """The roofline's two times: (ms to read the row's bytes at `gbps`, ms to do its flops at `gflops`;
    0 without a peak)."""
    mem_ms = row["weight_bytes"] / (gbps * 1e9) * 1e3
    return mem_ms, row["flops"] / (gflops * 1e9) * 1e3 if gflops else 0.0
