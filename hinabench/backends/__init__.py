"""The backend registry. A new backend is one module here, listed in _MODULES."""
from __future__ import annotations

import importlib

from ..errors import UserError
from .base import Backend, Unsupported

REGISTRY: dict[str, type[Backend]] = {}
IMPORT_ERRORS: dict[str, str] = {}
_MODULES = ["torch_naive", "torch_quant", "torch_cuda", "onednn", "hina", "vllm", "kt", "ipex", "llamacpp", "zentorch",
            "torch_attention", "vllm_attention", "ipex_attention", "llamacpp_attention", "sglang_attention"]


def register(cls: type[Backend]) -> type[Backend]:
    REGISTRY[cls.name] = cls
    return cls


_LOADED: list[bool] = []


def _load() -> None:
    """Import every backend module once (a module imported on its own registers only itself)."""
    if _LOADED:
        return
    _LOADED.append(True)
    for mod in _MODULES:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except Exception as e:  # a broken backend must not take the harness down
            IMPORT_ERRORS[mod] = f"{type(e).__name__}: {e}"


def names() -> list[str]:
    _load()
    return list(REGISTRY)


def resolve(spec: str, op: str = "ffn") -> list[str]:
    """'all', 'torch,onednn' or 'onednn:prepacked' -> registry names of backends with a path for the
    problem kind `op`. A family name means all of its variants (those with an `op` path); 'all' means
    every backend with an `op` path; a backend named alone that has none is an error."""
    _load()
    serves = [n for n in REGISTRY if op in REGISTRY[n].ops]
    if spec.strip() in ("", "all"):
        return serves
    out: list[str] = []
    for part in (s.strip() for s in spec.split(",")):
        if not part:
            continue
        hits = [n for n in REGISTRY if n == part or n.split(":")[0] == part]
        if not hits:
            raise UserError(f"unknown backend '{part}'; known: {', '.join(REGISTRY)}")
        ok = [h for h in hits if h in serves]
        if not ok:
            raise UserError(f"backend '{part}' has no {op} path; backends with one: {', '.join(serves)}")
        out += [h for h in ok if h not in out]
    return out


def get(name: str) -> type[Backend]:
    _load()
    return REGISTRY[name]


__all__ = ["Backend", "Unsupported", "REGISTRY", "register", "resolve", "get", "names"]
