"""The dense projections (attention q/k/v/o, the router, the LM head) on the HiNa linear kernel: engine `hina+l`.

transformers has no interface for nn.Linear, so this one replaces the forward of each nn.Linear
instance outside the experts (weights stay where transformers keeps them, read in place, no copy).
Why it exists: on a CPU without AVX-512 BF16, torch's bf16 matmul has no fast path (~3-6 GFLOP/s
here), so the projections and the LM head, not the experts, dominate a decode step of the `hina`
engine; `hina+l` shows what is left when they run on the same micro-kernels as the expert FFN.

Two more pieces, each the model's own code left as it is:
- Sibling projections of one input (an attention block's q_proj, k_proj, v_proj; a dense MLP's
  gate_proj, up_proj) run as one `linear_group` call when the first of them is called: one pack of
  the input and one task list, so the small k and v (512 x 2048 for Qwen3) do not each pay a
  parallel region and a tail. The others take their result if they are then called on the very same
  tensor, unmodified (identity checked, and the version where torch keeps one); otherwise each computes its own.
- A router that is not an nn.Linear (transformers 5's `*TopKRouter` calls `F.linear(x, self.weight)`
  in its forward) runs its own forward with `F.linear` bound to the HiNa kernel.
"""
import types

import torch
import torch.nn.functional as F

from hinabench.kernels import linear_prepare

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _fits(x, w) -> bool:
    K, N = w.shape[1], w.shape[0]
    return x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and K % 32 == 0 and N % 32 == 0


def _prepared(holder, weights):
    """The weights checked once (kernels.linear_prepare), kept on `holder`; made again if they change."""
    p = holder.__dict__.get("_hina")
    if p is None or not p.reads(*weights):
        p = holder._hina = linear_prepare(weights)
    return p


def _hina_linear(x, weight, bias, holder):
    if not _fits(x, weight):
        return F.linear(x, weight, bias)
    K, N = weight.shape[1], weight.shape[0]
    y = _prepared(holder, [weight])(x.reshape(-1, K).contiguous())[0]
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], N)


def hina_linear_forward(self, x):
    return _hina_linear(x, self.weight, self.bias, self)


def _version(x):
    return None if x.is_inference() else x._version   # inference tensors keep no version counter


class _Siblings:
    """Projections of one module that read the same input: the first called computes them all."""

    def __init__(self, mods):
        self.mods = mods
        self.x, self.version, self.pending = None, None, {}

    def forward(self, mod, x):
        if self.x is x and self.version == _version(x) and mod in self.pending:
            return self.pending.pop(mod)
        if not _fits(x, mod.weight):
            return F.linear(x, mod.weight, mod.bias)
        K = mod.in_features
        ys = _prepared(self, [m.weight for m in self.mods])(x.reshape(-1, K).contiguous())
        out = {}
        for m, y in zip(self.mods, ys):
            if m.bias is not None:
                y = y + m.bias
            out[m] = y.reshape(*x.shape[:-1], m.out_features)
        mine = out.pop(mod)
        self.x, self.version, self.pending = x, _version(x), out
        return mine


def _sibling_groups(model):
    for parent in model.modules():
        for names in SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if (all(isinstance(m, torch.nn.Linear) for m in mods)
                    and len({m.in_features for m in mods}) == 1
                    and all(m.weight.dtype == torch.bfloat16 and m.out_features % 32 == 0 for m in mods)):
                yield mods


class _HinaFunctional:
    """torch.nn.functional as one router's forward sees it, with `linear` on the HiNa kernel."""

    def linear(self, x, weight, bias=None):
        return _hina_linear(x, weight, bias, self)

    def __getattr__(self, name):
        return getattr(F, name)


def _is_router(mod) -> bool:
    w = getattr(mod, "weight", None)
    code = getattr(type(mod).forward, "__code__", None)
    return (not isinstance(mod, torch.nn.Linear) and isinstance(w, torch.nn.Parameter) and w.dim() == 2
            and code is not None and {"F", "linear"} <= set(code.co_names))


def _router_forward(mod):
    fwd = type(mod).forward
    glb = dict(fwd.__globals__, F=_HinaFunctional())
    return types.MethodType(types.FunctionType(fwd.__code__, glb, fwd.__name__, fwd.__defaults__,
                                               fwd.__closure__), mod)


def use_hina_linear(model, on: bool = True):
    """Every nn.Linear and router of the model on the HiNa linear kernel (on=False: back to torch's)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) or _is_router(mod):
            if on:
                mod.forward = (types.MethodType(hina_linear_forward, mod) if isinstance(mod, torch.nn.Linear)
                               else _router_forward(mod))
            elif "forward" in mod.__dict__:
                del mod.forward
    if on:
        for mods in _sibling_groups(model):
            group = _Siblings(mods)
            for m in mods:
                m.forward = types.MethodType(lambda self, x, g=group: g.forward(self, x), m)
    return model
