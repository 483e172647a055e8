"""INT8 experts for engines `hina+l+a:int8` and `hina+fused:int8`: the experts quantized once, then the W8A8 kernel; this file is the patch.

Quantization is the framework's offline step (hinabench.quant.quantize_int8: group-wise symmetric int8
rows, one fp32 scale per row and group of 128 along K, or 64 or 32 where 128 does not divide H or I,
the rows in transformers' own [E, 2I, H] and [E, H, I] order: nothing repacked). The int8 copies sit beside transformers' bf16 parameters, made at
the first call and kept on the experts module, so the other engines of the same process still read the
bf16 ones; made again when transformers' tensors are replaced (not when their contents are changed in
place: the copies are a snapshot). Each call runs `moe_ffn_quant` (activations quantized per token and
group in the gather, int32 sums per group). The engine is `hina+l+a` otherwise: the same bytes class as
llama.cpp's Q8_0. `hina+fused:int8` hands the same prepared experts to the native decoder layer (dropin_layer.py).
"""
import torch
from transformers.integrations.moe import ExpertsInterface

from hinabench.e2e.dropin import fused_only
from hinabench.kernels import _Prepared, moe_ffn_quant_prepare
from hinabench.quant import quantize_int8


def int8_experts(ex):
    """The experts module's INT8 copy, prepared: made at the first call, again if transformers' tensors change."""
    src = (ex.gate_up_proj, ex.down_proj)
    got = ex.__dict__.get("_hina_int8")
    if got is None or not got[0].reads(*src):
        fused_only(ex)
        H, I = ex.gate_up_proj.shape[2], ex.down_proj.shape[2]
        g = next(g for g in (128, 64, 32) if H % g == 0 and I % g == 0)
        moe = moe_ffn_quant_prepare(quantize_int8(ex.gate_up_proj.data, g), quantize_int8(ex.down_proj.data, g))
        got = ex._hina_int8 = (_Prepared(src), moe)   # the bf16 tensors they came from; keeps the int8 copies
    return got[1]


def hina_int8_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = int8_experts(self)(hidden_states.to(torch.bfloat16), top_k_index, top_k_weights.float())
    return out.to(hidden_states.dtype)


ExpertsInterface.register("hina-int8", hina_int8_experts_forward)


def use_hina_int8(model):
    """Route `model`'s expert FFNs through the HiNa INT8 kernel (transformers' own API)."""
    model.set_experts_implementation("hina-int8")
    return model
