"""The HiNa-MoE expert-FFN operator (paper Section 4), torch tensors in and out.

    out = moe_ffn(x, w_gate, w_up, w_down, topk_ids, topk_weights, isa="auto", threads=None)
    out = moe_ffn(x, None, None, w_down, topk_ids, topk_weights, w13=w13)      # fused gate/up
    moe = moe_ffn_prepare(w_gate, w_up, w_down); out = moe(x, topk_ids, topk_weights)   # weights checked once

    out[t] = sum_s topk_weights[t, s] * W_down[e] . (SiLU(W_gate[e] . x[t]) * (W_up[e] . x[t])),
             e = topk_ids[t, s]

Arguments (CPU tensors; nothing is copied, converted or repacked except the tiny routing arrays):
  x             [T, H] bf16, rows contiguous (any row stride).
  w_gate, w_up  [E, I, H] bf16, the framework's layout (out x in, like nn.Linear): rows contiguous
                along H; any row stride and any expert stride, so the views w13[:, :I] and
                w13[:, I:] of a fused tensor are accepted as they are.
  w13           [E, 2I, H] bf16, gate rows then up rows (pass w_gate = w_up = None).
  w_down        [E, H, I] bf16, rows contiguous along I; any row/expert stride.
  topk_ids      [T, k] int32 or int64, values in [0, E) (a token may name the same expert twice).
  topk_weights  [T, k] float32.
  isa           "auto" (default; the HINA_ISA environment variable, if set, replaces "auto"), or one
                of ISAS: "amx", "avx512", "avx512-nobf16", "avx2", "scalar" (real hardware; "avx512"
                is the "avx512-nobf16" build on CPUs without AVX512_BF16), "amx-emulated",
                "avx512-emulated" (the same micro-kernel sources on a software AMX tile unit / on
                SIMDe: tests only, slow). "auto" picks the first usable of amx, avx512, avx2, scalar.
  threads       OpenMP threads (default: torch.get_num_threads()).
  numa          "auto" (default), "off", "interleave-partitioned" (paper Section 5, Algorithm 2):
                threads are grouped per NUMA node and bound to its CPUs; each group computes partial
                products over only its node's local segments of every weight matrix (the segments of
                hinabench.numa.plan_for_kernel, from each matrix's real address, page size and
                phase); the partials are reduced across nodes. "auto" partitions when the weights'
                pages are a valid interleave (hinabench.numa.tensor_placement) over >= 2 nodes (or
                when numa_nodes is given), else runs "off".
  numa_nodes    None: the real memory nodes. An int N: N nodes; if N differs from the real node
                count they are *virtual* -- the threads split into N groups with no binding, the
                placement modelled by address as if interleaved over N nodes (how the mode is tested
                on a one-node machine).
  numa_page     "4k" | "2m" | None: the page size of the placement model (None: what smaps shows for
                real placement, "4k" for virtual nodes).
Returns [T, H] bf16 (contiguous, newly allocated).

Summation order (both modes): every dot product is a sum of K *pieces* cut at the row's 4 KiB
address boundaries (rounded up to 32 elements), each accumulated from zero, added in ascending K
(kernels/pieces.h). A NUMA node owns whole pieces, so "interleave-partitioned" is bit-identical to
"off" for any node count, page model, phase or thread count. Segment edges that are not on a
32-element edge (a row not 64-byte aligned) are rounded up: the straddling 64 bytes are read by the
node of their first element (at most 62 remote bytes per page boundary; none for aligned rows).

Shapes: H and I must be multiples of 32 (the AMX tile's k_r; every MoE model we know uses
multiples of 128). Other shapes raise ValueError: there is no tail code, on purpose.
Errors: ValueError for bad input; IsaUnavailable (a RuntimeError) for an ISA this CPU lacks or a
module that was not built. An unusable ISA is refused before any instruction of it runs (no SIGILL).

Precision: fp32 accumulation throughout; the output is rounded once to bf16. The avx2 and scalar
paths keep SiLU(gate)*up in fp32; the avx512 and amx paths round it to bf16 (their MM operands
are bf16), as every bf16 kernel we know does.
"""
from __future__ import annotations

import functools
import os

import torch

ISAS_REAL = ("amx", "avx512", "avx512-nobf16", "avx2", "scalar")  # "auto" takes the first usable, in this order
# "avx512" names the AVX-512 kernels: on a CPU with AVX-512 but without AVX512_BF16 (Cascade Lake, Ice
# Lake) it resolves to their build without it, "avx512-nobf16" (kernels/isa/avx512/dpbf16.h)
ISA_FALLBACK = {"avx512": "avx512-nobf16"}
ISAS_EMULATED = {"amx-emulated": "_C_amx_emu", "avx512-emulated": "_C_avx512_emu",
                 "avx512-nobf16-emulated": "_C_avx512_emu"}
ISAS = ISAS_REAL + tuple(ISAS_EMULATED)
SHAPE_MULTIPLE = 32


_MODULES: dict = {}


class IsaUnavailable(RuntimeError):
    """The requested ISA cannot run here (the CPU or the OS lacks it, or its module was not built)."""


_LOADED: dict = {}   # compiled module name -> module (an import per call costs ~10 us)


def _module(isa: str):
    from .native import NativeMissing, load
    name = ISAS_EMULATED.get(isa, "_C")
    mod = _LOADED.get(name)
    if mod is not None:
        return mod
    env = os.environ.get("HINA_AVX512_BLOCKING", "")   # as the C++ reads it: no stripping
    if env and env not in AVX512_BLOCKING:
        from .errors import UserError
        raise UserError(f"HINA_AVX512_BLOCKING must be one of {', '.join(AVX512_BLOCKING)} (got '{env}')")
    try:
        mod = _LOADED[name] = load(name)
    except NativeMissing as e:
        raise IsaUnavailable(f"isa '{isa}': {e}") from e
    return mod


AVX512_BLOCKING = ("auto", "default", "zen5", "xeon")


def avx512_blocking(choice: str | None = None, *, isa: str = "avx512") -> str:
    """The AVX-512 BF16 kernel's blocking in this process, for `isa`'s module ("avx512" and
    "avx512-emulated" are separate modules, each with its own setting): "zen5" (decode tiles with rows
    far apart, two chunks of a row at a time, the tile's own rows prefetched; from 5 tokens, blocks of
    128 tokens and the next W piece prefetched; the INT8/FP8 kernels' decode tiles without prefetch at
    one token (INT8: and two), tasks of 512 rows; the attention kernel's prefetch into L1, the next
    step's rows in reading order: measured faster on Zen 5), "xeon" (the BF16 FFN kernel's zen5 tiles
    with the one-token tiles prefetching their own rows, measured faster on a Xeon with AMX, whose
    hina:amx runs these tiles up to 4 tokens an expert; the INT8/FP8 and attention kernels' default
    blocking) or "default" (measured on Zen 4). The same bits whichever. `choice` "auto" (the start,
    unless HINA_AVX512_BLOCKING names one) takes zen5 on AMD family >= 26, xeon on Intel, default
    elsewhere. Returns the blocking in effect."""
    if choice is not None and choice not in AVX512_BLOCKING:
        raise ValueError(f"avx512 blocking must be one of {', '.join(AVX512_BLOCKING)} (got '{choice}')")
    _setting, in_effect = _module(isa).avx512_blocking(choice)
    return in_effect


def isa_status(isa: str) -> tuple[bool, str]:
    """(True, "") if `isa` can run in this process, else (False, the reason in words)."""
    if isa not in ISAS:
        raise ValueError(f"unknown isa '{isa}'; known: auto, {', '.join(ISAS)}")
    try:
        mod = _module(isa)
    except IsaUnavailable as e:
        return False, str(e)
    if isa in ISAS_EMULATED or isa == "scalar":
        return True, ""
    if mod.isa_usable(isa):
        return True, ""
    f = mod.cpu_features()
    need = {"avx2": [("avx2", "AVX2"), ("fma", "FMA")],
            "avx512": [("avx512f", "AVX512F"), ("avx512bw", "AVX512BW"), ("avx512vl", "AVX512VL"),
                       ("avx512_bf16", "AVX512_BF16")],
            "avx512-nobf16": [("avx512f", "AVX512F"), ("avx512bw", "AVX512BW"), ("avx512dq", "AVX512DQ"),
                              ("avx512vl", "AVX512VL"), ("avx512_vnni", "AVX512_VNNI")],
            "amx": [("amx_tile", "AMX_TILE"), ("amx_bf16", "AMX_BF16"), ("avx512f", "AVX512F"),
                    ("avx512bw", "AVX512BW")]}[isa]
    missing = [label for key, label in need if not f[key]]
    if missing:
        return False, f"this CPU lacks {', '.join(missing)}"
    if isa == "amx" and not f["os_amx"]:
        return False, f"the OS refused AMX tile data to this process ({f['amx_permission']})"
    return False, f"isa '{isa}' is not usable here"


def resolve_isa(isa: str = "auto") -> str:
    """The ISA a call with `isa` runs on; raises ValueError/IsaUnavailable if it cannot run."""
    if isa == "auto":
        isa = os.environ.get("HINA_ISA", "").strip() or "auto"
    return _resolve(isa)


@functools.lru_cache(maxsize=None)  # the CPU does not change under a running process
def _resolve(isa: str, built: tuple[str, ...] | None = None) -> str:
    """The ISA `isa` names here ("auto": the best that runs, among `built` where given), or IsaUnavailable."""
    if isa == "auto":
        for cand in ISAS_REAL:
            if (built is None or cand in built) and isa_status(cand)[0]:
                return cand
        return "scalar"
    isa = isa_variant(isa)
    ok, why = isa_status(isa)
    if not ok:
        raise IsaUnavailable(f"isa '{isa}' cannot run here: {why}")
    return isa


def isa_variant(isa: str) -> str:
    """The build of `isa` that runs here: ISA_FALLBACK's where `isa` cannot and it can, else `isa`."""
    alt = ISA_FALLBACK.get(isa)
    if alt and not isa_status(isa)[0] and isa_status(alt)[0]:
        return alt
    return isa


def _check_weight(name: str, w: torch.Tensor, shape: tuple[int, int, int]) -> None:
    if not (isinstance(w, torch.Tensor)):
        raise ValueError(f"{name} must be a torch.Tensor")
    if not (w.device.type == "cpu"):
        raise ValueError(f"{name} must be on the CPU (got {w.device})")
    if not (w.dtype == torch.bfloat16):
        hint = (": quantized weights go through moe_ffn_quant with their scales (hinabench.quant)"
                if w.dtype in (torch.int8, torch.float8_e4m3fn) else "")
        raise ValueError(f"{name} must be bfloat16 (got {w.dtype}){hint}")
    if not (tuple(w.shape) == shape):
        raise ValueError(f"{name} has shape {tuple(w.shape)}, expected {shape}")
    if not (w.stride(2) == 1 or w.shape[2] == 1):
        raise ValueError(f"{name} rows must be contiguous along their last dimension (stride {w.stride()}); "
                         "the kernel reads weights in place and never copies them")
    if not (w.stride(0) >= 0 and w.stride(1) >= 0):
        raise ValueError(f"{name} has negative strides {w.stride()}")


def _check_routing(topk_ids, topk_weights, T: int) -> int:
    """topk_ids [T, k] int32/int64 and topk_weights [T, k] float32, k >= 1; returns k."""
    if not (isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2 and topk_ids.shape[0] == T):
        raise ValueError(f"topk_ids must be [T={T}, k]")
    if not (topk_ids.dtype in (torch.int32, torch.int64)):
        raise ValueError(f"topk_ids must be int32 or int64 (got {topk_ids.dtype})")
    k = int(topk_ids.shape[1])
    if not (isinstance(topk_weights, torch.Tensor) and tuple(topk_weights.shape) == (T, k)):
        raise ValueError(f"topk_weights must be [T={T}, k={k}] like topk_ids")
    if not (topk_weights.dtype == torch.float32):
        raise ValueError(f"topk_weights must be float32 (got {topk_weights.dtype})")
    if not (k >= 1):
        raise ValueError("topk_ids needs at least one slot per token")
    return k


def _check_tokens(x: torch.Tensor, K: int, name: str) -> int:
    """x must be [T, K] bf16 on the CPU with contiguous rows (any row stride); returns T."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] == K):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x)
        raise ValueError(f"x must be [T, {name}={K}] (got {got})")
    if not (x.device.type == "cpu" and x.dtype == torch.bfloat16):
        raise ValueError("x must be a bfloat16 CPU tensor")
    if not (x.stride(1) == 1 and (x.shape[0] <= 1 or x.stride(0) >= K)):
        raise ValueError(f"x rows must be contiguous (stride {x.stride()})")
    return int(x.shape[0])


def _threads(threads) -> int:
    """A call's OpenMP threads: torch's count when None; fewer than 1 is refused."""
    n = torch.get_num_threads() if threads is None else int(threads)
    if n < 1:
        raise ValueError(f"threads must be >= 1 (got {threads})")
    return n


# ---- NUMA mode (Section 5): the plan arrays come from hinabench.numa.kernel_plan ----------------------
from .numa import kernel_plan as _kernel_plan  # noqa: E402
from .numa.kernel_plan import NUMA_MODES  # noqa: E402  (re-exported: the modes moe_ffn accepts)


def numa_last_call() -> dict:
    """How the last moe_ffn call ran: mode, nodes, virtual, page_bytes, bound, reason."""
    from .numa import kernel_plan
    return kernel_plan.last_call()


def numa_debug(enabled: bool, isa: str = "auto") -> None:
    """Testing: make the partitioned kernel count per-node weight bytes and check coverage."""
    _module(resolve_isa(isa)).moe_numa_debug(bool(enabled))


def numa_stats(isa: str = "auto") -> dict:
    """Testing (after numa_debug(True)): per node the weight bytes read and those remote under the
    placement model, task counts, and rows whose pieces do not tile [0, K) exactly once."""
    return dict(_module(resolve_isa(isa)).moe_numa_stats())


def moe_ffn(x: torch.Tensor, w_gate: torch.Tensor | None, w_up: torch.Tensor | None,
            w_down: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
            w13: torch.Tensor | None = None, isa: str = "auto",
            threads: int | None = None, numa: str = "auto", numa_nodes: int | None = None,
            numa_page: str | None = None) -> torch.Tensor:
    """The HiNa-MoE expert FFN; see the module docstring for arguments, shapes and errors."""
    return moe_ffn_prepare(w_gate, w_up, w_down, w13=w13, isa=isa, numa=numa, numa_nodes=numa_nodes,
                           numa_page=numa_page)(x, topk_ids, topk_weights, threads=threads)


class _Prepared:
    """Weights checked and laid out once, then called often: PreparedMoe, PreparedLinear."""

    def __init__(self, weights):
        self.weights = tuple(weights)   # the tensors it reads (kept alive)
        self._ptrs = tuple(w.data_ptr() for w in self.weights)

    def reads(self, *weights) -> bool:
        """Whether it was made from these very tensors (the same objects, at the same addresses)."""
        return (len(weights) == len(self.weights) and all(a is b for a, b in zip(weights, self.weights))
                and tuple(w.data_ptr() for w in weights) == self._ptrs)


class PreparedMoe(_Prepared):
    """The weights' half of a moe_ffn call, checked and laid out once (moe_ffn_prepare,
    moe_ffn_quant_prepare): what a framework keeps per MoE layer. Calling it with x, topk_ids and
    topk_weights runs the operator after the tokens' checks only: at a decode step the Python side of
    the full call costs ~0.4 ms with its caches cold (after a layer's weights streamed through them; the
    AMX Xeon, Qwen3-30B-A3B's shapes), against the kernel's ~2.8. The weights must keep their shapes;
    their contents may change."""

    def __init__(self, mod, call, E: int, H: int, weights: tuple, numa_info: dict, keep: tuple = ()):
        super().__init__(weights)
        self._mod, self._call, self.E, self.H = mod, call, E, H
        self._keep = keep        # arrays the call points at (the NUMA plan)
        self._numa = numa_info   # what numa_last_call() reports after each call

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 threads: int | None = None) -> torch.Tensor:
        H = self.H
        T = _check_tokens(x, H, "H")
        k = _check_routing(topk_ids, topk_weights, T)
        out = torch.empty(T, H, dtype=torch.bfloat16)
        if T == 0:
            return out
        threads = _threads(threads)
        ids, tw = topk_ids.contiguous(), topk_weights.contiguous()
        _kernel_plan.record(self._numa)
        # raises ValueError for an expert id outside [0, E), int64 ids checked before they are narrowed
        self._mod.moe_ffn_tokens(self._call, x.data_ptr(), T, x.stride(0) if T > 1 else H, ids.data_ptr(),
                                 ids.dtype == torch.int64, k, tw.data_ptr(), out.data_ptr(), threads)
        return out


def moe_ffn_prepare(w_gate: torch.Tensor | None, w_up: torch.Tensor | None, w_down: torch.Tensor, *,
                    w13: torch.Tensor | None = None, isa: str = "auto", numa: str = "auto",
                    numa_nodes: int | None = None, numa_page: str | None = None) -> PreparedMoe:
    """moe_ffn's weights checked and laid out once: moe_ffn(x, w..., ids, tw) is
    moe_ffn_prepare(w...)(x, ids, tw). The NUMA plan is made here, from where the pages are now."""
    isa = resolve_isa(isa)
    # ---- weights: shapes and strides only; never a copy ------------------------------------------
    if w13 is not None:
        if not (w_gate is None and w_up is None):
            raise ValueError("pass either w13 or (w_gate, w_up), not both")
        if not (isinstance(w13, torch.Tensor) and w13.dim() == 3 and w13.shape[1] % 2 == 0):
            raise ValueError("w13 must be [E, 2I, H]")
        half = w13.shape[1] // 2
        w_gate, w_up = w13[:, :half], w13[:, half:]
    if not (w_gate is not None and w_up is not None):
        raise ValueError("w_gate and w_up (or w13) are required")
    if not (isinstance(w_gate, torch.Tensor) and w_gate.dim() == 3):
        raise ValueError("w_gate must be [E, I, H]")
    E, I, H = (int(s) for s in w_gate.shape)
    _check_weight("w_gate", w_gate, (E, I, H))
    _check_weight("w_up", w_up, (E, I, H))
    _check_weight("w_down", w_down, (E, H, I))
    if not (H > 0 and I > 0 and E > 0):
        raise ValueError(f"empty weights (E={E}, I={I}, H={H})")
    if not (H % SHAPE_MULTIPLE == 0 and I % SHAPE_MULTIPLE == 0):
        raise ValueError(f"H={H} and I={I} must be multiples of {SHAPE_MULTIPLE} (the AMX tile's k_r = 32; "
                         "this kernel has no tail code for other shapes)")
    mod = _MODULES.get(isa) or _MODULES.setdefault(isa, _module(isa))
    setup = None if numa == "off" else _kernel_plan.setup(numa, numa_nodes, numa_page, (w_gate, w_up, w_down))
    # the C++ entry point takes one argument struct (kernels/ops/moe_ffn.h: MoeCall)
    call = mod.MoeCall(H=H, I=I, w_gate=w_gate.data_ptr(), gate_es=w_gate.stride(0), gate_rs=w_gate.stride(1),
                       w_up=w_up.data_ptr(), up_es=w_up.stride(0), up_rs=w_up.stride(1),
                       w_down=w_down.data_ptr(), down_es=w_down.stride(0), down_rs=w_down.stride(1),
                       E=E, isa=isa)
    weights = (w13, w_down) if w13 is not None else (w_gate, w_up, w_down)
    if setup is None:
        if numa not in NUMA_MODES:
            raise ValueError(f"numa must be one of {', '.join(NUMA_MODES)} (got {numa!r})")
        return PreparedMoe(mod, call, E, H, weights, {"mode": "off"})
    nodes, arrays, cpus, info = setup
    if info.get("plain"):  # one node: nothing to partition, the plain tasks (kernel_plan.setup)
        return PreparedMoe(mod, call, E, H, weights, info)
    call.numa_nodes, call.node_cpus = nodes, cpus
    call.mat_plan, call.plan_hdr, call.seg_off, call.segs = (a.data_ptr() for a in arrays)
    return PreparedMoe(mod, call, E, H, weights, info, keep=arrays)


_QUANT_CODES = {"int8": 1, "fp8": 2}
_QUANT_TORCH = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def _check_quant(name: str, w, scheme: str, shape: tuple[int, int, int], group: int) -> None:
    """A QuantWeight of `scheme`, shape `shape`, with scales in the scheme's layout (hinabench.quant)."""
    from .quant import FP8_BLOCK, INT8_GROUPS, QuantWeight
    if not isinstance(w, QuantWeight):
        got = f"a {w.dtype} tensor" if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{name} must be a hinabench.quant.QuantWeight (quantized weights and their "
                         f"scales; got {got}): quantize with hinabench.quant.quantize")
    if w.scheme != scheme:
        raise ValueError(f"{name} is {w.scheme}, but this call is {scheme}")
    q, s = w.q, w.scale
    if not (isinstance(q, torch.Tensor) and q.device.type == "cpu" and q.dtype == _QUANT_TORCH[scheme]):
        raise ValueError(f"{name}: {scheme} weights must be a {_QUANT_TORCH[scheme]} CPU tensor (got "
                         f"{getattr(q, 'dtype', type(q))}); bf16 weights go through moe_ffn")
    if tuple(q.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(q.shape)}, expected {shape}")
    if not (q.stride(2) == 1 and q.stride(0) >= 0 and q.stride(1) >= 0):
        raise ValueError(f"{name} rows must be contiguous along K (stride {q.stride()}); the kernel reads "
                         "weights in place and never copies them")
    E, N, K = shape
    if scheme == "int8":
        if group not in INT8_GROUPS:
            raise ValueError(f"{name}: int8 group size must be one of {INT8_GROUPS} (got {group})")
        want = (E, N, K // group)
    else:
        if group != FP8_BLOCK:
            raise ValueError(f"{name}: fp8 scales are {FP8_BLOCK}x{FP8_BLOCK} blocks (got group {group})")
        want = (E, -(-N // FP8_BLOCK), -(-K // FP8_BLOCK))
    if not (isinstance(s, torch.Tensor) and s.dtype == torch.float32 and s.device.type == "cpu"):
        raise ValueError(f"{name}: scales must be a float32 CPU tensor (got {getattr(s, 'dtype', type(s))})")
    if tuple(s.shape) != want:
        raise ValueError(f"{name}: scales have shape {tuple(s.shape)}, but {scheme} weights {shape} with "
                         f"group {group} need {want}")
    if not (s.stride(2) == 1 or s.shape[2] == 1):
        raise ValueError(f"{name}: scale rows must be contiguous (stride {s.stride()})")


def moe_ffn_quant(x: torch.Tensor, w13, w_down, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                  isa: str = "auto", threads: int | None = None) -> torch.Tensor:
    """The HiNa-MoE expert FFN on quantized weights (kernels/quant.h), the same driver as moe_ffn.

    w13     hinabench.quant.QuantWeight [E, 2I, H] (gate rows then up rows), int8 or fp8;
    w_down  QuantWeight [E, H, I] of the same scheme and group.
    int8 is W8A8: x is quantized per token and group of `group` along H in the gather, the SiLU(gate)*up
    intermediate per token and group along I before the down projection (hinabench.quant.quantize_act's
    steps); int32 sums per group, scaled per group in fp32. fp8 is weight-only: x stays bf16 (fp32 in
    the kernel). x, topk_ids, topk_weights, isa, threads as in moe_ffn. Returns [T, H] bf16.
    ValueError for bad input (wrong dtype, scale shapes that do not match the group, a group that does
    not divide H or I, ...)."""
    return moe_ffn_quant_prepare(w13, w_down, isa=isa)(x, topk_ids, topk_weights, threads=threads)


def moe_ffn_quant_prepare(w13, w_down, *, isa: str = "auto") -> PreparedMoe:
    """moe_ffn_quant's weights checked and laid out once (PreparedMoe)."""
    from .quant import QuantWeight
    isa = resolve_isa(isa)
    if not isinstance(w13, QuantWeight):
        _check_quant("w13", w13, "int8", (0, 0, 0), 0)   # raises with the reason
    scheme, group = w13.scheme, int(w13.group)
    if scheme not in _QUANT_CODES:
        raise ValueError(f"unknown quantization scheme {scheme!r}")
    if not (w13.q.dim() == 3 and w13.q.shape[1] % 2 == 0):
        raise ValueError("w13 must be [E, 2I, H]")
    E, I2, H = (int(v) for v in w13.q.shape)
    I = I2 // 2
    if not (H > 0 and I > 0 and E > 0):
        raise ValueError(f"empty weights (E={E}, I={I}, H={H})")
    if not (H % SHAPE_MULTIPLE == 0 and I % SHAPE_MULTIPLE == 0):
        raise ValueError(f"H={H} and I={I} must be multiples of {SHAPE_MULTIPLE} (no tail code)")
    if scheme == "int8" and (H % group or I % group):
        raise ValueError(f"the int8 group size {group} must divide H={H} and I={I}")
    if scheme == "fp8" and I % 128:
        raise ValueError(f"fp8: I={I} must be a multiple of 128 (gate and up rows in whole scale blocks)")
    _check_quant("w13", w13, scheme, (E, 2 * I, H), group)
    if not isinstance(w_down, QuantWeight) or w_down.group != group:
        _check_quant("w_down", w_down, scheme, (E, H, I), group)
        raise ValueError(f"w_down's group ({w_down.group}) differs from w13's ({group})")
    _check_quant("w_down", w_down, scheme, (E, H, I), group)
    gate, up = w13.rows(0, I), w13.rows(I, 2 * I)
    mod = _MODULES.get(isa) or _MODULES.setdefault(isa, _module(isa))
    q, s = (gate.q, up.q, w_down.q), (gate.scale, up.scale, w_down.scale)
    call = mod.MoeCall(H=H, I=I, w_gate=q[0].data_ptr(), gate_es=q[0].stride(0), gate_rs=q[0].stride(1),
                       w_up=q[1].data_ptr(), up_es=q[1].stride(0), up_rs=q[1].stride(1),
                       w_down=q[2].data_ptr(), down_es=q[2].stride(0), down_rs=q[2].stride(1),
                       E=E, isa=isa, dtype=_QUANT_CODES[scheme], group=group,
                       s_gate=s[0].data_ptr(), s_gate_es=s[0].stride(0), s_gate_rs=s[0].stride(1),
                       s_up=s[1].data_ptr(), s_up_es=s[1].stride(0), s_up_rs=s[1].stride(1),
                       s_down=s[2].data_ptr(), s_down_es=s[2].stride(0), s_down_rs=s[2].stride(1))
    return PreparedMoe(mod, call, E, H, (w13.q, w13.scale, w_down.q, w_down.scale), {"mode": "off"})


def linear(x: torch.Tensor, w: torch.Tensor, *, isa: str = "auto", threads: int | None = None) -> torch.Tensor:
    """y = x W^T (a dense projection) on the same micro-kernels: the driver's single-matrix case.

    x [T, K] bf16 (rows contiguous, any row stride); w [N, K] bf16 as nn.Linear keeps it (rows
    contiguous along K, any row stride; read in place, never copied). N and K multiples of 32.
    Returns [T, N] bf16 (fp32 accumulation, one rounding). On the AMX ISA, one token (T = 1) runs the
    AVX-512-BF16 micro-kernel: measured faster there (kernels/ops/moe_ffn.cpp, `linear`)."""
    return linear_group(x, [w], isa=isa, threads=threads)[0]


def linear_group(x: torch.Tensor, ws, *, isa: str = "auto", threads: int | None = None) -> list[torch.Tensor]:
    """[x W_1^T, x W_2^T, ...] in one call: several projections of the same x (an attention block's
    q, k and v; a dense MLP's gate and up) share one pack of x and one task list, so the small ones
    pay neither their own parallel region nor their own tail. Each W_i as `linear` takes it, in place;
    the same K for all. Each result is what `linear(x, W_i)` returns, bit for bit."""
    return linear_prepare(ws, isa=isa)(x, threads=threads)


class PreparedLinear(_Prepared):
    """linear_group's weights checked once (linear_prepare): calling it with x runs the group after
    x's checks only (what a framework keeps per projection; see PreparedMoe)."""

    def __init__(self, mod, isa: str, weights: list, K: int):
        super().__init__(weights)
        self._mod, self._isa, self.K = mod, isa, K
        self._N = [int(w.shape[0]) for w in weights]
        self._ldw = [w.stride(0) if N > 1 else K for w, N in zip(weights, self._N)]

    def __call__(self, x: torch.Tensor, *, threads: int | None = None) -> list[torch.Tensor]:
        K = self.K
        T = _check_tokens(x, K, "K")
        outs = [torch.empty(T, N, dtype=torch.bfloat16) for N in self._N]
        if T == 0:
            return outs
        threads = _threads(threads)
        self._mod.linear(x=x.data_ptr(), T=T, K=K, ldx=x.stride(0) if T > 1 else K, w=list(self._ptrs), N=self._N,
                         ldw=self._ldw, out=[o.data_ptr() for o in outs], isa=self._isa, threads=threads)
        return outs


def linear_prepare(ws, *, isa: str = "auto") -> PreparedLinear:
    """linear_group's weight matrices checked and laid out once: linear_group(x, ws) is
    linear_prepare(ws)(x)."""
    isa = resolve_isa(isa)
    ws = list(ws)
    if not ws:
        raise ValueError("linear_group needs at least one weight matrix")
    shapes = []
    for w in ws:
        if not (isinstance(w, torch.Tensor) and w.dim() == 2):
            raise ValueError("w must be a [N, K] tensor")
        N, K = (int(s) for s in w.shape)
        if not (w.device.type == "cpu" and w.dtype == torch.bfloat16):
            raise ValueError(f"w must be a bfloat16 CPU tensor (got {w.dtype} on {w.device})")
        if not (w.stride(1) == 1 and (N <= 1 or w.stride(0) >= K)):
            raise ValueError(f"w rows must be contiguous along K (stride {w.stride()}); the kernel reads "
                             "weights in place and never copies them")
        if not (N > 0 and K > 0 and N % SHAPE_MULTIPLE == 0 and K % SHAPE_MULTIPLE == 0):
            raise ValueError(f"N={N} and K={K} must be positive multiples of {SHAPE_MULTIPLE} (no tail code)")
        if shapes and K != shapes[0][1]:
            raise ValueError(f"every matrix of a group must have the same K (got {shapes[0][1]} and {K})")
        shapes.append((N, K))
    mod = _MODULES.get(isa) or _MODULES.setdefault(isa, _module(isa))
    return PreparedLinear(mod, isa, ws, shapes[0][1])


def scratch_bytes(isa: str = "auto") -> int:
    """Scratch bytes (packed I, activations, y rows) the last call on this ISA's module used."""
    return int(_module(resolve_isa(isa)).moe_scratch_bytes())


# Decode / extend attention (paper Section 6): its own module, re-exported here.
from .kernels_attention import (AttentionPlan, attention_fused_step, attention_isas,  # noqa: E402
                                attention_last_schedule,
                                decode_attention, decode_attention_plan, extend_attention,
                                extend_attention_plan, resolve_attention_isa)
