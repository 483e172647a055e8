"""`hinabench report`: a static, self-contained HTML report of stored rows (no server, no CDN, no
external library: plain HTML, inline CSS and JS, PNG files beside the pages; `python -m http.server`
is enough to share the folder, and file:// works as well).

  index.html    the figures (drawn, or why not, per machine), the machines (fingerprints, row
                counts by status, the files read) and what the readers noted (damaged rows, re-runs)
  <fig>.html    one page per figure in figures.FIGURES: a panel per machine side by side (the PNG,
                its caption, the commands that made it and its rows, the fingerprint), then the rows
                behind it (figures.FIGURE_ROWS: every status) as a table that filters and sorts
  rows.html     every row read
  img/<machine>/<fig>.png and .txt   what figures.py saved (the side .txt: caption and commands)

Figures are drawn from stored rows with the figure functions themselves, one machine's rows at a
time (fig1 also over all machines together when several are given: a GPU's rows may be in another
folder). A figure that cannot be drawn is listed with the reason, never dropped.
"""
from __future__ import annotations

import html
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError, writable_folder

GENERATOR = "hinabench report"
ALL = "all machines"

# The columns of the row tables: (header, column or function of the row, number format).
TABLE_COLUMNS = [
    ("machine", "machine", None), ("backend", "backend", None), ("op", "op", None), ("model", "model", None),
    ("dtype", "dtype", None), ("routing", "routing", None), ("B", "batch_tokens", "d"),
    ("T", "tokens_per_expert", "d"), ("thr", "threads", "d"), ("numa", "numa", None),
    ("status", "status", None), ("reason", "reason", None), ("rank", "rank", "d"),
    ("median ms", "median_ms", ".3f"), ("± MAD", "mad_ms", ".3f"), ("p10 ms", "p10_ms", ".3f"),
    ("p90 ms", "p90_ms", ".3f"), ("tokens/s", lambda r: _tps(r), ".1f"), ("GB/s", "gbps", ".1f"),
    ("probe GB/s", "read_gbps", ".1f"), ("%bw", "pct_bw", ".0%"), ("eff", "efficiency", ".2f"),
    ("eff/turn", "efficiency_turn", ".2f"), ("GFLOP/s", "gflops", ".1f"), ("GEMM GFLOP/s", "gemm_gflops", ".1f"),
    ("rel_err", "rel_err", ".1e"), ("remote (model)", "remote_fraction_model", ".2f"),
    ("remote (perf)", "remote_fraction_perf", ".2f"), ("perf", "perf_status", None),
    ("note", "note", None), ("run", "run_id", None), ("cohort", "cohort", None),
    ("timestamp", "timestamp", None),
]
STATUS_ORDER = ("ok", "wrong", "failed", "timeout", "unsupported", "unavailable")


def _missing(v) -> bool:
    return v is None or v == "" or (isinstance(v, float) and math.isnan(v))


def _tps(r: dict):
    b = r.get("batch_tokens")
    if _missing(b):
        b = r.get("tokens_per_expert")
    try:
        return float(b) / (float(r["median_ms"]) / 1e3) if r.get("status") == "ok" else None
    except (TypeError, ValueError, ZeroDivisionError, KeyError):
        return None


def _value(r: dict, col):
    v = col(r) if callable(col) else r.get(col)
    return None if _missing(v) else v


def _fmt(v, fmt) -> str:
    if v is None:
        return ""
    if fmt:
        try:
            return format(int(round(float(v))), "d") if fmt == "d" else format(float(v), fmt)
        except (TypeError, ValueError):
            return str(v)
    return str(v)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unrecorded"


def _e(v) -> str:
    return html.escape(str(v), quote=True)


@dataclass
class Drawn:
    """One figure for one machine (or ALL): its files, or why it was not drawn."""
    machine: str
    png: Path | None = None
    side: str = ""                 # the side .txt: caption, the figure's command, its rows' commands
    reason: str = ""
    fingerprints: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    rows: int = 0


# ---- the page frame: inline CSS and JS -------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2125;background:#fff}
header{background:#1f3b57;color:#fff;padding:10px 24px}header a{color:#cfe3ff;margin-right:14px}
main{padding:12px 24px 40px}h1{font-size:22px;margin:14px 0 6px}h2{font-size:18px;margin:22px 0 8px}
code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}pre{white-space:pre-wrap;background:#f5f7f9;
padding:8px;border:1px solid #e1e5ea;margin:6px 0}
.machines{display:grid;gap:16px;align-items:start}
.panel{border:1px solid #d4dae1;border-radius:6px;padding:10px;min-width:0;background:#fbfcfd}
.panel h3{margin:0 0 6px;font-size:15px}.panel img{max-width:100%;height:auto;border:1px solid #e1e5ea;background:#fff}
.fp{color:#4a5560;font-size:12px}.why{background:#fff4e5;border:1px solid #f0c36d;padding:8px;border-radius:4px}
table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #dde2e7;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eef2f6;position:sticky;top:0;cursor:pointer;user-select:none;white-space:nowrap}
th.asc::after{content:' \\25B2'}th.desc::after{content:' \\25BC'}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.s-wrong td,tr.s-failed td,tr.s-timeout td{background:#fde8e8}tr.s-unsupported td,tr.s-unavailable td{color:#5f6b76;background:#f4f5f6}
td.reason{max-width:420px;white-space:normal}table.plan td{white-space:normal;vertical-align:top}.st-ok{background:#cdebd3}.st-modeled{background:#fdf3c8}.st-unsupported{background:#f4f5f6;color:#5f6b76}.badge{display:inline-block;border-radius:10px;padding:1px 8px;margin-right:6px;
background:#e8eef4;font-size:12px}.badge.wrong,.badge.failed,.badge.timeout{background:#f9caca}.badge.ok{background:#cdebd3}
.tools{margin:8px 0;display:flex;gap:10px;align-items:center;flex-wrap:wrap}.tools input{width:320px;padding:4px}
.scroll{overflow:auto;max-height:75vh;border:1px solid #dde2e7}
ul.figs li{margin:4px 0}
"""

JS = """
(function(){
  function num(v){var f=parseFloat(v);return isNaN(f)?null:f;}
  document.querySelectorAll('table.rows').forEach(function(table){
    var box=table.closest('section');
    var input=box.querySelector('input.filter'), sel=box.querySelector('select.status'), shown=box.querySelector('.shown');
    var body=table.tBodies[0], rows=Array.prototype.slice.call(body.rows);
    function apply(){
      var terms=(input.value||'').toLowerCase().split(/\\s+/).filter(Boolean), st=sel.value, n=0;
      rows.forEach(function(tr){
        var text=tr.getAttribute('data-text');
        var ok=terms.every(function(t){return text.indexOf(t)>=0;}) && (!st || tr.getAttribute('data-status')===st);
        tr.style.display=ok?'':'none'; if(ok) n++;
      });
      shown.textContent=n+' of '+rows.length+' rows shown';
    }
    rows.forEach(function(tr){tr.setAttribute('data-text',tr.textContent.toLowerCase());});
    input.addEventListener('input',apply); sel.addEventListener('change',apply);
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
      th.addEventListener('click',function(){
        var asc=!th.classList.contains('asc');
        Array.prototype.forEach.call(table.tHead.rows[0].cells,function(h){h.classList.remove('asc','desc');});
        th.classList.add(asc?'asc':'desc');
        rows.sort(function(a,b){
          var x=a.cells[i].getAttribute('data-v'), y=b.cells[i].getAttribute('data-v');
          var nx=num(x), ny=num(y);
          if(x===''&&y!=='') return 1; if(y===''&&x!=='') return -1;
          var c=(nx!==null&&ny!==null)?nx-ny:x.localeCompare(y);
          return asc?c:-c;
        });
        rows.forEach(function(tr){body.appendChild(tr);});
      });
    });
    apply();
  });
})();
"""


def _page(title: str, body: str, figures: dict) -> str:
    nav = '<a href="index.html">index</a>' + "".join(
        f'<a href="{_e(n)}.html">{_e(n)}</a>' for n in figures) + '<a href="rows.html">all rows</a>'
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="generator" content="{GENERATOR}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{_e(title)}</title><style>{CSS}</style></head>\n'
            f'<body><header>{nav}</header><main><h1>{_e(title)}</h1>\n{body}\n</main>'
            f'<script>{JS}</script></body></html>\n')


def _badges(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    order = [s for s in STATUS_ORDER if s in counts] + sorted(set(counts) - set(STATUS_ORDER))
    return "".join(f'<span class="badge {_e(s)}">{_e(s)}: {counts[s]}</span>' for s in order)


def rows_table(rows: list[dict], table_id: str) -> str:
    """The rows as a table that filters (text, status) and sorts (click a header); every status is
    shown by default, with its reason."""
    cols = [c for c in TABLE_COLUMNS if any(_value(r, c[1]) is not None for r in rows)]
    statuses = [s for s in STATUS_ORDER if any(r.get("status") == s for r in rows)]
    head = "".join(f"<th>{_e(h)}</th>" for h, _, _ in cols)
    body = []
    for r in rows:
        cells = []
        for h, col, fmt in cols:
            v = _value(r, col)
            text = _fmt(v, fmt)
            cls = ' class="num"' if fmt else (' class="reason"' if h in ("reason", "note") else "")
            sort = "" if v is None else (repr(float(v)) if fmt and _isnum(v) else str(v))
            cells.append(f'<td{cls} data-v="{_e(sort)}">{_e(text)}</td>')
        st = str(r.get("status"))
        body.append(f'<tr class="s-{_e(st)}" data-status="{_e(st)}">{"".join(cells)}</tr>')
    opts = '<option value="">every status</option>' + "".join(
        f'<option value="{_e(s)}">{_e(s)}</option>' for s in statuses)
    return (f'<section id="{_e(table_id)}"><div class="tools">'
            f'<input class="filter" type="search" placeholder="filter rows: backend, model, status, reason ..." '
            f'aria-label="filter rows"><select class="status" aria-label="status">{opts}</select>'
            f'<span class="shown"></span><span>{_badges(rows)}</span></div>'
            f'<div class="scroll"><table class="rows"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div></section>')


def _isnum(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _records(df) -> list[dict]:
    from ..harness.store import _cell
    return [{k: _cell(v) for k, v in r.items()} for r in df.to_dict("records")]


def _machine_of(df):
    return df["machine"].fillna("").astype(str) if "machine" in df else df["backend"].map(lambda _: "")


def _draw(name: str, fn, rows_fn, frame, machine: str, out: Path) -> Drawn:
    d = Drawn(machine)
    sel = rows_fn(frame)
    d.rows = len(sel)
    d.fingerprints = sorted(set(sel["fingerprint"].dropna().astype(str))) if "fingerprint" in sel else []
    d.commands = sorted(set(sel["command"].dropna().astype(str))) if "command" in sel else []
    sources = list(dict.fromkeys(frame["source"].dropna().astype(str))) if "source" in frame else []
    target = out / "img" / _slug(machine)
    try:
        paths = fn(sources or ["."], str(target), frame=frame.drop(columns=["source"], errors="ignore"))
    except UserError as e:
        d.reason = str(e)
        return d
    except Exception as e:    # a figure that breaks on these rows is a listed reason, not a lost report
        d.reason = f"{name} could not be drawn from these rows ({type(e).__name__}: {e})"
        return d
    for p in paths:
        p = Path(p)
        if p.suffix == ".png":
            d.png = p
        elif p.suffix == ".txt":
            d.side = p.read_text()
    return d


def build(results: list[str], out_dir: str | Path, all_runs: bool = False, command: str = "",
          plan: list[dict] | None = None) -> dict:
    """Write the report for the rows in `results` into `out_dir`; return what was drawn
    ({figure: [Drawn, ...]}) with the machines and the notes. `plan`: `hinabench reproduce`'s rows
    (each paper figure: measured / modeled / not reproducible here, and why), shown on the index."""
    from ..harness.store import load_frame
    from .figures import FIGURE_ROWS, FIGURES, TITLES

    notes: list[str] = []
    df = load_frame(results, notes, latest=True, source=True)
    shown = df if not all_runs else load_frame(results, [], latest=False, source=True)
    if df.empty:
        raise UserError("no stored rows in the results given")
    out = writable_folder(out_dir)
    index = out / "index.html"
    if (out / "img").is_dir() and (not index.exists() or GENERATOR in index.read_text(errors="replace")):
        shutil.rmtree(out / "img")      # our own figures of an earlier report: drawn anew

    machines = list(dict.fromkeys(_machine_of(df)))
    drawn: dict[str, list[Drawn]] = {}
    for name, fn in FIGURES.items():
        drawn[name] = []
        for m in machines:
            drawn[name].append(_draw(name, fn, FIGURE_ROWS[name], df[_machine_of(df) == m], m or "", out))
        if name == "fig1" and len(machines) > 1:   # the CPU's and the GPU's rows may be of two machines
            drawn[name].append(_draw(name, fn, FIGURE_ROWS[name], df, ALL, out))

    figs = {n: TITLES.get(n, n) for n in FIGURES}
    for name in FIGURES:
        (out / f"{name}.html").write_text(_figure_page(name, figs, drawn[name], FIGURE_ROWS[name](shown),
                                                       len(machines), out))
    (out / "rows.html").write_text(_page("Every row read", (
        f"<p>{len(shown)} rows from {len(machines)} machine(s)"
        + (" (every run of each point: --all)" if all_runs else " (the latest run of each point per machine)")
        + ".</p>" + rows_table(_records(shown.drop(columns=["source"], errors="ignore")), "rows")), figs))
    index.write_text(_index_page(figs, drawn, df, machines, notes, results, command, out, plan))
    return {"figures": drawn, "machines": machines, "notes": notes, "index": index}


def _rel(p: Path, out: Path) -> str:
    return p.resolve().relative_to(out.resolve()).as_posix()


def _panel(d: Drawn, out: Path) -> str:
    title = d.machine or "machine not recorded"
    parts = [f"<div class=\"panel\" data-machine=\"{_e(d.machine)}\"><h3>{_e(title)}</h3>"]
    parts += [f'<div class="fp">{_e(fp)}</div>' for fp in d.fingerprints[:4]]
    if d.png is not None:
        src = _rel(d.png, out)
        parts.append(f'<p><a href="{_e(src)}"><img src="{_e(src)}" alt="{_e(d.png.stem)} for {_e(title)}"></a></p>')
        parts.append(f"<pre class=\"side\">{_e(d.side)}</pre>")
        parts.append(f'<p><a href="{_e(_rel(d.png.with_suffix(".txt"), out))}">caption and commands (.txt)</a></p>')
    else:
        parts.append(f'<p class="why"><b>not drawn:</b> {_e(d.reason)}</p>')
        if d.commands:
            parts.append("<p>its rows were made by:</p><pre>" + _e("\n".join(d.commands)) + "</pre>")
    parts.append(f"<p>{d.rows} row(s) behind it.</p></div>")
    return "".join(parts)


def _figure_page(name: str, figs: dict, drawn: list[Drawn], rows_df, n_machines: int, out: Path) -> str:
    cols = max(1, len(drawn))
    panels = (f'<div class="machines" style="grid-template-columns:repeat({cols},minmax(0,1fr))">'
              + "".join(_panel(d, out) for d in drawn) + "</div>")
    rows = _records(rows_df.drop(columns=["source"], errors="ignore"))
    table = (f"<h2>The rows behind it ({len(rows)}, every status)</h2>" + rows_table(rows, f"{name}-rows")
             if rows else "<h2>The rows behind it</h2><p class=\"why\">none of the rows given are of this figure's kind.</p>")
    return _page(figs[name], f"<p>One panel per machine ({n_machines}).</p>" + panels + table, figs)


def _plan_table(plan: list[dict], figs: dict) -> str:
    """hinabench reproduce's plan: every paper figure, its status here and why."""
    body = []
    for r in plan:
        name = r["figure"]
        link = f'<a href="{_e(name)}.html">{_e(name)}</a>' if name in figs else _e(name)
        cls = {"measured here": "ok", "modeled here": "modeled"}.get(r["status"], "unsupported")
        body.append(f"<tr><td>{link}</td><td>{_e(r['title'])}</td><td class=\"st-{cls}\">{_e(r['status'])}</td>"
                    f"<td>{_e(r['detail'])}</td><td>{_e(r.get('when', ''))}</td></tr>")
    return ("<h2>The paper's figures on this machine</h2><p>As <code>hinabench reproduce</code> planned them.</p>"
            "<table class=\"plan\"><thead><tr><th>figure</th><th>what</th><th>status</th><th>how, or why not</th>"
            "<th>rows</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def _index_page(figs: dict, drawn: dict, df, machines: list[str], notes: list[str], results: list[str],
                command: str, out: Path, plan: list[dict] | None = None) -> str:
    items = []
    for name, title in figs.items():
        states = []
        for d in drawn[name]:
            who = _e(d.machine or "machine not recorded")
            states.append(f"{who}: drawn" if d.png is not None else f"{who}: <b>not drawn</b> — {_e(d.reason)}")
        items.append(f'<li><a href="{_e(name)}.html">{_e(title)}</a><ul>'
                     + "".join(f"<li>{s}</li>" for s in states) + "</ul></li>")
    mrows = []
    machine_col = _machine_of(df)
    for m in machines:
        sub = df[machine_col == m]
        fps = sorted(set(sub["fingerprint"].dropna().astype(str))) if "fingerprint" in sub else []
        srcs = sorted(set(sub["source"].dropna().astype(str))) if "source" in sub else []
        mrows.append(f"<tr><td>{_e(m or 'not recorded')}</td><td>{'<br>'.join(_e(f) for f in fps) or '-'}</td>"
                     f"<td class=\"num\">{len(sub)}</td><td>{_badges(_records(sub[['status']]))}</td>"
                     f"<td>{'<br>'.join(_e(s) for s in srcs)}</td></tr>")
    body = [f"<p>Made by <code>{_e(command or GENERATOR)}</code> from {len(df)} stored row(s) "
            f"(the latest run of each point per machine); nothing here was measured live.</p>",
            *([_plan_table(plan, figs)] if plan else []),
            "<h2>Figures</h2><ul class=\"figs\">" + "".join(items) + "</ul>",
            '<p><a href="rows.html">Every row read</a>, as one table.</p>',
            "<h2>Machines</h2><table class=\"machines-table\"><thead><tr><th>machine</th><th>fingerprint</th>"
            "<th>rows</th><th>statuses</th><th>files</th></tr></thead><tbody>" + "".join(mrows) + "</tbody></table>"]
    if notes:
        body.append("<h2>What the readers noted</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    body.append("<h2>Results given</h2><pre>" + _e("\n".join(str(r) for r in results)) + "</pre>")
    return _page("hinabench report", "\n".join(body), figs)


def summary(result: dict) -> dict:
    """What was drawn, as plain data (tests, --json)."""
    return {"machines": result["machines"], "notes": result["notes"],
            "figures": {n: [{"machine": d.machine, "png": str(d.png) if d.png else None, "reason": d.reason}
                            for d in ds] for n, ds in result["figures"].items()}}


__all__ = ["build", "rows_table", "summary"]
