"""Roofline denominators, measured in the process that runs the kernel.

Read bandwidth on a VM can differ from process to process and minute to minute, so a kernel's
bandwidth figure is judged against a read of *its own weight buffers*, in *its own process*, just
before and after its samples, with the best of several read kernels (a weak probe flatters a weak
kernel). The compute peak is a register-only FMA loop on the best unit a BF16 kernel could use.
"""
from __future__ import annotations

import functools

from ..native import load

_C = load("_C")

# Best first: what a BF16 kernel could use on this CPU.
PEAK_PREFERENCE = ["amx-bf16", "avx512-bf16-dot", "avx512-fma-fp32", "avx2-fma-fp32"]
# INT8 (W8A8) rows: the CPU's best int8 multiply-add unit first, else the list above. AMX's tdpbssd
# (32768 integer ops per instruction, twice tdpbf16ps's), VNNI's vpdpbusd (128, twice vdpbf16ps's FLOPs,
# four times an fp32 FMA's), AVX2's vpsignb + vpmaddubsw + vpmaddwd + vpaddd (64 per four: the AVX2
# kernel's step, no VNNI; its int16 form before 2026-12-07, vpmaddwd + vpaddd, is avx2-int16-madd).
# Until 2026-12-03 AMX and AVX2 INT8 rows were judged against the BF16 / fp32 FMA unit.
DTYPE_PEAK_PREFERENCE = {"int8": ["amx-int8", "avx512-vnni-int8", "avx2-int8-maddubs"]}


def read_variants() -> list[str]:
    v = _C.read_variants()
    # the scalar loop is never the best where a vector one exists; keep it only as a last resort
    return [x for x in v if x != "scalar"] or v


def read_gbps(buffers: list[tuple[int, int]], threads: int, variants: list[str] | None = None,
              passes: int = 1) -> tuple[float, str, dict[str, float]]:
    """Best GB/s over read kernels (and passes) of the given (address, bytes) buffers."""
    total = sum(n for _, n in buffers)
    per = {}
    for v in variants or read_variants():
        best = min(_C.read_pass(buffers, threads, v) for _ in range(passes))
        per[v] = total / best / 1e9
    name = max(per, key=per.get)
    return per[name], name, per


def peak_unit(dtype: str = "bf16") -> str:
    """The compute unit whose register-only peak is the roofline of a `dtype` kernel here."""
    units = _C.peak_units()
    for u in DTYPE_PEAK_PREFERENCE.get(dtype, []) + PEAK_PREFERENCE:
        if u in units:
            return u
    raise RuntimeError("no FMA unit usable on this CPU")


@functools.lru_cache(maxsize=None)
def peak_gflops(threads: int, unit: str | None = None, seconds: float = 0.25) -> tuple[float, str]:
    """(GFLOP/s, unit): best of three runs of the register-only loop; cached per process (for the
    `peak` command; rows use the same-process probe below, taken beside their samples)."""
    unit = unit or peak_unit()
    return max(_C.peak_flops(unit, threads, seconds) for _ in range(3)) / 1e9, unit


GEMM_SHAPE = (2048, 4096, 4096)     # M, N, K of the achievable-ceiling GEMM (issue 11 names it)


@functools.lru_cache(maxsize=None)
def gemm_gflops(threads: int, shape: tuple[int, int, int] = GEMM_SHAPE, reps: int = 3) -> float:
    """GFLOP/s of torch's own fp32 GEMM (oneDNN/MKL sgemm) on `threads` threads: the achievable compute
    ceiling, beside the register-only FMA peak (the physical one). Best of `reps` after one warm-up;
    measured once per process and thread count (a row's `gemm_gflops`)."""
    import time

    import torch
    m, n, k = shape
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(m, k)
        b = torch.randn(k, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 2.0 * m * n * k / best / 1e9


def peak_probe(threads: int, seconds: float = 0.03, dtype: str = "bf16") -> tuple[float, str]:
    """(GFLOP/s, unit) of one short run of the register-only loop, now, in this process: the compute
    term of the roofline measured like the read probe, beside the samples (a VM's two vCPUs can be
    SMT siblings one minute and not the next)."""
    unit = peak_unit(dtype)
    return _C.peak_flops(unit, threads, seconds) / 1e9, unit


def remember_peak(fingerprint: str, threads: int, unit: str, gflops: float) -> float:
    """The best peak ever seen on this machine fingerprint (threads, unit), updated with `gflops`;
    kept in $HINABENCH_CACHE (default ~/.cache/hinabench)/peaks.json. Returns the best."""
    import json
    import os
    from pathlib import Path
    path = Path(os.environ.get("HINABENCH_CACHE", Path.home() / ".cache" / "hinabench")) / "peaks.json"
    key = f"{fingerprint}|{threads}|{unit}"
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        seen = {}
    best = max(float(seen.get(key, 0.0)), gflops)
    if best > float(seen.get(key, 0.0)):
        seen[key] = best
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".partial")
            tmp.write_text(json.dumps(seen, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass   # a read-only home: the row still has its same-process peak
    return best


# ---- overlap: does a core's compute hide under its memory stream? --------------------------------
OVERLAP_L1_BYTES = 16 << 10       # per thread: the compute-only pass's buffer (in L1 on every x86 core)


def overlap_fraction(stream_gbps: float, compute_gbps: float, combined_gbps: float) -> float:
    """How much of the shorter of a byte's memory time (1/B) and compute time (1/C) hides under the
    longer, from the combined rate R: 1 when R is the slower of the two alone (1/R = max), 0 when the
    times add up (1/R = 1/B + 1/C), below 0 when the pair is slower still (the compute holding back the
    loads that would have streamed), above 1 only within the noise."""
    tb, tc, t = 1 / stream_gbps, 1 / compute_gbps, 1 / combined_gbps
    return (tb + tc - t) / (tb + tc - max(tb, tc))


def stream_work_gbps(address: int, nbytes: int, threads: int, work: int, ahead: int = 0,
                     repeat: int = 1) -> float:
    """GB/s of one overlap-probe pass (`repeat` sweeps of each thread's share)."""
    return nbytes * repeat / _C.stream_work_pass(address, nbytes, threads, work, ahead, repeat) / 1e9


def compute_only_gbps(address: int, threads: int, work: int, seconds: float = 0.05) -> float:
    """The overlap probe's loop over OVERLAP_L1_BYTES per thread, swept until ~`seconds`: the rate of
    its compute (and L1 loads) alone, in bytes of the line stream per second."""
    n = OVERLAP_L1_BYTES * threads
    rep = 64
    while True:
        s = _C.stream_work_pass(address, n, threads, work, 0, rep)
        if s >= seconds / 4 or rep >= 1 << 24:
            break
        rep *= 4
    rep = max(1, int(rep * seconds / max(s, 1e-9)))
    return stream_work_gbps(address, n, threads, work, 0, rep)
