"""What the peer engines' scripts (vllm_run.py, llamacpp_run.py, ipex_run.py) share: the request in, the result out;
and `resident`, the load step every transformers-loaded engine takes (measure.load's too).

    python <engine>_run.py REQUEST.json RESULT.json

Run by each engine's own interpreter, which imports this file as a top-level module from the
script's folder (sys.path[0]); like the scripts, it imports nothing from hinabench (the env has none).
"""
import json
import sys
from typing import Callable


def run(measure: Callable[[dict, dict], None]) -> int:
    """measure(request, result) fills the result. Whatever it raises goes into result["error"] (beside
    what it had filled), and the result is always written: the harness turns the error into the rows'
    reason. Exit status 0: a missing result file means the process itself died."""
    req_path, out_path = sys.argv[1], sys.argv[2]
    req = json.load(open(req_path))
    res: dict = {}
    try:
        measure(req, res)
    except BaseException as e:  # noqa: BLE001 - reported to the harness as the row's reason
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:400]
    json.dump(res, open(out_path, "w"))
    return 0


def resident(model):
    """Every parameter and buffer of a transformers model copied into this process's own memory, one
    tensor at a time.

    transformers maps the safetensors file, so a page of it that was never read, or that the kernel
    dropped from the page cache since, is read from the disk when a step first needs it: with random
    weights each new token's embedding row (151936 rows for Qwen3). Measured on the AMX Xeon
    (2026-12-04, Qwen3-30B-A3B 4 layers, batch 1): the embedding lookup took 3-10 ms on 4-8 of 16 decode
    steps, each with a major page fault, against 0.04-0.1 ms on the others, for `hf` and the `hina`
    engines alike. vLLM and llama.cpp (run without mmap) read their weights into memory at load; so do
    the transformers-loaded engines (measure.load, ipex_run.py). The kernels still read the parameters in
    place: a copy here is the loader's, made once, for every engine the same."""
    import gc

    import torch
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            t.data = t.data.clone()
    gc.collect()
    return model
