"""Renderers: one row schema, many renderings (llama-bench's `-o csv|json|jsonl|md|sql`).

RENDERERS maps a format name to a function of (rows, context) that returns text (or, for `parquet`,
writes a file); every command that prints rows takes `--format` with these names. `table` prints with
rich; `markdown` is what notes and the README quote.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass

def _f(v, fmt):
    try:
        if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return format(float(v), fmt)
    except (TypeError, ValueError):
        return str(v)


def x_value(r: dict):
    """The token axis of a row: tokens per expert for the FFN, batch tokens for other kinds."""
    if (r.get("op") or "ffn") == "ffn":
        return r.get("tokens_per_expert")
    if r.get("op") == "attention":     # attention: the context l (the batch is in the table's title)
        return r.get("context")
    return r.get("batch_tokens")


@dataclass
class View:
    """How rows print as a table: (header, column name or function of the row, number format)."""
    columns: list[tuple[str, object, str | None]]
    title: object = None                # function of a row -> the title of its table (tables group by it)
    style: object = None                # function of a row -> a rich style, or None
    right: tuple[str, ...] = ()         # headers justified right besides the formatted ones

    def cells(self, r: dict) -> list[str]:
        out = []
        for _, col, fmt in self.columns:
            v = col(r) if callable(col) else r.get(col)
            if fmt:
                out.append(_f(v, fmt))
            else:
                out.append("-" if v is None or v == "" or (isinstance(v, float) and math.isnan(v)) else str(v))
        return out

    def headers(self) -> list[str]:
        return [h for h, _, _ in self.columns]


def _spread(r: dict) -> str:
    return f"{_f(r.get('p10_ms'), '.2f')}–{_f(r.get('p90_ms'), '.2f')}" if r.get("p10_ms") not in (None, "") else "-"


def _result_title(r: dict) -> str:
    op = r.get("op") or "ffn"
    if op == "ffn":
        routing = r.get("routing") or "same-experts"
        tail = f" (A={_int(r.get('experts'))})" + ("" if routing == "same-experts" else f", {routing}, B={_int(r.get('batch_tokens'))}")
        g = _int(r.get("quant_group")) if r.get("quant_group") not in (None, "") else None
        dt = f"{r.get('dtype')} g{g}" if g is not None and r.get("dtype") == "int8" else r.get("dtype")
        return f"{r.get('model')} {dt}{tail}"
    if op == "linear":
        return f"{r.get('model')} {r.get('proj')} [{_int(r.get('out_features'))}x{_int(r.get('in_features'))}] {r.get('dtype')}"
    if op == "attention":
        lay = f"paged/{_int(r.get('block_size'))}" if r.get("layout") == "paged" else str(r.get("layout"))
        ext = f" n={_int(r.get('extend'))}" if r.get("phase") == "extend" else ""
        rag = " ragged" if str(r.get("ragged")) in ("True", "true", "1") else ""
        return (f"{r.get('model')} attention {r.get('phase')}{ext} {lay} B={_int(r.get('batch'))}{rag} "
                f"[{_int(r.get('h_q'))}q/{_int(r.get('h_kv'))}kv x {_int(r.get('head_dim'))}] {r.get('dtype')} (T = l)")
    return f"{op} {r.get('model')} {r.get('dtype')}"


def _int(v):
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return v


def _status_style(r: dict):
    return {"wrong": "red", "failed": "red", "timeout": "red", "unsupported": "dim",
            "unavailable": "dim"}.get(r.get("status"))


RESULTS = View([
    ("backend", "backend", None), ("T", x_value, None), ("thr", "threads", None),
    ("status", "status", None), ("rank", "rank", None),
    ("median ms", "median_ms", ".3f"), ("± MAD", "mad_ms", ".3f"), ("p10–p90 ms", _spread, None),
    ("GB/s", "gbps", ".1f"), ("probe GB/s", "read_gbps", ".1f"), ("%bw", "pct_bw", ".0%"),
    ("eff", "efficiency", ".2f"), ("eff/turn", "efficiency_turn", ".2f"), ("%gemm", "pct_gemm", ".0%"),
    ("rel_err", "rel_err", ".1e"),
], title=_result_title, style=_status_style, right=("T", "thr", "rank"))


def results_view(rows: list[dict], runs: bool = False) -> View:
    """RESULTS, with a `machine` column first when the rows come from several machines, and the run
    id last with `runs` (every run of a point shown, `--all`)."""
    cols = list(RESULTS.columns)
    if len(machines_of(rows)) > 1:
        cols.insert(0, ("machine", "machine", None))
    if any(r.get("quant_err") not in (None, "") for r in rows):   # quantized rows: the scheme's own error
        cols.append(("quant_err", "quant_err", ".1e"))
    if runs:
        cols.append(("run", "run_id", None))
    return View(cols, RESULTS.title, RESULTS.style, RESULTS.right)


def machines_of(rows: list[dict]) -> list[str]:
    """The machine ids the rows record, in first-seen order ('' for rows that record none)."""
    return list(dict.fromkeys(str(r.get("machine") or "") for r in rows))


def plain_view(rows: list[dict]) -> View:
    """Every key of the first row, numbers to one decimal (bandwidth, peak, lists of dicts)."""
    keys = list(rows[0]) if rows else []
    return View([(k, k, None) for k in keys], right=tuple(keys))


# ---- the renderers ---------------------------------------------------------------------------------
def _groups(rows, view) -> dict:
    """The rows by their table's title (one untitled table where the view has no titles), in order."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(view.title(r) if view.title else "", []).append(r)
    return groups


def _table(rows, view, notes, console):
    from rich.table import Table
    for title, group in _groups(rows, view).items():
        t = Table(title=title or None, show_lines=False)
        for name, _, fmt in view.columns:
            t.add_column(name, justify="right" if fmt or name in view.right else "left", overflow="fold")
        for r in group:
            t.add_row(*view.cells(r), style=view.style(r) if view.style else None)
        console.print(t)
    for line in notes:   # plain text: a reason's "[tokens, h_kv, d]" is not rich markup
        console.print(line, style="dim", highlight=False, markup=False)


def _markdown_text(rows, view, notes) -> str:
    """A table per title, as the rich tables are cut (model, dtype, shape): each under its title in bold."""
    head = view.headers()
    lines: list[str] = []
    for title, group in _groups(rows, view).items():
        if lines:
            lines.append("")
        if title:
            lines += [f"**{title}**", ""]
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(view.cells(r)) + " |" for r in group]
    if notes:
        lines += [""] + list(notes)
    return "\n".join(lines)


def _jsonable(rows):
    return json.loads(json.dumps(rows, default=str))


def _csv_text(rows) -> str:
    buf = io.StringIO()
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


RENDERERS = {
    "table": lambda rows, view, notes, echo, console: _table(rows, view, notes, console),
    "markdown": lambda rows, view, notes, echo, console: echo(_markdown_text(rows, view, notes)),
    "csv": lambda rows, view, notes, echo, console: echo(_csv_text(rows).rstrip("\n")),
    "json": lambda rows, view, notes, echo, console: echo(json.dumps(_jsonable(rows), indent=2)),
    "jsonl": lambda rows, view, notes, echo, console: echo("\n".join(json.dumps(r) for r in _jsonable(rows))),
}
FORMATS = tuple(RENDERERS)


def emit(rows: list[dict], fmt: str = "table", view: View | None = None, notes: list[str] = (),
         echo=None, console=None) -> None:
    """Print `rows` in format `fmt`. table/markdown use `view` (RESULTS by default) and print
    `notes` after the rows; csv/json/jsonl print every column of every row and no notes."""
    if fmt not in RENDERERS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if echo is None:
        import click
        echo = click.echo
    if console is None and fmt == "table":
        from rich.console import Console
        console = Console(width=200)
    RENDERERS[fmt](rows, view or RESULTS, list(notes), echo, console)


# ---- files ------------------------------------------------------------------------------------------
def write_rows(rows: list[dict], path) -> None:
    """Rows to a file whose suffix names the format: .csv, .json, .jsonl or .parquet."""
    from pathlib import Path
    p = Path(path)
    if p.suffix == ".parquet":
        import pandas as pd
        pd.DataFrame(rows).to_parquet(p, index=False)
        return
    text = {".csv": lambda: _csv_text(rows), ".json": lambda: json.dumps(_jsonable(rows), indent=2),
            ".jsonl": lambda: "\n".join(json.dumps(r) for r in _jsonable(rows)) + "\n"}.get(p.suffix)
    if text is None:
        raise ValueError(f"no file format for {p.suffix!r}; known: .csv, .json, .jsonl, .parquet")
    p.write_text(text())


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


def provenance(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(machines, commands) the rows record; with rows of several machines each fingerprint is
    prefixed by its machine id."""
    if len(machines_of(rows)) > 1:
        machines = sorted({f"{r.get('machine') or '?'}: {r.get('fingerprint') or 'fingerprint not recorded'}"
                           for r in rows})
        commands = sorted({str(r.get("command") or "") for r in rows} - {""})
        return machines, commands
    machines = sorted({str(r.get("fingerprint") or r.get("machine") or "") for r in rows} - {""})
    commands = sorted({str(r.get("command") or "") for r in rows} - {""})
    return machines, commands
