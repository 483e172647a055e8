"""The `llamacpp:*` engines' measurement, run by the llamacpp environment's interpreter (its own process).

    python llamacpp_run.py REQUEST.json RESULT.json

REQUEST: as vllm_run.py's, plus "gguf" (the file hinabench e2e --gguf wrote) and "threads". RESULT: the
same shape as vllm_run.py's. llama-cpp-python's Llama runs one sequence, so only batch 1 is timed
(other batches come back without samples: the harness stores them `unsupported`). TTFT is one eval()
of the prompt; each decode step one eval() of the argmax token. Validation: the prompt tokens' log-probs
from the full logits (a logits_all instance, freed before the timed one). Written against
llama-cpp-python 0.3's API (0.3.36 built on the development machine); any failure is a `failed` row with
the error.

The KV cache is bf16 (request "kv_cache"), as transformers and vLLM keep it (the model's dtype), not
llama.cpp's default f16: on these synthetic weights f16 flushed small K/V values into its subnormals and
the BF16 GGUF's prompt log-probs moved 0.068 nats from the fp32 reference (bf16 cache: 0.019, f32:
0.017; Qwen3-30B-A3B widths, 2 layers; transformers' own bf16 run: 0.034).

Request "extra_bufts": false loads with llama.cpp's extra buffer types off (llama_model_params
use_extra_bufts, what `llama-cli --no-repack` sets): no AMX or CPU repacking of the weights, each
matrix product on ggml's plain CPU kernels. The harness asks for it only after the default load died
with SIGSEGV or SIGILL (run._run_peer): on the first AMX Xeon (intel-f6m167) the Q8_0 engine's AMX buffer
(attention, router and output weights repacked for tiles) crashes in ggml_backend_amx_mul_mat at the
first eval (gdb; llama.cpp issue 20824, "works fine on another machine", closed without a fix); on the
second (intel-f6m207) the same engine dies with SIGILL 3 s in, at `tilezero %tmm4` in
ggml_backend_amx_mul_mat (gdb, llama-cpp-python 0.3.36), also with the process's AMX permission
requested first (arch_prctl ARCH_REQ_XCOMP_PERM returned 0): a tile instruction with no tile
configuration loaded in that thread.
"""
import sys
import time


def measure(req: dict, res: dict) -> None:
    import llama_cpp
    import numpy as np
    res["version"] = llama_cpp.__version__
    if req.get("extra_bufts") is False:
        import llama_cpp.llama_cpp as capi     # Llama() builds its params from this function
        default_params = capi.llama_model_default_params
        if "use_extra_bufts" not in dict(default_params().__class__._fields_):
            raise RuntimeError(f"llama-cpp-python {llama_cpp.__version__} has no use_extra_bufts")

        def no_extra_bufts():
            p = default_params()
            p.use_extra_bufts = False
            return p
        capi.llama_model_default_params = no_extra_bufts
    res["extra_bufts"] = req.get("extra_bufts", True)
    P, G = int(req["prompt"]), int(req["gen"])
    n = int(req["threads"])
    kv_name = req.get("kv_cache", "bf16")
    kv = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16,
          "bf16": getattr(llama_cpp, "GGML_TYPE_BF16", 30)}[kv_name]
    res["kv_cache"] = kv_name

    n_ctx = max(P, len(req["validate_ids"])) + G + 16

    def load(logits_all: bool):
        # n_batch >= n_ctx: without logits_all, llama-cpp-python 0.3 keeps n_batch rows of scores but
        # writes a step's logits at its absolute position (an IndexError past n_batch: a 4096-token
        # prompt with n_batch 4096 failed at the first decode step)
        return llama_cpp.Llama(model_path=req["gguf"], n_threads=n, n_threads_batch=n,
                               n_ctx=n_ctx, n_batch=max(512, n_ctx),
                               logits_all=logits_all, verbose=False, seed=0, type_k=kv, type_v=kv,
                               use_mmap=False)   # weights read into memory at load, as peer_run.resident
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
