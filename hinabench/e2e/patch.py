"""The drop-in's text and its size in lines of code (what `hinabench e2e --show-patch` prints)."""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc_lines)


def patch_text(name: str = "dropin.py") -> tuple[str, int]:
    """A drop-in file's text and its code lines: dropin.py (the expert FFN: the paper's "about 30 lines"),
    dropin_attention.py (decode attention, engine hina+a), dropin_cache.py (its KV cache appended in place),
    dropin_int8.py (the INT8 experts, engines hina+l+a:int8 and hina+fused:int8), dropin_layer.py (the decoder
    layer's decode step as one native call, engines hina+fused and hina+fused:int8)."""
    src = Path(__file__).with_name(name).read_text()
    return src, code_lines(src)
