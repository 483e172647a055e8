"""INT8 experts for engine `hina+l+a:int8`: the experts quantized once, then the W8A8 kernel; this file is the patch.

Quantization is the framework's offline step (hinabench.quant.quantize_int8: group-wise symmetric int8
rows, one fp32 scale per row and group of 128 along K, or 64 or 32 where 128 does not divide H or I,
the rows in transformers' own [E, 2I, H] and [E, H, I] order: nothing repacked). The int8 copies sit beside transformers' bf16 parameters, made at
the first call and kept on the experts module, so the other engines of the same process still read the
bf16 ones. Each call runs `moe_ffn_quant` (activations quantized per token and group in the gather,
int32 sums per group). The engine is `hina+l+a` otherwise: the same bytes class as llama.cpp's Q8_0.
"""
import torch
from transformers.integrations.moe import ExpertsInterface

from hinabench.e2e.dropin import fused_only
from hinabench.kernels import moe_ffn_quant_prepare
from hinabench.quant import quantize_int8


def hina_int8_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    moe = self.__dict__.get("_hina_int8")
    if moe is None:
        fused_only(self)
        H, I = self.gate_up_proj.shape[2], self.down_proj.shape[2]
        g = next(g for g in (128, 64, 32) if H % g == 0 and I % g == 0)
        w13, w_down = quantize_int8(self.gate_up_proj.data, g), quantize_int8(self.down_proj.data, g)
        moe = self._hina_int8 = moe_ffn_quant_prepare(w13, w_down)   # keeps the int8 copies
    out = moe(hidden_states.to(torch.bfloat16), top_k_index, top_k_weights.float())
    return out.to(hidden_states.dtype)


ExpertsInterface.register("hina-int8", hina_int8_experts_forward)


def use_hina_int8(model):
    """Route `model`'s expert FFNs through the HiNa INT8 kernel (transformers' own API)."""
    model.set_experts_implementation("hina-int8")
    return model
