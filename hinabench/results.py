"""One result-row schema, many renderings (llama-bench's habit): CSV/Parquet on disk, JSON on stdout,
a rich table on the terminal, markdown for notes.

Rows are appended as they are measured, so an interrupted sweep keeps every point it measured;
`--resume` skips the points already stored.
"""
from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from .errors import UserError

STATUSES = ("ok", "wrong", "failed", "unavailable", "unsupported", "timeout")
# Points with these statuses are measured again on --resume (they may have been transient).
RETRY_STATUSES = ("failed", "timeout")

COLUMNS = [
    # what was run
    "backend", "model", "dtype", "tokens_per_expert", "experts", "hidden_size", "intermediate_size",
    "threads", "numa",
    # outcome
    "status", "reason", "rank",
    # timings (ms) over the samples of all rounds; warm-ups excluded
    "median_ms", "min_ms", "mean_ms", "mad_ms", "p10_ms", "p90_ms", "samples", "rounds", "warmup",
    "prepare_ms", "unstable",
    # validation
    "rel_err", "tolerance",
    # roofline
    "weight_bytes", "flops", "read_gbps", "read_gbps_min", "read_probe", "peak_gflops", "peak_unit",
    "roofline_ms", "bound", "gbps", "gflops", "pct_bw", "efficiency",
    # memory and cache policy
    "extra_bytes", "rotation_groups", "allocated_bytes",
    # NUMA: where the weights are (the placement model), and the remote traffic, modeled and counted
    "placement_policy", "placement_nodes", "placement_page_bytes", "placement_phase",
    "placement_backing", "placement_model_valid", "placement_reason",
    "work_partition", "remote_fraction_model", "remote_fraction_basis",
    "remote_fraction_perf", "dram_local_loads", "dram_remote_loads", "perf_status", "perf_reason",
    # conditions
    "load_other_cpus", "load_warning", "loadavg_before",
    # provenance
    "machine", "fingerprint", "versions", "hinabench_version", "git_rev", "timestamp", "command",
]
KEY = ("backend", "model", "dtype", "tokens_per_expert", "experts", "threads", "numa")


def empty_row() -> dict:
    return {c: None for c in COLUMNS}


def point_key(row: dict) -> tuple:
    return tuple(str(row.get(k)) for k in KEY)


class ResultStore:
    """Rows on disk: CSV (appended line by line) or Parquet (rewritten after each row)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.kind = "parquet" if self.path.suffix == ".parquet" else "csv"

    def check_writable(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"results file {self.path} is not writable: {e.strerror or e}") from None
        existed = self.path.exists()
        try:
            with open(self.path, "a"):
                pass
        except OSError as e:
            raise UserError(f"results file {self.path} is not writable: {e.strerror or e}") from None
        if not existed:
            self.path.unlink()   # created by the first row, so a run refused later leaves no empty file
        if self.kind == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise UserError("writing .parquet needs pyarrow (pip install pyarrow), or use a .csv path") from None

    def rows(self) -> list[dict]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        if self.kind == "parquet":
            import pandas as pd
            return pd.read_parquet(self.path).to_dict("records")
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def done_keys(self) -> set[tuple]:
        return {point_key(r) for r in self.rows() if r.get("status") not in RETRY_STATUSES}

    def append(self, row: dict) -> None:
        row = {c: _cell(row.get(c)) for c in COLUMNS}
        if self.kind == "parquet":
            import pandas as pd
            df = pd.DataFrame(self.rows() + [row], columns=COLUMNS)
            df.to_parquet(self.path, index=False)
            return
        new = not self.path.exists() or self.path.stat().st_size == 0
        with open(self.path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerow(row)
            f.flush()
            os.fsync(f.fileno())


def _cell(v):
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def load_frame(paths):
    """Stored rows from one or more files (CSV or Parquet) as one DataFrame, numbers as numbers."""
    import pandas as pd
    frames = []
    for p in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        p = Path(p)
        if not p.exists():
            raise UserError(f"no results file at {p}")
        frames.append(pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    for c in ("tokens_per_expert", "experts", "threads", "median_ms", "min_ms", "p10_ms", "p90_ms",
              "mad_ms", "roofline_ms", "gbps", "pct_bw", "efficiency", "rel_err", "read_gbps"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def read_rows(paths) -> list[dict]:
    """Stored rows of one or more files (CSV or Parquet) as dicts, in file order; NaN as None."""
    df = load_frame(paths)
    rows = [{k: _cell(v) for k, v in r.items()} for r in df.to_dict("records")]
    for r in rows:  # whole-number columns that pandas read as float (a NaN in the column)
        for c in ("rank", "tokens_per_expert", "experts", "threads", "samples", "rounds", "warmup"):
            v = r.get(c)
            if isinstance(v, float) and v.is_integer():
                r[c] = int(v)
    return rows


def select_rows(rows: list[dict], models=None, backends=None, tokens=None, threads=None,
                statuses=None) -> list[dict]:
    """Rows matching every given filter. A backend filter without ':' is a family (hina matches
    hina:avx2, hina:amx-numa, ...); models match by name."""
    def fam_ok(b):
        return not backends or any(b == f or (":" not in f and b.split(":")[0] == f) for f in backends)

    def num_in(v, allowed):
        try:
            return not allowed or int(v) in allowed
        except (TypeError, ValueError):
            return False
    return [r for r in rows
            if (not models or r.get("model") in models) and fam_ok(str(r.get("backend")))
            and num_in(r.get("tokens_per_expert"), tokens) and num_in(r.get("threads"), threads)
            and (not statuses or r.get("status") in statuses)]


def rank_rows(rows: list[dict]) -> None:
    """Rank `ok` rows by median within each (model, dtype, T, A, threads, numa); others get no rank."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        r["rank"] = None
        if r.get("status") == "ok" and r.get("median_ms") is not None:
            k = tuple(r.get(c) for c in ("model", "dtype", "tokens_per_expert", "experts", "threads", "numa"))
            groups.setdefault(k, []).append(r)
    for g in groups.values():
        for i, r in enumerate(sorted(g, key=lambda r: float(r["median_ms"])), 1):
            r["rank"] = i


def _f(v, fmt):
    try:
        if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(float(v), fmt)
    except (TypeError, ValueError):
        return str(v)


TABLE_COLUMNS = [
    ("backend", "backend", None), ("T", "tokens_per_expert", None), ("thr", "threads", None),
    ("status", "status", None), ("rank", "rank", None),
    ("median ms", "median_ms", ".3f"), ("± MAD", "mad_ms", ".3f"), ("p10–p90 ms", None, None),
    ("GB/s", "gbps", ".1f"), ("probe GB/s", "read_gbps", ".1f"), ("%bw", "pct_bw", ".0%"),
    ("eff", "efficiency", ".2f"), ("rel_err", "rel_err", ".1e"),
]


def _cells(r: dict) -> list[str]:
    out = []
    for _, col, fmt in TABLE_COLUMNS:
        if col is None:
            out.append(f"{_f(r.get('p10_ms'), '.2f')}–{_f(r.get('p90_ms'), '.2f')}"
                       if r.get("p10_ms") not in (None, "") else "-")
        elif fmt:
            out.append(_f(r.get(col), fmt))
        else:
            v = r.get(col)
            out.append("-" if v in (None, "") else str(v))
    return out


def render_table(rows: list[dict], title: str = ""):
    from rich.table import Table
    t = Table(title=title or None, show_lines=False)
    for name, _, fmt in TABLE_COLUMNS:
        t.add_column(name, justify="right" if fmt or name in ("T", "thr", "rank") else "left")
    for r in rows:
        cells = _cells(r)
        style = {"wrong": "red", "failed": "red", "timeout": "red", "unsupported": "dim",
                 "unavailable": "dim"}.get(r.get("status"), None)
        t.add_row(*cells, style=style)
    return t


def render_markdown(rows: list[dict]) -> str:
    head = [n for n, _, _ in TABLE_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def reasons(rows: list[dict]) -> list[str]:
    """One line per distinct (backend, reason) of rows that did not run cleanly."""
    seen, out = set(), []
    for r in rows:
        if r.get("status") != "ok" and r.get("reason"):
            k = (r["backend"], r["reason"])
            if k not in seen:
                seen.add(k)
                out.append(f"{r['backend']}: {r['status']}: {r['reason']}")
    return out
