"""`ipex:*`: Intel Extension for PyTorch 2.8.0's CPU MoE, run in the `ipex` environment (torch 2.8.0).

- `ipex:tpp`    ipex.llm.modules.GatedMLPMOE(W13, W2, use_prepack=True): the TPP path the paper names.
                Routing is ours (a custom routing function returns the problem's top-k ids and weights).
- `ipex:fused`  torch.ops.torch_ipex.fused_experts on weights packed once with
                torch.ops.torch_ipex.convert_weight_packed_moe_bf16(w13, w2).
Pitfalls handled: with use_prepack=True IPEX rewrites the weights it is given in place, so it gets
copies (counted in extra_bytes, like the packed copies); it flips a process-wide TPP switch, so each
variant has a worker of its own; its first call packs, so prepare makes that call, outside the timing.
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


class _Ipex(WorkerBackend):
    env_name = "ipex"
    module = "ipex"
    packages = ("intel-extension-for-pytorch", "torch")


@register
class IpexTpp(_Ipex):
    name = "ipex:tpp"
    variant = "tpp"
    description = "IPEX 2.8 GatedMLPMOE(use_prepack=True): the TPP MoE path, weights packed by its first call"


@register
class IpexFused(_Ipex):
    name = "ipex:fused"
    variant = "fused"
    description = "IPEX 2.8 torch_ipex.fused_experts on convert_weight_packed_moe_bf16 weights"


# ---- worker side ----------------------------------------------------------------------------------
def _call_by_schema(op, known: dict):
    """Call a torch op with the arguments we know by name; the rest at their defaults or empty."""
    import torch
    from ..worker.protocol import PeerUnsupported
    args = []
    for a in op.default._schema.arguments:
        t = str(a.type)
        if a.name in known:
            args.append(known[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        elif isinstance(a.type, torch.OptionalType) or t.endswith("?"):
            args.append(None)
        elif t == "Tensor":
            args.append(torch.tensor(0, dtype=torch.bfloat16))
        elif t == "bool":
            args.append(False)
        elif t == "int":
            args.append(0)
        else:
            raise PeerUnsupported(f"unknown argument {a.name}: {t} in {op.default._schema}")
    return op(*args)


# IPEX's own words when a path needs an ISA this CPU lacks (it checks, rather than dying with SIGILL);
# e.g. at Mixtral's shape on AVX2: "tinygemm_kernel_avx: scalar path not implemented!"
_ISA_WORDS = ("instruction set", "cpu support", "amx` is supported", "only supported on x64",
              "path not implemented")


class _isa_refusals:
    """Turn IPEX's explicit ISA checks (AssertionError / RuntimeError) into an `unsupported` row."""

    def __enter__(self):
        return self

    def __exit__(self, tp, e, tb):
        from ..worker.protocol import PeerUnsupported
        if isinstance(e, (AssertionError, RuntimeError)):
            msg = (str(e).strip().splitlines() or [""])[0]
            if any(w in msg.lower() for w in _ISA_WORDS):
                raise PeerUnsupported(f"IPEX refuses on this CPU: {msg}") from None
        return False


class IpexPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads

    def prepare(self, data) -> None:
        import torch
        import intel_extension_for_pytorch as ipex
        from ..worker.protocol import PeerUnsupported
        self.data = data
        self.x = data.x
        self.weights = data.topk_weights.float().contiguous()
        self.ids = [t.to(torch.int32).contiguous() for t in data.topk_ids]
        E = data.num_experts
        if self.variant == "tpp":
            self.w13 = data.w13.clone()        # IPEX packs these in place
            self.w2 = data.w_down.clone()
            self.moe = ipex.llm.modules.GatedMLPMOE(self.w13, self.w2, use_prepack=True)
            self.logits = torch.zeros(data.problem.T, E, dtype=data.x.dtype)
            self.group = 0
            with _isa_refusals():
                self.run(0)                    # the first call packs
        elif self.variant == "fused":
            ops = torch.ops.torch_ipex
            if not (hasattr(ops, "convert_weight_packed_moe_bf16") and hasattr(ops, "fused_experts")):
                raise PeerUnsupported("this IPEX has no fused_experts / convert_weight_packed_moe_bf16")
            self.w13, self.w2 = ops.convert_weight_packed_moe_bf16(data.w13.clone(), data.w_down.clone())
            with _isa_refusals():
                self.run(0)
        else:
            raise PeerUnsupported(f"ipex has no variant '{self.variant}'")

    def _route(self, hidden_states, gating_output, topk, renormalize, *args, **kw):
        return self.weights, self.ids[self.group]

    def run(self, group: int):
        import torch
        if self.variant == "tpp":
            self.group = group
            return self.moe(self.x, False, self.data.problem.A, self.logits, False,
                            custom_routing_function=self._route)
        return _call_by_schema(torch.ops.torch_ipex.fused_experts, {
            "hidden_states": self.x, "x": self.x, "a": self.x, "w1": self.w13, "w13": self.w13, "w2": self.w2,
            "topk_weights": self.weights, "topk_ids": self.ids[group], "inplace": False, "is_vnni": True,
            "is_distributed": False, "is_woq": False})

    def extra_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in (self.w13, self.w2))

    def versions(self) -> dict:
        import torch
        return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_peer(variant: str, threads: int) -> IpexPeer:
    return IpexPeer(variant, threads)
