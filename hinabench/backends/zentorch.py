"""`zentorch:*`: AMD zentorch 2.14.0.1's fused MoE operator (ZenDNN's PyTorch extension for EPYC), run in
the `zentorch` environment (torch 2.14.1).

- `zentorch:bf16`     torch.ops.zentorch.zentorch_fused_moe(out, x, w13, w2, None, None, topk_weights,
                      topk_ids, False, "silu") on the weights as they are ([E, 2I, H] gate then up,
                      [E, H, I]): the call vLLM's zentorch plugin makes, with the library's defaults.
- `zentorch:libxsmm`  the same call with ZENDNNL_MATMUL_ALGO=6 (ZenDNN's libxsmm GEMM backend), the
                      setting under which it is right on an AVX2-only CPU (below).
The op has no prepack step: ZenDNN reorders the weights itself into a cache keyed by their address on the
first call (it warms every expert's, firing or not). That call is made in prepare, outside the timing;
the cache's growth of this process's resident memory is what extra_bytes reports. The output is an out
parameter the op accumulates into, so every call zeroes it first (part of the timed call, as in vLLM).

What was found on Zen 3 (AVX2+FMA, no AVX512-BF16), zentorch 2.14.0.1:
- With the defaults its BF16 GEMM is wrong whenever K > 512 and N > 64, in the plain group GEMM too
  (zentorch_group_matmul with no activation): column 65 of a [1, 513] x [513, 65] product is already off.
  The fused MoE runs two GEMMs, w13 (K=H, N=2I) and w2 (K=I, N=H), so it is wrong when H > 512 and
  I > 32, or I > 512 and H > 64: the smallest failing MoE shapes are H=513, I=33 and H=65, I=513 (any T,
  E); Mixtral (H=4096, I=14336) is far inside. Same call, same layouts, right below those sizes: not a
  convention. ZENDNNL_MATMUL_ALGO=3/4/6/9 (libxsmm blocked, AOCL-DLP unblocked, libxsmm, reference)
  are right on the plain GEMM, 1 and the default are not: the fault is in the default AOCL-DLP blocked
  (reordered-weight) BF16 path. zentorch's own zentorch_mm refuses BF16 on this CPU ("zentorch_matmul
  bf16 path needs the cpu support avx512bf16"); the group GEMM behind the fused MoE has no such check.
  Under ZENDNNL_MATMUL_ALGO=4 the fused path still gives NaN at some shapes (H=I=1024, T=2..4);
  under 6 (libxsmm) every shape tried, Mixtral's included, is right.
- Its weight cache is keyed by address: a new weight tensor allocated where a freed one was gets the old
  one's reordered weights (a script that re-creates the weights per T in one process sees stale results
  or NaN). hinabench's worker holds its weights for its whole life, so this does not arise here.
- A call with a single firing expert fails (the op needs at least two): an `unsupported` row.
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


class _Zentorch(WorkerBackend):
    env_name = "zentorch"
    module = "zentorch"
    packages = ("zentorch", "torch")


@register
class ZentorchBf16(_Zentorch):
    name = "zentorch:bf16"
    variant = "bf16"
    description = "AMD zentorch zentorch_fused_moe (ZenDNN group GEMM + fused SiLU and weighted reduce), library defaults"


@register
class ZentorchLibxsmm(_Zentorch):
    name = "zentorch:libxsmm"
    variant = "libxsmm"
    description = "AMD zentorch zentorch_fused_moe with ZENDNNL_MATMUL_ALGO=6 (ZenDNN's libxsmm GEMM backend)"


# ---- worker side ----------------------------------------------------------------------------------
# ZENDNNL_MATMUL_ALGO per variant: ZenDNN reads it once, at its first matmul, so it is set before that
_ALGO = {"bf16": None, "libxsmm": "6"}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _rss_bytes() -> int:
    import os
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ZENDNNL_MATMUL_ALGO values under which the BF16 GEMM was wrong on Zen 3 (unset, none, dynamic
# dispatch, AOCL-DLP blocked, auto-tuner); 3, 4, 6 and 9 were right on the plain GEMM
_FAULTY_ALGOS = (None, "", "-1", "none", "0", "1", "8", "auto")


def known_fault(H: int, I: int, algo: str | None, avx512_bf16: bool) -> str:
    """What is known to go wrong for this shape, GEMM backend and CPU ("" if nothing known): the
    sentence a `wrong` row's reason carries (the harness adds it only when the output is off)."""
    if avx512_bf16:
        return ""
    if algo not in _FAULTY_ALGOS:
        return (f"not a known fault: on a CPU without AVX512-BF16, ZENDNNL_MATMUL_ALGO={algo} was right "
                f"in the shapes tried, except NaN from the fused path at some shapes under 4")
    gemms = []
    if H > 512 and 2 * I > 64:
        gemms.append(f"w13 (K=H={H}, N=2I={2 * I})")
    if I > 512 and H > 64:
        gemms.append(f"w2 (K=I={I}, N=H={H})")
    if not gemms:
        return ""
    return ("zentorch 2.14.0.1's BF16 GEMM (ZenDNN's default AOCL-DLP blocked path) is wrong on a CPU "
            "without AVX512-BF16 when K > 512 and N > 64, as for " + " and ".join(gemms) +
            " here; smallest failing MoE shapes H=513, I=33 and H=65, I=513 (its zentorch_mm refuses BF16 "
            "on such a CPU; the fused MoE does not check); with ZENDNNL_MATMUL_ALGO=6 (zentorch:libxsmm) "
            "it is right")


class ZentorchPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads
        self._note = ""

    def prepare(self, data) -> None:
        import os
        from ..worker.protocol import PeerUnsupported
        if self.variant not in _ALGO:
            raise PeerUnsupported(f"zentorch has no variant '{self.variant}'")
        algo = _ALGO[self.variant]
        if algo is not None:
            os.environ["ZENDNNL_MATMUL_ALGO"] = algo
        self.algo = os.environ.get("ZENDNNL_MATMUL_ALGO")   # a user's own setting, for bf16
        import torch
        import zentorch
        self.zentorch = zentorch
        if getattr(zentorch, "__stable_abi_only__", False):
            raise PeerUnsupported(f"zentorch {zentorch.__version__} was built for torch "
                                  f"{zentorch._build_info.__torchversion__}, this env has {torch.__version__}: "
                                  f"only its stable-ABI subset loads")
        if not hasattr(torch.ops.zentorch, "zentorch_fused_moe"):
            raise PeerUnsupported(f"zentorch {zentorch.__version__} has no torch.ops.zentorch.zentorch_fused_moe")
        p = data.problem
        self.data = data
        self.x = data.x.contiguous()
        self.w13 = data.w13.contiguous()        # [E, 2I, H], gate rows then up rows: the op's layout
        self.w2 = data.w_down.contiguous()      # [E, H, I]
        self.weights = data.topk_weights.float().contiguous()
        self.ids = [t.to(torch.int32).contiguous() for t in data.topk_ids]
        for g, ids in enumerate(self.ids):
            if ids.unique().numel() < 2:
                raise PeerUnsupported("zentorch_fused_moe needs at least 2 firing experts per call "
                                      f"(\"zentorch_group_matmul_out_impl requires at least 2 active experts\"); "
                                      f"group {g} fires {ids.unique().numel()}")
        self.out = torch.zeros_like(self.x)
        self.avx512_bf16 = "avx512_bf16" in _cpu_flags()
        self._note = known_fault(p.H, p.I, self.algo, self.avx512_bf16)
        # the first call reorders (and caches) every expert's weights: made here, outside the timing
        rss0 = _rss_bytes()
        for g in range(data.groups):
            self.run(g)
        self._extra = max(0, _rss_bytes() - rss0)

    def run(self, group: int):
        import torch
        self.out.zero_()                        # the op accumulates into its output
        torch.ops.zentorch.zentorch_fused_moe(self.out, self.x, self.w13, self.w2, None, None, self.weights,
                                              self.ids[group], False, "silu")
        return self.out

    def extra_bytes(self) -> int:
        """Resident memory the first calls added: ZenDNN's reordered-weight cache (and its scratch),
        not visible from Python."""
        return self._extra

    def note(self) -> str:
        return self._note

    def versions(self) -> dict:
        import torch
        b = getattr(getattr(self, "zentorch", None), "_build_info", None)
        return {"zentorch_built_for_torch": str(getattr(b, "__torchversion__", "")),
                "zentorch_source_tag": str(getattr(b, "__source_tag__", "")),
                "zendnnl_matmul_algo": getattr(self, "algo", None) or "default",
                "cpu_avx512_bf16": "yes" if "avx512_bf16" in _cpu_flags() else "no",
                "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_peer(variant: str, threads: int) -> ZentorchPeer:
    return ZentorchPeer(variant, threads)
