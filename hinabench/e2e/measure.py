"""Validation, then timing, of the in-process engines (`hf`, `hina`) on one checkpoint.

Both engines are the *same* transformers model object: `hf` runs it as transformers ships it (its
default experts implementation), `hina` after `dropin.use_hina` (transformers' experts interface),
so the weights are loaded once and the two are timed in interleaved rounds.

Validation (before any timing): teacher-forced logits of the validation prompt against transformers
in float32 on the same checkpoint and ids (relative L2 over all positions, `LOGIT_TOLERANCE`), argmax
agreement per position and the first greedy steps. Random weights give near-uniform logits, so argmax
is fragile: only the logits decide `wrong`; the argmax figures are reported beside them. When the fp32
model does not fit in the memory budget, the reference is transformers' own bf16 run (eager experts),
and the row says so.

Timing: TTFT is one prefill of B x P prompt tokens (a fresh cache, logits of the last position, argmax);
TPOT is each decode step after it (one token per sequence, the cache growing from P), median and MAD
over the steps of every round. The FFN's and attention's share of decode comes from a separate pass with
timers (forward hooks) around every experts module and every attention module.
"""
from __future__ import annotations

import functools
import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..harness.stats import summarize
from .peer_run import resident

LOGIT_TOLERANCE = 0.03       # relative L2 of the prompt logits against transformers fp32 (bf16 weights and activations)
# the INT8 engine's: its experts' weights and activations rounded to int8 per group (the scheme's own error,
# ~1% per product, hinabench.quant), beside the bf16 rounding above
LOGIT_TOLERANCE_INT8 = 0.08
VALIDATE_TOKENS = 32
GREEDY_STEPS = 4
DECODE_CHECK = 8         # the validation prompt's last tokens, checked again as teacher-forced decode steps


def logit_tolerance(engine: str) -> float:
    from .engines import INT8
    return LOGIT_TOLERANCE_INT8 if engine in INT8 else LOGIT_TOLERANCE


def _moe_block(layer):
    """A decoder layer's MoE block (`mlp`, or Mixtral's older `block_sparse_moe`), or None."""
    return getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)


def moe_blocks(model):
    """(experts modules, attention modules) of every decoder layer."""
    experts, attn = [], []
    for layer in model.model.layers:
        moe = _moe_block(layer)
        if moe is not None and hasattr(moe, "experts"):
            experts.append(moe.experts)
        attn.append(layer.self_attn)
    return experts, attn


def load(path: Path, dtype=torch.bfloat16, experts: str | None = None):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    kw = {"experts_implementation": experts} if experts else {}
    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kw)
    m.eval()
    return resident(m)   # the weights into memory at load


@contextmanager
def first_layers(model, n: int):
    """The model cut to its first `n` decoder layers while the block runs (run.py's paired depths): the
    same modules and tensors, so the N-layer checkpoint's bytes (the seeded fill is per tensor name: its
    embedding, layers 0..n-1, final norm and LM head are these), and the config's layer count (and
    per-layer lists) cut with them, so that a new cache has n layers. Restored on the way out."""
    inner, cfg = model.model, model.config
    full, saved = inner.layers, {k: getattr(cfg, k) for k in ("num_hidden_layers", "layer_types") if hasattr(cfg, k)}
    if not 1 <= n <= len(full):
        raise ValueError(f"first_layers: {n} of a {len(full)}-layer model")
    inner.layers = torch.nn.ModuleList(list(full)[:n])
    cfg.num_hidden_layers = n
    if saved.get("layer_types") is not None:
        cfg.layer_types = list(saved["layer_types"])[:n]
    try:
        yield model
    finally:
        inner.layers = full
        for k, v in saved.items():
            setattr(cfg, k, v)


def set_engine(model, engine: str, default_impl: str, default_attn: str = "sdpa") -> str:
    """Put the model in `engine`'s configuration; returns what runs: "experts=... attn=...[ linear=hina]"."""
    from . import dropin_linear
    from .engines import FUSED, HINA, INT8, WITH_ATTENTION, WITH_LINEAR
    if engine in INT8:
        from . import dropin_int8
        dropin_int8.use_hina_int8(model)
    elif engine in HINA:
        from . import dropin
        dropin.use_hina(model)
    else:
        model.set_experts_implementation(default_impl)
    if engine in WITH_ATTENTION:
        from . import dropin_attention
        dropin_attention.use_hina_attention(model)
    elif model.config._attn_implementation != default_attn:
        model.set_attn_implementation(default_attn)
    dropin_linear.use_hina_linear(model, on=engine in WITH_LINEAR)
    if engine in FUSED or any("forward" in layer.__dict__ for layer in model.model.layers):
        from . import dropin_layer
        dropin_layer.use_hina_layer(model, on=engine in FUSED)
    return (f"experts={model.config._experts_implementation} attn={model.config._attn_implementation}"
            + (" linear=hina" if engine in WITH_LINEAR else "") + (" layer=hina" if engine in FUSED else ""))


def new_cache(model):
    """The KV cache a pass decodes with: appended in place under HiNa attention (dropin_cache.py),
    transformers' DynamicCache otherwise."""
    if model.config._attn_implementation == "hina":
        from .dropin_cache import append_cache
        return append_cache(model.config)
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


# ---- validation --------------------------------------------------------------------------------------
@dataclass
class Reference:
    ids: torch.Tensor            # [1, Pv]
    logits: torch.Tensor         # [Pv, V] float32
    greedy: list[int]            # the reference's first greedy tokens after the prompt
    what: str                    # "transformers fp32" or why another reference
    near_tie: str | None = None  # the prompt's closest router decision, when under NEAR_TIE (see router_near_tie)
    router_margin: float | None = None   # the prompt's closest router decision (k-th minus (k+1)-th logit)
    # the reference's prompt log-probs with one near-tie decision taken the other way: [(words, [Pv - 1])]
    alternates: list = field(default_factory=list)

    @functools.cached_property
    def logprobs(self) -> torch.Tensor:
        """The reference's own prompt log-probs [Pv - 1] (what every engine's are judged against), once."""
        return prompt_logprobs_of(self.ids, self.logits)

    def why_wrong(self, reason: str) -> str:
        """A mismatch's reason, with the reference's router near-tie when it has one."""
        alt = (f"; nor within it of the reference with any of its {len(self.alternates)} closest router "
               f"decisions taken the other way" if self.alternates else "")
        return reason + alt + (f"; {self.near_tie}" if self.near_tie else "")


# A router whose k-th and (k+1)-th expert logits are closer than this for some prompt token can be flipped
# by bf16 rounding: that token then takes another expert, and its log-probs and every later token's move
# (seen: Mixtral-8x7B's synthetic weights at 2 layers, margin 0.009, 0.32-0.34 nats for vLLM and llama.cpp).
NEAR_TIE = 0.02
PROMPT_CANDIDATES = 8        # validation prompts `reference` tries for one without such a near-tie
# When every candidate has one: the reference is also made with each of its ALTERNATES closest router
# decisions (under NEAR_TIE) taken the other way, one at a time, and an engine's prompt log-probs are judged
# against the closest of these (`logprob_match`). Measured (Qwen3-30B-A3B, 4 layers, Zen 5, 2026-12-05):
# hina+fused's log-probs 0.081 nats from the reference, 0.040 from it with layer 3's decision for token 1
# (0.0016 from a tie) taken the other way; transformers' own bf16 run 0.035 from the reference as made.
ALTERNATES = 8
LOGPROB_TOLERANCE_BF16 = 0.05   # nats: a bf16 engine's prompt log-probs (run.py: LOGPROB_TOLERANCE)


def _router_hooks(model, margins: list, flip: tuple[int, int] | None = None):
    """Forward hooks on every MoE router (`mlp.gate`) recording (k-th minus (k+1)-th logit, layer, token) of
    every decision. flip = (layer, token): that decision taken the other way -- the (k+1)-th expert in place
    of the k-th, with the router's own weights for the k it then has (normalized where the router's are)."""
    k = int(getattr(model.config, "num_experts_per_tok", 0) or 0)
    hooks = []
    if not k:
        return hooks
    for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", [])):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is None:
            continue

        def hook(mod, inp, out, i=i):
            logits = (out[0] if isinstance(out, tuple) else out).float()
            if logits.dim() != 2 or logits.shape[-1] <= k:
                return None
            top = logits.topk(k + 1, dim=-1).values
            gap = (top[:, k - 1] - top[:, k]).tolist()
            margins.extend((g, i, t) for t, g in enumerate(gap))
            if flip is None or flip[0] != i or not (isinstance(out, tuple) and len(out) == 3):
                return None
            raw, scores, idx = out          # transformers' TopKRouter: (logits, weights, experts)
            t = flip[1]
            probs = torch.softmax(logits[t], -1)
            order = probs.topk(k + 1).indices
            sel = torch.cat([order[:k - 1], order[k:]])
            w = probs[sel]
            if abs(float(scores[t].float().sum()) - 1.0) < 1e-3:
                w = w / w.sum()
            idx, scores = idx.clone(), scores.clone()
            idx[t], scores[t] = sel.to(idx.dtype), w.to(scores.dtype)
            return raw, scores, idx
        hooks.append(gate.register_forward_hook(hook))
    return hooks


def router_near_tie(margins: list) -> str | None:
    """Words for the closest router decision of the prompt, if it is under NEAR_TIE."""
    if not margins:
        return None
    m, layer, tok = min(margins)
    if m >= NEAR_TIE:
        return None
    return (f"the reference's router in layer {layer + 1} has prompt token {tok}'s k-th and (k+1)-th expert "
            f"logits {m:.3g} apart (< {NEAR_TIE}): bf16 rounding can send that token to another expert, so "
            f"a mismatch may be the synthetic weights' near-tie, not the engine's error")


@torch.inference_mode()
def _greedy(model, ids, steps: int) -> list[int]:
    cache = new_cache(model)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    toks = []
    for _ in range(steps):
        nxt = out.logits[:, -1].float().argmax(-1, keepdim=True)
        toks.append(int(nxt))
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
    return toks


def validation_prompts(vocab_size: int, tokens: int, seed: int) -> list[torch.Tensor]:
    """The candidate validation prompts, [1, tokens] each, in the order `reference` tries them: the first
    is the prompt of seed + 1 that every earlier version used."""
    from .checkpoint import prompt_ids
    return [prompt_ids(vocab_size, 1, tokens, seed + 1 + 7919 * k) for k in range(PROMPT_CANDIDATES)]


def reference(ck, candidates: list[torch.Tensor], mem_budget: int, echo=print) -> Reference:
    """transformers fp32 logits of a validation prompt on checkpoint `ck`, cached beside it; if fp32 does
    not fit in `mem_budget` bytes, transformers' bf16 run with its eager experts (said so in `what`).

    The prompt is the first of `candidates` ([1, Pv] ids each) whose every router decision is at least
    NEAR_TIE from a tie, in the reference's own run: a prompt token that sits on a near-tie can take
    another expert under any engine's bf16 rounding and move every later log-prob, which is the synthetic
    weights' doing, not the engine's. When no candidate clears it, the first, with its near-tie recorded
    (a `wrong` row then says so): with many experts (Qwen3-30B-A3B's top 8 of 128, 32 tokens) every
    candidate has one, and the widest of such margins (0.0023 against 0.001) was no safer (measured:
    transformers' own bf16 run moved 0.079 nats on it, 0.034 on the first). `Reference.what` says which.

    The two are cached apart: an fp32 reference, once made, is always used; a bf16 one only while fp32
    does not fit (a later run with a larger --mem-gib makes the fp32 one rather than reuse bf16)."""
    ids0 = candidates[0]
    tag = "-".join(str(int(i)) for i in ids0[0, :4].tolist()) + f"-{ids0.shape[1]}-of{len(candidates)}-alt{ALTERNATES}"
    # fp32 weights (twice the bf16 checkpoint) and what transformers' loader holds beside them while it
    # converts and stacks the experts: measured 19.95 GB peak RSS for Qwen3-30B-A3B at 4 layers (6.23 GB
    # of bf16; Zen 5, 2026-12-05), where 2x + 1 GiB said 13.5 and a run at --mem-gib 13 was killed
    need = (13 * ck.bytes) // 4 + (1 << 30)
    fits = need <= mem_budget
    cached = {d: Path(ck.path) / f"reference-{tag}-{d}.pt" for d in ("fp32", "bf16")}
    what = "transformers fp32" if fits else (
        f"transformers bf16 with eager experts (fp32 needs {need / 2**30:.1f} GiB with headroom, over the "
        f"{mem_budget / 2**30:.1f} GiB budget)")
    for d in ("fp32",) if fits else ("fp32", "bf16"):
        if cached[d].exists():
            c = torch.load(cached[d])   # a bf16 one says this run's budget, not the one it was made under
            return Reference(c["ids"], c["logits"], c["greedy"],
                             (what if d == "bf16" else c["what"]) + c["prompt"], c.get("near_tie"), c["margin"],
                             c.get("alternates", []))
    cache_file = cached["fp32" if fits else "bf16"]
    dtype = torch.float32 if fits else torch.bfloat16
    echo(f"  reference: {what}")
    m = load(ck.path, dtype, experts="eager")
    best = None
    for k, ids in enumerate(candidates):
        margins: list = []
        hooks = _router_hooks(m, margins)
        with torch.inference_mode():
            logits = m(input_ids=ids).logits[0].float()
        for h in hooks:
            h.remove()
        margin = min(margins)[0] if margins else float("inf")
        if best is None:
            best = (margin, k, ids, logits, margins)
        if margin >= NEAR_TIE:
            best = (margin, k, ids, logits, margins)
            break
    margin, k, ids, logits, margins = best
    near_tie = router_near_tie(margins)
    prompt = ("" if not margins else
              f" (validation prompt {k + 1} of {len(candidates)}: closest router decision {margin:.3g} from a tie"
              + ("" if margin >= NEAR_TIE else f"; every candidate has one under {NEAR_TIE}") + ")")
    echo(f"  reference: validation prompt {k + 1}" + (
        ": the earlier ones had a router near-tie" if k else "" if margin >= NEAR_TIE else
        f": all {len(candidates)} candidates have a router near-tie, the first is kept"))
    greedy = _greedy(m, ids, GREEDY_STEPS)
    alternates = []
    if near_tie:
        close = [x for x in sorted(margins) if x[0] < NEAR_TIE][:ALTERNATES]
        echo(f"  reference: again with each of its {len(close)} closest router decisions taken the other way")
        for g, layer, tok in close:
            hooks = _router_hooks(m, [], flip=(layer, tok))
            with torch.inference_mode():
                alt = m(input_ids=ids).logits[0].float()
            for h in hooks:
                h.remove()
            alternates.append((f"layer {layer + 1}'s decision for prompt token {tok} ({g:.2g} from a tie) taken "
                               f"the other way", prompt_logprobs_of(ids, alt)))
    del m
    gc.collect()
    torch.save({"ids": ids, "logits": logits, "greedy": greedy, "what": what, "near_tie": near_tie,
                "prompt": prompt, "margin": margin, "alternates": alternates}, cache_file)
    return Reference(ids, logits, greedy, what + prompt, near_tie, margin, alternates)


@torch.inference_mode()
def validate(model, ref: Reference, tolerance: float = LOGIT_TOLERANCE) -> dict:
    """The engine's teacher-forced logits against the reference: the prompt in one forward (prefill), and
    its last DECODE_CHECK tokens again as decode steps on the engine's own cache (the decode paths: HiNa
    attention, hina+fused's native layer), each within `tolerance`; greedy steps compared, not judged."""
    from ..problems.validate import rel_err
    logits = model(input_ids=ref.ids).logits[0].float()
    err = rel_err(logits, ref.logits)
    lp_err, lp_ref = logprob_match(logits, ref, LOGPROB_TOLERANCE_BF16)
    agree = float((logits.argmax(-1) == ref.logits.argmax(-1)).float().mean())
    n = min(DECODE_CHECK, ref.ids.shape[1] - 1)
    dec_err = rel_err(_decode_logits(model, ref.ids, n), ref.logits[-n:]) if n > 0 else None
    greedy = _greedy(model, ref.ids, GREEDY_STEPS)
    match = 0
    for a, b in zip(greedy, ref.greedy):
        if a != b:
            break
        match += 1
    ok, tie = logits_ok(err, dec_err, tolerance, lp_err, lp_ref)
    return {"rel_err": err, "decode_rel_err": dec_err, "argmax_agree": agree,
            "greedy_match": f"{match}/{len(ref.greedy)}", "logprob_err": lp_err, "logprob_ref": lp_ref,
            "tolerance": tolerance, "ok": ok, "tie": tie}


def logits_ok(err: float, dec_err: float | None, tolerance: float, lp_err: float,
              lp_ref: str | None) -> tuple[bool, str | None]:
    """(ok, the near-tie that explains it): an in-process engine's logits within `tolerance` of the
    reference, as a prefill and as decode steps; else, where the engine's prompt log-probs are within
    LOGPROB_TOLERANCE_BF16 of the reference with one of its near-tie router decisions taken the other way
    (lp_ref, logprob_match's words for it), ok with those words: the test the out-of-process engines,
    which show log-probs only, pass (seen: Mixtral-8x7B's synthetic weights at 2 layers, transformers'
    grouped experts 0.041 from the bf16 eager reference in logits, 0.016 nats in log-probs with a decision
    0.008 from a tie taken the other way)."""
    if err <= tolerance and (dec_err is None or dec_err <= tolerance):
        return True, None
    if lp_ref is not None and lp_err <= LOGPROB_TOLERANCE_BF16:
        return True, lp_ref
    return False, None


@torch.inference_mode()
def _decode_logits(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """[n, V] logits of the last n tokens of `ids` [1, P], each from a decode step after a prefill of the rest."""
    cache = new_cache(model)
    model(input_ids=ids[:, :-n], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return torch.stack([model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1].float()
                        for t in range(ids.shape[1] - n, ids.shape[1])])


def prompt_logprobs_of(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for each token of ids [1, P] after the first, from [P, V] logits."""
    lp = torch.log_softmax(logits.float(), -1)
    return lp[:-1].gather(1, ids[0, 1:, None])[:, 0]


def prompt_logprobs(ref: Reference, logits: torch.Tensor) -> torch.Tensor:
    """The reference prompt's log-probs from [Pv, V] logits."""
    return prompt_logprobs_of(ref.ids, logits)


def logprob_match(got, ref: Reference, tolerance: float | None = None) -> tuple[float, str | None]:
    """(max |delta log-prob| (nats) over the prompt tokens, which reference): against the reference as made
    when that is within `tolerance` (None: never enough), else against the closest of it and its
    alternates (a near-tie router decision taken the other way: the words for it). `got` is [Pv, V]
    logits or the [Pv - 1] log-probs themselves."""
    got = (got if got.dim() == 1 else prompt_logprobs(ref, got)).float()
    best = (_max_delta(got, ref.logprobs), None)
    if tolerance is not None and best[0] <= tolerance:
        return best
    for words, lp in ref.alternates:
        err = _max_delta(got, lp)
        if err < best[0]:
            best = (err, words)
    return best


def logprob_err(got, ref: Reference) -> float:
    """max |delta log-prob| (nats) over the prompt tokens against the reference as made (its alternates:
    logprob_match); `got` is [Pv, V] logits or the [Pv - 1] log-probs themselves."""
    return _max_delta(got if got.dim() == 1 else prompt_logprobs(ref, got), ref.logprobs)


def _max_delta(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the prompt tokens (nats), in float32."""
    return float((a.float() - b.float()).abs().max())


# ---- timing ------------------------------------------------------------------------------------------
@torch.inference_mode()
def generate_timed(model, ids: torch.Tensor, gen: int) -> tuple[float, list[float]]:
    """(TTFT seconds, [seconds of each decode step]) for prompt `ids` [B, P] and `gen` new tokens."""
    cache = new_cache(model)
    t0 = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    ttft = time.perf_counter() - t0
    steps = []
    for _ in range(max(gen - 1, 0)):
        t0 = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        steps.append(time.perf_counter() - t0)
    return ttft, steps


@torch.inference_mode()
def prefill_timed(model, ids: torch.Tensor) -> float:
    cache = new_cache(model)
    t0 = time.perf_counter()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    out.logits[:, -1].argmax(-1)
    return time.perf_counter() - t0


@dataclass
class BlockTimes:
    ffn: float = 0.0
    attn: float = 0.0
    norm: float = 0.0
    router: float = 0.0
    kernels: float = 0.0
    kernel_calls: int = 0
    touched: list[int] = field(default_factory=list)
    parts: dict = field(default_factory=dict)   # the fused layer's own timers, seconds per part (LAYER_PARTS)


def _norms_and_routers(model):
    """(every RMSNorm module, every MoE router) of the model: transformers' own small blocks."""
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    routers = []
    for layer in model.model.layers:
        moe = _moe_block(layer)
        if moe is not None and getattr(moe, "gate", None) is not None:
            routers.append(moe.gate)
    return norms, routers


# the HiNa kernels' native entry points (hinabench.kernels' modules), timed as one bucket
KERNEL_ENTRIES = ("moe_ffn", "moe_ffn_tokens", "linear", "attention")


@contextmanager
def block_timers(model):
    """Timers around every experts module, attention module, RMSNorm module and MoE router (forward
    pre/post hooks) and around every call into the HiNa kernels' native modules; also the number of
    distinct experts each experts call touches. Attention's time includes its q/k norms (Qwen3), so
    `norm` and `attn` overlap there; the kernels' time lies inside the blocks'."""
    from ..kernels import _LOADED
    experts, attn = moe_blocks(model)
    norms, routers = _norms_and_routers(model)
    bt = BlockTimes()
    start = {}
    hooks = []

    def pre(kind):
        def f(mod, args, kwargs=None):
            start[id(mod)] = time.perf_counter()
            if kind == "ffn" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
                bt.touched.append(int(torch.unique(args[1]).numel()))
        return f

    def post(kind):
        def f(mod, args, out):
            dt = time.perf_counter() - start.pop(id(mod), time.perf_counter())
            setattr(bt, kind, getattr(bt, kind) + dt)
        return f

    for kind, mods in (("ffn", experts), ("attn", attn), ("norm", norms), ("router", routers)):
        for mod in mods:
            hooks.append(mod.register_forward_pre_hook(pre(kind)))
            hooks.append(mod.register_forward_hook(post(kind)))

    def timed(fn):
        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                bt.kernels += time.perf_counter() - t0
                bt.kernel_calls += 1
        return call
    wrapped = [(mod, name, getattr(mod, name)) for mod in list(_LOADED.values()) for name in KERNEL_ENTRIES
               if hasattr(mod, name)]
    for mod, name, fn in wrapped:
        setattr(mod, name, timed(fn))
    # hina+fused's native layer (dropin_layer.py) runs its blocks inside one call: its own timers say where
    profiled = [mod for mod in list(_LOADED.values()) if hasattr(mod, "decoder_layer_profile")]
    for mod in profiled:
        mod.decoder_layer_profile(True)
    try:
        yield bt
    finally:
        for h in hooks:
            h.remove()
        for mod, name, fn in wrapped:
            setattr(mod, name, fn)
        for mod in profiled:
            _add_layer_profile(bt, mod.decoder_layer_profile(False))


# The fused layer's parts (ops/layer.h's LayerProfile), in the order a decode step runs them
LAYER_PARTS = ("norms", "qkv", "rope", "attention", "o", "router", "experts", "adds")


def _add_layer_profile(bt: BlockTimes, p: dict) -> None:
    """The native layer's parts into the blocks' buckets as the hooks define them: attention is q/k/v, the
    q/k norms, rotary and the KV append, attention itself and o; the kernels are the matrix parts. Each
    part is also kept on its own (bt.parts)."""
    if not p["calls"]:
        return
    for k in LAYER_PARTS:
        bt.parts[k] = bt.parts.get(k, 0.0) + p[k]
    bt.ffn += p["experts"]
    bt.attn += p["qkv"] + p["rope"] + p["attention"] + p["o"]
    bt.norm += p["norms"]
    bt.router += p["router"]
    bt.kernels += p["qkv"] + p["attention"] + p["o"] + p["experts"]
    bt.kernel_calls += p["calls"]
    bt.touched += list(p["touched"])


@torch.inference_mode()
def decode_shares(model, ids: torch.Tensor, steps: int = 16) -> dict:
    """Per decode step: ms in the experts, in attention, in the RMSNorms, in the routers, in the HiNa
    kernels (None where the engine made no call into them), the step's ms, distinct experts touched
    per layer (a pass of its own, with timers; not the timed one)."""
    cache = new_cache(model)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    with block_timers(model) as bt:
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        total = time.perf_counter() - t0
    return {"ffn_ms": bt.ffn / steps * 1e3, "attn_ms": bt.attn / steps * 1e3, "step_ms": total / steps * 1e3,
            "ffn_share": bt.ffn / total, "attn_share": bt.attn / total,
            "norm_ms": bt.norm / steps * 1e3, "router_ms": bt.router / steps * 1e3,
            "kernel_ms": bt.kernels / steps * 1e3 if bt.kernel_calls else None,
            "experts_touched": sum(bt.touched) / max(len(bt.touched), 1),
            "parts_ms": {k: v / steps * 1e3 for k, v in bt.parts.items()} or None}


def read_probe(model, threads: int) -> tuple[float, str]:
    """Same-process read bandwidth over the first layer's expert weights (where transformers keeps them)."""
    from ..machine.probes import read_gbps
    experts, _ = moe_blocks(model)
    e = experts[0]
    bufs = [(t.data_ptr(), t.numel() * t.element_size()) for t in (e.gate_up_proj, e.down_proj)]
    gbps, name, _ = read_gbps(bufs, threads)
    return gbps, name


def stats(samples_s: list[float]) -> dict:
    return summarize(samples_s)
