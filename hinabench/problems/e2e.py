"""End to end: one phase (prefill of P prompt tokens, or decode steps after it) of a synthetic-weight
model cut to N layers, at batch B (issue 15; the paper's Figures 12-14 and Table 4).

The row's `backend` is the engine (hf, hina, vllm, llamacpp:bf16, ...); `median_ms` is TTFT for a
prefill row and TPOT (the median decode step) for a decode row. The engines, the checkpoint and the
timing loops are hinabench/e2e/; this kind is what the store, row keys and figures read. It is not run
by the generic runner (`materialize` refuses): `hinabench e2e` measures it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from ..models import Model, get_model
from .base import Problem


@dataclass(frozen=True)
class E2EProblem(Problem):
    kind: ClassVar[str] = "e2e"
    key_columns: ClassVar[tuple[str, ...]] = ("model", "dtype", "layers", "phase", "batch_size",
                                              "prompt_tokens", "gen_tokens")
    columns: ClassVar[tuple[str, ...]] = key_columns + (
        "full_layers", "checkpoint_hash", "engine_impl", "engine_version",
        "tokens_per_s", "tpot_ms", "ttft_ms",                 # the decode row carries its prefill's TTFT too
        "ffn_ms", "attn_ms", "ffn_share", "attn_share",       # per decode step, timers around the blocks
        "norm_ms", "router_ms", "kernel_ms",                  # ... the RMSNorms, the routers, the HiNa kernels' calls
        "layer_parts",                                        # the fused layer's parts: ms per step, bytes per layer (JSON)
        "paired_layers", "paired_per_layer_ms", "paired_mad_ms",   # the in-process per-layer cost from paired depths
        "paired_rounds", "paired_t1_ms",                      # ... (e2e/run.py): rounds, the cut model's TPOT
        "experts_touched", "layer_bytes", "step_bytes",       # what one decode step must read
        "validation", "logit_rel_err_hf", "greedy_match",
        "decode_rel_err",                                     # the prompt's last tokens as decode steps, vs the reference
        "logprob_err", "logprob_err_hf",                     # max |delta log-prob| of the prompt, nats
        "router_margin")                                     # the validation prompt's closest router decision

    model: Model
    layers: int
    phase: str              # "prefill" | "decode"
    batch: int
    prompt: int
    gen: int = 0
    dtype: str = "bf16"
    seed: int = 0

    @classmethod
    def create(cls, model: str, layers: int, phase: str, batch: int, prompt: int, gen: int = 0,
               dtype: str = "bf16", seed: int = 0) -> "E2EProblem":
        return cls(get_model(model), int(layers), phase, int(batch), int(prompt), int(gen) if phase == "decode" else 0,
                   dtype, int(seed))

    def key(self) -> dict:
        return {"model": self.model.name, "dtype": self.dtype, "layers": self.layers, "phase": self.phase,
                "batch_size": self.batch, "prompt_tokens": self.prompt, "gen_tokens": self.gen,
                "full_layers": self.model.layers}

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model.name, "layers": self.layers, "phase": self.phase,
                "batch": self.batch, "prompt": self.prompt, "gen": self.gen, "dtype": self.dtype, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "E2EProblem":
        return cls.create(d["model"], d["layers"], d["phase"], d["batch"], d["prompt"], d.get("gen", 0),
                          d.get("dtype", "bf16"), d.get("seed", 0))

    # ---- what one decode step reads, per layer (the roofline's memory term) -----------------------
    def layer_bytes(self, experts_touched: float, context: int, expert_width: float = 2.0) -> int:
        """Bytes one decode step reads in one layer: the experts it touches (expert_width bytes a weight:
        bf16, or an INT8 engine's int8 and scales), the router, the attention projections, and the KV
        cache of `context` tokens for each of the batch's sequences."""
        return int(sum(self.layer_part_bytes(experts_touched, context, expert_width).values()))

    def layer_part_bytes(self, experts_touched: float, context: int, expert_width: float = 2.0) -> dict:
        """layer_bytes by the part of the layer that reads them, as the fused layer's timers name the parts:
        qkv and o (the projections), attention (the KV cache), router, experts (a shared expert's too)."""
        m, b = self.model, 2
        shared = 0
        if m.shared_experts:
            from ..e2e.checkpoint import hf_config
            shared = 3 * m.hidden_size * hf_config(m, 1).get("shared_expert_intermediate_size", 0) * b
        qkv, o = m.projections()["qkv"], m.projections()["o"]
        return {"qkv": qkv[0] * qkv[1] * b, "attention": 2 * m.kv_heads * m.head_dim * context * b * self.batch,
                "o": o[0] * o[1] * b, "router": m.routed_experts * m.hidden_size * b,
                "experts": int(experts_touched * m.expert_bytes(expert_width)) + shared}

    def head_bytes(self) -> int:
        """The LM head read once per decode step (the embedding reads one row per token)."""
        return self.model.vocab_size * self.model.hidden_size * 2

    @property
    def weight_bytes(self) -> int:
        m = self.model
        return int(self.layers * self.layer_bytes(min(m.routed_experts, self.batch * m.top_k), self.prompt)
                   + self.head_bytes())

    @property
    def flops(self) -> int:
        m = self.model
        t = self.batch * (self.prompt if self.phase == "prefill" else 1)
        per_tok = 2 * (m.top_k * 3 * m.hidden_size * m.intermediate_size
                       + sum(n * k for n, k in m.projections().values() if True))
        return int(t * per_tok * max(self.layers, 1))

    @property
    def group_bytes(self) -> int:
        return self.weight_bytes

    @property
    def batch_tokens(self) -> int:
        return self.batch * (self.prompt if self.phase == "prefill" else 1)

    def reference_bytes(self) -> int:
        return 0

    def materialize(self, llc_bytes=None, rotate=True, numa="default"):
        raise NotImplementedError("end-to-end points are measured by `hinabench e2e`, not the FFN runner")

    def matrices(self) -> list[tuple]:
        return []

    def __str__(self) -> str:
        return (f"{self.model.name} layers={self.layers} {self.phase} batch={self.batch} prompt={self.prompt}"
                + (f" gen={self.gen}" if self.phase == "decode" else ""))


def expected_experts_touched(model: Model, batch: int) -> float:
    """Distinct experts B tokens touch under uniform routing: E (1 - (1 - k/E)^B)."""
    E, k = model.routed_experts, model.top_k
    return E * (1 - math.pow(1 - k / E, batch))
