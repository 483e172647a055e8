"""The `vllm` engine's measurement, run by the vllm environment's interpreter (its own process).

    python vllm_run.py REQUEST.json RESULT.json

REQUEST: {"path", "batches", "prompt", "gen", "rounds", "validate_ids", "greedy_steps", "prompt_ids"
(per batch: [B][P] ids), "compile"}. RESULT: {"version", "validation": {"prompt_logprobs": [...],
"greedy": [...]}, "points": {B: {"ttft_s": [...], "steps_s": [...]}}} or {"error": "..."}.
Timing steps vLLM's engine by hand (LLMEngine.add_request, then step() until done, the engine core in
this process): the first step is the prefill of every prompt (TTFT), each later step one decode token
per sequence (TPOT). Reading the request and writing the result (or the error): peer_run.py. Imports
nothing from hinabench: the env has its own torch and transformers. Run with PYTHONPATH=vllm_site/
(its sitecustomize keeps torchvision, torchaudio and torchcodec out of the way).
"""
import os
import sys
import time


def measure(req: dict, res: dict) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import LLM, SamplingParams
    res["version"] = vllm.__version__
    P, G = int(req["prompt"]), int(req["gen"])
    kw = {}
    if not req.get("compile", False):
        kw["compilation_config"] = {"mode": 0}
    # enable_prefix_caching=False: every round sends the same prompt, which vLLM's prefix cache (on by
    # default in its v1 engine) would otherwise serve from the first round's KV: TTFT of a 4096-token
    # prompt read 175 ms from round 2 on (2 layers of Qwen3-30B-A3B, 2 threads), where round 1 took ~1.3 s
    llm = LLM(model=req["path"], dtype="bfloat16", max_model_len=P + G + 16, seed=0, enable_prefix_caching=False,
              max_num_seqs=max(req["batches"]), skip_tokenizer_init=True, enforce_eager=True,
              max_num_batched_tokens=max(4096, P * max(req["batches"])), **kw)
    # validation: prompt log-probs of the validation ids, and the first greedy steps
    sp = SamplingParams(max_tokens=int(req["greedy_steps"]), temperature=0.0, prompt_logprobs=0,
                        ignore_eos=True, detokenize=False)
    out = llm.generate([{"prompt_token_ids": req["validate_ids"]}], sp, use_tqdm=False)[0]
    plp = []
    for tok, d in zip(req["validate_ids"][1:], out.prompt_logprobs[1:]):
        plp.append(float(d[tok].logprob))
    res["validation"] = {"prompt_logprobs": plp, "greedy": list(out.outputs[0].token_ids)}
    eng = llm.llm_engine
    res["points"] = {}
    for r in range(int(req["rounds"])):
        for B in req["batches"]:
            ids = req["prompt_ids"][str(B)]
            sp = SamplingParams(max_tokens=G, temperature=0.0, ignore_eos=True, detokenize=False)
            t0 = time.perf_counter()
            for i in range(B):
                eng.add_request(f"r{r}-b{B}-{i}", {"prompt_token_ids": ids[i]}, sp)
            steps = []
            while eng.has_unfinished_requests():
                t = time.perf_counter()
                eng.step()
                steps.append(time.perf_counter() - t)
            p = res["points"].setdefault(str(B), {"ttft_s": [], "steps_s": [], "wall_s": []})
            p["ttft_s"].append(steps[0] + (time.perf_counter() - t0 - sum(steps)) if steps else None)
            p["steps_s"] += steps[1:]
            p["wall_s"].append(time.perf_counter() - t0)


if __name__ == "__main__":
    from peer_run import run   # beside this file (see peer_run.py)
    sys.exit(run(measure))
