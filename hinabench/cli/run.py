"""`hinabench ffn | linear | suite run`: measure points into a results file, validated first."""
from __future__ import annotations

import click

from . import command_line, format_option, ints, names

_TIMING = [
    click.option("--backends", default="all", show_default=True,
                 help="Backends or families, comma-separated (e.g. torch,onednn:prepacked,hina), or all "
                      "(every backend with a path for this problem kind)."),
    click.option("--dtype", default="bf16", show_default=True, help="Weight dtypes, comma-separated."),
    click.option("--threads", default=None, help="Thread counts, e.g. 1,2 (default: all usable CPUs)."),
    click.option("--repeats", default=0, type=click.IntRange(0, 100_000),
                 help="Samples per backend per round (default 0: calibrated from --min-time)."),
    click.option("--rounds", default=3, show_default=True, type=click.IntRange(1, 1000), help="Interleaved rounds."),
    click.option("--min-time", default=0.3, show_default=True, type=click.FloatRange(0.0, 3600, min_open=True),
                 help="Seconds of samples per backend per round when calibrating."),
    click.option("--warmup", default=2, show_default=True, type=click.IntRange(0, 1000)),
    click.option("--seed", default=0, show_default=True, type=int),
    click.option("--numa", "numa", default="default", show_default=True,
                 help="Memory policies for the weights, comma-separated: default (first touch), "
                      "interleave (all nodes, like numactl --interleave=all), bind:N; each with an optional "
                      "+thp: the weights (and a peer's own copies) on transparent huge pages "
                      "(default+thp, interleave+thp)."),
    click.option("--perf", is_flag=True, help="Count local/remote DRAM loads with perf around the samples."),
    click.option("--wait-quiet", default=0.0, show_default=True, type=click.FloatRange(0, 86400),
                 help="Before each point, wait up to this many seconds for other processes to leave the "
                      "CPUs (0: do not wait)."),
    click.option("--dtypes-apart", is_flag=True,
                 help="Measure each dtype's points on their own. By default the dtypes of one model, T and "
                      "thread count take turns in the same interleaved rounds (rows share a `cohort`), so "
                      "that their ratios (INT8 over BF16) carry no drift of the host between them."),
    click.option("--out", default=None,
                 help="Results file (.csv or .parquet). Default: results/<machine>/<command>-<model>-<time>.csv"),
    click.option("--resume", is_flag=True, help="Skip points already in --out."),
    format_option(),
    click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json."),
]


def timing_options(f):
    for opt in reversed(_TIMING):
        f = opt(f)
    return f


def _sweep(op: str, model_names: str, tokens: str, kw: dict, **axes):
    from ..harness.suite import Sweep
    return Sweep(op=op, models=[m for m in model_names.split(",") if m.strip()],
                 tokens=ints(tokens, "--tokens"), backends=kw["backends"], dtype=names(kw["dtype"]) or ["bf16"],
                 threads=ints(kw["threads"], "--threads") if kw["threads"] else None, repeats=kw["repeats"],
                 rounds=kw["rounds"], min_time=kw["min_time"], warmup=kw["warmup"], seed=kw["seed"],
                 numa=names(kw["numa"]), perf=kw["perf"], wait_quiet=kw["wait_quiet"],
                 dtypes_apart=kw["dtypes_apart"], **axes)


def _run(sweep, name: str, kw: dict) -> None:
    from ..harness.suite import run_sweep
    run_sweep(sweep, out=kw["out"], resume=kw["resume"], fmt="json" if kw["as_json"] else kw["fmt"],
              name=name, command=command_line())


@click.command()
@click.option("--model", "model_names", default="mixtral-8x7b", show_default=True,
              help="Model(s), comma-separated; see `hinabench models`.")
@click.option("--tokens", default="1,2,4,8,16", show_default=True,
              help="Tokens per expert T (same-experts routing) or batch tokens B (router routing).")
@click.option("--experts", default=None, type=click.IntRange(1, None), help="Active experts per token A (default: the model's top-k).")
@click.option("--routing", default="same-experts", show_default=True,
              help="Routing modes, comma-separated: same-experts (every token to the same A experts: "
                   "Figure 10's tokens per expert), router (a seeded softmax top-k over all experts).")
@click.option("--group", default=None, type=click.Choice(["32", "64", "128"]),
              help="int8: K elements per scale (default 128); rows carry it as quant_group.")
# the choices are problems.base.FILL_LAWS, written out: importing it would load torch at every CLI start
@click.option("--fill", default="binades", show_default=True, type=click.Choice(["binades", "normal"]),
              help="How weights and tokens are drawn: binades (magnitudes within a factor of 4: every "
                   "kernel's fast path) or normal (a bell curve over many binades, as trained weights are: "
                   "shows costs that depend on the values, such as denormals). Rows carry it as fill.")
@timing_options
def ffn(model_names, tokens, experts, routing, group, fill, **kw):
    """Time the MoE expert FFN of a model on every backend, side by side, validated first.
    --dtype bf16,int8,fp8 is a sweep axis (int8: W8A8 group-wise; fp8: e4m3, 128x128 block scales)."""
    _run(_sweep("ffn", model_names, tokens, kw, experts=experts, routing=names(routing),
                group=int(group) if group else None, fill=fill), "ffn", kw)


@click.command()
@click.option("--model", "model_names", default="qwen3-30b-a3b", show_default=True,
              help="Model(s), comma-separated; see `hinabench models`.")
@click.option("--proj", default=None,
              help="Projections, comma-separated (default: each of the model's: qkv, o, lm_head; "
                   "DeepSeek's MLA: q_a, q_b, kv_a, kv_b, o, lm_head).")
@click.option("--tokens", default="1,8,64", show_default=True, help="Batch tokens B.")
@timing_options
def linear(model_names, proj, tokens, **kw):
    """Time one dense projection (y = x W^T, W [N, K] as nn.Linear keeps it) on every backend that
    has one: the attention block's projections and the LM head, on the same micro-kernels."""
    _run(_sweep("linear", model_names, tokens, kw, proj=names(proj)), "linear", kw)


@click.group()
def suite():
    """Declared sweeps (suites/*.toml)."""


@suite.command("run")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--out", default=None,
              help="Results file (default: results/<machine>/<suite>-<model>-<time>.csv).")
@click.option("--resume", is_flag=True)
@format_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
def suite_run(path, out, resume, fmt, as_json):
    """Run the sweep a suite file declares."""
    from ..harness.suite import load_suite, run_sweep
    sweep, name = load_suite(path)
    run_sweep(sweep, out=out, resume=resume, fmt="json" if as_json else fmt, name=name,
              command=command_line())


COMMANDS = [ffn, linear, suite]
