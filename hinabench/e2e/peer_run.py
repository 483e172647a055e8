"""What the peer engines' scripts (vllm_run.py, llamacpp_run.py, ipex_run.py) share: the request in, the result out.

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
