"""The `ipex` engine's measurement, run by the ipex environment's interpreter (its own process).

    python ipex_run.py REQUEST.json RESULT.json

REQUEST: as vllm_run.py's. RESULT: the same shape. The model is the checkpoint loaded by the env's own
transformers (4.51.3, the version IPEX 2.8 validated `ipex.llm.optimize` with) in bf16, then
`ipex.llm.optimize(model, dtype=bfloat16, deployment_mode=True)`: IPEX's fused and prepacked linear
layers, its MoE and attention ops and its KV cache (IndirectAccessKVCache), as IPEX's own LLM examples run
it. `generate()` is IPEX's (the optimize call installs its greedy search); the times come from a logits
processor, called once per generated token after that step's forward: the first call less the start of
`generate()` is the TTFT (the prefill of B x P tokens), each later interval one decode step.
Validation: the prompt tokens' log-probs from one forward of the validation ids, and the first greedy
tokens from `generate()`. Reading the request and writing the result (or the error): peer_run.py.
"""
import sys
import time


def measure(req: dict, res: dict) -> None:
    import torch
    import intel_extension_for_pytorch as ipex
    try:
        import transformers
        from transformers import AutoModelForCausalLM, LogitsProcessorList
    except ImportError as e:
        raise RuntimeError(f"the ipex env has no transformers ({e}): an env made before the e2e engine; run "
                           "`hinabench env remove ipex` and `hinabench env create ipex`") from None
    torch.set_num_threads(int(req["threads"]))
    res["version"] = ipex.__version__
    res["transformers"] = transformers.__version__
    G = int(req["gen"])
    model = AutoModelForCausalLM.from_pretrained(req["path"], torch_dtype=torch.bfloat16)
    model.eval()
    from peer_run import resident   # beside this file (see peer_run.py): the weights into memory at load
    model = resident(model)
    model = ipex.llm.optimize(model, dtype=torch.bfloat16, inplace=True, deployment_mode=True)
    # no end-of-sequence: every run generates exactly its tokens (random weights may pick any id)
    gen_kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, num_beams=1)

    class Clock:
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    with torch.inference_mode():
        ids = torch.tensor([req["validate_ids"]])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        plp = lp[:-1].gather(1, ids[0, 1:, None])[:, 0]
        n = int(req["greedy_steps"])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **gen_kw)
        res["validation"] = {"prompt_logprobs": plp.tolist(), "greedy": out[0, ids.shape[1]:].tolist()}
        res["points"] = {}
        for _ in range(int(req["rounds"])):
            for B in req["batches"]:
                x = torch.tensor(req["prompt_ids"][str(B)])
                clock = Clock()
                t0 = time.perf_counter()
                model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=G, min_new_tokens=G,
                               logits_processor=LogitsProcessorList([clock]), **gen_kw)
                p = res["points"].setdefault(str(B), {"ttft_s": [], "steps_s": [], "wall_s": []})
                if clock.t:
                    p["ttft_s"].append(clock.t[0] - t0)
                    p["steps_s"] += [b - a for a, b in zip(clock.t, clock.t[1:])]
                p["wall_s"].append(time.perf_counter() - t0)


if __name__ == "__main__":
    from peer_run import run   # beside this file (see peer_run.py)
    sys.exit(run(measure))
