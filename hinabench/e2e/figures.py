"""Figures 12, 13, 14 and Table 4 from stored end-to-end rows (op = e2e), never from a live run.

Per-layer cost comes from two depths of the same model, engine and batch: (t(N2) - t(N1)) / (N2 - N1),
so the embedding and the LM head (151936 x 2048 for Qwen3) do not dominate a few-layer model. A
full-depth figure is t(N1) + (L - N1) x per-layer, always labelled *projected*.
fig12  decode speed at batch 1 per model and engine (projected full depth) and the per-layer step
fig13  decode tokens/s by batch (left) and the share of a decode step in the MoE experts and attention (right)
fig14  the ablation over baseline (transformers): +m (HiNa expert FFN), +m+l (and the linear kernel), +m+a
       (and HiNa attention), +m+l+a, per-layer
table4 prefill throughput (tokens/s) by prompt length, batch 1
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..errors import UserError
from ..harness.store import latest_per_point, load_frame
from .engines import HINA, INT8

NUM = ("layers", "batch_size", "prompt_tokens", "gen_tokens", "full_layers", "median_ms", "mad_ms", "tokens_per_s",
       "ffn_share", "attn_share", "ffn_ms", "attn_ms", "ttft_ms", "tpot_ms", "read_gbps", "layer_bytes",
       "step_bytes", "rel_err", "samples")
ABLATION = (("baseline", "hf"), ("+m", "hina"), ("+m+l", "hina+l"), ("+m+a", "hina+a"), ("+m+l+a", "hina+l+a"),
            ("+fused", "hina+fused"))


def e2e_points(df):
    """Every end-to-end row (all statuses), numbers as numbers."""
    import pandas as pd
    if "op" not in df:
        return df.iloc[0:0]
    df = df[df["op"] == "e2e"].copy()
    for c in NUM:
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _llc_bytes(df, model) -> int | None:
    """The L3 of the machine `model`'s rows ran on, from their fingerprint (sysinfo's "L3 480 MiB")."""
    import re
    if "fingerprint" not in df:
        return None
    for fp in df[df["model"] == model]["fingerprint"].dropna():
        m = re.search(r"L3 (\d+(?:\.\d+)?) MiB", str(fp))
        if m:
            return int(float(m.group(1)) * 2**20)
    return None


def _layer_roofline(df, model, rows, depth):
    """(ms a layer's bytes take at the best read probe of `rows`, or None; whether `depth` such layers fit
    the L3 of the machine the rows ran on, where the DRAM time is then no lower bound)."""
    if not ({"layer_bytes", "read_gbps"} <= set(rows) and rows["layer_bytes"].notna().any()
            and rows["read_gbps"].notna().any()):
        return None, False
    llc = _llc_bytes(df, model)
    return (rows["layer_bytes"].max() / (rows["read_gbps"].max() * 1e9) * 1e3,
            bool(llc) and rows["layer_bytes"].max() * depth <= llc)


def _load(results, frame):
    df = e2e_points(load_frame(results) if frame is None else frame)
    if df.empty:
        raise UserError("no end-to-end rows (op e2e) in the results given: run `hinabench e2e` first")
    from ..report.figures import _one_machine
    _one_machine(df, "the end-to-end figures")
    return df


def _one_run(g):
    """g's rows of the newest run that timed two depths or more (two depths of one run, not the newest
    row of each depth), where the rows say which run they come from; else g."""
    if "run_id" in g and g["run_id"].notna().any():
        two = [(grp["timestamp"].max() if "timestamp" in grp else "", run) for run, grp in g.groupby("run_id")
               if grp["layers"].nunique() >= 2]
        if two:
            return g[g["run_id"] == max(two)[1]]
    return g


def _paired(r, n1: int):
    """(per-layer ms, its MAD) from the deeper row's paired depths (run.py: the model cut to its first n1
    layers timed beside it, round by round, in one process), or None where the row has none for n1."""
    v, n = r.get("paired_per_layer_ms"), r.get("paired_layers")
    if v is None or v != v or n is None or n != n or int(n) != n1:
        return None
    return float(v), float(r["paired_mad_ms"])


def per_layer(df, phase: str = "decode"):
    """Rows of (model, engine, batch, prompt, per_layer_ms, mad_ms, depths, t_ms at the shallowest depth,
    full_layers): the per-layer cost from the two shallowest depths with ok rows, both of one run (the
    newest run that timed two depths) where the rows say which run they come from. Where the deeper row
    carries paired depths for the shallower one (the in-process engines: run.py), the cost is theirs
    (`paired` True) and the two depths' processes' difference stays beside it (`sequential_ms`)."""
    import pandas as pd
    ok = df[(df["status"] == "ok") & (df["phase"] == phase)]
    out = []
    for (model, eng, b, p), g in ok.groupby(["model", "backend", "batch_size", "prompt_tokens"]):
        g = _one_run(g.sort_values(["layers", "timestamp"] if "timestamp" in g else "layers"))   # per depth, the newest last
        depths = list(dict.fromkeys(g["layers"]))
        if len(depths) < 2:
            r = g.iloc[0]
            out.append(dict(model=model, engine=eng, batch=int(b), prompt=int(p), per_layer_ms=None, mad_ms=None,
                            depths=f"{int(depths[0])}", t1_ms=r["median_ms"], n1=int(depths[0]),
                            full_layers=int(r["full_layers"]), projected_ms=None, raw_ms=None))
            continue
        r1, r2 = g[g["layers"] == depths[0]].iloc[-1], g[g["layers"] == depths[1]].iloc[-1]
        n1, n2 = int(depths[0]), int(depths[1])
        pl = seq = (r2["median_ms"] - r1["median_ms"]) / (n2 - n1)
        mad = ((r1["mad_ms"] ** 2 + r2["mad_ms"] ** 2) ** 0.5) / (n2 - n1)
        paired = _paired(r2, n1)
        if paired:
            pl, mad = paired
        L = int(r1["full_layers"])
        # A layer cannot stream its bytes from DRAM faster than the best read probe of its rows: a
        # difference more than 10% under that (where the layers do not fit the L3) says the two depths'
        # runs disagree -- on Zen 5 every engine's step at one Mixtral layer took 1.4x another run's, at two
        # the same, and `hina+fused` read 0.42 of its roofline -- not a per-layer cost.
        rl, fits = _layer_roofline(df, model, g, n2)
        under = rl if rl is not None and not fits and 0 < pl < 0.9 * rl else None
        if not pl > 0 or under:   # the deeper model was not slower (or not by a layer's bytes): the machine's
                                  # noise, not a cost; no projection
            out.append(dict(model=model, engine=eng, batch=int(b), prompt=int(p), per_layer_ms=None, mad_ms=mad,
                            depths=f"{n1},{n2}", t1_ms=r1["median_ms"], n1=n1, full_layers=L, projected_ms=None,
                            raw_ms=pl, under_roofline_ms=under, paired=bool(paired), sequential_ms=seq))
            continue
        out.append(dict(model=model, engine=eng, batch=int(b), prompt=int(p), per_layer_ms=pl, mad_ms=mad,
                        depths=f"{n1},{n2}", t1_ms=r1["median_ms"], n1=n1, full_layers=L,
                        projected_ms=r1["median_ms"] + (L - n1) * pl, raw_ms=pl,
                        roofline_ms=rl if rl is not None and not fits else None, paired=bool(paired),
                        sequential_ms=seq))
    return pd.DataFrame(out)


def per_layer_by_run(df, phase: str = "decode"):
    """per_layer for each run (`hinabench e2e` invocation: its run_id) on its own, with a `run` column: a
    results folder holds several runs, and each run's per-layer cost is two depths timed minutes apart,
    so the runs are the samples a verdict over the day is taken from."""
    import pandas as pd
    if "run_id" not in df or not df["run_id"].notna().any():
        return per_layer(df, phase).assign(run="")
    parts = [per_layer(g, phase).assign(run=str(run)) for run, g in df.groupby("run_id")]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else per_layer(df.iloc[0:0], phase).assign(run="")


def _run_costs(runs, model: str, engine: str, batch: int) -> dict:
    """{run: its per_layer_by_run row} where the per-layer cost is above twice its spread (the rule
    `tables` applies to one run: below it the deeper model was not reliably slower)."""
    if not len(runs):
        return {}
    r = runs[(runs["model"] == model) & (runs["engine"] == engine) & (runs["batch"] == batch)]
    return {row["run"]: row for _, row in r.iterrows()
            if row["per_layer_ms"] is not None and row["per_layer_ms"] == row["per_layer_ms"]
            and row["per_layer_ms"] >= 2 * row["mad_ms"]}


def run_ratios(runs, model: str, engine: str, other: str, batch: int = 1) -> list[tuple[str, float]]:
    """(run, other's per-layer ms / engine's) for every run that has both per-layer costs (_run_costs)."""
    h, o = _run_costs(runs, model, engine, batch), _run_costs(runs, model, other, batch)
    return sorted((run, o[run]["per_layer_ms"] / h[run]["per_layer_ms"]) for run in h if run in o)


def roofline_ratios(runs, model: str, engine: str, batch: int = 1) -> list[tuple[str, float]]:
    """(run, engine's per-layer ms / its roofline in that run) for every run with a per-layer cost
    (_run_costs) whose layers do not fit the L3 (the issue's roofline target)."""
    return sorted((run, row["per_layer_ms"] / row["roofline_ms"])
                  for run, row in _run_costs(runs, model, engine, batch).items()
                  if row.get("roofline_ms") is not None and row["roofline_ms"] == row["roofline_ms"])


def _over_runs(rr, m: str, what: str, bound: float, at_least: bool) -> str:
    """The line of a target judged on the median of several runs' ratios."""
    med = statistics.median(x for _, x in rr)
    days = sorted({str(run)[:8] for run, _ in rr})
    ok = med >= bound if at_least else med <= bound
    return (f"- {m}: {what}, over {len(rr)} runs{' of ' + days[0] if len(days) == 1 and days[0].isdigit() else ''}: "
            f"median {_against(med, bound)}x (runs {min(x for _, x in rr):.2f}-{max(x for _, x in rr):.2f}x) -> "
            f"{'PASS' if ok else 'FAIL'}")


def _status_notes(df, engines=None) -> list[str]:
    notes = []
    bad = df[df["status"] != "ok"]
    for eng, g in bad.groupby("backend"):
        if engines and eng not in engines:
            continue
        notes.append(f"{eng}: {g['status'].iloc[0]} ({str(g['reason'].iloc[0])[:150]})")
    return notes


def _caption(df, what: str, notes: list[str]) -> str:
    """The figure's caption, its lines wrapped to the figure's width (a 6-point line of ~190 characters)."""
    import textwrap
    fp = str(df["fingerprint"].dropna().iloc[0]) if "fingerprint" in df and df["fingerprint"].notna().any() else ""
    return "\n".join(textwrap.fill(x, 190) for x in [what, fp] + notes)


def _colors(plt, engines) -> dict:
    """One colour per engine: tab10, or tab20 past ten (matplotlib's C0.. come round again after ten)."""
    cmap = plt.get_cmap("tab10" if len(engines) <= 10 else "tab20")
    return {eng: cmap(i) for i, eng in enumerate(engines)}


def _below(cap: str, height_in: float) -> float:
    """The share of a figure `height_in` inches high that `cap`'s 6-point lines take at its foot."""
    return 0.01 + (cap.count("\n") + 1) * 0.11 / height_in


def fig12(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..report.figures import _save
    df = _load(results, frame)
    pl = per_layer(df)
    pl = pl[pl["batch"] == 1] if len(pl) else pl
    if pl.empty:
        raise UserError("fig12 needs ok decode rows at batch 1")
    models = list(dict.fromkeys(pl["model"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    engines = list(dict.fromkeys(pl["engine"]))
    w = 0.8 / max(len(engines), 1)
    color = _colors(plt, engines)
    seen: set[str] = set()

    def once(label):
        if label in seen:
            return None
        seen.add(label)
        return label
    for i, eng in enumerate(engines):
        for j, m in enumerate(models):
            r = pl[(pl["engine"] == eng) & (pl["model"] == m)]
            if r.empty:
                continue
            r = r.iloc[0]
            if r["projected_ms"] is not None and r["projected_ms"] == r["projected_ms"]:
                axes[0].bar(j + i * w, 1000 / r["projected_ms"], w, label=once(f"0{eng}") and eng, color=color[eng])
                axes[1].bar(j + i * w, r["per_layer_ms"], w, yerr=r["mad_ms"], color=color[eng],
                            label=once(f"1{eng}") and eng)
            elif "," not in str(r["depths"]):
                axes[1].bar(j + i * w, r["t1_ms"] / r["n1"], w, color=color[eng], hatch="//",
                            label=once(f"2{eng}") and f"{eng} (one depth: whole step / N, LM head included)")
    for ax in axes:
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(models))], models)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not axes[0].patches:
        axes[0].text(0.5, 0.5, "one depth only: no projection", ha="center", transform=axes[0].transAxes)
    axes[0].set_ylabel("tokens/s, full depth (PROJECTED from two depths)")
    axes[1].set_ylabel("decode ms per layer, batch 1 (median, +- MAD)")
    fig.suptitle("Figure 12: end-to-end decode, batch 1")
    notes = _status_notes(df)
    cap = _caption(df, "Per-layer = (t(N2)-t(N1))/(N2-N1) of TPOT; full depth projected = t(N1) + (L-N1) x per-layer.", notes)
    fig.text(0.01, 0.01, cap, fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, _below(cap, 4.8), 1, 0.95))
    return _save(fig, "fig12", results, out_dir, cap, df)


def fig13(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..report.figures import _save
    df = _load(results, frame)
    dec = df[(df["phase"] == "decode") & (df["status"] == "ok")]
    if dec.empty:
        raise UserError("fig13 needs ok decode rows")
    # the model with the most batch sizes measured (Figure 13 is about batching), the first on a tie
    nb = dec.groupby("model", sort=False)["batch_size"].nunique()
    model = nb.idxmax()
    dec = dec[dec["model"] == model]
    nd = dec.groupby("layers")["batch_size"].nunique()   # the depth with the most batch sizes, the deepest on a tie
    depth = int(nd[nd == nd.max()].index.max())
    dec = dec[dec["layers"] == depth]
    # one row per engine and batch: the newest, where a folder holds several runs (a bar or point each)
    if "timestamp" in dec:
        dec = dec.sort_values("timestamp", kind="stable")
    dec = dec.drop_duplicates(["backend", "batch_size"], keep="last").sort_index()
    # the engines measured at several batch sizes (a folder's batch-1 runs of others are Figure 12's)
    nb = dec.groupby("backend")["batch_size"].nunique()
    if (nb > 1).any():
        dec = dec[dec["backend"].isin(nb[nb > 1].index)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    engines = list(dict.fromkeys(dec["backend"]))
    color = _colors(plt, engines)
    for eng in engines:
        g = dec[dec["backend"] == eng].sort_values("batch_size")
        axes[0].plot(g["batch_size"], g["tokens_per_s"], "o-", label=eng, color=color[eng])
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("batch (sequences)")
    axes[0].set_ylabel(f"decode tokens/s ({depth} layers, measured)")
    axes[0].legend(fontsize=8)
    sh = dec[dec["ffn_share"].notna()]
    batches = sorted(set(sh["batch_size"].astype(int)))
    eng_sh = list(dict.fromkeys(sh["backend"]))
    w = 0.8 / max(len(eng_sh), 1)
    for i, eng in enumerate(eng_sh):
        g = sh[sh["backend"] == eng].set_index("batch_size")
        xs = [k + i * w for k in range(len(batches))]
        ffn = [100 * g.loc[b, "ffn_share"] if b in g.index else 0 for b in batches]
        att = [100 * g.loc[b, "attn_share"] if b in g.index else 0 for b in batches]
        axes[1].bar(xs, ffn, w, color=color[eng], label=f"{eng}: MoE experts")
        axes[1].bar(xs, att, w, bottom=ffn, color=color[eng], alpha=0.4, hatch="..", label=f"{eng}: attention")
    axes[1].set_xticks([k + 0.4 - w / 2 for k in range(len(batches))], [str(b) for b in batches])
    axes[1].set_xlabel("batch")
    axes[1].set_ylabel("% of a decode step (timers around the blocks)")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Figure 13: batch decoding, {model}, {depth} layers")
    notes = _status_notes(df[(df["model"] == model) & (df["layers"] == depth)])
    cap = _caption(df, f"{model} with {depth} layers (the LM head is in every step: shares are of the whole step).", notes)
    fig.text(0.01, 0.01, cap, fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, _below(cap, 4.8), 1, 0.95))
    return _save(fig, "fig13", results, out_dir, cap, df)


def _ablation_run(df, model):
    """`model`'s rows of the one run that measured the most of the ablation's steps at two depths (the
    newest of equals), so that every step's speedup is over the baseline timed beside it (a newer run of
    hf and hina+fused alone made the other steps' speedups over its hf); all of them where the rows do not
    say which run they come from."""
    g = df[df["model"] == model]
    if "run_id" not in g or not g["run_id"].notna().any():
        return g
    engines = {"hf"} | {e for _, e in ABLATION}
    best = None
    for run, grp in g.groupby("run_id"):
        ok = grp[(grp["phase"] == "decode") & (grp["status"] == "ok") & (grp["batch_size"] == 1)]
        key = (sum(ok[ok["backend"] == e]["layers"].nunique() >= 2 for e in engines),
               grp["timestamp"].max() if "timestamp" in grp else "")
        if best is None or key > best[0]:
            best = (key, run)
    return g[g["run_id"] == best[1]]


def ablation(df):
    """(model, step, engine, per-layer ms or None, speedup over baseline or None, status/reason), each
    model's steps from one run (_ablation_run)."""
    out = []
    for model in dict.fromkeys(df["model"]):
        sub = _ablation_run(df, model)
        pl = per_layer(sub)
        base = pl[(pl["model"] == model) & (pl["engine"] == "hf") & (pl["batch"] == 1)] if len(pl) else pl
        b = base.iloc[0]["per_layer_ms"] if len(base) else None
        b = None if b is None or b != b else b
        for step, eng in ABLATION:
            r = pl[(pl["model"] == model) & (pl["engine"] == eng) & (pl["batch"] == 1)] if len(pl) else pl
            v = r.iloc[0]["per_layer_ms"] if len(r) else None
            v = None if v is None or v != v else v
            rows = sub[sub["backend"] == eng]
            if len(r) and not v:
                u = r.iloc[0].get("under_roofline_ms")
                why = ("per-layer cost not above the noise (two depths)" if u is None or u != u else
                       f"per-layer difference under its DRAM roofline ({u:.2f} ms): the two depths' runs disagree")
            else:
                why = "" if len(r) else (f"{rows['status'].iloc[0]}: {rows['reason'].iloc[0]}" if len(rows) else "not run")
            # the whole decode step at the deepest depth both ran (labelled as such where per-layer is missing)
            dec = sub[(sub["phase"] == "decode") & (sub["batch_size"] == 1) & (sub["status"] == "ok")]
            if "timestamp" in dec:
                dec = dec.sort_values("timestamp")   # the newest row of each last
            step_speedup, depth = None, None
            both = sorted(set(dec[dec["backend"] == "hf"]["layers"]) & set(dec[dec["backend"] == eng]["layers"]))
            if both:
                depth = int(both[-1])
                t_hf = dec[(dec["backend"] == "hf") & (dec["layers"] == depth)]["median_ms"].iloc[-1]
                t_e = dec[(dec["backend"] == eng) & (dec["layers"] == depth)]["median_ms"].iloc[-1]
                step_speedup = t_hf / t_e
            out.append(dict(model=model, step=step, engine=eng, per_layer_ms=v,
                            speedup=(b / v) if (b and v) else None, why=why, step_speedup=step_speedup,
                            step_depth=depth))
    return out


def fig14(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..report.figures import _save
    # every run's rows (not the newest per point): the ablation takes each model's steps from one run;
    # the files read once, the newest per point (the other figures' rows, the caption's) derived from them
    every = None if frame is not None else load_frame(results, latest=False)
    df = _load(results, frame if every is None else latest_per_point(every))
    ab = ablation(df if every is None else e2e_points(every))
    if not any(a["speedup"] or a["step_speedup"] for a in ab):
        raise UserError("fig14 needs ok decode rows of hf and hina at batch 1")
    models = list(dict.fromkeys(a["model"] for a in ab))
    fig, ax = plt.subplots(figsize=(10, 5.2))
    w = 0.8 / len(ABLATION)
    for i, (step, _) in enumerate(ABLATION):
        for j, m in enumerate(models):
            a = next(x for x in ab if x["model"] == m and x["step"] == step)
            if a["speedup"]:
                ax.bar(j + i * w, a["speedup"], w, color=f"C{i}", label=step if j == 0 else None)
                ax.text(j + i * w, a["speedup"], f"{a['speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
            elif a["step_speedup"]:
                ax.bar(j + i * w, a["step_speedup"], w, color=f"C{i}", hatch="//",
                       label=f"{step} (whole step, {a['step_depth']} layers)" if j == 0 else None)
                ax.text(j + i * w, a["step_speedup"], f"{a['step_speedup']:.2f}x", ha="center", va="bottom", fontsize=8)
            else:
                ax.text(j + i * w, 0.05, f"{step}: {a['why'][:40]}", rotation=90, fontsize=6, ha="center", va="bottom")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(models))], models)
    ax.set_ylabel("decode speedup over hf, batch 1\n(per layer; hatched: whole step)")
    ax.set_xlim(-0.5, len(models) - 0.1)
    ax.legend(fontsize=8)
    fig.suptitle(f"Figure 14: decode ablation ({', '.join(step for step, _ in ABLATION)})")
    notes = [f"{a['model']} {a['step']}: {a['why'][:150]}" for a in ab if not a["speedup"] and a["step"] != "baseline" and a["why"]]
    cap = _caption(df, "baseline = transformers' default experts (hf); +m = HiNa expert FFN via ExpertsInterface; "
                       "+m+l = also the dense projections and LM head on the HiNa linear kernel (not in the paper's ablation); +m+a = HiNa decode attention; "
                       "+m+l+a = both; +fused = +m+l+a with the decode step as one native call (the glue between the kernels in C++).", notes)
    fig.text(0.01, 0.01, cap, fontsize=6, va="bottom")
    fig.tight_layout(rect=(0, _below(cap, 5.2), 1, 0.95))
    return _save(fig, "fig14", results, out_dir, cap, df)


def table4_rows(df):
    """Prefill throughput rows: ok prefill rows at batch 1, tokens/s by prompt length."""
    if df.empty or "phase" not in df or "batch_size" not in df:
        return df.iloc[0:0]
    p = df[(df["phase"] == "prefill") & (df["batch_size"] == 1)]
    return p


def table4(results: list[str], out_dir: str | None = None, frame=None) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ..report.figures import _save
    df = _load(results, frame)
    p = table4_rows(df)
    p = p[p["status"] == "ok"]
    if p.empty:
        raise UserError("table4 needs ok prefill rows at batch 1 (hinabench e2e --prefill 512,1024,...)")
    text = table4_markdown(p)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.3 * text.count("\n")))
    ax.axis("off")
    ax.text(0, 1, text, family="monospace", fontsize=8, va="top")
    fig.suptitle("Table 4: prefill throughput (tokens/s, batch 1)")
    cap = _caption(df, "tokens/s = P / TTFT (median over rounds); per model and depth.", [])
    return _save(fig, "table4", results, out_dir, cap, df)


def table4_markdown(p) -> str:
    lines = ["| model | layers | engine | " + " | ".join(f"P={int(x)}" for x in sorted(set(p["prompt_tokens"]))) + " |"]
    Ps = sorted(set(p["prompt_tokens"]))
    lines.append("|---" * (3 + len(Ps)) + "|")
    for (m, L, eng), g in p.groupby(["model", "layers", "backend"]):
        g = g.set_index("prompt_tokens")
        cells = [f"{g.loc[x, 'tokens_per_s']:.0f}" if x in g.index else "" for x in Ps]
        lines.append(f"| {m} | {int(L)} | {eng} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(rows: list[dict]) -> str:
    """The rows just measured, as Markdown: median +- MAD, tokens/s, shares, status."""
    lines = ["| model | layers | engine | phase | B | P | median ms | MAD | tok/s | FFN % | attn % | rel_err | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        try:
            return format(float(v), fmt)
        except (TypeError, ValueError):
            return ""
    for r in rows:
        share = lambda k: f(100 * float(r[k]), ".0f") if r.get(k) is not None else ""  # noqa: E731
        lines.append(f"| {r['model']} | {r['layers']} | {r['backend']} | {r['phase']} | {r['batch_size']} | "
                     f"{r['prompt_tokens']} | {f(r.get('median_ms'), '.1f')} | {f(r.get('mad_ms'), '.1f')} | "
                     f"{f(r.get('tokens_per_s'), '.1f')} | {share('ffn_share')} | {share('attn_share')} | "
                     f"{f(r.get('rel_err'), '.1e')} | {r['status']}{(': ' + str(r['reason'])[:60]) if r.get('reason') else ''} |")
    return "\n".join(lines)


def tables(df, runs=None) -> str:
    """The note's tables from stored rows: decode and prefill per depth (median +- MAD), the per-layer
    cost from two depths with the speedups and the roofline ratio, and the issue's targets judged.
    `runs`: the same rows with every run kept (load_frame(..., latest=False)); where two or more runs
    measured both engines, each peer target is also judged on the median of the runs' ratios, and so is
    the roofline target where two or more runs have the engine's per-layer cost."""
    df = e2e_points(df)
    if df.empty:
        raise UserError("no end-to-end rows (op e2e) in the results given")
    runs = per_layer_by_run(df if runs is None else e2e_points(runs))
    out = ["### Decode (TPOT) and prefill (TTFT) per depth", "",
           "| model | layers | engine | B | TTFT ms | TPOT ms (median +- MAD) | tok/s | FFN % | attn % | rel_err | status |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    dec = df[df["phase"] == "decode"].sort_values(["model", "layers", "batch_size", "backend"])
    for _, r in dec.iterrows():
        pre = df[(df["phase"] == "prefill") & (df["model"] == r["model"]) & (df["layers"] == r["layers"])
                 & (df["backend"] == r["backend"]) & (df["batch_size"] == r["batch_size"])
                 & (df["prompt_tokens"] == r["prompt_tokens"])]
        ttft = pre["median_ms"].iloc[-1] if len(pre) and pre["median_ms"].notna().any() else None
        if r["status"] != "ok" and r["status"] != "wrong":
            out.append(f"| {r['model']} | {int(r['layers'])} | {r['backend']} | {int(r['batch_size'])} | | | | | | | "
                       f"{r['status']}: {str(r['reason'])[:80]} |")
            continue
        f = lambda v, fmt=".1f": "" if v is None or v != v else format(v, fmt)  # noqa: E731
        out.append(f"| {r['model']} | {int(r['layers'])} | {r['backend']} | {int(r['batch_size'])} | {f(ttft, '.0f')} | "
                   f"{f(r['median_ms'])} +- {f(r['mad_ms'])} | {f(r['tokens_per_s'], '.2f')} | "
                   f"{f(100 * r['ffn_share'], '.0f') if r['ffn_share'] == r['ffn_share'] else ''} | "
                   f"{f(100 * r['attn_share'], '.0f') if r['attn_share'] == r['attn_share'] else ''} | "
                   f"{f(r['rel_err'], '.1e')} | {r['status']} |")
    pl = per_layer(df)
    out += ["", "### Per layer (decode, from two depths; 'paired': both depths in one process, round by round)", "",
            "| model | engine | B | depths | ms per layer (+- MAD) | roofline ms/layer | ratio | projected full-depth tok/s |",
            "|---|---|---|---|---|---|---|---|"]
    roof, cached = {}, {}
    for _, r in pl.iterrows():
        rows = df[(df["phase"] == "decode") & (df["status"] == "ok") & (df["model"] == r["model"])
                  & (df["backend"] == r["engine"]) & (df["batch_size"] == r["batch"])]
        # the roofline streams every layer's bytes from DRAM each step; when the deeper model's layers fit
        # in the L3 (a 480 MiB one would hold a 4-layer Qwen3-30B-A3B step), they may stay cached between
        # steps, and then the DRAM time is no lower bound: a pass is withheld, a miss still fails (a cache
        # can only make the step faster). On the AMX Xeon whose sysinfo says 480 MiB, a 1 GiB read between
        # decode steps did not change the step time (2026-12-02): there the layers were not served from it.
        depth = max(int(float(x)) for x in str(r["depths"]).split(",") if x.strip())
        rl, fits = _layer_roofline(df, r["model"], rows, depth)
        roof[(r["model"], r["engine"], r["batch"])] = rl
        if fits:
            llc = _llc_bytes(df, r["model"])
            cached[(r["model"], r["engine"], r["batch"])] = (
                f"{depth} layers x {rows['layer_bytes'].max() / 1e6:.0f} MB fit in the {llc / 2**20:.0f} MiB L3: "
                f"they may be cached between steps, and the DRAM roofline is then no bound")
        v = r["per_layer_ms"]
        raw = r.get("raw_ms")
        under = r.get("under_roofline_ms")
        if (v is None or v != v) and raw is not None and raw == raw:
            why = ("not positive: noise" if not (under is not None and under == under) else
                   f"under its DRAM roofline of {under:.2f}: the depths' runs disagree")
            out.append(f"| {r['model']} | {r['engine']} | {r['batch']} | {r['depths']} | {raw:.2f} +- {r['mad_ms']:.2f} "
                       f"({why}) | | | |")
            continue
        if v is None or v != v:
            out.append(f"| {r['model']} | {r['engine']} | {r['batch']} | {r['depths']} | (one depth) | | | |")
            continue
        proj = 1000 * r["batch"] / r["projected_ms"] if r["projected_ms"] else None
        how = f" (paired; the depths' runs: {r['sequential_ms']:.2f})" if r.get("paired") is True else ""
        out.append(f"| {r['model']} | {r['engine']} | {r['batch']} | {r['depths']} | {v:.2f} +- {r['mad_ms']:.2f}{how} | "
                   f"{'' if rl is None else format(rl, '.2f')} | {'' if rl is None else format(v / rl, '.2f')}"
                   f"{' (fits the L3)' if (r['model'], r['engine'], r['batch']) in cached else ''} | "
                   f"{'' if proj is None else format(proj, '.2f')} (projected) |")
    out += ["", "### The issue's targets (batch 1, per layer, same day)", ""]

    noisy, under = set(), set()

    def batch1(m, e):   # the per-layer row of (model, engine) at batch 1 (empty if none)
        return pl[(pl["model"] == m) & (pl["engine"] == e) & (pl["batch"] == 1)] if len(pl) else pl

    def mad_of(m, e):
        r = batch1(m, e)
        return float(r["mad_ms"].iloc[0]) if len(r) and r["mad_ms"].iloc[0] is not None else 0.0

    def layer(m, e):
        r = batch1(m, e)
        v = r["per_layer_ms"].iloc[0] if len(r) else None
        if v is None or v != v:
            if len(r) and r["raw_ms"].iloc[0] == r["raw_ms"].iloc[0] and r["raw_ms"].iloc[0] is not None:
                u = r["under_roofline_ms"].iloc[0]   # set on every row with a raw difference
                (under if u is not None and u == u else noisy).add((m, e))
            return None
        if v < 2 * r["mad_ms"].iloc[0]:   # the deeper model was not reliably slower: noise, no verdict
            noisy.add((m, e))
            return None
        return v
    for m in dict.fromkeys(df["model"]):
        # `hina` (experts), and where measured `hina+l` (+ the dense projections), `hina+a` (+ decode attention)
        # and `hina+l+a` (both)
        for eng in [e for e in HINA
                    if e not in INT8 and (e == "hina" or ((df["model"] == m) & (df["backend"] == e)).any())]:
            h = layer(m, eng)
            for other, need in (("hf", 1.5), ("vllm", 1.2), ("llamacpp:bf16", 1.0)):
                o = layer(m, other)
                if h is None or o is None:
                    st = df[(df["model"] == m) & (df["backend"] == other)]["status"]
                    bad = [e for e in (eng, other) if (m, e) in noisy]
                    low = [e for e in (eng, other) if (m, e) in under]
                    why = (f"{other} {st.iloc[0]}" if len(st) and st.iloc[0] != "ok" else
                           f"the per-layer cost of {' and '.join(bad)} is not above twice its spread (two depths, noisy machine)"
                           if bad else
                           f"the per-layer difference of {' and '.join(low)} is under its DRAM roofline (the depths' runs disagree)"
                           if low else f"no per-layer {other if h else eng} cost")
                    out.append(f"- {m}: {eng} >= {need}x {other} per layer: n/a ({why})")
                else:
                    sp = _ratio_spread(o / h, (h, mad_of(m, eng)), (o, mad_of(m, other)))
                    out.append(f"- {m}: {eng} >= {need}x {other} per layer: {_against(o / h, need)}x -> "
                               f"{_verdict(o / h, need, sp, True)} ({h:.2f} vs {o:.2f} ms)")
                rr = run_ratios(runs, m, eng, other)
                if len(rr) >= 2:   # several runs in the rows given: the verdict on their median ratio
                    out.append(_over_runs(rr, m, f"{eng} >= {need}x {other} per layer", need, True))
            rl = roof.get((m, eng, 1))
            if h is not None and rl and (m, eng, 1) in cached and h / rl <= 1.25:
                out.append(f"- {m}: {eng} per layer within 1.25x of its roofline: n/a ({cached[(m, eng, 1)]}; "
                           f"{h:.2f} ms vs {rl:.2f} ms)")
            elif h is not None and rl:
                sp = _ratio_spread(h / rl, (h, mad_of(m, eng)))
                out.append(f"- {m}: {eng} per layer within 1.25x of its roofline: {_against(h / rl, 1.25)}x -> "
                           f"{_verdict(h / rl, 1.25, sp, False)} ({h:.2f} ms vs {rl:.2f} ms)")
            rr = roofline_ratios(runs, m, eng)
            if len(rr) >= 2:   # as the peer targets: the median of the runs' ratios (each against its own probe)
                out.append(_over_runs(rr, m, f"{eng} per layer within 1.25x of its roofline", 1.25, False))
            pre = df[(df["phase"] == "prefill") & (df["model"] == m) & (df["batch_size"] == 1) & (df["status"] == "ok")
                     & (df["prompt_tokens"] == 128)]
            for L in sorted(set(pre["layers"])):
                at = pre[pre["layers"] == L].set_index("backend")
                g = at["median_ms"]
                if eng in g and "hf" in g:
                    # the per-layer targets' rule: a margin within the two TTFTs' MADs is INCONCLUSIVE
                    mad = at["mad_ms"] if "mad_ms" in at else g * float("nan")
                    x = g["hf"] / g[eng]
                    sp = _ratio_spread(x, (g[eng], mad[eng]), (g["hf"], mad["hf"]))
                    out.append(f"- {m} L{int(L)}: TTFT(128) {eng} <= hf: {g[eng]:.0f} vs {g['hf']:.0f} ms -> "
                               f"{_verdict(x, 1.0, sp, True)}")
        for eng in [e for e in INT8 if ((df["model"] == m) & (df["backend"] == e)).any()]:
            # the issue's targets are the BF16 engine's: the INT8 one beside the same bytes class, no verdict
            h, o = layer(m, eng), layer(m, "llamacpp:q8_0")
            out.append(f"- {m}: {eng} per layer against llamacpp:q8_0 (same bytes class; no target): "
                       + (f"{o / h:.2f}x ({h:.2f} vs {o:.2f} ms)" if h is not None and o is not None else "n/a"))
    out += where_a_step_goes(dec)
    out += where_the_gap_goes(df)
    t4 = table4_rows(df)
    t4 = t4[t4["status"] == "ok"] if len(t4) else t4
    if len(t4):
        out += ["", "### Prefill throughput (tokens/s, batch 1; Table 4)", "", table4_markdown(t4)]
    return "\n".join(out)


def _verdict(x: float, bound: float, spread: float, at_least: bool) -> str:
    """A single run's verdict on ratio x against its bound: PASS or FAIL where x clears or misses the bound
    by more than the ratio's spread (its costs' MADs, propagated), else INCONCLUSIVE, with the spread."""
    margin = x - bound if at_least else bound - x
    if spread > 0 and abs(margin) <= spread:
        return f"INCONCLUSIVE (within its spread, +- {spread:.2f}x)"
    return "PASS" if margin >= 0 else "FAIL"


def _ratio_spread(x: float, *cost_mads: tuple[float, float]) -> float:
    """The spread of a ratio x of per-layer costs: their relative MADs added in quadrature, times x."""
    return abs(x) * sum((m / c) ** 2 for c, m in cost_mads if c and m == m and m is not None) ** 0.5


def _against(x: float, bound: float) -> str:
    """A ratio beside its target's bound: two decimals, three where two would print the bound itself
    (a median of 1.196 against 1.2 reads 1.196, not a failing 1.20)."""
    return f"{x:.3f}" if f"{x:.2f}" == f"{bound:.2f}" and x != bound else f"{x:.2f}"


def where_a_step_goes(dec) -> list[str]:
    """Per in-process decode row that has them: ms per step and per layer in the HiNa kernels' calls,
    the experts and attention blocks, transformers' RMSNorms and routers (decode_shares' pass)."""
    if "norm_ms" not in dec or not dec["norm_ms"].notna().any():
        return []
    out = ["", "### Where a decode step goes (in-process engines; ms per step / per layer, from a pass with timers)", "",
           "| model | layers | engine | B | step (timed) | step (this pass) | HiNa kernels | experts block | attention block | RMSNorms | routers |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in dec[dec["norm_ms"].notna()].iterrows():
        L = int(r["layers"])
        def c(k):
            try:
                v = float(r.get(k))
            except (TypeError, ValueError):
                return ""
            return "" if v != v else f"{v:.2f} / {v / L:.2f}"
        try:   # the pass's own step, with its timers: the experts' ms over their share of it
            step = f"{float(r['ffn_ms']) / float(r['ffn_share']):.1f}"
        except (TypeError, ValueError, ZeroDivisionError):
            step = ""
        out.append(f"| {r['model']} | {L} | {r['backend']} | {int(r['batch_size'])} | {r['median_ms']:.1f} | "
                   f"{step} | {c('kernel_ms')} | {c('ffn_ms')} | {c('attn_ms')} | {c('norm_ms')} | {c('router_ms')} |")
    out += ["", "(the kernels' calls lie inside the blocks, and Qwen3's q/k norms inside attention; the "
            "kernels' column holds the LM head's call too, once per step)"]
    return out


def _part_rows(df, model: str, engine: str, batch: int, prompt: int, n1: int, n2: int):
    """The decode rows at depths n1 and n2 that carry the fused layer's parts, of one run (_one_run):
    (row at n1, row at n2) or None."""
    g = df[(df["phase"] == "decode") & (df["status"] == "ok") & (df["model"] == model) & (df["backend"] == engine)
           & (df["batch_size"] == batch) & (df["prompt_tokens"] == prompt) & df["layers"].isin([n1, n2])]
    g = _one_run(g[g["layer_parts"].notna() & (g["layer_parts"].astype(str) != "")])
    if "run_id" in g and g["run_id"].notna().any() and g["run_id"].nunique() != 1:
        return None   # no run has both depths: no pair of depths from two runs
    if "timestamp" in g:
        g = g.sort_values("timestamp")
    a, b = g[g["layers"] == n1], g[g["layers"] == n2]
    return (a.iloc[-1], b.iloc[-1]) if len(a) and len(b) else None


def gap_parts(df) -> list[dict]:
    """Per (model, engine, batch) with the fused layer's parts at two depths: each part's ms per layer from
    the two depths ((t(n2) - t(n1)) / (n2 - n1), from the pass with timers), its bytes per layer, its time
    at the rows' best read probe, and the excess over it; with the timed per-layer cost and its roofline."""
    if "layer_parts" not in df:
        return []
    out = []
    for _, pl in per_layer(df).iterrows():
        if pl["per_layer_ms"] is None or pl["per_layer_ms"] != pl["per_layer_ms"] or "," not in str(pl["depths"]):
            continue
        n1, n2 = (int(x) for x in str(pl["depths"]).split(","))
        two = _part_rows(df, pl["model"], pl["engine"], int(pl["batch"]), int(pl["prompt"]), n1, n2)
        if two is None:
            continue
        p1, p2 = (json.loads(r["layer_parts"]) for r in two)
        probes = [float(r["read_gbps"]) for r in two if "read_gbps" in r and r["read_gbps"] == r["read_gbps"]]
        if not probes:
            continue
        gbps = max(probes)
        parts = []
        for k in p2:
            if k not in p1:
                continue
            ms = (p2[k]["ms"] - p1[k]["ms"]) / (n2 - n1)
            by = p2[k].get("bytes", 0)
            at = by / (gbps * 1e9) * 1e3 if by else 0.0
            parts.append(dict(part=k, ms=ms, bytes=by, probe_ms=at, excess_ms=ms - at))
        out.append(dict(model=pl["model"], engine=pl["engine"], batch=int(pl["batch"]), depths=pl["depths"],
                        per_layer_ms=float(pl["per_layer_ms"]), gbps=gbps, parts=parts,
                        roofline_ms=sum(x["probe_ms"] for x in parts)))
    return out


def where_the_gap_goes(df) -> list[str]:
    """The roofline target's gap named part by part (issue 15: "the note names where it goes"): gap_parts
    as a table per (model, engine, batch). The parts come from the pass with timers (one pass of a few
    steps), the per-layer cost the target judges from the timed passes: each part's share is of the gap in
    the pass it was measured in, and the two passes' per-layer costs are given side by side."""
    gp = gap_parts(df)
    if not gp:
        return []
    out = ["", "### Where the per-layer roofline gap goes (the fused layer's own timers; per layer, from two depths)"]
    for g in gp:
        tot = sum(x["ms"] for x in g["parts"])
        gap = tot - g["roofline_ms"]
        out += ["", f"{g['model']} {g['engine']} B={g['batch']} (depths {g['depths']}, bytes at the best read probe "
                f"of its rows, {g['gbps']:.1f} GB/s):", "",
                "| part | ms / layer | MB / layer | at the probe, ms | x the probe's time | excess ms | share of the gap |",
                "|---|---|---|---|---|---|---|"]
        for x in g["parts"]:
            ratio = f"{x['ms'] / x['probe_ms']:.2f}" if x["probe_ms"] > 0 else "-"
            share = f"{100 * x['excess_ms'] / gap:.0f}%" if gap > 0 else "-"
            out.append(f"| {x['part']} | {x['ms']:.3f} | {x['bytes'] / 1e6:.1f} | {x['probe_ms']:.3f} | {ratio} | "
                       f"{x['excess_ms']:.3f} | {share} |")
        out.append(f"| all parts | {tot:.3f} | {sum(x['bytes'] for x in g['parts']) / 1e6:.1f} | "
                   f"{g['roofline_ms']:.3f} | {tot / g['roofline_ms']:.2f} | {gap:.3f} | 100% |")
        out += ["", f"the timed passes: {g['per_layer_ms']:.3f} ms a layer ({g['per_layer_ms'] / g['roofline_ms']:.2f}x "
                f"the probe's time); the pass with timers: {tot:.3f} in its parts. Their difference "
                f"({g['per_layer_ms'] - tot:+.3f} ms) is the time outside the parts and the two passes' noise."]
    return out
