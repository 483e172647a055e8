"""The compiled modules (`_C`, and the emulated builds), imported with a diagnosis when they are missing.

The usual cause on a developer's machine: Python imports the source folder `hinabench/` of a checkout
(the current directory is on sys.path: `python -c`, `python -m`, a notebook started at the repository
root) instead of the installed package, and the source folder has no compiled module. That is said so,
with what to do, instead of a bare ImportError.
"""
from __future__ import annotations

import importlib
import os


class NativeMissing(ImportError):
    """A compiled module of hinabench is not importable; the message says why and what to do."""


def shadowing() -> str:
    """'' or a sentence: the imported hinabench is a checkout's source folder shadowing an installed one."""
    import hinabench
    here = os.path.realpath(os.path.dirname(hinabench.__file__))
    root = os.path.dirname(here)
    if not os.path.exists(os.path.join(root, "pyproject.toml")):
        return ""
    try:
        from importlib import metadata
        dist = metadata.distribution("hinabench")
        installed = os.path.realpath(str(dist.locate_file("hinabench")))
    except Exception:
        return ""
    if installed == here or not os.path.isdir(installed):
        return ""
    return (f"Python imported hinabench from the source folder {here} (the current directory is on "
            f"sys.path), which shadows the installed package at {installed}; run from another directory, "
            f"or install the checkout in editable mode: pip install --no-build-isolation -e .")


def load(name: str = "_C"):
    """hinabench.<name>, or NativeMissing with the reason and the fix."""
    try:
        return importlib.import_module(f"hinabench.{name}")
    except ImportError as e:
        why = shadowing()
        if why:
            raise NativeMissing(f"the compiled module hinabench.{name} is not here: {why}") from e
        raise NativeMissing(f"the compiled module hinabench.{name} is not built ({e}); install hinabench "
                            f"with `pip install .` (or `pip install --no-build-isolation -e .` in a checkout)"
                            + (" with simde-py installed" if name == "_C_avx512_emu" else "")) from e
