"""Loaded by every Python process of the vllm engine (PYTHONPATH=this folder), vLLM's own model-inspection
subprocesses included: keeps packages that fail to import in that env out of transformers' and vLLM's way."""
import importlib.abc
import importlib.util
import sys

# The env's torchvision, torchaudio and torchcodec fail to import against its torch (torchvision::nms missing);
# transformers imports them when it finds them. Keep them out of its way: not found, not importable.
KEPT_OUT = ("torchvision", "torchaudio", "torchcodec")
_find_spec = importlib.util.find_spec


def _find_spec_without(name, package=None):
    if name.split(".")[0] in KEPT_OUT:
        return None
    return _find_spec(name, package)


class _KeepOut(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in KEPT_OUT:
            raise ModuleNotFoundError(f"{name} is kept out of vLLM's way (it fails to import in this env)", name=name)
        return None


def keep_out() -> None:
    importlib.util.find_spec = _find_spec_without
    sys.meta_path.insert(0, _KeepOut())


keep_out()
