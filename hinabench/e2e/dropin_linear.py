"""The dense projections (attention q/k/v/o, the LM head) on the HiNa linear kernel: engine `hina+l`.

transformers has no interface for nn.Linear, so this one replaces the forward of each nn.Linear
instance outside the experts (weights stay where transformers keeps them, read in place, no copy).
Why it exists: on a CPU without AVX-512 BF16, torch's bf16 matmul has no fast path (~3-6 GFLOP/s
here), so the projections and the LM head, not the experts, dominate a decode step of the `hina`
engine; `hina+l` shows what is left when they run on the same micro-kernels as the expert FFN.
"""
import types

import torch
import torch.nn.functional as F

from hinabench.kernels import linear


def hina_linear_forward(self, x):
    K, N = self.in_features, self.out_features
    if x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16 or K % 32 or N % 32:
        return F.linear(x, self.weight, self.bias)
    y = linear(x.reshape(-1, K).contiguous(), self.weight)
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], N)


def use_hina_linear(model, on: bool = True):
    """Every nn.Linear of the model on the HiNa linear kernel (on=False: back to torch's)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            if on:
                mod.forward = types.MethodType(hina_linear_forward, mod)
            elif "forward" in mod.__dict__:
                del mod.forward
    return model
