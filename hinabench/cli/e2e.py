"""`hinabench e2e`: whole-model prefill and decode of synthetic-weight MoE checkpoints, per engine."""
from __future__ import annotations

import click

from . import command_line, ints, names


@click.command()
@click.option("--model", "model_names", default="qwen3-30b-a3b", show_default=True,
              help="Model(s), comma-separated: qwen3-30b-a3b, mixtral-8x7b, qwen2-57b-a14b.")
@click.option("--layers", default="2,4", show_default=True,
              help="Depths (decoder layers) to build and time, comma-separated; two depths give the per-layer cost.")
@click.option("--prompt", default=128, show_default=True, type=click.IntRange(1, 65536), help="Prompt tokens P.")
@click.option("--gen", default=128, show_default=True, type=click.IntRange(2, 65536), help="Generated tokens per sequence.")
@click.option("--batch", default="1", show_default=True, help="Batch sizes (sequences), comma-separated.")
@click.option("--engines", default="hina,hf", show_default=True,
              help="Engines, comma-separated: hina, hf, hina+l, hina+a, hina+l+a, vllm, llamacpp (bf16 and q8_0), ipex, kt, or all.")
@click.option("--prefill", default=None,
              help="Table 4: prompt lengths timed as prefill at batch 1, comma-separated (e.g. 512,1024,2048).")
@click.option("--prefill-engines", default="hina,hf", show_default=True, help="Engines timed for --prefill.")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(1, 100), help="Interleaved rounds.")
@click.option("--paired/--no-paired", default=True, show_default=True,
              help="With two depths or more: at the second-shallowest, each round also decodes the model cut to its "
                   "first (shallowest-depth) layers, in one process, and the in-process engines' per-layer cost comes "
                   "from those pairs (the machine's drift between the depths' processes stays out of it).")
@click.option("--seed", default=0, show_default=True, type=int, help="Weights' seed (the checkpoint's).")
@click.option("--threads", default=None, type=click.IntRange(1, None), help="Threads (default: torch's).")
@click.option("--mem-gib", default=7.0, show_default=True, type=click.FloatRange(1, 4096),
              help="Memory budget: the fp32 reference runs only when it fits.")
@click.option("--out", default=None, help="Results file (default: results/<machine>/e2e-<model>-<time>.csv).")
@click.option("--show-patch", is_flag=True, help="Print the drop-ins (hinabench/e2e/dropin.py, dropin_attention.py, dropin_cache.py, dropin_int8.py, dropin_layer.py) and their line counts, and exit.")
@click.option("--checkpoint-only", is_flag=True, help="Write (or find) the checkpoints and exit.")
@click.option("--tables", "tables_from", default=None,
              help="Print the note's tables (per depth, per layer, the targets, Table 4) from stored rows "
                   "(a results file, folder or glob), and exit. Rows of several runs: the newest per point, "
                   "and each peer target and the roofline target also over the runs (the median of each run's "
                   "per-layer ratio).")
@click.option("--gguf", "gguf_types", default=None,
              help="Also write the checkpoint as GGUF, comma-separated types (bf16, q8_0), and exit.")
def e2e(model_names, layers, prompt, gen, batch, engines, prefill, prefill_engines, rounds, paired, seed, threads,
        mem_gib, out, show_patch, checkpoint_only, tables_from, gguf_types):
    """Decode and prefill of real MoE model configurations (synthetic weights, N layers) on every
    engine that runs here, validated against transformers fp32 first: TTFT, TPOT (median +- MAD),
    tokens/s by batch, the FFN's share of decode, prefill throughput by P (Figures 12-14, Table 4)."""
    if show_patch:
        from ..e2e.patch import patch_text
        text, n = patch_text()
        click.echo(text)
        click.echo(f"# the drop-in: {n} lines of code (blank lines, comments and docstrings not counted)")
        text, n = patch_text("dropin_attention.py")
        click.echo("\n" + text)
        click.echo(f"# the attention drop-in (engine hina+a): {n} lines of code, counted the same way")
        text, n = patch_text("dropin_cache.py")
        click.echo("\n" + text)
        click.echo(f"# its KV cache appended in place (engines hina+a, hina+l+a): {n} lines of code, counted "
                   f"the same way")
        text, n = patch_text("dropin_int8.py")
        click.echo("\n" + text)
        click.echo(f"# the INT8 experts (engines hina+l+a:int8, hina+fused:int8): {n} lines of code, counted the same way")
        text, n = patch_text("dropin_layer.py")
        click.echo("\n" + text)
        click.echo(f"# the decoder's decode step as one native call (engines hina+fused, hina+fused:int8): {n} lines of code, "
                   f"counted the same way")
        return
    if tables_from:
        from ..e2e.figures import tables
        from ..harness.store import latest_per_point, load_frame
        every = load_frame(tables_from, latest=False)   # the files read once; the newest per point from them
        click.echo(tables(latest_per_point(every), runs=every))
        return
    from ..e2e.checkpoint import checkpoint
    models = names(model_names) or []
    depths = ints(layers, "--layers")
    if checkpoint_only or gguf_types:
        for m in models:
            for n in depths:
                ck = checkpoint(m, n, seed, echo=click.echo)
                click.echo(str(ck.path))
                for t in names(gguf_types) or []:
                    from ..e2e.gguf_writer import write_gguf
                    click.echo(str(write_gguf(ck, t, echo=click.echo)))
        return
    from pathlib import Path
    import time
    from ..e2e.engines import expand
    from ..e2e.run import E2EConfig, run_e2e
    from ..harness.store import ResultStore
    from ..machine.sysinfo import check_threads, machine_id
    if threads:
        check_threads([threads])
    cfg = E2EConfig(models=models, layers=depths, prompt=prompt, gen=gen, batches=ints(batch, "--batch"),
                    engines=expand(names(engines) or []), prefill=ints(prefill, "--prefill") if prefill else [],
                    prefill_engines=expand(names(prefill_engines) or []), rounds=rounds, paired=paired, seed=seed,
                    threads=threads or 0, mem_budget=int(mem_gib * 2**30), command=command_line())
    if out is None:
        out = str(Path("results") / machine_id() / f"e2e-{models[0]}-{time.strftime('%Y%m%d-%H%M%S')}.csv")
    store = ResultStore(out, op="e2e")
    store.open_for_append()
    rows = run_e2e(cfg, store, echo=click.echo)
    from ..e2e.figures import summary_table
    click.echo(summary_table(rows))
    click.echo(f"{len(rows)} rows -> {out}")


COMMANDS = [e2e]
