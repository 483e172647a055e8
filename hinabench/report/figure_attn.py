"""`hinabench figure attn`: attention latency and achieved KV bandwidth against context, per backend,
from stored rows only (`hinabench attn`).

One row of panels per model: decode latency vs context, decode GB/s (KV bytes read / median) vs
context, and (when extend rows exist) extend latency vs prefix. A line per backend and batch (colour:
backend, marker and dash: batch). The roofline is drawn from the rows' own same-process denominators:
max(KV bytes / best read probe, FLOPs / FMA peak) per point (dashed, black), and the best read probe
as a horizontal line on the GB/s panel. One layout is drawn (paged when there are paged rows); backends
that did not run are in the legend with their reason.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from .figures import _save, _short, figure_rows


def attention_points(df):
    """The attention rows (every status)."""
    if "op" not in df:
        return df.iloc[0:0]
    return df[df["op"] == "attention"]


def attn(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df, gpu_note = figure_rows(results, frame, attention_points, "attn",
                               "no attention rows in the results given (make them with `hinabench attn`)")
    df = df.copy()
    for c in ("context", "batch", "median_ms", "p10_ms", "p90_ms", "weight_bytes", "flops", "read_gbps",
              "peak_gflops", "threads", "extend"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    threads = int(df["threads"].max())
    df = df[df["threads"] == threads]
    layouts = list(dict.fromkeys(df["layout"].astype(str)))
    layout = "paged" if "paged" in layouts else layouts[0]
    df = df[df["layout"].astype(str) == layout]
    models = list(dict.fromkeys(df["model"]))
    has_extend = (df["phase"] == "extend").any()
    ncol = 3 if has_extend else 2
    fig, axes = plt.subplots(len(models), ncol, figsize=(5.6 * ncol, 4.2 * len(models) + 2.4), squeeze=False)
    backends = list(dict.fromkeys(df["backend"]))
    ran = [b for b in backends if df[(df["backend"] == b) & df["status"].isin(["ok", "wrong"])].size]
    palette = plt.cm.tab10
    colors = {b: palette(i % 10) for i, b in enumerate(ran)}
    batches = sorted(int(b) for b in df["batch"].dropna().unique())
    styles = {b: (m, ls) for b, m, ls in zip(batches, "osD^v<>" * 4, ["-", "--", "-.", ":"] * 7)}
    legend: dict[str, object] = {}

    def lines(ax, rows, y, phase):
        for b in backends:
            for B in batches:
                r = rows[(rows["backend"] == b) & (rows["batch"] == B)].drop_duplicates("context", keep="last")
                ok = r[r["status"] == "ok"].sort_values("context")
                if len(ok):
                    m, ls = styles[B]
                    h, = ax.plot(ok["context"], y(ok), marker=m, ls=ls, ms=4, color=colors[b])
                    legend.setdefault(b, plt.Line2D([], [], color=colors[b], lw=2))
                    legend.setdefault(f"B = {B}", plt.Line2D([], [], color="0.3", marker=m, ls=ls))
                wrong = r[r["status"] == "wrong"]
                if len(wrong):
                    h = ax.scatter(wrong["context"], y(wrong), marker="x", color=colors.get(b, "0.5"))
                    legend.setdefault(f"{b} (WRONG result: not ranked)", h)
            st = rows[(rows["backend"] == b)]
            if len(st) and not st["status"].isin(["ok", "wrong"]).any():
                s = st.iloc[0]
                legend.setdefault(f"{b}: {s['status']} — {_short(s['reason'])}",
                                  plt.Line2D([], [], color="0.6", ls=":"))

    def roof(ax, rows):
        r = rows[rows["read_gbps"].notna()]
        if not len(r):
            return None
        bw, pk = r["read_gbps"].max(), r["peak_gflops"].max()
        for B in batches:
            pts = r[r["batch"] == B].groupby("context")[["weight_bytes", "flops"]].first()
            if len(pts):
                ms = [max(wb / (bw * 1e9), fl / (pk * 1e9)) * 1e3 for wb, fl in pts.values]
                h, = ax.plot(pts.index, ms, color="k", ls=styles[B][1], lw=1.0, alpha=0.7)
                legend.setdefault("roofline: max(KV bytes / best same-process read probe, FLOPs / FMA peak)", h)
        return bw, pk

    for row_axes, model in zip(axes, models):
        m = df[df["model"] == model]
        dec, ext = m[m["phase"] == "decode"], m[m["phase"] == "extend"]
        first = m.iloc[0]
        shape = f"{int(first['h_q'])}q/{int(first['h_kv'])}kv x {int(first['head_dim'])}"
        ax = row_axes[0]
        lines(ax, dec, lambda r: r["median_ms"], "decode")
        rb = roof(ax, dec)
        ax.set_title(f"{model} decode [{shape}], {layout}", fontsize=9)
        ax.set_ylabel("latency per call (ms)")
        ax = row_axes[1]
        lines(ax, dec, lambda r: r["weight_bytes"] / (r["median_ms"] * 1e-3) / 1e9, "decode")
        if rb:
            h = ax.axhline(rb[0], color="k", ls="--", lw=1.0)
            legend.setdefault("best same-process read probe (GB/s)", h)
            ax.text(0.02, 0.97, f"read probe {rb[0]:.1f} GB/s, FMA peak {rb[1]:.0f} GFLOP/s",
                    transform=ax.transAxes, ha="left", va="top", fontsize=7)
        ax.set_title(f"{model} decode: KV bytes read / latency", fontsize=9)
        ax.set_ylabel("achieved GB/s")
        if has_extend:
            ax = row_axes[2]
            if len(ext):
                n = sorted(set(int(x) for x in ext["extend"].dropna()))
                lines(ax, ext, lambda r: r["median_ms"], "extend")
                roof(ax, ext)
                ax.set_title(f"{model} extend (n = {', '.join(map(str, n))} new tokens)", fontsize=9)
                ax.set_xlabel("cached prefix (tokens)")
            ax.set_ylabel("latency per call (ms)")
        for ax in row_axes[:2]:
            ax.set_xlabel("context l (keys per sequence)")
        for ax in row_axes:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
    machine = str(df["fingerprint"].dropna().iloc[0]) if "fingerprint" in df and df["fingerprint"].notna().any() else ""
    caption = (f"{threads} thread(s), {layout} KV layout, bf16 KV, fp32 accumulation; median of the samples. "
               f"{machine}" + gpu_note)
    fig.suptitle("Attention: latency and achieved KV bandwidth vs context (paper Section 6)", fontsize=12)
    wrapped = textwrap.wrap(caption, 160)
    fig.text(0.5, 0.01, "\n".join(wrapped), ha="center", va="bottom", fontsize=7)
    h_in = fig.get_figheight()
    cap = (0.14 * len(wrapped) + 0.1) / h_in
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=2, fontsize=7,
               frameon=False, bbox_to_anchor=(0.5, cap))
    leg = (0.16 * ((len(legend) + 1) // 2) + 0.1) / h_in
    fig.tight_layout(rect=(0, cap + leg, 1, 0.96))
    return _save(fig, "attn", results, out_dir, caption, df)
