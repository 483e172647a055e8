"""Synthetic result rows for the tests of readers, figures and reports: whole rows of the store's
schema, written through the store itself (never measured: every number here is made up, and the
rows say so in their `command`)."""
from __future__ import annotations

from pathlib import Path

from hinabench.harness.store import ResultStore, empty_row

MACHINES = {
    "amd-f25m1-2t-1n": "AMD EPYC (family 25 model 1), 1S/2C/2T, ISA avx2, 1 NUMA node(s) [synthetic]",
    "intel-spr-112t-2n": "Intel Xeon (Sapphire Rapids), 2S/56C/112T, ISA amx, 2 NUMA node(s) [synthetic]",
}


def row(backend="hina:avx2", tokens=1, status="ok", machine="amd-f25m1-2t-1n", median_ms=10.0,
        threads=2, model="mixtral-8x7b", routing="same-experts", run_id="20260101T000000-1",
        timestamp="2026-01-01T00:00:00+0000", reason=None, numa="default", **extra) -> dict:
    r = empty_row("ffn")
    ran = status in ("ok", "wrong")
    r.update(op="ffn", backend=backend, model=model, dtype="bf16", routing=routing, batch_tokens=tokens,
             tokens_per_expert=tokens, experts=2, hidden_size=4096, intermediate_size=14336,
             threads=threads, numa=numa, status=status, reason=reason,
             median_ms=median_ms if ran else None, p10_ms=median_ms * 0.9 if ran else None,
             p90_ms=median_ms * 1.1 if ran else None, mad_ms=median_ms * 0.05 if ran else None,
             weight_bytes=704643072, flops=2 * tokens * 2 * 3 * 4096 * 14336,
             read_gbps=20.0 if ran else None, peak_gflops=200.0 if ran else None,
             peak_unit="avx2-fma-fp32" if ran else None,
             gbps=704643072 / (median_ms * 1e-3) / 1e9 if ran else None,
             efficiency=0.5 if status == "ok" else None, rel_err=1e-3 if ran else None, tolerance=0.02,
             machine=machine, fingerprint=MACHINES.get(machine, machine), run_id=run_id, timestamp=timestamp,
             command=f"hinabench ffn --backends {backend} (synthetic rows for the tests)")
    r.update(extra)
    return r


def write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    store = ResultStore(path)
    store.open_for_append()
    for r in rows:
        store.append(r)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pandas as pd
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path


def two_machines(root: Path) -> tuple[Path, Path]:
    """results/<machine>/ffn.csv for two machines: the same points, different numbers and statuses
    (a `wrong`, an `unsupported` and a `timeout` row among them)."""
    a = write_csv(root / "amd-f25m1-2t-1n" / "ffn.csv", [
        row("torch", 1, median_ms=60.0), row("torch", 8, median_ms=300.0),
        row("hina:avx2", 1, median_ms=40.0), row("hina:avx2", 8, median_ms=80.0),
        row("hina:amx", 1, "unsupported", reason="no AMX tiles on this CPU (cpuinfo: amx_tile missing)"),
        row("kt:llamafile", 8, "wrong", median_ms=50.0, reason="rel_err 1 > tolerance 0.02: all-zero output"),
    ])
    b = write_csv(root / "intel-spr-112t-2n" / "ffn.csv", [
        row("torch", 1, machine="intel-spr-112t-2n", median_ms=12.0),
        row("torch", 8, machine="intel-spr-112t-2n", median_ms=30.0),
        row("hina:amx", 1, machine="intel-spr-112t-2n", median_ms=3.0),
        row("hina:amx", 8, machine="intel-spr-112t-2n", median_ms=5.0),
        row("vllm:vec", 8, "timeout", machine="intel-spr-112t-2n",
            reason="worker did not answer within 600 s; its process group was killed"),
    ])
    return a.parent, b.parent
