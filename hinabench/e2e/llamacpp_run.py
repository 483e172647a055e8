"""The `llamacpp:*` engines' measurement, run by the llamacpp environment's interpreter (its own process).

    python llamacpp_run.py REQUEST.json RESULT.json

REQUEST: as vllm_run.py's, plus "gguf" (the file hinabench e2e --gguf wrote) and "threads". RESULT: the
same shape as vllm_run.py's. llama-cpp-python's Llama runs one sequence, so only batch 1 is timed
(other batches come back without samples: the harness stores them `unsupported`). TTFT is one eval()
of the prompt; each decode step one eval() of the argmax token. Validation: the prompt tokens' log-probs
from the full logits (a logits_all instance, freed before
the timed one). Written against llama-cpp-python 0.3's API; not run on the
development machine (its env is a ~14-minute source build), so the harness treats any failure as a
`failed` row with the error.
"""
import sys
import time


def measure(req: dict, res: dict) -> None:
    import llama_cpp
    import numpy as np
    res["version"] = llama_cpp.__version__
    P, G = int(req["prompt"]), int(req["gen"])
    n = int(req["threads"])
    def load(logits_all: bool):
        return llama_cpp.Llama(model_path=req["gguf"], n_threads=n, n_threads_batch=n,
                               n_ctx=max(P, len(req["validate_ids"])) + G + 16, n_batch=max(512, P),
                               logits_all=logits_all, verbose=False, seed=0)
    llm = load(True)          # every prompt position's logits: validation only (it costs a prefill)
    ids = req["validate_ids"]
    llm.reset()
    llm.eval(ids)
    scores = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    lse = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
    res["validation"] = {"prompt_logprobs": [float(scores[i - 1, t] - lse[i - 1]) for i, t in enumerate(ids) if i > 0]}
    greedy = []
    for _ in range(int(req["greedy_steps"])):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy.append(tok)
        llm.eval([tok])
    res["validation"]["greedy"] = greedy
    del llm
    llm = load(False)         # the timed instance: logits of the last position only
    res["points"] = {}
    for _ in range(int(req["rounds"])):
        for B in req["batches"]:
            p = res["points"].setdefault(str(B), {"ttft_s": [], "steps_s": []})
            if B != 1:
                continue
            llm.reset()
            t = time.perf_counter()
            llm.eval(req["prompt_ids"][str(B)][0])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            p["ttft_s"].append(time.perf_counter() - t)
            for _ in range(G - 1):
                t = time.perf_counter()
                llm.eval([tok])
                tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                p["steps_s"].append(time.perf_counter() - t)


if __name__ == "__main__":
    from peer_run import run   # beside this file (see peer_run.py)
    sys.exit(run(measure))
