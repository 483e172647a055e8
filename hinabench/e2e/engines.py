"""The end-to-end engines: which can run here, and why not when one cannot.

  hf            transformers eager, as shipped (its default experts implementation), in this process
  hina          the same model with dropin.py (the HiNa expert FFN through transformers' experts interface)
  hina+l        hina plus the dense projections (q/k/v/o, router, LM head) on the HiNa linear kernel
  hina+a        hina plus HiNa decode attention through transformers' attention interface (dropin_attention.py),
                on a KV cache appended in place (dropin_cache.py) instead of DynamicLayer's torch.cat per step
  hina+l+a      every HiNa kernel: the experts, the dense projections and decode attention
  hina+fused    hina+l+a with the decoder's decode step as one native call (dropin_layer.py): the same kernels,
                the glue between them (norms, rotary, the router's top-k, the residuals) in C++
  hina+l+a:int8 hina+l+a with the experts quantized to INT8 once (dropin_int8.py: group-wise W8A8, the bytes
                class of llama.cpp's Q8_0)
  hina+fused:int8  hina+fused on the same INT8 experts
  vllm          vLLM-CPU on the same checkpoint, in the `vllm` environment (vllm_run.py)
  llamacpp:bf16, llamacpp:q8_0   a GGUF of the same weights (gguf_writer.py) through llama-cpp-python in
                the `llamacpp` environment (llamacpp_run.py; batch 1 only)
  ipex          ipex.llm.optimize on the env's own transformers model (4.51.3), in the `ipex` environment
                (ipex_run.py; CPUs with AVX-512)
  kt            KTransformers' engine
"""
from __future__ import annotations

ENGINES = ("hina", "hf", "hina+l", "hina+a", "hina+l+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8", "vllm",
           "llamacpp:bf16", "llamacpp:q8_0", "ipex", "kt")
IN_PROCESS = ("hf", "hina", "hina+l", "hina+a", "hina+l+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8")
# the engines with the HiNa kernels, and which of the drop-ins each adds to the experts'
HINA = ("hina", "hina+l", "hina+a", "hina+l+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8")
WITH_LINEAR = ("hina+l", "hina+l+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8")
WITH_ATTENTION = ("hina+a", "hina+l+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8")
FUSED = ("hina+fused", "hina+fused:int8")     # the decoder's decode step as one native call (dropin_layer.py)
FUSED_MODEL_TYPES = ("qwen3_moe", "mixtral")   # the decoder layers it knows (dropin_layer.ROUTERS)
INT8 = ("hina+l+a:int8", "hina+fused:int8")   # the experts quantized (dropin_int8.py)
# in their own env and process, each by its script beside this file (run._run_peer): engine -> (env, script)
PEERS = {"vllm": ("vllm", "vllm_run.py"), "llamacpp:bf16": ("llamacpp", "llamacpp_run.py"),
         "llamacpp:q8_0": ("llamacpp", "llamacpp_run.py"), "ipex": ("ipex", "ipex_run.py")}
DESCRIPTIONS = {
    "hf": "transformers eager (its default experts implementation), bf16",
    "hina": "transformers + the HiNa expert FFN via ExpertsInterface (hinabench/e2e/dropin.py), bf16",
    "hina+l": "hina + the dense projections, router and LM head on the HiNa linear kernel (dropin_linear.py), bf16",
    "hina+a": "hina + HiNa decode attention via transformers' AttentionInterface (dropin_attention.py) on a KV cache appended in place (dropin_cache.py), bf16",
    "hina+l+a": "hina + the linear kernel (dropin_linear.py) + HiNa decode attention (dropin_attention.py, dropin_cache.py), bf16",
    "hina+fused": "hina+l+a with the decoder's decode step as one native call (dropin_layer.py), bf16",
    "hina+l+a:int8": "hina+l+a with the experts quantized to INT8 once (dropin_int8.py: group 128, W8A8), bf16 elsewhere",
    "hina+fused:int8": "hina+fused on the INT8 experts of hina+l+a:int8 (dropin_layer.py, dropin_int8.py), bf16 elsewhere",
    "vllm": "vLLM-CPU (bf16, eager, its own process and env)",
    "llamacpp:bf16": "llama.cpp via llama-cpp-python, GGUF BF16 of the same weights",
    "llamacpp:q8_0": "llama.cpp via llama-cpp-python, GGUF Q8_0 of the same weights",
    "ipex": "Intel Extension for PyTorch 2.8, ipex.llm.optimize (bf16, deployment mode; its own process and env)",
    "kt": "KTransformers' inference engine",
}


def expand(names: list[str]) -> list[str]:
    """Engine names from --engines: `llamacpp` means both of its GGUF types; `all` every engine."""
    from ..errors import UserError
    out: list[str] = []
    for n in names:
        n = n.strip().lower()
        if n == "all":
            out += list(ENGINES)
        elif n == "llamacpp":
            out += ["llamacpp:bf16", "llamacpp:q8_0"]
        elif n in ENGINES:
            out.append(n)
        else:
            raise UserError(f"unknown engine '{n}'; known: {', '.join(ENGINES)}, llamacpp, all")
    return list(dict.fromkeys(out))


def status(engine: str, model_type: str | None = None) -> tuple[str, str]:
    """('ok', '') when `engine` can run here (on a checkpoint of `model_type`, where given), else (row
    status, reason in words)."""
    from .. import envs
    if engine in FUSED and model_type is not None and model_type not in FUSED_MODEL_TYPES:
        return "unsupported", (f"{engine} knows the decoder layers of {', '.join(FUSED_MODEL_TYPES)} (dropin_layer.py), "
                               f"not {model_type}'s (Qwen2-MoE's shared expert and its gate are not in the native layer)")
    if engine in IN_PROCESS:
        try:
            import transformers  # noqa: F401
            from transformers.integrations.moe import ExpertsInterface  # noqa: F401
        except ImportError as e:
            return "unavailable", f"transformers with an experts interface (>= 5) is not installed ({e}): pip install -e '.[e2e]'"
        if engine in HINA:
            from ..kernels import isa_status, resolve_isa
            try:
                isa = resolve_isa("auto")
            except Exception as e:  # noqa: BLE001
                return "unavailable", f"the HiNa kernel cannot run here: {e}"
            if not isa_status(isa)[0]:
                return "unavailable", isa_status(isa)[1]
        if engine in WITH_ATTENTION:
            from ..kernels_attention import resolve_attention_isa
            try:
                resolve_attention_isa("auto")
            except Exception as e:  # noqa: BLE001
                return "unavailable", f"the HiNa attention kernel cannot run here: {e}"
        return "ok", ""
    if engine == "vllm":
        ok, why = envs.usable("vllm")
        return ("ok", "") if ok else ("unavailable", why)
    if engine.startswith("llamacpp"):
        ok, why = envs.usable("llamacpp")
        if not ok:
            return "unavailable", (f"{why} (a ~14-minute source build of llama-cpp-python on 2 cores); the GGUF "
                                   f"it would load is written by `hinabench e2e --gguf`")
        return "ok", ""
    if engine == "ipex":
        if not _cpu_has("avx512f"):
            return "unsupported", ("ipex.llm.optimize needs AVX-512 (bf16 prepack/brgemm): on an AVX2-only CPU "
                                   "IPEX refuses it (MACHINE-NOTES)")
        ok, why = envs.usable("ipex")
        return ("ok", "") if ok else ("unavailable", f"{why} (about 7 GB: torch 2.8 from PyPI is a CUDA build)")
    if engine == "kt":
        return "unsupported", ("KTransformers' engine is a server that puts attention on a GPU and its MoE on "
                               "kt-kernel with its own weight conversion; not integrated here (kt-kernel's MoE "
                               "op alone is the `kt` backend of `hinabench ffn`)")
    return "unsupported", f"unknown engine {engine}"


def _has_attention_kernel() -> bool:
    try:
        from .. import kernels
    except ImportError:
        return False
    return hasattr(kernels, "decode_attention") or hasattr(kernels, "attention")


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return flag in line.split()
    except OSError:
        pass
    return False
