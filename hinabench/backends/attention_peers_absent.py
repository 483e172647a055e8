"""Attention peers the issue names that have no adapter in hinabench yet, each with the reason, so every
`hinabench attn` run shows them as `unsupported` rows instead of leaving them out silently. None of these
claims to run: availability() is always False, with what was found on the development machine (an
AVX2-only Zen 3; docs/MACHINE-NOTES in the shared notes) and what writing the adapter would take.
"""
from __future__ import annotations

from typing import ClassVar

from . import register
from .base import Backend


class _Absent(Backend):
    ops = ("attention",)
    missing_status: ClassVar[str] = "unsupported"
    why: ClassVar[str] = ""

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        return False, cls.why


@register
class SglangAttn(_Absent):
    name = "sglang:attn"
    description = "SGLang decode_attention_cpu / extend_attention_cpu (adapter not written)"
    why = ("the adapter is not written: the only build that carries SGLang's decode_attention_cpu/"
           "extend_attention_cpu is vLLM's _C (its AVX-512-BF16 library, SIGILL on an AVX2-only CPU); kt's "
           "sgl_kernel does not import (no common_ops)")
