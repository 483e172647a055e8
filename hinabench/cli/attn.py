"""`hinabench attn`: decode / extend attention over a bf16 KV cache, every backend side by side, validated first."""
from __future__ import annotations

import click

from ..errors import UserError
from . import format_option, ints, names
from .run import _run, _sweep, timing_options


@click.command()
@click.option("--model", "model_names", default="qwen3-30b-a3b", show_default=True,
              help="Model(s), comma-separated; see `hinabench models` (DeepSeek-V3's MLA is refused, with why).")
@click.option("--phase", default="decode", show_default=True,
              help="decode (one new token per sequence) and/or extend (n new tokens over a cached prefix), "
                   "comma-separated.")
@click.option("--context", default="1024,4096", show_default=True,
              help="Context lengths l, comma-separated: decode's keys per sequence, extend's cached prefix.")
@click.option("--batch", default="1", show_default=True, help="Sequences per call B, comma-separated.")
@click.option("--extend", default="128", show_default=True, help="New tokens per sequence n (--phase extend).")
@click.option("--layout", default="paged", show_default=True,
              help="KV layouts, comma-separated: paged ([num_blocks, block_size, h_kv, d] + a shuffled block "
                   "table, vLLM/SGLang) and/or contiguous ([B, h_kv, L, d], Hugging Face).")
@click.option("--block-size", default=32, show_default=True, type=click.IntRange(1, 4096),
              help="Tokens per block of the paged layout (vLLM-CPU's attention takes multiples of 32).")
@click.option("--ragged", is_flag=True, help="Sequence b gets l - (l//2) * b // (B-1) keys (l down to l/2).")
@timing_options
def attn(model_names, phase, context, batch, extend, layout, block_size, ragged, **kw):
    """Time decode or extend attention (paper Section 6) on every backend that has it, validated first
    against the fp32 SDPA reference; roofline: KV bytes read / same-process read bandwidth (decode),
    FLOPs / FMA peak (extend)."""
    sweep = _sweep("attention", model_names, batch, kw, phase=names(phase), context=ints(context, "--context"),
                   extend=ints(extend, "--extend"), layout=names(layout), block_size=block_size, ragged=ragged)
    _run(sweep, "attn", kw)


@click.command("attn-targets")
@click.argument("results", nargs=-1, required=True)
@click.option("--backend", default="hina:avx2", show_default=True, help="The hina variant to judge.")
@click.option("--threads", default=None, help="Only these thread counts, comma-separated.")
@format_option()
def attn_targets(results, backend, threads, fmt):
    """Judge the attention targets on stored rows: decode B=1, l >= 4096 at >= 0.85 of the KV-bytes
    roofline (Qwen3-30B-A3B, Mixtral); >= 2x torch:sdpa at B=1 for l >= 1024; faster than llamacpp:fa;
    extend (n=128 over 4096) faster than torch:sdpa, with its compute-bound efficiency. A comparison
    that did not run is n/a, never a pass."""
    from ..harness.store import read_rows, select_rows
    from ..report.attn_targets import VIEW, judge_attention
    from ..report.render import machines_of
    rows = select_rows(read_rows(list(results)), threads=ints(threads, "--threads") if threads else None)
    if len(machines_of(rows)) > 1:
        raise UserError("attn-targets judges one machine's rows: give one machine's results")
    verdicts = judge_attention(rows, backend)
    if not verdicts:
        raise UserError(f"no ok attention row of {backend} in those results")
    from .results import emit_verdicts
    emit_verdicts(verdicts, rows, backend, fmt, VIEW)


COMMANDS = [attn, attn_targets]
