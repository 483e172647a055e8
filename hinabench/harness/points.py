"""Points: one measurement's coordinates, and the row key, in one place.

A `Point` is a problem (its kind's key columns: model, dtype, tokens, routing, projection, ...) at a
thread count under a NUMA memory policy. With the backend's name it is a result row's key: resume,
ranking, targets and tables all use `row_key` and nothing else. Sweeps build points with
`itertools.product` over the axes they declare (harness/suite.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..problems import KINDS, Problem

TAIL = ("threads", "numa")


@dataclass(frozen=True)
class Point:
    problem: Problem
    threads: int
    numa: str = "default"

    @property
    def op(self) -> str:
        return self.problem.kind

    def columns(self) -> dict:
        return {"op": self.op, **self.problem.key(), "threads": self.threads, "numa": self.numa}

    def key(self, backend: str | None = None) -> tuple:
        row = self.columns()
        if backend is not None:
            row["backend"] = backend
        return row_key(row, backend=backend is not None)

    def __str__(self) -> str:
        return f"{self.problem} threads={self.threads} numa={self.numa}"


# The columns a point's dtype decides: points that differ only in these are measured side by side, as
# one cohort (harness/runner.py run_cohort), unless the sweep says dtypes_apart.
DTYPE_COLUMNS = ("dtype", "quant_group", "scale_dtype")


def cohorts(points: list[Point]) -> list[list[Point]]:
    """`points` grouped by everything but their dtype, in the order each group first appears."""
    groups: dict[tuple, list[Point]] = {}
    for pt in points:
        cols = pt.columns()
        key = tuple((c, _norm(v)) for c, v in cols.items() if c not in DTYPE_COLUMNS)
        groups.setdefault(key, []).append(pt)
    return list(groups.values())


def _norm(v) -> str:
    """One spelling per value, whether it came from memory (2, 2.0) or a CSV cell ('2', '2.0')."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f:           # NaN: an empty cell
        return ""
    return str(int(f)) if f.is_integer() else repr(round(f, 6))


def row_key(row: dict, backend: bool = True) -> tuple:
    """The point a row measured (with its backend unless backend=False). Rows stored before a key
    column existed read as its default (op: ffn; routing: same-experts; batch_tokens: = T)."""
    op = _norm(row.get("op")) or "ffn"
    kind = KINDS.get(op)
    vals = [op]
    if backend:
        vals.append(_norm(row.get("backend")))
    for c in (kind.key_columns if kind else ()):
        v = _norm(row.get(c))
        if not v:
            v = _norm(kind.key_defaults.get(c))
        if not v and c == "batch_tokens":
            v = _norm(row.get("tokens_per_expert"))
        vals.append(v)
    vals += [_norm(row.get(c)) for c in TAIL]
    return tuple(vals)
