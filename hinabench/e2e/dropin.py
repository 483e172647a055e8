"""The HiNa-MoE expert FFN dropped into transformers: this whole file is the patch.

transformers (>= 5) dispatches every `@use_experts_implementation` experts module (Qwen3-MoE, Qwen2-MoE,
Mixtral, ...) through its ExpertsInterface by `config._experts_implementation`. Registering one
function there and selecting it is the integration: the expert weights stay in the fused
`gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] parameters transformers loaded, read in place by
the kernel (no copy, no repack). The router, the shared expert and attention stay transformers' own.
`hinabench e2e --show-patch` prints this file and counts its code lines.
"""
import torch
from transformers.integrations.moe import ExpertsInterface

from hinabench.kernels import moe_ffn_prepare


def fused_only(experts):
    """The layout the kernels read: fused [gate; up] rows, no bias (dropin_int8.py checks the same)."""
    if experts.has_bias or not experts.has_gate or experts.is_transposed or not experts.is_concatenated:
        raise NotImplementedError("hina experts: fused [gate; up] weights without bias only")


def hina_experts(ex):
    """The experts module's weights checked once (moe_ffn_prepare), redone if transformers' tensors change."""
    moe = ex.__dict__.get("_hina")
    if moe is None or not moe.reads(ex.gate_up_proj, ex.down_proj):
        fused_only(ex)
        moe = ex._hina = moe_ffn_prepare(None, None, ex.down_proj, w13=ex.gate_up_proj)
    return moe


def hina_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = hina_experts(self)(hidden_states.to(torch.bfloat16), top_k_index, top_k_weights.float())
    return out.to(hidden_states.dtype)


ExpertsInterface.register("hina", hina_experts_forward)


def use_hina(model):
    """Route `model`'s expert FFNs through the HiNa kernel (transformers' own API)."""
    model.set_experts_implementation("hina")
    return model
