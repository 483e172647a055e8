"""Problem kinds: the spine of the harness (see base.py for the contract).

A new kind is one module here with a `Problem` subclass, listed in KINDS.
"""
from __future__ import annotations

from ..errors import UserError
from .base import Problem, ProblemData, fill_bf16, rotation_groups, seed_for
from .ffn import ROUTINGS, FFNData, FFNProblem, materialize, moe_ffn_reference
from .attention import AttentionData, AttentionProblem
from .e2e import E2EProblem
from .linear import LinearData, LinearProblem
from .validate import diagnose, rel_err

KINDS: dict[str, type[Problem]] = {k.kind: k for k in (FFNProblem, LinearProblem, AttentionProblem, E2EProblem)}


def get_kind(op: str) -> type[Problem]:
    if op not in KINDS:
        raise UserError(f"unknown problem kind '{op}'; known: {', '.join(KINDS)}")
    return KINDS[op]


def problem_from_dict(d: dict) -> Problem:
    """The inverse of Problem.to_dict (a dict without 'kind' is an FFN problem, protocol v1)."""
    return get_kind(d.get("kind", "ffn")).from_dict(d)


__all__ = ["KINDS", "Problem", "ProblemData", "FFNProblem", "FFNData", "LinearProblem", "LinearData", "AttentionProblem", "AttentionData", "E2EProblem",
           "ROUTINGS", "get_kind", "problem_from_dict", "materialize", "moe_ffn_reference", "fill_bf16",
           "rotation_groups", "seed_for", "rel_err", "diagnose"]
