"""Figures drawn from stored result rows only, never from a live run (triton.testing's habit).

fig10: the paper's Figure 10 style: FFN latency against tokens per expert, one line per backend,
one panel per model, with the roofline drawn in. Backends that could not run here are in the legend
with the reason. The caption carries the machine's one-line summary and the command that made the rows.
fig4: the share of the same-process read bandwidth each backend's FFN reaches in decode (the
smallest T), a bar per backend and model (and per NUMA policy where rows have several).
fig15: the remote-DRAM fraction per backend, weights interleaved (measured or modeled, labelled).
fig1: CPU vs GPU expert-FFN throughput (tokens/s) by batch tokens: the CPU backends against the
`torch-cuda` backend, drawn only where both sides have rows that ran.
fig11: the paper's Figure 11: speedup of hina's INT8 kernel over KTransformers' INT8 per model and T;
where no kt INT8 row ran (kt's AVX2 build has no INT8 class), over the best validated INT8 peer, the
caption naming it; a second panel does the same for FP8 when FP8 rows exist (kt:fp8 runs on AVX2).

Each takes the results paths (named in the caption's side file) and, optionally, the rows already
loaded (`frame`: `hinabench report` draws one machine's rows at a time). FIGURE_ROWS says which rows
stand behind each figure (all statuses: the report shows them as a table).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from ..errors import UserError, writable_folder
from ..harness.store import load_frame


CUDA_BACKENDS = ("torch-cuda", "torch-cuda:grouped")     # GPU backends: drawn in fig1, left out of the CPU figures (said so)


def _cpu_only(df):
    """(rows of CPU backends, a caption note naming the GPU backends left out, or '')."""
    gpu = df["backend"].isin(CUDA_BACKENDS)
    if not gpu.any():
        return df, ""
    names = ", ".join(dict.fromkeys(df[gpu]["backend"]))
    return df[~gpu], f" GPU backends ({names}) are in fig1, not here."


def ffn_points(df):
    """Only the FFN rows with same-experts routing (rows stored before those columns existed are)."""
    if "op" in df:
        df = df[df["op"].fillna("ffn") == "ffn"]
    if "routing" in df:
        df = df[df["routing"].fillna("same-experts") == "same-experts"]
    return df


def _short(reason: str, n: int = 110) -> str:
    reason = str(reason).split(": ", 1)[-1] if "not supported on this CPU" in str(reason) else str(reason)
    return reason if len(reason) <= n else reason[: n - 1] + "…"


def _save(fig, name: str, results: list[str], out_dir: str | None, caption: str, df) -> list[Path]:
    """The PNG, and beside it the caption and the commands that made the figure and its rows."""
    import matplotlib.pyplot as plt
    out = writable_folder(Path(out_dir) if out_dir else _beside(results))
    png = out / f"{name}.png"
    fig.savefig(png, dpi=130)
    plt.close(fig)
    cmds = sorted(set(df["command"].dropna())) if "command" in df else []
    side = out / f"{name}.txt"
    side.write_text(f"{caption}\nmade by: hinabench figure {name} {' '.join(results)}\nfrom rows made by:\n"
                    + "\n".join(f"  {c}" for c in cmds) + "\n")
    return [png, side]


def _beside(results: list[str]) -> Path:
    """Where a figure goes by default: the first results folder given, or the first file's folder."""
    from ..harness.store import results_files
    first = Path(results[0])
    if first.is_dir():
        return first
    return results_files(results)[0][0].parent


def _one_machine(df, name: str) -> None:
    """fig10 and fig15 draw one machine: rows of several would be drawn over each other."""
    if "machine" in df:
        ms = [m for m in dict.fromkeys(df["machine"].dropna().astype(str))]
        if len(ms) > 1:
            raise UserError(f"{name} draws one machine's rows; these are of {len(ms)} machines "
                            f"({', '.join(ms)}): give one machine's results, or use `hinabench report`, "
                            f"which puts machines side by side")


def figure_rows(results: list[str], frame, select, name: str, empty: str):
    """The rows a figure draws: `select` of the stored rows (or of `frame`), one machine's, CPU backends
    only; returns (rows, the caption's note on GPU backends left out). None left: UserError(`empty`)."""
    df = select(load_frame(results) if frame is None else frame)
    _one_machine(df, name)
    df, gpu_note = _cpu_only(df)
    if df.empty:
        raise UserError(empty)
    return df, gpu_note


def fig10(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = ffn_points(load_frame(results) if frame is None else frame)
    _one_machine(df, "fig10")
    df, gpu_note = _cpu_only(df)
    if "dtype" in df and df["dtype"].nunique() > 1:   # Figure 10 is BF16's; quantized rows are fig11's
        gpu_note += f" Quantized rows ({', '.join(sorted(set(df['dtype']) - {'bf16'}))}) are in fig11, not here."
        df = df[df["dtype"] == "bf16"]
    if df.empty:
        raise UserError("no FFN rows of a CPU backend with same-experts routing (Figure 10's tokens per "
                        "expert) in the results given" + (f";{gpu_note}" if gpu_note else ""))
    models = list(dict.fromkeys(df["model"]))
    threads = int(df["threads"].max())
    df = df[df["threads"] == threads]
    policy = ""
    if "numa" in df and df["numa"].fillna("default").nunique() > 1:   # one line per backend: one policy
        pol = df["numa"].fillna("default")
        policy = "default" if (pol == "default").any() else str(pol.iloc[0])
        df = df[pol == policy]
    backends = list(dict.fromkeys(df["backend"]))
    ncol = min(len(models), 2)
    nrow = (len(models) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(10.0, 6.4 * ncol), 4.4 * nrow + 2.0), squeeze=False)
    measured = [b for b in backends if df[(df["backend"] == b) & df["status"].isin(["ok", "wrong"])].size]
    palette = plt.cm.tab10 if len(measured) <= 10 else plt.cm.tab20
    colors = {b: palette(i % palette.N) for i, b in enumerate(measured)}
    colors.update({b: (0.6, 0.6, 0.6, 1.0) for b in backends if b not in colors})
    legend: dict[str, object] = {}
    for ax, model in zip(axes.flat, models):
        m = df[df["model"] == model]
        for b in backends:
            rows = m[m["backend"] == b].sort_values("tokens_per_expert")
            ok = rows[rows["status"] == "ok"]
            if len(ok):
                h = ax.errorbar(ok["tokens_per_expert"], ok["median_ms"],
                                yerr=[ok["median_ms"] - ok["p10_ms"], ok["p90_ms"] - ok["median_ms"]],
                                marker="o", ms=4, capsize=2, color=colors[b], label=b)
                legend.setdefault(b, h)
            wrong = rows[rows["status"] == "wrong"]
            if len(wrong):
                h = ax.scatter(wrong["tokens_per_expert"], wrong["median_ms"], marker="x", color=colors[b])
                legend.setdefault(f"{b} (WRONG result: not ranked)", h)
            if not len(ok) and not len(wrong) and len(rows):
                st = rows.iloc[0]
                label = f"{b}: {st['status']} — {_short(st['reason'])}"
                legend.setdefault(label, plt.Line2D([], [], color=colors[b], ls=":", alpha=0.5))
        # One roofline per model: the best same-process read probe and the FMA peak over its rows.
        r = m[m["read_gbps"].notna()]
        if len(r):
            bw, pk = r["read_gbps"].max(), r["peak_gflops"].astype(float).max()
            pts = r.groupby("tokens_per_expert")[["weight_bytes", "flops"]].first().astype(float)
            roof = [max(wb / (bw * 1e9), fl / (pk * 1e9)) * 1e3 for wb, fl in pts.values]
            h, = ax.plot(pts.index, roof, "k--", lw=1.2)
            legend.setdefault("roofline: max(weight bytes / best same-process read probe, FLOPs / FMA peak)", h)
            ax.text(0.02, 0.97, f"roofline: {bw:.1f} GB/s read, {pk:.0f} GFLOP/s {r['peak_unit'].iloc[0]}",
                    transform=ax.transAxes, ha="left", va="top", fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per expert (T)")
        ax.set_ylabel("latency per MoE FFN call (ms)")
        first = m.iloc[0]
        ax.set_title(f"{model}: {int(first['experts'])} experts of {int(first['intermediate_size'])}x"
                     f"{int(first['hidden_size'])}, {first['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    machine = str(df["fingerprint"].dropna().iloc[0]) if "fingerprint" in df and df["fingerprint"].notna().any() else ""
    caption = (f"{threads} thread(s)" + (f", NUMA policy {policy}" if policy else "")
               + f"; median with p10-p90 bars. {machine}" + gpu_note)
    fig.suptitle("MoE expert FFN latency vs tokens per expert (paper Fig. 10 style)", fontsize=12)
    wrapped = textwrap.wrap(caption, 150)
    fig.text(0.5, 0.01, "\n".join(wrapped), ha="center", va="bottom", fontsize=7)
    h_in = fig.get_figheight()
    cap = (0.14 * len(wrapped) + 0.1) / h_in
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=1, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, cap))
    leg = (0.17 * len(legend) + 0.1) / h_in
    fig.tight_layout(rect=(0, cap + leg, 1, 0.96))
    return _save(fig, "fig10", results, out_dir, caption, df)


def fig4_points(df):
    """Figure 4's rows: FFN rows (same-experts routing) at each model's smallest tokens per expert
    (decode), one thread count (the largest), every NUMA policy and status."""
    df = ffn_points(df)
    if df.empty:
        return df
    df = df[df["threads"] == df["threads"].max()]
    first = df.groupby("model")["tokens_per_expert"].transform("min")
    return df[df["tokens_per_expert"] == first]


def fig4(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    """Memory-bandwidth utilisation of each method's MoE FFN in decode: achieved GB/s over the
    same-process read probe, a bar per backend and model, a bar group per NUMA policy where the rows
    have several (the paper's one-node vs two-node bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    empty = ("no FFN rows of a CPU backend (same-experts routing) in the results given: make them "
             "with `hinabench ffn --tokens 1` or suites/fig10.toml")
    df, gpu_note = figure_rows(results, frame, fig4_points, "fig4", empty)
    if "pct_bw" not in df:
        raise UserError(empty)
    df = df.copy()
    df["pct_bw"] = pd.to_numeric(df["pct_bw"], errors="coerce")
    df["numa"] = df["numa"].fillna("default") if "numa" in df else "default"
    models = list(dict.fromkeys(df["model"]))
    ran = set(df[df["status"].isin(["ok", "wrong"])]["backend"])
    not_ran = {b: f"{r['status']}: {_short(r.get('reason', ''), 70)}"
               for b, r in df[~df["backend"].isin(ran)].groupby("backend").first().iterrows()}
    backends = [b for b in dict.fromkeys(df["backend"]) if b in ran]     # an axis slot only for those that ran
    if not backends:
        raise UserError("no backend ran (status ok or wrong) in the FFN rows given")
    policies = list(dict.fromkeys(df["numa"]))
    series = [(m, p) for p in policies for m in models]
    fig, ax = plt.subplots(figsize=(min(20.0, max(9.0, 0.5 * len(backends) * len(series) + 3)), 6.0))
    width = 0.8 / max(len(series), 1)
    for i, (model, pol) in enumerate(series):
        sub = df[(df["model"] == model) & (df["numa"] == pol)].groupby("backend").first()
        label = model + (f", numa {pol}" if len(policies) > 1 else "")
        for j, b in enumerate(backends):
            x = j + (i - (len(series) - 1) / 2) * width
            if b not in sub.index:
                continue
            r = sub.loc[b]
            if r["status"] == "ok" and pd.notna(r["pct_bw"]):
                ax.bar(x, r["pct_bw"], width * 0.9, color=plt.cm.tab10(i % 10), edgecolor="black",
                       label=label if label not in ax.get_legend_handles_labels()[1] else None)
                ax.text(x, r["pct_bw"] + 0.01, f"{r['pct_bw']:.0%}", ha="center", va="bottom", fontsize=6,
                        rotation=90)
            else:
                ax.text(x, 0.01, str(r["status"]), ha="center", va="bottom", fontsize=6, rotation=90,
                        color="red" if r["status"] == "wrong" else "gray")
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.text(len(backends) - 0.5, 1.0, " same-process read probe", va="bottom", ha="right", fontsize=7)
    ax.set_xticks(range(len(backends)))
    ax.set_xticklabels(backends, rotation=30, ha="right")
    ax.set_ylabel("achieved weight GB/s / read probe GB/s")
    ax.set_ylim(0, 1.15)
    t = ", ".join(f"{m} T={int(df[df['model'] == m]['tokens_per_expert'].iloc[0])}" for m in models)
    threads = int(df["threads"].max())
    ax.set_title(f"Memory-bandwidth utilisation of the MoE FFN in decode (paper Fig. 4 style)\n{t}; "
                 f"{threads} thread(s); a bar only where the result was validated (wrong rows are not drawn)",
                 fontsize=10)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8)
    machine = str(df["fingerprint"].dropna().iloc[0]) if "fingerprint" in df and df["fingerprint"].notna().any() else ""
    import re
    nodes = sorted({int(m.group(1)) for m in (re.search(r"(\d+) NUMA node", f) for f in
                   (df["fingerprint"].dropna().astype(str) if "fingerprint" in df else [])) if m})
    caption = (machine + (". NUMA policies: " + ", ".join(policies))
               + (". One NUMA node: the paper's two-node bars cannot be measured here" if nodes == [1] else "")
               + (". Did not run here (no bar): " + "; ".join(f"{b} {w}" for b, w in not_ran.items()) if not_ran else "")
               + gpu_note)
    wrapped = textwrap.wrap(caption, 160)
    fig.text(0.5, 0.005, "\n".join(wrapped), ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, 0.03 + 0.025 * len(wrapped), 1, 1))
    return _save(fig, "fig4", results, out_dir, caption, df)


def fig15(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    """Remote-DRAM fraction per backend and model, weights interleaved: measured (perf) where the
    counters worked, modeled otherwise, and each bar says which."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = load_frame(results) if frame is None else frame
    _one_machine(df, "fig15")
    if "remote_fraction_model" not in df:
        raise UserError("these rows have no NUMA columns: make them with --numa interleave (suites/fig15.toml)")
    df = df[df["numa"] == "interleave"]
    if df.empty:
        raise UserError("no rows with --numa interleave in the results given")
    df, gpu_note = _cpu_only(df)
    for c in ("remote_fraction_model", "remote_fraction_perf"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    models = list(dict.fromkeys(df["model"]))
    not_run = sorted(set(df["backend"]) - set(df[df["status"].isin(["ok", "wrong"])]["backend"]))
    df = df[df["status"].isin(["ok", "wrong"])]          # bars only for backends that ran here
    backends = list(dict.fromkeys(df["backend"]))
    if not backends:
        raise UserError("no backend ran (status ok or wrong) in the rows given")
    fig, ax = plt.subplots(figsize=(min(18.0, max(8.0, 0.45 * len(backends) * len(models) + 2)), 5.6))
    width = 0.8 / max(len(models), 1)
    for i, model in enumerate(models):
        m = df[df["model"] == model].groupby("backend").first()
        for j, b in enumerate(backends):
            if b not in m.index:
                continue
            r = m.loc[b]
            measured = r["remote_fraction_perf"]
            val, kind = (measured, "measured") if pd.notna(measured) else (r["remote_fraction_model"], "modeled")
            x = j + (i - (len(models) - 1) / 2) * width
            if pd.isna(val):
                ax.text(x, 0.01, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
                continue
            ax.bar(x, val, width * 0.9, color=plt.cm.tab10(i % 10), hatch=None if kind == "measured" else "//",
                   edgecolor="black", label=model if j == 0 else None)
            ax.text(x, val + 0.01, kind, ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(backends)))
    ax.set_xticklabels(backends, rotation=30, ha="right")
    ax.set_ylabel("fraction of weight bytes read from a remote node")
    ax.set_ylim(0, 1.05)
    nodes = df["placement_nodes"].dropna().astype(str).iloc[0] if "placement_nodes" in df and df["placement_nodes"].notna().any() else "?"
    ax.set_title(f"Remote DRAM traffic, weights interleaved over node(s) {nodes}\n"
                 "hatched: modeled (placement model x work partition); solid: perf counters", fontsize=10)
    ax.legend(fontsize=8)
    machine = str(df["fingerprint"].dropna().iloc[0]) if df["fingerprint"].notna().any() else ""
    ran = df[df["status"].isin(["ok", "wrong"])]
    reasons = sorted(set(ran["perf_reason"].dropna().astype(str))) if "perf_reason" in ran else []
    caption = machine + (f". perf: {reasons[0][:200]}" if reasons else "") + (
        f". Did not run here (no bar): {', '.join(not_run)}" if not_run else "") + gpu_note
    fig.text(0.5, 0.005, "\n".join(textwrap.wrap(caption, 150)), ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return _save(fig, "fig15", results, out_dir, caption, df)


def _batch(df):
    """Batch tokens of FFN rows (rows stored before the column existed: = tokens per expert)."""
    import pandas as pd
    b = pd.to_numeric(df["batch_tokens"], errors="coerce") if "batch_tokens" in df else None
    t = pd.to_numeric(df["tokens_per_expert"], errors="coerce")
    return t if b is None else b.fillna(t)


def fig1_points(df):
    """Figure 1's rows: every FFN row (any routing), batch tokens filled in."""
    if "op" in df:
        df = df[df["op"].fillna("ffn") == "ffn"]
    df = df.copy()
    if len(df):
        df["batch_tokens"] = _batch(df)
    return df


def _side_missing(rows, what: str, how: str) -> str:
    """Why one side of Figure 1 has no row that ran, in words."""
    if not len(rows):
        return f"no rows of {what} ({how})"
    seen = []
    for r in rows.to_dict("records"):
        s = f"{r['backend']}: {r['status']}" + (f" ({_short(r.get('reason'), 140)})" if r.get("reason") else "")
        if s not in seen:
            seen.append(s)
    return f"no ok rows of {what}: " + "; ".join(seen[:4]) + (" ..." if len(seen) > 4 else "")


def fig1(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    """The paper's Figure 1 style: expert-FFN throughput (tokens per second = batch tokens / median
    latency of one call) against batch tokens, the CPU backends beside the CUDA backend, one panel
    per model and routing. Needs ok rows of both sides (of any machines: a GPU's rows may come from
    another results folder); otherwise a UserError names the side that is missing and why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..backends.torch_cuda import device_name

    df = fig1_points(load_frame(results) if frame is None else frame)
    if df.empty:
        raise UserError("fig1 needs FFN rows; the results given have none")
    df["routing"] = df["routing"].fillna("same-experts") if "routing" in df else "same-experts"
    is_gpu = df["backend"].isin(CUDA_BACKENDS)
    gpu, cpu = df[is_gpu], df[~is_gpu]
    missing = []
    if not (gpu["status"] == "ok").any():
        missing.append(_side_missing(gpu, "the CUDA backend (torch-cuda)",
                                     "measure them where an NVIDIA GPU and a CUDA build of torch are: "
                                     "hinabench ffn --backends torch-cuda --tokens 1,4,16,64,256"))
    if not (cpu["status"] == "ok").any():
        missing.append(_side_missing(cpu, "a CPU backend", "hinabench ffn --tokens 1,4,16,64,256"))
    if missing:
        raise UserError("fig1 (CPU vs GPU throughput) needs rows of both sides that ran: " + "; ".join(missing))
    ok = df[df["status"] == "ok"]
    ok_gpu, ok_cpu = ok[ok["backend"].isin(CUDA_BACKENDS)], ok[~ok["backend"].isin(CUDA_BACKENDS)]
    on_gpu, on_cpu = set(zip(ok_gpu["model"], ok_gpu["routing"])), set(zip(ok_cpu["model"], ok_cpu["routing"]))
    panels = [p for p in dict.fromkeys(zip(ok["model"], ok["routing"])) if p in on_gpu and p in on_cpu]
    if not panels:
        raise UserError("fig1 needs CPU and CUDA rows that ran of one model and routing; the CUDA rows are of "
                        + ", ".join(f"{m} ({r})" for m, r in sorted(on_gpu)) + "; the CPU rows of "
                        + ", ".join(f"{m} ({r})" for m, r in sorted(on_cpu)))
    machines = list(dict.fromkeys(df["machine"].dropna().astype(str))) if "machine" in df else []
    many = len(machines) > 1
    ncol = min(len(panels), 2)
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(9.0, 6.4 * ncol), 4.6 * nrow + 2.0), squeeze=False)
    legend: dict[str, object] = {}
    lines = list(dict.fromkeys(zip(df["machine"].fillna("") if "machine" in df else [""] * len(df),
                                   df["backend"])))
    palette = plt.cm.tab10 if len(lines) <= 10 else plt.cm.tab20
    colors = {k: palette(i % palette.N) for i, k in enumerate(lines)}
    threads_used = set()
    for ax, (model, routing) in zip(axes.flat, panels):
        m = df[(df["model"] == model) & (df["routing"] == routing)]
        for key in lines:
            machine, b = key
            rows = m[(m["backend"] == b) & ((m["machine"].fillna("") == machine) if "machine" in m else True)]
            if not len(rows):
                continue
            gpu_line = b in CUDA_BACKENDS
            label = b
            if gpu_line:
                dev = next((device_name(v) for v in rows.get("versions", pd.Series(dtype=object)) if device_name(v)), "")
                label = f"{b} ({dev})" if dev else b
            if many:
                label += f" @ {machine or 'machine not recorded'}"
            r_ok = rows[rows["status"] == "ok"]
            if len(r_ok):
                r_ok = r_ok[r_ok["threads"] == r_ok["threads"].max()]
                r_ok = r_ok[r_ok["numa"].fillna("default") == r_ok["numa"].fillna("default").iloc[0]] if "numa" in r_ok else r_ok
                r_ok = r_ok.drop_duplicates("batch_tokens", keep="last").sort_values("batch_tokens")
                if not gpu_line:
                    threads_used.update(int(t) for t in r_ok["threads"].dropna())
                tps = r_ok["batch_tokens"] / (r_ok["median_ms"] / 1e3)
                lo = r_ok["batch_tokens"] / (r_ok["p90_ms"] / 1e3)
                hi = r_ok["batch_tokens"] / (r_ok["p10_ms"] / 1e3)
                yerr = [(tps - lo).clip(lower=0).fillna(0), (hi - tps).clip(lower=0).fillna(0)]
                h = ax.errorbar(r_ok["batch_tokens"], tps, yerr=yerr, marker="s" if gpu_line else "o", ms=4,
                                capsize=2, lw=2.2 if gpu_line else 1.2, ls="-" if gpu_line else "--",
                                color=colors[key])
                legend.setdefault(label + (" [GPU]" if gpu_line else ""), h)
            elif len(rows):
                st = rows.iloc[0]
                legend.setdefault(f"{label}: {st['status']} — {_short(st['reason'])}",
                                  plt.Line2D([], [], color=(0.6, 0.6, 0.6), ls=":"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch tokens (B)")
        ax.set_ylabel("expert FFN throughput (tokens/s)")
        ax.set_title(f"{model}, {routing} routing, {m['dtype'].iloc[0]}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fps = []
    if "fingerprint" in df:
        for mach, fp in dict.fromkeys(zip(df["machine"].fillna("") if "machine" in df else [""] * len(df),
                                          df["fingerprint"].fillna(""))):
            if fp:
                fps.append(f"{mach}: {fp}" if many and mach else str(fp))
    thr = ", ".join(str(t) for t in sorted(threads_used))
    caption = (f"tokens/s = batch tokens / median latency of one MoE FFN call (p10-p90 bars); CPU backends at "
               f"{thr} thread(s), the GPU's call includes copying its output to the host. " + " | ".join(fps))
    fig.suptitle("MoE expert FFN throughput, CPU vs GPU, by batch (paper Fig. 1 style)", fontsize=12)
    wrapped = textwrap.wrap(caption, 150)
    fig.text(0.5, 0.01, "\n".join(wrapped), ha="center", va="bottom", fontsize=7)
    h_in = fig.get_figheight()
    cap = (0.14 * len(wrapped) + 0.1) / h_in
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=2 if len(legend) > 6 else 1,
               fontsize=8, frameon=False, bbox_to_anchor=(0.5, cap))
    leg = (0.17 * ((len(legend) + 1) // (2 if len(legend) > 6 else 1)) + 0.1) / h_in
    fig.tight_layout(rect=(0, cap + leg, 1, 0.96))
    return _save(fig, "fig1", results, out_dir, caption, df)


# Peers that quantize bf16 problems to 8-bit weights themselves (their rows' dtype is bf16): int8 peers
# for Figure 11. llama.cpp's Q8_0 is 32 int8 weights + one fp16 scale per block, activations quantized
# to Q8_0 for the dot products: W8A8 in its own scheme, about the same bytes as hina's int8 g128.
INT8_OWN_SCHEME_PEERS = ("llamacpp:q8_0",)


def quant_points(df):
    """The FFN rows of quantized dtypes (Figure 11's), with the own-scheme int8 peers' rows."""
    df = ffn_points(df)
    if "dtype" not in df:
        return df.iloc[0:0]
    return df[df["dtype"].isin(["int8", "fp8"]) | ((df["dtype"] == "bf16") & df["backend"].isin(INT8_OWN_SCHEME_PEERS))]


def _quant_rows(df, dt: str):
    """The ok rows that compete at quantized dtype `dt` (int8 takes the own-scheme peers' bf16 rows)."""
    ok = df["status"] == "ok"
    if dt == "int8":
        return df[ok & ((df["dtype"] == dt) | df["backend"].isin(INT8_OWN_SCHEME_PEERS))]
    return df[ok & (df["dtype"] == dt)]


def fig11_speedups(df) -> dict:
    """{dtype: (peer-choice note, [(model, T, hina backend, peer backend, speedup, hina ms, peer ms)])}:
    hina over KTransformers where a kt row of the dtype ran (status ok), else over the fastest validated
    (ok) peer of the point (for int8 also llama.cpp's Q8_0, INT8_OWN_SCHEME_PEERS). Rows of other statuses
    are never ranked."""
    out = {}
    for dt in ("int8", "fp8"):
        d = _quant_rows(df, dt)
        if d.empty:
            continue
        pts, peers_used = [], set()
        kt_any = d["backend"].str.startswith("kt:").any()
        for (model, T), g in d.groupby(["model", "tokens_per_expert"], sort=False):
            hina = g[g["backend"].str.startswith("hina:")]
            peers = g[~g["backend"].str.startswith("hina:")]
            if kt_any:
                peers = peers[peers["backend"].str.startswith("kt:")]
            if hina.empty or peers.empty:
                continue
            h = hina.loc[hina["median_ms"].astype(float).idxmin()]
            p = peers.loc[peers["median_ms"].astype(float).idxmin()]
            peers_used.add(p["backend"])
            pts.append((model, int(T), h["backend"], p["backend"], float(p["median_ms"]) / float(h["median_ms"]),
                        float(h["median_ms"]), float(p["median_ms"])))
        if not pts:
            continue
        who = ", ".join(sorted(peers_used))
        note = (f"{dt.upper()}: over KTransformers ({who})" if kt_any else
                f"{dt.upper()}: no KTransformers {dt} row ran here; over the best validated {dt} peer per point ({who})")
        out[dt] = (note, pts)
    return out


def fig11(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df, gpu_note = figure_rows(results, frame, quant_points, "fig11",
                               "no int8 or fp8 FFN rows in the results given (hinabench ffn --dtype int8,fp8, "
                               "or hinabench suite run suites/fig11.toml)")
    threads = int(df["threads"].max())
    df = df[df["threads"] == threads]
    sp = fig11_speedups(df)
    if not sp:
        raise UserError("no point where a hina row and a peer row of the same quantized dtype both ran (ok): "
                        "nothing to compare; the rows' reasons say why (hinabench show)")
    fig, axes = plt.subplots(1, len(sp), figsize=(6.8 * len(sp), 5.2), squeeze=False)
    notes = []
    for ax, (dt, (note, pts)) in zip(axes.flat, sp.items()):
        notes.append(note)
        models = list(dict.fromkeys(p[0] for p in pts))
        Ts = sorted({p[1] for p in pts})
        width = 0.8 / len(Ts)
        cmap = plt.cm.viridis
        for j, T in enumerate(Ts):
            xs, ys = [], []
            for i, m in enumerate(models):
                v = [p[4] for p in pts if p[0] == m and p[1] == T]
                if v:
                    xs.append(i + (j - (len(Ts) - 1) / 2) * width)
                    ys.append(v[0])
            ax.bar(xs, ys, width, color=cmap(j / max(1, len(Ts) - 1)), label=f"T={T}")
            for x, y in zip(xs, ys):
                ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=6)
        ax.axhline(1.0, color="k", lw=0.8)
        mean = sum(p[4] for p in pts) / len(pts)
        ax.set_xticks(range(len(models)), models)
        ax.set_ylabel("speedup (peer median / hina median)")
        ax.set_title(f"hina {dt.upper()} speedup, mean {mean:.2f}x over {len(pts)} points", fontsize=10)
        ax.legend(fontsize=7, ncol=len(Ts))
        ax.grid(True, axis="y", alpha=0.3)
    machine = str(df["fingerprint"].dropna().iloc[0]) if "fingerprint" in df and df["fingerprint"].notna().any() else ""
    qe = df.groupby("dtype")["quant_err"].max() if "quant_err" in df else {}
    qtxt = "; ".join(f"{d} quant_err <= {float(v):.3g}" for d, v in dict(qe).items() if v == v)
    caption = "; ".join(notes) + f". {threads} thread(s), medians of validated rows only. {qtxt}. {machine}" + gpu_note
    fig.suptitle("Quantized expert FFN: hina speedup per model and T (paper Fig. 11 style)", fontsize=12)
    wrapped = textwrap.wrap(caption, int(fig.get_figwidth() * 16))
    fig.text(0.5, 0.01, "\n".join(wrapped), ha="center", va="bottom", fontsize=7)
    fig.tight_layout(rect=(0, (0.16 * len(wrapped) + 0.1) / fig.get_figheight(), 1, 0.94))
    return _save(fig, "fig11", results, out_dir, caption, df)


def _fig15_rows(df):
    return df[df["numa"] == "interleave"] if "numa" in df else df.iloc[0:0]


FIGURES = {"fig1": fig1, "fig4": fig4, "fig10": fig10, "fig11": fig11, "fig15": fig15}
# The rows behind each figure, every status kept (what `hinabench report` shows beside the figure).
FIGURE_ROWS = {"fig1": fig1_points, "fig4": fig4_points, "fig10": ffn_points, "fig11": quant_points,
               "fig15": _fig15_rows}
# End to end (hinabench/e2e/figures.py): Figures 12-14 and Table 4
from ..e2e import figures as _e2e  # noqa: E402

FIGURES.update({"fig12": _e2e.fig12, "fig13": _e2e.fig13, "fig14": _e2e.fig14, "table4": _e2e.table4})
FIGURE_ROWS.update({k: _e2e.e2e_points for k in ("fig12", "fig13", "fig14")})
FIGURE_ROWS["table4"] = lambda df: _e2e.table4_rows(_e2e.e2e_points(df))
TITLES = {"fig1": "Figure 1: CPU vs GPU expert-FFN throughput by batch",
          "fig4": "Figure 4: memory-bandwidth utilisation of the MoE FFN in decode, per method",
          "fig10": "Figure 10: expert-FFN latency vs tokens per expert, with the roofline",
          "fig11": "Figure 11: quantized (INT8, FP8) expert-FFN speedup over the peers",
          "fig15": "Figure 15: remote-DRAM traffic, weights interleaved",
          "fig12": "Figure 12: end-to-end decode at batch 1, per engine (per layer, and projected to full depth)",
          "fig13": "Figure 13: batch decode throughput and the MoE FFN's share of a decode step",
          "fig14": "Figure 14: decode ablation (baseline, +m HiNa FFN, +m+l and the linear kernel, +m+a HiNa "
                   "attention, +m+l+a)",
          "table4": "Table 4: prefill throughput by prompt length"}


# The attention figure lives in its own module (figure_attn.py); registered here like the others.
from .figure_attn import attention_points as _attn_rows, attn as _attn_figure  # noqa: E402

FIGURES["attn"] = _attn_figure
FIGURE_ROWS["attn"] = _attn_rows
TITLES["attn"] = "Attention: latency and achieved KV bandwidth vs context, with the roofline"
