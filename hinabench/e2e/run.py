"""`hinabench e2e`: every engine on one checkpoint per depth, validated, then timed, rows stored.

Per (model, depth): the checkpoint (written once), the fp32 reference, then the in-process engines
(hf, hina: one transformers model, interleaved rounds), the engines in their own processes (vllm, llamacpp)
once the in-process model is freed, then the in-process engines' other half of the rounds (with peers
and >= 2 rounds: see _InProcess), then rows for engines that cannot run here (status + reason).
Rows: one `prefill` row (TTFT) and one `decode` row (TPOT, tokens/s, FFN and attention shares) per
engine and batch; `prefill` rows at batch 1 for each --prefill length (Table 4).

Paired depths (`paired`, on by default with two depths or more): at the second-shallowest depth N2 each
round of an in-process engine also decodes with the model cut to its first N1 layers (the shallowest depth:
measure.first_layers; the seeded fill is per tensor name, so those are the N1 checkpoint's bytes), the two
in alternating order, and the decode row carries the per-layer cost from those pairs
(`paired_per_layer_ms`: the median over rounds of (step(N2) - step(N1)) / (N2 - N1), `paired_mad_ms` their
MAD). Both depths are then timed seconds apart in one process, so the machine's drift over the minutes
between the two depths' processes (4-layer steps moved 37.4 -> 40.2 ms within one run on the AMX Xeon)
stays out of the difference; the peers' per-layer cost stays the two processes' (figures.per_layer).
"""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import UserError
from ..harness.loadmeter import LoadMeter
from ..harness.stats import median, summarize, unstable
from ..models import get_model
from ..problems.e2e import E2EProblem
from . import engines as E
from . import measure as M
from .checkpoint import checkpoint, checkpoint_bytes, hf_config, prompt_ids


@dataclass
class E2EConfig:
    models: list[str]
    layers: list[int]
    prompt: int = 128
    gen: int = 128
    batches: list[int] = field(default_factory=lambda: [1])
    engines: list[str] = field(default_factory=lambda: ["hina", "hf"])
    prefill: list[int] = field(default_factory=list)        # Table 4 prompt lengths (batch 1)
    prefill_engines: list[str] = field(default_factory=lambda: ["hina", "hf"])
    rounds: int = 2
    seed: int = 0
    threads: int = 0
    mem_budget: int = 7 << 30
    vllm_compile: bool = False
    paired: bool = True                 # the in-process engines' per-layer cost also from paired depths
    command: str = ""
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}")


def _base(p: E2EProblem, engine: str, cfg: E2EConfig, ck) -> dict:
    from .. import __version__
    from ..harness.store import empty_row
    from ..machine.sysinfo import fingerprint, machine_id, summary
    fp = fingerprint()
    row = empty_row("e2e")
    row.update(op="e2e", **p.key(), backend=engine, threads=cfg.threads, numa="default",
               checkpoint_hash=ck.hash if ck else None, rounds=cfg.rounds, machine=machine_id(fp), fingerprint=summary(fp),
               hinabench_version=__version__, git_rev=fp["git_rev"], command=cfg.command, run_id=cfg.run_id,
               timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"), note=E.DESCRIPTIONS.get(engine))
    return row


def _fill_timing(row: dict, samples_s: list[float], tokens_per_sample: int) -> None:
    s = summarize(samples_s)
    row.update(s)
    row["unstable"] = unstable(s)
    if s:
        row["tokens_per_s"] = tokens_per_sample / (s["median_ms"] / 1e3)


def _versions(engine: str) -> str:
    import transformers
    v = {"transformers": transformers.__version__, "torch": torch.__version__}
    if engine.startswith("hina"):
        from ..kernels import resolve_isa
        v["hina_isa"] = resolve_isa("auto")
    return json.dumps(v, sort_keys=True)


def run_e2e(cfg: E2EConfig, store, echo=print) -> list[dict]:
    from .. import envs
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cfg.threads = torch.get_num_threads()
    rows: list[dict] = []

    def emit(row):
        store.append(row)
        rows.append(row)

    for model in cfg.models:
        for layers in cfg.layers:
            need = checkpoint_bytes(hf_config(model, layers)) + (512 << 20)
            m = get_model(model)
            int8 = max((layers * m.routed_experts * m.expert_bytes(_expert_width(e)) for e in cfg.engines
                        if e in E.INT8), default=0)   # the INT8 engine's copies, beside the bf16 weights
            need += int8
            if need > cfg.mem_budget:   # a row per engine and point, and nothing written
                why = (f"{model} with {layers} layers needs {need / 2**30:.1f} GiB in memory (bf16 weights + "
                       + (f"{int8 / 2**30:.1f} GiB of int8 experts + " if int8 else "")
                       + f"0.5 GiB), over the {cfg.mem_budget / 2**30:.1f} GiB budget (--mem-gib)")
                echo(f"{model} layers={layers}: {why}")
                for eng in cfg.engines:
                    for b in cfg.batches:
                        for ph in ("prefill", "decode"):
                            p = E2EProblem.create(model, layers, ph, b, cfg.prompt, cfg.gen)
                            r = _base(p, eng, cfg, None)
                            r.update(status="unavailable", reason=why)
                            emit(r)
                continue
            ck = checkpoint(model, layers, cfg.seed, echo=echo)
            echo(f"{model} layers={layers}: {ck.path} ({ck.bytes / 1e9:.2f} GB, hash {ck.hash})")
            V = ck.config["vocab_size"]
            val_ids = M.validation_prompts(V, min(M.VALIDATE_TOKENS, cfg.prompt), cfg.seed)
            ref = None
            problems = [E2EProblem.create(model, layers, ph, b, cfg.prompt, cfg.gen)
                        for b in cfg.batches for ph in ("prefill", "decode")]
            table4 = [E2EProblem.create(model, layers, "prefill", 1, P) for P in cfg.prefill if P != cfg.prompt
                      or 1 not in cfg.batches]
            # ---- engines that cannot run here: a row each, with the reason ------------------------
            runnable = []
            for eng in cfg.engines:
                st, why = E.status(eng, ck.config.get("model_type"))
                if st == "ok":
                    runnable.append(eng)
                    continue
                echo(f"  {eng}: {st}: {why}")
                for p in problems:
                    r = _base(p, eng, cfg, ck)
                    r.update(status=st, reason=why)
                    emit(r)
            inproc = [e for e in runnable if e in E.IN_PROCESS]
            peers = [e for e in runnable if e in E.PEERS]
            if runnable:
                ref = M.reference(ck, val_ids, cfg.mem_budget, echo)
            # the in-process rounds in two passes around the peers' when both run and there are >= 2 rounds
            first = (cfg.rounds + 1) // 2 if inproc and peers and cfg.rounds > 1 else cfg.rounds
            d = sorted(set(cfg.layers))   # the per-layer cost's two depths: the shallowest two (figures.per_layer)
            pair = d[0] if cfg.paired and len(d) >= 2 and layers == d[1] else None
            ip = _InProcess(cfg, ck, ref, inproc, problems, table4, echo, pair) if inproc else None
            if ip:
                ip.run(range(first), last=first == cfg.rounds)
            gc.collect()
            for eng in peers:
                for r in _run_peer(cfg, ck, ref, problems, echo, envs, eng, ip.hf_logprob_err if ip else None):
                    emit(r)
            if ip:
                if first < cfg.rounds:
                    ip.run(range(first, cfg.rounds), last=True)
                for r in ip.finish():
                    emit(r)
    return rows


class _InProcess:
    """The in-process engines (hf, hina...) on one transformers model: validated once, then timed in
    rounds that may come in two passes, before and after the peers' (run_e2e), so that a drift of the
    machine over the minutes the peers take (the read probe moved 30 -> 35 GB/s within a run here) falls
    on both sides of a comparison. Each pass loads the model and frees it before the peers load theirs."""

    def __init__(self, cfg, ck, ref, engines_, problems, table4, echo, pair: int | None = None):
        self.cfg, self.ck, self.ref, self.engines, self.echo = cfg, ck, ref, engines_, echo
        self.problems, self.table4 = problems, table4
        self.pair = pair                                  # the shallower depth timed beside this one, or None
        self.pairs: dict[tuple, list] = {}                # (engine, decode problem) -> [(s full, s cut), ...] a round
        self.rows: dict[tuple, dict] = {}
        self.samples: dict[tuple, list] = {}
        self.ttfts: dict[tuple, list] = {}
        self.probes: dict[str, list] = {e: [] for e in engines_}
        self.loads: dict[str, list] = {e: [] for e in engines_}
        self.shares: dict[tuple, dict] = {}
        self.hf_logprob_err = None

    def _load(self):
        self.echo(f"  loading {self.ck.path.name} in transformers (bf16)")
        model = M.load(self.ck.path)
        return model, model.config._experts_implementation, model.config._attn_implementation

    def _validate(self, model, default_impl, default_attn) -> None:
        cfg, ref = self.cfg, self.ref
        valid: dict[str, dict] = {}
        impl: dict[str, str] = {}
        hf_err = None
        for eng in self.engines:
            impl[eng] = M.set_engine(model, eng, default_impl, default_attn)
            valid[eng] = M.validate(model, ref, M.logit_tolerance(eng))
            v = valid[eng]
            dec = "" if v["decode_rel_err"] is None else f", as decode steps {v['decode_rel_err']:.2e}"
            self.echo(f"  {eng} ({impl[eng]}): logits rel_err {v['rel_err']:.2e}{dec} vs {ref.what} (tolerance "
                      f"{v['tolerance']}), prompt log-probs max delta {v['logprob_err']:.3g} nats"
                      + (f" (with {v['logprob_ref']})" if v.get("logprob_ref") else "") + ", argmax agree "
                      f"{v['argmax_agree']:.2f}, greedy {v['greedy_match']}"
                      + (" -- ok by the log-probs with that decision" if v.get("tie") else ""))
            if eng == "hf":
                hf_err, self.hf_logprob_err = v["rel_err"], v["logprob_err"]
        for eng in self.engines:
            for p in self.problems + self.table4:
                r = _base(p, eng, cfg, self.ck)
                v = valid[eng]
                r.update(engine_impl=impl[eng],
                         engine_version=_versions(eng), versions=_versions(eng),
                         rel_err=v["rel_err"], tolerance=v["tolerance"], greedy_match=v["greedy_match"],
                         validation=f"teacher-forced logits of {ref.ids.shape[1]} tokens vs {ref.what}"
                                    + ("" if v["decode_rel_err"] is None else
                                       f", the last {M.DECODE_CHECK} again as decode steps: rel_err {v['decode_rel_err']:.2e}")
                                    + f"; argmax agree {v['argmax_agree']:.2f} (random weights: near-uniform logits, argmax fragile)"
                                    + ("" if not v.get("logprob_ref") else f"; prompt log-probs "
                                       f"{v['logprob_err']:.3g} nats from it with {v['logprob_ref']}")
                                    + ("" if not v.get("tie") else f"; logits rel_err {v['rel_err']:.3g} over "
                                       f"{v['tolerance']}, ok as the log-probs match with that decision "
                                       f"(within {M.LOGPROB_TOLERANCE_BF16} nats)"),
                         logit_rel_err_hf=hf_err, logprob_err=v["logprob_err"], router_margin=ref.router_margin,
                         decode_rel_err=v["decode_rel_err"],
                         status="ok" if v["ok"] else "wrong",
                         reason=None if v["ok"] else ref.why_wrong(
                             f"logits rel_err {max(v['rel_err'], v['decode_rel_err'] or 0):.3g} > {v['tolerance']}"
                             + ("" if v["rel_err"] > v["tolerance"] else " (as decode steps)")),
                         warmup=1)
                self.rows[(eng, p)] = r
                self.samples[(eng, p)], self.ttfts[(eng, p)] = [], []

    def run(self, rounds: range, last: bool) -> None:
        """One pass: load (and, the first time, validate), warm up, time `rounds`; the shares pass if
        `last`; free the model."""
        cfg, echo, engines_, problems = self.cfg, self.echo, self.engines, self.problems
        model, default_impl, default_attn = self._load()
        V = self.ck.config["vocab_size"]
        if not self.rows:
            self._validate(model, default_impl, default_attn)
        elif rounds:
            echo(f"  rounds {rounds.start + 1}-{rounds.stop} after the other engines' (the machine may have moved)")
        # warm-up: one short generate per engine (first-call allocations, the kernel's module load)
        for eng in engines_:
            M.set_engine(model, eng, default_impl, default_attn)
            M.generate_timed(model, prompt_ids(V, 1, 8, 7), 3)
        for rnd in rounds:
            for b in cfg.batches:
                ids = prompt_ids(V, b, cfg.prompt, cfg.seed + 100 + b)
                for eng in engines_:
                    M.set_engine(model, eng, default_impl, default_attn)
                    self.probes[eng].append(M.read_probe(model, cfg.threads))
                    pp = next(p for p in problems if p.phase == "prefill" and p.batch == b)
                    pd = next(p for p in problems if p.phase == "decode" and p.batch == b)
                    cut = None
                    with LoadMeter() as lm:
                        if self.pair and rnd % 2:   # the pair's order alternates round by round
                            cut = self._cut_steps(model, ids)
                        ttft, steps = M.generate_timed(model, ids, cfg.gen)
                        if self.pair and not rnd % 2:
                            cut = self._cut_steps(model, ids)
                    self.loads[eng].append(lm.other_cpus)
                    self.samples[(eng, pp)].append(ttft)
                    self.samples[(eng, pd)] += steps
                    self.ttfts[(eng, pd)].append(ttft)
                    if cut and steps:
                        self.pairs.setdefault((eng, pd), []).append((median(steps), median(cut)))
                    cut_note = f" (its first {self.pair} layers: {median(cut) * 1e3:.1f} ms)" if cut else ""
                    echo(f"  round {rnd + 1} {eng} B={b}: TTFT {ttft * 1e3:.0f} ms, TPOT median "
                         f"{median(steps) * 1e3:.1f} ms{cut_note}" if steps else "")
            for p in self.table4:
                ids = prompt_ids(V, 1, p.prompt, cfg.seed + 200)
                for eng in cfg.prefill_engines:
                    if eng not in engines_:
                        continue
                    M.set_engine(model, eng, default_impl, default_attn)
                    with LoadMeter() as lm:
                        t = M.prefill_timed(model, ids)
                    self.loads[eng].append(lm.other_cpus)
                    self.samples[(eng, p)].append(t)
                    echo(f"  round {rnd + 1} {eng} prefill P={p.prompt}: {t * 1e3:.0f} ms ({p.prompt / t:.0f} tok/s)")
        if last:   # FFN and attention shares of a decode step (a pass with timers of its own)
            for b in cfg.batches:
                ids = prompt_ids(V, b, cfg.prompt, cfg.seed + 100 + b)
                for eng in engines_:
                    M.set_engine(model, eng, default_impl, default_attn)
                    self.shares[(eng, b)] = M.decode_shares(model, ids, steps=min(16, max(cfg.gen - 1, 1)))
        del model
        gc.collect()

    def _cut_steps(self, model, ids) -> list[float]:
        """The decode steps' seconds of the model cut to its first `pair` layers (same engine, same prompt)."""
        with M.first_layers(model, self.pair):
            return M.generate_timed(model, ids, self.cfg.gen)[1]

    def finish(self) -> list[dict]:
        """The rows, from every pass's samples."""
        cfg, probes, loads = self.cfg, self.probes, self.loads
        out = []
        for (eng, p), r in self.rows.items():
            if p in self.table4 and eng not in cfg.prefill_engines:
                continue
            s = self.samples[(eng, p)]
            tokens = p.batch * (p.prompt if p.phase == "prefill" else 1)
            _fill_timing(r, s, tokens)
            gb = [g for g, _ in probes[eng]]
            if gb:
                r.update(read_gbps=max(gb), read_gbps_min=min(gb), read_probe=probes[eng][0][1])
            if loads[eng]:
                r["load_other_cpus"] = round(max(loads[eng]), 2)
                if max(loads[eng]) > 0.3:
                    r["load_warning"] = f"other processes used {max(loads[eng]):.2f} CPUs during the samples"
            if p.phase == "decode" and self.pairs.get((eng, p)):
                n2, n1 = p.layers, self.pair
                per = summarize([(f - c) / (n2 - n1) for f, c in self.pairs[(eng, p)]])   # seconds in, ms out
                r.update(paired_layers=n1, paired_per_layer_ms=per["median_ms"], paired_mad_ms=per["mad_ms"],
                         paired_rounds=per["samples"], paired_t1_ms=1e3 * median([c for _, c in self.pairs[(eng, p)]]))
            if p.phase == "decode":
                sh = self.shares[(eng, p.batch)]
                touched = sh["experts_touched"]
                context = p.prompt + p.gen // 2
                lb = p.layer_bytes(touched, context, _expert_width(eng))
                r.update(ffn_ms=sh["ffn_ms"], attn_ms=sh["attn_ms"], ffn_share=sh["ffn_share"], attn_share=sh["attn_share"],
                         norm_ms=sh["norm_ms"], router_ms=sh["router_ms"], kernel_ms=sh["kernel_ms"],
                         experts_touched=touched, layer_bytes=lb, step_bytes=p.layers * lb + p.head_bytes(),
                         weight_bytes=p.layers * lb + p.head_bytes(), tpot_ms=r.get("median_ms"))
                if sh.get("parts_ms"):   # the fused layer's parts: ms per step (all layers), bytes per layer
                    pb = p.layer_part_bytes(touched, context, _expert_width(eng))
                    r["layer_parts"] = json.dumps({k: {"ms": round(v, 4), "bytes": int(pb.get(k, 0))}
                                                   for k, v in sh["parts_ms"].items()})
                if self.ttfts[(eng, p)]:
                    r["ttft_ms"] = summarize(self.ttfts[(eng, p)])["median_ms"]
                if r.get("read_gbps") and r.get("median_ms"):
                    r["roofline_ms"] = r["step_bytes"] / (r["read_gbps"] * 1e9) * 1e3
                    r["gbps"] = r["step_bytes"] / (r["median_ms"] / 1e3) / 1e9
                    r["pct_bw"] = 100 * r["gbps"] / r["read_gbps"]
                    r["bound"] = "memory"
            else:
                r["ttft_ms"] = r.get("median_ms")
            out.append(r)
        return out


def _expert_width(engine: str) -> float:
    """Bytes an engine's experts read a weight: bf16, or int8 plus an fp32 scale per group (E.INT8)."""
    from ..quant import INT8_DEFAULT_GROUP
    return 1 + 4 / INT8_DEFAULT_GROUP if engine in E.INT8 else 2.0


def _run_peer(cfg, ck, ref, problems, echo, envs, engine: str, hf_lp: float | None = None) -> list[dict]:
    """An engine in its own env and process (E.PEERS: vllm_run.py, llamacpp_run.py, ipex_run.py): request
    and result as JSON."""
    V = ck.config["vocab_size"]
    req = {"path": str(ck.path), "batches": cfg.batches, "prompt": cfg.prompt, "gen": cfg.gen, "rounds": cfg.rounds,
           "validate_ids": ref.ids[0].tolist(), "greedy_steps": len(ref.greedy), "compile": cfg.vllm_compile,
           "threads": cfg.threads,
           "prompt_ids": {str(b): prompt_ids(V, b, cfg.prompt, cfg.seed + 100 + b).tolist() for b in cfg.batches}}
    env_name, script = E.PEERS[engine]
    tolerance = LOGPROB_TOLERANCE.get(engine, M.LOGPROB_TOLERANCE_BF16)
    rows = {p: _base(p, engine, cfg, ck) for p in problems}
    if engine.startswith("llamacpp:"):
        from .gguf_writer import write_gguf
        try:
            req["gguf"] = str(write_gguf(ck, engine.split(":", 1)[1], echo=echo))
        except UserError as e:    # no GGUF (a full disk): this engine's rows say why, the others go on
            for r in rows.values():
                r.update(status="failed", reason=f"{engine}: {e}")
            return list(rows.values())
    with tempfile.TemporaryDirectory() as td:
        rq, rs = Path(td) / "req.json", Path(td) / "res.json"
        rq.write_text(json.dumps(req))
        env = dict(os.environ)
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
        n = cfg.threads
        env.update(OMP_NUM_THREADS=str(n), VIRTUAL_ENV=str(envs.env_path(env_name)), TOKENIZERS_PARALLELISM="false")
        if engine == "vllm":
            env["PYTHONPATH"] = str(Path(__file__).with_name("vllm_site"))   # its sitecustomize (see there)
            env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{n - 1}", VLLM_CPU_KVCACHE_SPACE="1",
                       VLLM_ENABLE_V1_MULTIPROCESSING="0")
        env.update(envs.recipe_runtime_env(env_name))
        def attempt():
            echo(f"  {engine}: starting in its env ({envs.python(env_name)})"
                 + (" with its extra buffer types off" if req.get("extra_bufts") is False else ""))
            t0 = time.time()
            c0 = os.times()
            with LoadMeter() as lm:
                # cwd: a temporary folder, so the checkout's own packages never shadow the env's
                proc = subprocess.run([str(envs.python(env_name)), str(Path(__file__).with_name(script)), str(rq),
                                       str(rs)], env=env, cwd=td, capture_output=True, text=True, timeout=3600)
            c1 = os.times()   # the engine's own CPU time is not "other processes'" load
            own_cpus = ((c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)) / max(c1.elapsed - c0.elapsed, 1e-6)
            res = json.loads(rs.read_text()) if rs.exists() else {
                "error": f"{script} exited {proc.returncode}: {(proc.stderr or '').strip().splitlines()[-1:] }"}
            echo(f"  {engine}: {time.time() - t0:.0f} s" + (f", error: {res['error']}" if "error" in res else ""))
            return proc.returncode, res, max(0.0, lm.other_cpus - own_cpus)

        rc, res, other_cpus = attempt()
        if engine.startswith("llamacpp:") and rc in (-signal.SIGSEGV, -signal.SIGILL) and not rs.exists():
            # llama.cpp's AMX buffer crashes on some AMX CPUs (llamacpp_run.py): once more without it
            died = signal.Signals(-rc).name
            req["extra_bufts"] = False
            rq.write_text(json.dumps(req))
            _, res, other_cpus = attempt()
            res["note"] = (f"its default load died with {died} (llama.cpp's AMX buffer: SIGSEGV "
                           "in ggml_backend_amx_mul_mat at the first eval on the first AMX Xeon, intel-f6m167, llama.cpp issue "
                           "20824; SIGILL on intel-f6m207); measured with its extra buffer types off "
                           "(use_extra_bufts=false: no AMX or CPU repacking)")
    if "error" in res:
        for r in rows.values():
            r.update(status="failed", reason=f"{engine}: {res['error']}", note=res.get("note"))
        return list(rows.values())
    # validation: the prompt tokens' log-probs against the reference's
    got = torch.tensor(res["validation"]["prompt_logprobs"], dtype=torch.float32)
    err, alt = M.logprob_match(got, ref, tolerance)
    ok = err <= tolerance
    own = (f" (transformers' own bf16 run: {hf_lp:.3g} nats on the same tokens)" if hf_lp is not None else "")
    g = res["validation"]["greedy"]
    match = 0
    for a, b in zip(g, ref.greedy):
        if a != b:
            break
        match += 1
    for p, r in rows.items():
        pt = res["points"].get(str(p.batch), {})
        pkg = {"vllm": "vllm", "ipex": "intel-extension-for-pytorch"}.get(engine, "llama-cpp-python")
        versions = {pkg: res.get("version")}
        if engine == "vllm":
            impl = "vllm eager (compilation mode 0)" if not cfg.vllm_compile else "vllm compiled"
        elif engine == "ipex":
            versions["transformers"] = res.get("transformers")
            impl = f"ipex.llm.optimize bf16 deployment_mode, transformers {res.get('transformers')}"
        else:
            impl = f"llama.cpp GGUF {engine.split(':', 1)[1].upper()}, KV cache {res.get('kv_cache', 'f16')}" + (
                ", extra buffer types off" if res.get("extra_bufts") is False else "")
        if res.get("note"):
            r["note"] = res["note"]
        r.update(engine_version=json.dumps(versions), versions=json.dumps(versions),
                 engine_impl=impl,
                 rel_err=err, tolerance=tolerance, greedy_match=f"{match}/{len(ref.greedy)}",
                 validation=f"max |delta log-prob| of {len(got)} prompt tokens vs {ref.what} (prompt_logprobs)"
                            + (f", with {alt} (the reference as made: {M.logprob_err(got, ref):.3g} nats)"
                               if alt else "")
                            + own,
                 logprob_err=err, logprob_err_hf=hf_lp, router_margin=ref.router_margin,
                 status="ok" if ok else "wrong",
                 reason=None if ok else ref.why_wrong(f"prompt log-probs differ by {err:.3g} nats > {tolerance}{own}"),
                 load_other_cpus=round(other_cpus, 2), warmup=0)
        if not pt.get("ttft_s"):
            r.update(status="unsupported", reason=f"{engine}: no samples at batch {p.batch} "
                     + ("(llama-cpp-python's Llama runs one sequence)" if engine.startswith("llamacpp:") else ""))
            continue
        if p.phase == "prefill":
            _fill_timing(r, pt.get("ttft_s", []), p.batch * p.prompt)
            r["ttft_ms"] = r.get("median_ms")
        else:
            _fill_timing(r, pt.get("steps_s", []), p.batch)
            r["tpot_ms"] = r.get("median_ms")
            if pt.get("ttft_s"):
                r["ttft_ms"] = summarize(pt["ttft_s"])["median_ms"]
    return list(rows.values())


# nats, max over the prompt tokens, against the reference (Q8_0 weights move log-probs more than bf16's rounding)
LOGPROB_TOLERANCE = {"vllm": M.LOGPROB_TOLERANCE_BF16, "ipex": M.LOGPROB_TOLERANCE_BF16,
                     "llamacpp:bf16": M.LOGPROB_TOLERANCE_BF16, "llamacpp:q8_0": 0.25}
