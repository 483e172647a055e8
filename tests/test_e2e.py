"""End to end (issue 15) on tiny models of each family: the checkpoint writer, the drop-in against
transformers fp32, `hinabench e2e` rows (every engine: ran, or why not), the figures from those rows."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from clihelp import invoke, read_csv  # noqa: E402

from hinabench import models  # noqa: E402
from hinabench.e2e import checkpoint as C  # noqa: E402

TINY = {  # name -> (Model, family): H and I multiples of 32 (the kernel's k_r), every field exercised
    "tiny-qwen3": (models.Model("tiny-qwen3", 64, 32, 8, 2, 0, 4, 4, 2, 16, 384, "test"), "qwen3-30b-a3b"),
    "tiny-mixtral": (models.Model("tiny-mixtral", 64, 96, 4, 2, 0, 4, 4, 2, 16, 320, "test"), "mixtral-8x7b"),
    "tiny-qwen2": (models.Model("tiny-qwen2", 64, 32, 8, 4, 1, 4, 4, 2, 16, 384, "test"), "qwen2-57b-a14b"),
}


@pytest.fixture(autouse=True)
def tiny_models(monkeypatch, tmp_path):
    for name, (m, fam) in TINY.items():
        monkeypatch.setitem(models.MODELS, name, m)
        monkeypatch.setitem(C.FAMILIES, name, fam)
    monkeypatch.setenv("HINABENCH_E2E_CACHE", str(tmp_path / "ckpt"))


def test_checkpoint_is_written_once_per_config_and_seed(tmp_path):
    ck = C.checkpoint("tiny-qwen3", 2, seed=3)
    cfg = json.loads((ck.path / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["model_type"] == "qwen3_moe" and cfg["num_experts"] == 8
    marker = (ck.path / ".complete").stat().st_mtime_ns
    again = C.checkpoint("tiny-qwen3", 2, seed=3)
    assert again.path == ck.path and (ck.path / ".complete").stat().st_mtime_ns == marker   # cached
    assert C.checkpoint("tiny-qwen3", 2, seed=4).hash != ck.hash                           # seed in the hash
    assert C.checkpoint("tiny-qwen3", 1, seed=3).hash != ck.hash                           # config in the hash
    # the tokenizer covers the vocabulary: every id round-trips
    tok = transformers.AutoTokenizer.from_pretrained(str(ck.path))
    ids = list(range(0, 384, 7)) + [383]
    assert tok(" ".join(C.word(i) for i in ids), add_special_tokens=False)["input_ids"] == ids


def test_checkpoint_refuses_unknown_model_and_depth():
    from hinabench.errors import UserError
    with pytest.raises(UserError, match="no end-to-end configuration"):
        C.checkpoint("deepseek-v3", 1)
    with pytest.raises(UserError, match="--layers must be between 1 and 4"):
        C.checkpoint("tiny-qwen3", 5)


def test_checkpoint_without_the_e2e_extra_says_what_to_install(monkeypatch):
    import importlib.util
    from hinabench.errors import UserError
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "safetensors" else real(name, *a))
    with pytest.raises(UserError, match=r"needs safetensors \(the e2e extra\): pip install -e '\.\[e2e\]'"):
        C.checkpoint("tiny-qwen3", 1, seed=11)


def test_a_bf16_reference_is_not_reused_once_fp32_fits():
    """A run under a small --mem-gib caches a bf16 reference; a later run whose budget fits fp32
    makes (and then keeps using) the fp32 one; a small budget after that reuses fp32 too."""
    from hinabench.e2e import measure as M
    ck = C.checkpoint("tiny-qwen3", 1, seed=11)
    ids = C.prompt_ids(ck.config["vocab_size"], 1, 6, 1)
    for f in ck.path.glob("reference-*.pt"):
        f.unlink()
    quiet = lambda *_: None  # noqa: E731
    small = M.reference(ck, [ids], 1, echo=quiet)
    assert small.what.startswith("transformers bf16") and "budget" in small.what
    assert M.reference(ck, [ids], 1, echo=quiet).what == small.what          # cached while fp32 does not fit
    assert "1.0 GiB budget" in M.reference(ck, [ids], 1 << 30, echo=quiet).what   # and says this run's budget
    big = M.reference(ck, [ids], 8 << 30, echo=quiet)
    assert big.what.startswith("transformers fp32")
    assert M.reference(ck, [ids], 1, echo=quiet).what.startswith("transformers fp32")  # the better one, once made


def test_loaded_weights_are_the_processes_own_memory_not_the_file_map():
    """measure.load copies what transformers mapped from the safetensors file into memory (a new token's
    embedding row was a disk read mid-decode), same values, and the model keeps working."""
    from hinabench.e2e import measure as M
    ck = C.checkpoint("tiny-qwen3", 1, seed=11)
    from transformers import AutoModelForCausalLM
    mapped = AutoModelForCausalLM.from_pretrained(str(ck.path), dtype=torch.bfloat16)
    m = M.load(ck.path)
    for (name, a), b in zip(mapped.state_dict().items(), m.state_dict().values()):
        assert torch.equal(a, b), name
    maps = open("/proc/self/maps").read()
    files = [tuple(int(v, 16) for v in line.split()[0].split("-")) for line in maps.splitlines()
             if str(ck.path) in line]

    def in_file(t):
        return any(lo <= t.data_ptr() < hi for lo, hi in files)
    assert any(in_file(t) for t in mapped.parameters())   # the premise: transformers maps the file
    assert not any(in_file(t) for t in m.parameters())


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("engine", ["hf", "hina+fused"])
def test_a_model_cut_to_its_first_layers_is_the_shallower_checkpoint(name, engine):
    """run.py's paired depths time the deeper model cut to its first n1 layers as the n1-layer model: the
    same bytes (the seeded fill is per tensor name), so the same logits, prompt and decode steps, whichever
    engine (the fused stack is prepared again for the cut model), and the model whole again afterwards."""
    from hinabench.e2e import measure as M
    from hinabench.e2e import engines as E
    if engine == "hina+fused" and C.FAMILIES[name] not in ("qwen3-30b-a3b", "mixtral-8x7b"):
        pytest.skip("the fused layer knows Qwen3-MoE and Mixtral")
    deep, shallow = M.load(C.checkpoint(name, 3).path), M.load(C.checkpoint(name, 1).path)
    ids = C.prompt_ids(deep.config.vocab_size, 1, 6, 2)
    for m in (deep, shallow):
        impl, attn = m.config._experts_implementation, m.config._attn_implementation
        M.set_engine(m, engine, impl, attn)

    def decode(m):   # the prompt's logits, then three decode steps' (the fused stack's own path)
        cache = M.new_cache(m)
        with torch.inference_mode():
            out = [m(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]]
            for t in range(3):
                out.append(m(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1])
        return torch.stack(out)
    whole = decode(deep)
    with M.first_layers(deep, 1):
        cut = decode(deep)
        assert len(deep.model.layers) == deep.config.num_hidden_layers == 1
    assert torch.equal(cut, decode(shallow)) and not torch.equal(cut, whole)
    assert len(deep.model.layers) == deep.config.num_hidden_layers == 3 and torch.equal(decode(deep), whole)
    assert engine in E.IN_PROCESS
    with pytest.raises(ValueError, match="4 of a 3-layer"):
        with M.first_layers(deep, 4):
            pass


@pytest.mark.parametrize("name", list(TINY))
def test_dropin_matches_transformers_fp32_without_copying_weights(name):
    from hinabench.e2e import measure as M
    ck = C.checkpoint(name, 2)
    ids = C.prompt_ids(ck.config["vocab_size"], 1, 12, 1)
    ref = M.reference(ck, [ids], 8 << 30, echo=lambda *_: None)
    assert ref.what.startswith("transformers fp32")
    m = M.load(ck.path)
    experts, _ = M.moe_blocks(m)
    ptrs = [(e.gate_up_proj.data_ptr(), e.down_proj.data_ptr()) for e in experts]
    hf = M.validate(m, ref)
    assert M.set_engine(m, "hina", "eager") == "experts=hina attn=sdpa"
    calls = []
    import hinabench.e2e.dropin as D
    real = D.moe_ffn_prepare

    def spy(wg, wu, wd, **kw):
        calls.append((wd.data_ptr(), kw["w13"].data_ptr()))
        return real(wg, wu, wd, **kw)
    D.moe_ffn_prepare = spy
    try:
        hina = M.validate(m, ref)
        M.validate(m, ref)
    finally:
        D.moe_ffn_prepare = real
    assert hina["ok"] and hina["rel_err"] < M.LOGIT_TOLERANCE, hina
    assert hf["ok"], hf
    # the kernel read the parameters transformers loaded, in place (no copy, no repack), each
    # experts module's checked once for every pass
    assert sorted((w13, wd) for wd, w13 in calls) == sorted(ptrs)
    assert all(e._hina.reads(e.gate_up_proj, e.down_proj) for e in experts)
    assert [(e.gate_up_proj.data_ptr(), e.down_proj.data_ptr()) for e in experts] == ptrs


@pytest.mark.parametrize("name", list(TINY))
def test_attention_dropin_decodes_on_hina_and_prefills_on_sdpa(name):
    """hina+a: transformers' AttentionInterface runs HiNa decode attention on its own KV cache for each
    decode step (one call per layer and step), sdpa for the prompt; logits match fp32 as hina's do."""
    from hinabench.e2e import dropin_attention as DA
    from hinabench.e2e import measure as M
    ck = C.checkpoint(name, 2)
    ids = C.prompt_ids(ck.config["vocab_size"], 1, 12, 1)
    ref = M.reference(ck, [ids], 8 << 30, echo=lambda *_: None)
    m = M.load(ck.path)
    assert M.set_engine(m, "hina", "eager", "sdpa") == "experts=hina attn=sdpa"
    hina = M.validate(m, ref)
    assert M.set_engine(m, "hina+a", "eager", "sdpa") == "experts=hina attn=hina"
    calls = []
    real = DA.decode_attention

    def spy(q, k, v, lens, **kw):
        calls.append((tuple(q.shape), k.data_ptr(), int(lens[0])))
        return real(q, k, v, lens, **kw)
    DA.decode_attention = spy
    try:
        with_a = M.validate(m, ref)          # a prompt forward (sdpa) then greedy decode steps (hina)
    finally:
        DA.decode_attention = real
    assert with_a["ok"] and abs(with_a["rel_err"] - hina["rel_err"]) < 2e-3, (with_a, hina)
    assert with_a["greedy_match"] == hina["greedy_match"]
    layers = ck.config["num_hidden_layers"]
    # decode steps only, every layer: the prompt's last tokens as teacher-forced steps, then the greedy ones
    assert len(calls) == layers * (M.DECODE_CHECK + M.GREEDY_STEPS)
    assert {c[2] for c in calls} == set(range(13 - M.DECODE_CHECK, 13 + M.GREEDY_STEPS))   # one more key per step
    assert M.set_engine(m, "hf", "eager", "sdpa") == "experts=eager attn=sdpa"   # and back
    greedy = calls[-layers * M.GREEDY_STEPS:]
    assert len({c[1] for c in greedy}) == layers      # each layer's keys read in place, step after step


def test_append_cache_holds_what_transformers_cache_holds_without_a_copy_per_step():
    """dropin_cache.AppendLayer: the same keys and values as DynamicLayer's torch.cat after a prompt and
    every append, as views of buffers that move only when they grow (capacity doubled); crop and a batch
    reorder keep it right."""
    from transformers.cache_utils import DynamicLayer

    from hinabench.e2e.dropin_cache import AppendLayer
    g = torch.Generator().manual_seed(0)
    kv = lambda n, b=2: (torch.randn(b, 3, n, 16, generator=g).bfloat16(), torch.randn(b, 3, n, 8, generator=g).bfloat16())  # noqa: E731
    ours, theirs = AppendLayer(), DynamicLayer()
    ptrs = []
    for n in [200] + [1] * 70 + [5]:
        k, v = kv(n)
        a, b = ours.update(k, v), theirs.update(k, v)
        assert all(torch.equal(x, y) for x, y in zip(a, b)) and a[0].stride(-1) == 1
        assert ours.get_seq_length() == theirs.get_seq_length()
        ptrs.append(a[0].data_ptr())
    assert len(set(ptrs)) == 2 and ptrs[0] == ptrs[56] != ptrs[57]   # 256 slots, then 512
    ours.crop(-10), theirs.crop(-10)
    ours.batch_select_indices(torch.tensor([1])), theirs.batch_select_indices(torch.tensor([1]))
    k, v = kv(3, 1)
    assert all(torch.equal(x, y) for x, y in zip(ours.update(k, v), theirs.update(k, v)))
    assert ours.get_seq_length() == 268


@pytest.mark.parametrize("name", list(TINY))
def test_every_dropin_at_once(name):
    """hina+l+a: the experts, the dense projections and decode attention all on the HiNa kernels, validated
    as each alone is; and back to transformers' own, linear included."""
    from hinabench.e2e import measure as M
    ck = C.checkpoint(name, 2)
    ref = M.reference(ck, [C.prompt_ids(ck.config["vocab_size"], 1, 12, 1)], 8 << 30, echo=lambda *_: None)
    m = M.load(ck.path)
    assert M.set_engine(m, "hina+l+a", "eager", "sdpa") == "experts=hina attn=hina linear=hina"
    assert all("forward" in lin.__dict__ for lin in m.modules() if isinstance(lin, torch.nn.Linear))
    v = M.validate(m, ref)
    assert v["ok"] and v["rel_err"] < 0.03, v
    assert M.set_engine(m, "hf", "eager", "sdpa") == "experts=eager attn=sdpa"
    assert not any("forward" in lin.__dict__ for lin in m.modules() if isinstance(lin, torch.nn.Linear))


@pytest.mark.parametrize("engine", ["hina+l+a:int8", "hina+fused:int8"])
@pytest.mark.parametrize("name", list(TINY))
def test_int8_engine_quantizes_the_experts_once_and_keeps_transformers_bf16(name, engine):
    """hina+l+a:int8 and hina+fused:int8: the experts' int8 copies made at the first call beside transformers'
    bf16 parameters (untouched: hf still reads them), validated at the INT8 tolerance (prompt and decode steps);
    the scheme's error is the larger. The fused engine's layers run on those same copies."""
    from hinabench.e2e import measure as M
    from hinabench.e2e.dropin_int8 import int8_experts
    from hinabench.e2e.engines import status
    from hinabench.kernels import PreparedMoe
    ck = C.checkpoint(name, 2)
    if "fused" in engine and ck.config["model_type"] == "qwen2_moe":   # its shared expert: not in the native layer
        assert status(engine, "qwen2_moe")[0] == "unsupported"
        return
    ref = M.reference(ck, [C.prompt_ids(ck.config["vocab_size"], 1, 12, 1)], 8 << 30, echo=lambda *_: None)
    m = M.load(ck.path)
    experts = M.moe_blocks(m)[0]
    before = [e.gate_up_proj.data_ptr() for e in experts]
    assert M.set_engine(m, engine, "eager", "sdpa") == ("experts=hina-int8 attn=hina linear=hina"
                                                        + (" layer=hina" if "fused" in engine else ""))
    v = M.validate(m, ref, M.logit_tolerance(engine))
    assert v["ok"] and M.LOGIT_TOLERANCE_INT8 > M.LOGIT_TOLERANCE, v
    copies = [int8_experts(e) for e in experts]
    assert all(isinstance(c, PreparedMoe) and c.weights[0].dtype == torch.int8 for c in copies)
    assert [e.gate_up_proj.data_ptr() for e in experts] == before
    if "fused" in engine:
        assert all(layer._hina_layer.experts is c for layer, c in zip(m.model.layers, copies))
    M.validate(m, ref, M.logit_tolerance(engine))
    assert all(a is int8_experts(e) for a, e in zip(copies, experts))   # once
    assert M.set_engine(m, "hf", "eager", "sdpa") == "experts=eager attn=sdpa"
    assert M.validate(m, ref)["ok"]


def test_show_patch_prints_the_dropin_and_its_line_count():
    r = invoke("e2e", "--show-patch")
    assert r.exit_code == 0, r.output
    assert "ExpertsInterface.register" in r.output and "AttentionInterface.register" in r.output
    n = int(r.output.rsplit("the drop-in: ", 1)[1].split()[0])
    assert 5 <= n <= 30
    n = int(r.output.rsplit("the attention drop-in (engine hina+a): ", 1)[1].split()[0])
    assert 5 <= n <= 30
    n = int(r.output.rsplit("its KV cache appended in place (engines hina+a, hina+l+a): ", 1)[1].split()[0])
    assert "class AppendLayer(DynamicLayer)" in r.output and 10 <= n <= 80
    n = int(r.output.rsplit("the INT8 experts (engines hina+l+a:int8, hina+fused:int8): ", 1)[1].split()[0])
    assert 5 <= n <= 30
    n = int(r.output.rsplit("one native call (engines hina+fused, hina+fused:int8): ", 1)[1].split()[0])
    assert "def hina_model_forward" in r.output and 20 <= n <= 120


def test_e2e_rows_every_engine_and_the_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("HINABENCH_ENVS", str(tmp_path / "no-envs"))   # vllm/llamacpp: unavailable, said so
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1,2", "--prompt", "8", "--gen", "4", "--batch", "1,2",
               "--engines", "hina,hf,hina+l,hina+a,hina+fused,hina+l+a:int8,hina+fused:int8,vllm,llamacpp,ipex,kt",
               "--prefill", "16",
               "--rounds", "1",
               "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = read_csv(out)
    by = {}
    for row in rows:
        by.setdefault(row["backend"], []).append(row)
    assert set(by) == {"hina", "hf", "hina+l", "hina+a", "hina+fused", "hina+l+a:int8", "hina+fused:int8", "vllm",
                       "llamacpp:bf16", "llamacpp:q8_0", "ipex", "kt"}
    for eng in ("hina", "hf", "hina+l", "hina+fused", "hina+l+a:int8", "hina+fused:int8"):   # fused: the native layer's timers
        dec = [x for x in by[eng] if x["phase"] == "decode"]
        assert len(dec) == 4 and all(x["status"] == "ok" and float(x["median_ms"]) > 0 for x in dec)
        assert all(0 < float(x["ffn_share"]) < 1 and float(x["tokens_per_s"]) > 0 for x in dec)
        assert all(x["command"].startswith("hinabench e2e") and x["checkpoint_hash"] for x in by[eng])
        assert {int(x["prompt_tokens"]) for x in by[eng] if x["phase"] == "prefill"} == ({8, 16} if eng in ("hina", "hf") else {8})
        # where a step goes: transformers' RMSNorms and routers for all, the HiNa kernels' calls for hina's
        assert all(float(x["norm_ms"]) > 0 and float(x["router_ms"]) > 0 for x in dec)
        assert all((float(x["kernel_ms"]) > 0) if eng != "hf" else x["kernel_ms"] == "" for x in dec)
    int8, fint8, bf16 = (float(next(x for x in by[e] if x["phase"] == "decode")["layer_bytes"])
                         for e in ("hina+l+a:int8", "hina+fused:int8", "hina"))
    assert int8 == fint8 < bf16                                   # its experts' bytes; its tolerance
    assert float(by["hina+l+a:int8"][0]["tolerance"]) == float(by["hina+fused:int8"][0]["tolerance"]) == 0.08
    assert all(x["status"] == "ok" and float(x["rel_err"]) < 0.03 for x in by["hina+l"])
    assert all(0 <= float(x["logprob_err"]) < 0.05 for e in ("hina", "hf", "hina+a") for x in by[e])
    dec = [x for x in by["hina+a"] if x["phase"] == "decode"]
    assert len(dec) == 4 and all(x["status"] == "ok" and x["engine_impl"] == "experts=hina attn=hina" for x in dec)
    # every in-process engine's decode path validated too: the prompt's last tokens as decode steps
    assert all(0 <= float(x["decode_rel_err"]) < 0.03 and "as decode steps" in x["validation"]
               for e in ("hina", "hf", "hina+a", "hina+fused") for x in by[e])
    assert all(0 <= float(x["decode_rel_err"]) < 0.08 for x in by["hina+fused:int8"])
    fused = [x for x in by["hina+fused"] if x["phase"] == "decode"]
    assert len(fused) == 4 and all(x["status"] == "ok" and x["engine_impl"].endswith("layer=hina") for x in fused)
    import json
    for x in fused:   # the native layer's parts, each with its ms per step and bytes per layer
        parts = json.loads(x["layer_parts"])
        assert set(parts) == {"norms", "qkv", "rope", "attention", "o", "router", "experts", "adds"}
        assert all(v["ms"] >= 0 for v in parts.values()) and parts["experts"]["bytes"] > 0
        assert sum(v["bytes"] for v in parts.values()) == int(float(x["layer_bytes"]))
    assert all(x["layer_parts"] == "" for x in by["hina"] if x["phase"] == "decode")
    assert all(0 < float(x["attn_share"]) < 1 for x in dec)
    for eng in ("hina", "hf", "hina+fused"):   # paired depths: the 2-layer rows carry the model cut to 1 beside them
        dec = {int(x["layers"]): x for x in by[eng] if x["phase"] == "decode" and x["batch_size"] == "1"}
        assert dec[2]["paired_layers"] == "1" and dec[2]["paired_rounds"] == "1" and float(dec[2]["paired_t1_ms"]) > 0
        assert float(dec[2]["paired_per_layer_ms"]) == float(dec[2]["paired_per_layer_ms"]) and dec[1]["paired_layers"] == ""
    assert all(x["status"] == "unavailable" and "hinabench env create vllm" in x["reason"] for x in by["vllm"])
    assert all(x["status"] in ("unsupported", "unavailable") and x["reason"] for x in by["ipex"] + by["kt"])
    for fig in ("fig12", "fig13", "fig14", "table4"):
        r = invoke("figure", fig, str(out), "--out", str(tmp_path / "figs"))
        assert r.exit_code == 0, (fig, r.output)
        assert (tmp_path / "figs" / f"{fig}.png").stat().st_size > 1000
    assert "+m+a" in (tmp_path / "figs" / "fig14.txt").read_text() and "+fused" in (tmp_path / "figs" / "fig14.txt").read_text()
    r = invoke("e2e", "--tables", str(out))
    assert r.exit_code == 0, r.output
    assert "| tiny-qwen3 | hina | 1 | 1,2 |" in r.output and "hina >= 1.5x hf per layer" in r.output
    for e in ("hina+l+a:int8", "hina+fused:int8"):
        assert f"{e} per layer against llamacpp:q8_0 (same bytes class; no target): n/a" in r.output
        assert f"{e} >=" not in r.output                       # the BF16 engine's targets are not its own
    assert "### Where a decode step goes" in r.output and "| tiny-qwen3 | 2 | hina+l | 1 |" in r.output


def test_fig13_draws_the_model_with_the_most_batch_sizes(tmp_path):
    import pandas as pd
    from hinabench.e2e.figures import fig13
    rows = [dict(op="e2e", model=m, backend=eng, phase="decode", status="ok", layers=2, batch_size=b,
                 prompt_tokens=128, median_ms=10.0 * b, mad_ms=0.1, tokens_per_s=100.0 * b, ffn_share=0.5,
                 attn_share=0.1)
            for m, bs in (("mixtral-8x7b", (1,)), ("qwen3-30b-a3b", (1, 4, 16))) for eng in ("hina", "hf") for b in bs]
    # and of its depths the one with the most batch sizes (a deeper run at batch 1 alone is not Figure 13's)
    rows += [dict(rows[-1], layers=6, batch_size=1)]
    fig13([], str(tmp_path), frame=pd.DataFrame(rows))
    assert (tmp_path / "fig13.txt").read_text().startswith("qwen3-30b-a3b with 2 layers")


def test_fig13_from_a_folder_of_several_runs_takes_each_engines_newest_row(tmp_path):
    """Two runs of an engine at the same depth and batch (a results folder): one bar each, the newest
    (was a ValueError from matplotlib: two shares where it wanted one)."""
    import pandas as pd
    from hinabench.e2e import figures as F
    rows = [dict(op="e2e", model="qwen3-30b-a3b", backend=eng, phase="decode", status="ok", layers=2, batch_size=b,
                 prompt_tokens=128, median_ms=10.0, mad_ms=0.1, tokens_per_s=t, ffn_share=sh, attn_share=0.1,
                 timestamp=ts)
            for ts, t, sh in (("2026-12-04T10:00:00", 50.0, 0.4), ("2026-12-04T12:00:00", 60.0, 0.6))
            for eng in ("hina", "hf") for b in (1, 4)]
    F.fig13([], str(tmp_path), frame=pd.DataFrame(rows[::-1]))       # file order not the time order
    assert (tmp_path / "fig13.png").stat().st_size > 1000


def test_per_layer_cost_from_two_depths():
    import pandas as pd
    from hinabench.e2e.figures import ablation, per_layer
    rows = []
    for eng, base, per in (("hf", 50.0, 10.0), ("hina", 40.0, 5.0)):
        for L in (2, 4):
            rows.append(dict(op="e2e", model="qwen3-30b-a3b", backend=eng, phase="decode", status="ok", layers=L,
                             batch_size=1, prompt_tokens=128, median_ms=base + per * L, mad_ms=0.5, full_layers=48))
    rows.append(dict(op="e2e", model="qwen3-30b-a3b", backend="hina+a", phase="decode", status="unsupported",
                     reason="no attention kernel yet", layers=2, batch_size=1, prompt_tokens=128, full_layers=48))
    df = pd.DataFrame(rows)
    pl = per_layer(df).set_index("engine")
    assert pl.loc["hf", "per_layer_ms"] == pytest.approx(10.0) and pl.loc["hina", "per_layer_ms"] == pytest.approx(5.0)
    assert pl.loc["hina", "projected_ms"] == pytest.approx(40 + 5 * 2 + 46 * 5.0)
    ab = {a["step"]: a for a in ablation(df)}
    assert ab["+m"]["speedup"] == pytest.approx(2.0) and ab["+m+a"]["speedup"] is None
    assert "no attention kernel" in ab["+m+a"]["why"]


def test_ablation_takes_its_steps_from_one_run():
    """A newer run of hf and hina+fused alone does not become the baseline of an older run's other steps:
    the run with the most steps at two depths gives them all (the newest of equals)."""
    import pandas as pd
    from hinabench.e2e.figures import ablation
    rows = []
    for run, ts, engines in (("A", "2026-12-06T09:00:00+0000", {"hf": 13.0, "hina": 8.0, "hina+fused": 5.0}),
                             ("B", "2026-12-06T10:00:00+0000", {"hf": 8.0, "hina+fused": 4.0})):
        for eng, per in engines.items():
            for L in (2, 4):
                rows.append(dict(op="e2e", model="qwen3-30b-a3b", backend=eng, phase="decode", status="ok", layers=L,
                                 batch_size=1, prompt_tokens=128, median_ms=30.0 + per * L, mad_ms=0.1, full_layers=48,
                                 run_id=run, timestamp=ts))
    ab = {a["step"]: a for a in ablation(pd.DataFrame(rows))}
    assert ab["+m"]["speedup"] == pytest.approx(13 / 8) and ab["+fused"]["speedup"] == pytest.approx(13 / 5)
    assert ab["baseline"]["per_layer_ms"] == pytest.approx(13.0)


@pytest.mark.parametrize("l3_mib,per,verdict", [(32, 5.0, "FAIL"), (480, 5.0, "FAIL"), (32, 4.0, "PASS"),
                                                 (480, 4.0, "n/a")])
def test_roofline_target_when_the_layers_could_sit_in_the_l3(l3_mib, per, verdict):
    """A 4-layer step of 114 MB layers would fit in a 480 MiB L3: there the DRAM time is no lower bound, so
    a pass is withheld (n/a) -- but a miss is a FAIL whatever the L3 (a cache only makes a step faster)."""
    import pandas as pd
    from hinabench.e2e.figures import tables
    rows = [dict(op="e2e", model="qwen3-30b-a3b", backend=eng, phase="decode", status="ok", layers=L,
                 batch_size=1, prompt_tokens=128, median_ms=40.0 + per * L, mad_ms=0.1, full_layers=48,
                 layer_bytes=114e6, read_gbps=30.0, tokens_per_s=20.0, ffn_share=0.3, attn_share=0.2, rel_err=0.01,
                 fingerprint=f"Some CPU, 1S/2C/2T, L3 {l3_mib} MiB, ISA avx2")
            for L in (2, 4) for eng in ("hina", "hina+l")]
    text = tables(pd.DataFrame(rows))
    lines = [x for x in text.splitlines() if "within 1.25x of its roofline" in x]
    assert [x.split(":")[1].split()[0] for x in lines] == ["hina", "hina+l"]     # hina+l judged where measured
    for line in lines:                                                          # 5 ms: 1.32x, 4 ms: 1.05x of 3.8 ms
        assert (("n/a (4 layers x 114 MB fit in the 480 MiB L3" in line) == (verdict == "n/a")
                and (verdict == "n/a" or f"-> {verdict}" in line)), line


def test_per_layer_prefers_the_paired_depths_of_one_process():
    """A deeper row with paired depths for the shallower one gives the per-layer cost (and its spread); the
    two depths' processes' difference stays beside it; a pairing with another depth is not used."""
    import pandas as pd
    from hinabench.e2e.figures import per_layer, tables
    def rows(paired_with):
        return pd.DataFrame([dict(op="e2e", model="qwen3-30b-a3b", backend="hina", phase="decode", status="ok",
                                  layers=L, batch_size=1, prompt_tokens=128, median_ms=ms, mad_ms=1.0, full_layers=48,
                                  layer_bytes=114e6, read_gbps=30.0, tokens_per_s=20.0, ffn_share=0.3, attn_share=0.2,
                                  rel_err=0.01, fingerprint="Some CPU, 1S/2C/2T, L3 32 MiB, ISA avx2",
                                  paired_layers=paired_with if L == 8 else None, paired_per_layer_ms=4.2 if L == 8 else None,
                                  paired_mad_ms=0.05 if L == 8 else None)
                             for L, ms in ((2, 40.0), (8, 70.0))])
    r = per_layer(rows(2)).iloc[0]
    assert (r["per_layer_ms"], r["mad_ms"], r["paired"], r["sequential_ms"]) == (4.2, 0.05, True, 5.0)
    assert "| 4.20 +- 0.05 (paired; the depths' runs: 5.00) |" in tables(rows(2))
    r = per_layer(rows(4)).iloc[0]
    assert r["per_layer_ms"] == pytest.approx(5.0) and not r["paired"]


def test_per_layer_takes_the_newest_row_of_a_depth_whatever_the_file_order():
    import pandas as pd
    from hinabench.e2e.figures import per_layer
    rows = [dict(op="e2e", model="m", backend="hf", phase="decode", status="ok", layers=L, batch_size=1,
                 prompt_tokens=128, median_ms=ms, mad_ms=0.1, full_layers=8, timestamp=ts)
            for L, ms, ts in ((2, 30.0, "2026-12-01T05:00:00+0000"), (4, 50.0, "2026-12-01T05:00:00+0000"),
                              (2, 20.0, "2026-11-30T05:00:00+0000"), (4, 60.0, "2026-11-30T05:00:00+0000"))]
    pl = per_layer(pd.DataFrame(rows))
    assert pl["per_layer_ms"].iloc[0] == pytest.approx(10.0)   # (50 - 30) / 2: the newer day's pair


def test_a_per_layer_difference_under_the_dram_roofline_is_no_cost():
    """Two depths whose runs disagree (one depth in a slow spell of the machine) can give a difference
    under what a layer's bytes take from DRAM at the best read probe: no per-layer cost, and the tables
    say why; where the layers fit the L3 the DRAM roofline is no bound and the difference stands."""
    import pandas as pd
    from hinabench.e2e.figures import per_layer
    def rows(ms2, fp="AMD EPYC, 1S/2C/2T, L3 32 MiB"):
        return pd.DataFrame([dict(op="e2e", model="m", backend="hina", phase="decode", status="ok", layers=L,
                                  batch_size=1, prompt_tokens=128, median_ms=ms, mad_ms=0.1, full_layers=8,
                                  timestamp="2026-12-05T06:00:00+0000", layer_bytes=700e6, read_gbps=80.0,
                                  fingerprint=fp)
                             for L, ms in ((1, 22.0), (2, ms2))])
    ok = per_layer(rows(32.0))                 # 10 ms a layer against the 8.75 ms roofline
    assert ok["per_layer_ms"].iloc[0] == pytest.approx(10.0)
    low = per_layer(rows(25.6))                # 3.6 ms: under 0.9 x 8.75
    assert low["per_layer_ms"].iloc[0] is None
    assert low["raw_ms"].iloc[0] == pytest.approx(3.6) and low["under_roofline_ms"].iloc[0] == pytest.approx(8.75)
    cached = per_layer(rows(25.6, fp="Xeon, 1S/2C/2T, L3 4800 MiB"))   # 2 x 700 MB fit that L3
    assert cached["per_layer_ms"].iloc[0] == pytest.approx(3.6)


def test_logprob_err_is_the_max_prompt_logprob_delta():
    from hinabench.e2e import measure as M
    torch.manual_seed(0)
    logits = torch.randn(5, 11)
    ref = M.Reference(torch.tensor([[3, 1, 4, 1, 5]]), logits, [], "test")
    assert M.logprob_err(logits.clone(), ref) == 0.0
    assert M.logprob_err(logits + 7.0, ref) == pytest.approx(0.0, abs=1e-5)     # a shift of all logits: none
    moved = logits.clone()
    moved[2, 1] += 0.5                     # position 2 predicts token ids[3] = 1: its log-prob moves
    lp = M.prompt_logprobs(ref, logits)
    want = abs(float(torch.log_softmax(moved[2], -1)[1] - lp[2]))
    assert M.logprob_err(moved, ref) == pytest.approx(want) and want > 0.1
    assert M.logprob_err(M.prompt_logprobs(ref, moved), ref) == pytest.approx(want)   # log-probs given directly


def test_gguf_refuses_a_disk_without_room(monkeypatch, tmp_path):
    import shutil
    from collections import namedtuple
    from hinabench.e2e.gguf_writer import write_gguf
    from hinabench.errors import UserError
    pytest.importorskip("gguf")
    ck = C.checkpoint("tiny-qwen3", 1)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 1 << 40, 1 << 20))
    path = ck.path / "model-q8_0.gguf"
    if path.exists():
        pytest.skip("the tiny checkpoint's GGUF is already written")
    with pytest.raises(UserError, match="GiB of disk"):
        write_gguf(ck, "q8_0")
    assert not path.exists() and not (ck.path / "model-q8_0.gguf.partial").exists()


@pytest.mark.parametrize("qtype", ["bf16", "q8_0"])
def test_gguf_of_the_same_weights(qtype):
    gguf = pytest.importorskip("gguf")
    from hinabench.e2e.gguf_writer import write_gguf
    ck = C.checkpoint("tiny-qwen3", 1)
    path = write_gguf(ck, qtype)
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "qwen3moe"
    names = {t.name: t for t in r.tensors}
    assert {"token_embd.weight", "output.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight",
            "blk.0.attn_q.weight", "blk.0.ffn_gate_inp.weight"} <= set(names)
    t = names["blk.0.ffn_gate_exps.weight"]
    assert list(t.shape) == [64, 32, 8]        # ggml order: ne0 = H, ne1 = I, ne2 = E
    want = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[qtype]
    assert t.tensor_type == want
    # the routers stay F32 (llama.cpp's converter and llama-quantize keep them so)
    assert names["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_gguf_of_an_older_writer_is_written_again():
    pytest.importorskip("gguf")
    from hinabench.e2e.gguf_writer import WRITER, write_gguf, writer_version
    ck = C.checkpoint("tiny-qwen3", 1)
    path = write_gguf(ck, "q8_0")
    assert writer_version(path) == WRITER
    path.write_bytes(b"GGUF but not one")             # a file this writer did not write (or an older one)
    assert writer_version(path) is None
    assert write_gguf(ck, "q8_0") == path and writer_version(path) == WRITER


def test_a_depth_over_the_memory_budget_is_a_row_not_an_oom(tmp_path):
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "mixtral-8x7b", "--layers", "4", "--engines", "hina,hf", "--mem-gib", "7",
               "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = read_csv(out)
    assert len(rows) == 4 and all(x["status"] == "unavailable" and "over the 7.0 GiB budget" in x["reason"] for x in rows)
    assert not any((tmp_path / "ckpt").glob("mixtral*"))


def _stand_in_env(tmp_path, monkeypatch, engine, before=""):
    """A stand-in env for a peer engine: its interpreter answers as vllm_run.py / llamacpp_run.py /
    ipex_run.py do (prompt log-probs all 0, fixed timings); `before`: Python run first, with req."""
    import stat
    import sys
    from hinabench.e2e import engines as E
    env_name, script = E.PEERS[engine]
    monkeypatch.setattr(E, "_cpu_has", lambda flag: True)   # ipex needs AVX-512; CI's Zen 3 has none
    env = tmp_path / "envs" / env_name
    (env / "bin").mkdir(parents=True)
    (env / "hinabench-env.json").write_text(json.dumps({"recipe": {}}))
    fake = env / "bin" / "python"
    fake.write_text(f"""#!{sys.executable}
import json, os, signal, sys
req = json.load(open(sys.argv[2]))
{before}
assert sys.argv[1].endswith("{script}")
assert "{engine}" != "llamacpp:q8_0" or req["gguf"].endswith("model-q8_0.gguf")
n = len(req["validate_ids"]) - 1
pts = {{str(b): ({{"ttft_s": [0.5, 0.6], "steps_s": [0.1, 0.11, 0.12] * 2}} if b == 1 or "{engine}" != "llamacpp:q8_0"
              else {{"ttft_s": [], "steps_s": []}}) for b in req["batches"]}}
json.dump({{"version": "0.32.0-stand-in", "validation": {{"prompt_logprobs": [0.0] * n, "greedy": [1, 2, 3, 4]}},
           "points": pts, "extra_bufts": req.get("extra_bufts", True)}}, open(sys.argv[3], "w"))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("HINABENCH_ENVS", str(tmp_path / "envs"))


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGILL"])
def test_llamacpp_engine_that_dies_with_sigsegv_runs_again_without_its_extra_buffers(tmp_path, monkeypatch, sig):
    """llama.cpp's AMX buffer crashes on some AMX CPUs (SIGSEGV in ggml_backend_amx_mul_mat on one, SIGILL
    on another): the harness runs the engine once more with use_extra_bufts off, and every row says so,
    naming the signal. A second crash, or a crash of another engine, is a `failed` row."""
    crash = f"if req.get('extra_bufts') is not False: os.kill(os.getpid(), signal.{sig})"
    _stand_in_env(tmp_path, monkeypatch, "llamacpp:q8_0", before=crash)
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1", "--prompt", "8", "--gen", "4", "--batch", "1",
               "--engines", "hf,llamacpp:q8_0", "--rounds", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = [x for x in read_csv(out) if x["backend"] == "llamacpp:q8_0"]
    assert len(rows) == 2 and all(x["status"] == "wrong" for x in rows)    # timed; the stand-in's log-probs
    assert all("extra buffer types off" in x["engine_impl"] and f"died with {sig}" in x["note"] for x in rows)
    assert "extra buffer types off" in r.output


def test_vllm_engine_that_dies_with_sigsegv_is_a_failed_row(tmp_path, monkeypatch):
    _stand_in_env(tmp_path, monkeypatch, "vllm", before="os.kill(os.getpid(), signal.SIGSEGV)")
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1", "--prompt", "8", "--gen", "4", "--batch", "1",
               "--engines", "hf,vllm", "--rounds", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = [x for x in read_csv(out) if x["backend"] == "vllm"]
    assert len(rows) == 2 and all(x["status"] == "failed" and "exited -11" in x["reason"] for x in rows)


@pytest.mark.parametrize("engine", ["vllm", "llamacpp:q8_0", "ipex"])
def test_peer_engine_rows_from_its_process(tmp_path, monkeypatch, engine):
    """The harness side of an engine in its own env, with a stand-in env (its interpreter answers as
    vllm_run.py / llamacpp_run.py / ipex_run.py do): timings become rows; prompt log-probs far from the
    reference make every row `wrong`, said why; llama.cpp's batch > 1 has no samples: `unsupported`."""
    import os
    _stand_in_env(tmp_path, monkeypatch, engine)
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1", "--prompt", "8", "--gen", "4", "--batch", "1,2",
               "--engines", f"hf,{engine}", "--rounds", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = read_csv(out)
    hf = [x for x in rows if x["backend"] == "hf"]
    rows = [x for x in rows if x["backend"] != "hf"]
    assert len(rows) == 4 and all(x["backend"] == engine for x in rows)
    b1 = [x for x in rows if x["batch_size"] == "1" or engine != "llamacpp:q8_0"]
    assert all(x["status"] == "wrong" and "nats" in x["reason"] for x in b1)
    own = float(hf[0]["logprob_err"])       # beside a peer's delta: transformers' own bf16 one, same tokens
    assert all(float(x["logprob_err_hf"]) == own and f"own bf16 run: {own:.3g} nats" in x["reason"] for x in b1)
    assert all(x["status"] == "unsupported" and "one sequence" in x["reason"] for x in rows if x not in b1)
    dec = [x for x in b1 if x["phase"] == "decode"]
    assert all(float(x["median_ms"]) == pytest.approx(110.0) and "0.32.0-stand-in" in x["engine_version"] for x in dec)
    assert os.environ.get("HINABENCH_ENVS") == str(tmp_path / "envs")


def test_in_process_rounds_come_in_two_passes_around_the_peers(tmp_path, monkeypatch):
    """With a peer and >= 2 rounds, the in-process engines run half their rounds before the peer's and
    half after (the machine drifts over minutes): rows carry every round's samples, validated once."""
    _stand_in_env(tmp_path, monkeypatch, "vllm", before="print('PEER RAN', flush=True)")
    out = tmp_path / "e2e.csv"
    r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1", "--prompt", "8", "--gen", "4", "--batch", "1",
               "--engines", "hf,hina,vllm", "--rounds", "3", "--out", str(out))
    assert r.exit_code == 0, r.output
    text = r.output
    assert text.count("round 3 hf B=1") == 1 and text.count("logits rel_err") == 2   # hf, hina: validated once
    assert text.index("round 2 hina B=1") < text.index("vllm: ") < text.index("rounds 3-3 after the other engines'")
    assert text.index("rounds 3-3 after") < text.index("round 3 hina B=1")
    rows = read_csv(out)
    dec = [x for x in rows if x["backend"] in ("hf", "hina") and x["phase"] == "decode"]
    assert len(dec) == 2 and all(int(x["samples"]) == 3 * 3 and x["status"] == "ok" for x in dec)   # 3 rounds x 3 steps
    assert all(x["ffn_share"] not in ("", None) for x in dec)
    assert {x["backend"] for x in rows} == {"hf", "hina", "vllm"}


def test_router_near_tie_is_found_and_worded():
    """The reference records its prompt's closest router decision; under NEAR_TIE a mismatch says so."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    from hinabench.e2e import measure as M
    assert M.router_near_tie([(0.5, 0, 3), (0.3, 1, 7)]) is None
    words = M.router_near_tie([(0.5, 0, 3), (0.009, 1, 17)])
    assert "layer 2" in words and "token 17" in words and "0.009" in words
    cfg = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    m = MixtralForCausalLM(cfg).eval()
    margins: list = []
    hooks = M._router_hooks(m, margins)
    with torch.inference_mode():
        m(input_ids=torch.arange(10)[None])
    for h in hooks:
        h.remove()
    assert sorted((layer, t) for _, layer, t in margins) == [(i, t) for i in (0, 1) for t in range(10)]  # all
    assert all(g >= 0 for g, _, _ in margins)
    # a decision taken the other way: that token's k-th expert becomes the (k+1)-th, nothing else moves
    seen = {}
    def capture(flip):
        hooks = M._router_hooks(m, [], flip=flip)
        hooks.append(m.model.layers[1].mlp.gate.register_forward_hook(
            lambda mod, i, out: seen.__setitem__(flip, (out[1].clone(), out[2].clone()))))
        with torch.inference_mode():
            m(input_ids=torch.arange(10)[None])
        for h in hooks:
            h.remove()
    capture(None)
    capture((1, 4))
    (w0, e0), (w1, e1) = seen[None], seen[(1, 4)]
    assert torch.equal(e0[:4], e1[:4]) and not torch.equal(e0[4], e1[4]) and e0[4, 0] == e1[4, 0]
    assert float(w1[4].sum()) == pytest.approx(1.0)                 # Mixtral's router normalizes its top k


def test_a_near_tie_taken_the_other_way_is_an_alternate_reference(monkeypatch):
    """With a near-tie in every candidate prompt, the reference is also made with each of its ALTERNATES
    closest decisions taken the other way; an engine's log-probs are judged against the closest of them,
    and the row says which."""
    import torch
    from hinabench.e2e import measure as M
    ck = C.checkpoint("tiny-qwen3", 2, seed=5)
    for f in ck.path.glob("reference-*.pt"):
        f.unlink()
    cands = M.validation_prompts(ck.config["vocab_size"], 10, 5)
    monkeypatch.setattr(M, "NEAR_TIE", 1e9)                        # every decision is "near"
    monkeypatch.setattr(M, "ALTERNATES", 3)
    ref = M.reference(ck, cands, 8 << 30, echo=lambda *_: None)
    assert len(ref.alternates) == 3 and all("taken the other way" in w for w, _ in ref.alternates)
    base = M.prompt_logprobs(ref, ref.logits)
    moved = [(w, lp) for w, lp in ref.alternates if float((lp - base).abs().max()) > 1e-4]
    assert moved                                                    # a flipped decision moves the log-probs
    assert M.logprob_match(base, ref) == (0.0, None)
    w, lp = moved[0]
    assert M.logprob_match(lp, ref) == (0.0, w) and M.logprob_match(lp + 0.01, ref)[0] == pytest.approx(0.01, abs=1e-5)
    far = float((lp - base).abs().max())                            # the reference as made, when within tolerance
    assert M.logprob_match(lp, ref, far) == (pytest.approx(far), None) and M.logprob_match(lp, ref, far / 2) == (0.0, w)
    assert "nor within it of the reference with any of its 3 closest" in ref.why_wrong("x")
    again = M.reference(ck, cands, 8 << 30, echo=lambda *_: None)  # cached with its alternates
    assert [w for w, _ in again.alternates] == [w for w, _ in ref.alternates]
    for f in ck.path.glob("reference-*.pt"):
        f.unlink()


def test_in_process_logits_over_tolerance_are_ok_when_a_near_tie_explains_them():
    """An in-process engine passes on its logits; where they miss the tolerance but its prompt log-probs
    match the reference with a near-tie decision taken the other way (within the bf16 log-prob tolerance,
    the out-of-process engines' test), it is ok and says which decision; otherwise wrong."""
    from hinabench.e2e import measure as M
    tie = "layer 2's decision for prompt token 12 (0.0078 from a tie) taken the other way"
    assert M.logits_ok(0.01, 0.005, 0.03, 0.2, None) == (True, None)          # the logits decide first
    assert M.logits_ok(0.01, 0.05, 0.03, 0.01, None) == (False, None)         # decode steps too
    assert M.logits_ok(0.041, 0.007, 0.03, 0.0158, tie) == (True, tie)        # explained by the tie
    assert M.logits_ok(0.041, 0.007, 0.03, M.LOGPROB_TOLERANCE_BF16 * 1.5, tie) == (False, None)
    assert M.logits_ok(0.041, 0.007, 0.03, 0.0158, None) == (False, None)     # log-probs of the reference as made


def test_reference_picks_a_validation_prompt_without_a_router_near_tie(monkeypatch):
    """Of the candidate prompts, the reference takes the first whose closest router decision is at
    least NEAR_TIE; when none is, the first, with its near-tie recorded; the choice is cached."""
    import torch
    from hinabench.e2e import measure as M
    ck = C.checkpoint("tiny-qwen3", 2, seed=5)
    cands = M.validation_prompts(ck.config["vocab_size"], 10, 5)
    assert len(cands) == M.PROMPT_CANDIDATES and cands[0].equal(C.prompt_ids(ck.config["vocab_size"], 1, 10, 6))
    m = M.load(ck.path, torch.float32, experts="eager")
    gaps = []
    for ids in cands:
        margins: list = []
        hooks = M._router_hooks(m, margins)
        with torch.inference_mode():
            m(input_ids=ids)
        for h in hooks:
            h.remove()
        gaps.append(min(margins)[0])
    quiet = lambda *_: None  # noqa: E731
    # a threshold the first candidate misses and a later one clears: the first that clears it is taken
    k = next(i for i in range(1, len(gaps)) if gaps[i] > gaps[0])
    monkeypatch.setattr(M, "NEAR_TIE", (gaps[0] + gaps[k]) / 2)
    want = next(i for i in range(len(gaps)) if gaps[i] >= M.NEAR_TIE)
    ref = M.reference(ck, cands, 8 << 30, echo=quiet)
    assert ref.ids.equal(cands[want]) and ref.near_tie is None and ref.router_margin == pytest.approx(gaps[want])
    assert f"validation prompt {want + 1} of {len(cands)}" in ref.what
    assert M.reference(ck, cands, 8 << 30, echo=quiet).ids.equal(cands[want])       # cached with its prompt
    for f in ck.path.glob("reference-*.pt"):
        f.unlink()
    # none clears it: the first, and the near-tie is said
    monkeypatch.setattr(M, "NEAR_TIE", max(gaps) + 1.0)
    ref = M.reference(ck, cands, 8 << 30, echo=quiet)
    assert ref.ids.equal(cands[0]) and "apart" in ref.near_tie and "every candidate has one" in ref.what


def test_peer_targets_over_several_runs_take_the_median_of_each_runs_ratio():
    """A folder of runs: each run's per-layer costs come from its own two depths, and the verdict over
    the runs is on the median of their ratios (a single run's ratio moves by more than the margin); the
    roofline target's too."""
    import pandas as pd
    from hinabench.e2e.figures import per_layer_by_run, run_ratios, tables
    rows = []
    for i, (hina, vllm) in enumerate(((5.0, 5.5), (5.0, 6.5), (4.0, 5.2))):   # ratios 1.10, 1.30, 1.30
        for eng, per in (("hina+l+a", hina), ("vllm", vllm)):
            for L in (2, 4):
                rows.append(dict(op="e2e", model="qwen3-30b-a3b", backend=eng, phase="decode", status="ok", layers=L,
                                 batch_size=1, prompt_tokens=128, median_ms=30.0 + per * L, mad_ms=0.1, full_layers=48,
                                 tokens_per_s=20.0, ffn_share=0.3, attn_share=0.2, rel_err=0.01, layer_bytes=114e6,
                                 read_gbps=30.0,
                                 run_id=f"20261204T10000{i}-1", timestamp=f"2026-12-04T10:00:0{i}+0000"))
    rows.append(dict(rows[-1], backend="vllm", layers=4, median_ms=30.0 + 2 * 5.2 + 0.4, mad_ms=0.1,
                     run_id="20261204T110000-2", timestamp="2026-12-04T11:00:00+0000"))   # one depth only: no ratio
    df = pd.DataFrame(rows)
    runs = per_layer_by_run(df)
    assert set(runs["run"]) == {"20261204T100000-1", "20261204T100001-1", "20261204T100002-1", "20261204T110000-2"}
    rr = run_ratios(runs, "qwen3-30b-a3b", "hina+l+a", "vllm")
    assert [round(x, 2) for _, x in rr] == [1.1, 1.3, 1.3]
    latest = df[df["run_id"] != "20261204T110000-2"].sort_values("timestamp").groupby(["backend", "layers"]).tail(1)
    text = tables(latest, runs=df)
    assert "hina+l+a >= 1.2x vllm per layer: 1.30x -> PASS (4.00 vs 5.20 ms)" in text       # the newest run alone
    assert "hina+l+a >= 1.2x vllm per layer, over 3 runs of 20261204: median 1.30x (runs 1.10-1.30x) -> PASS" in text
    # the roofline target too (114 MB at 30 GB/s: 3.8 ms a layer; 5.0, 5.0, 4.0 ms), each run against its own probe
    assert "hina+l+a per layer within 1.25x of its roofline, over 3 runs of 20261204: median 1.32x (runs 1.05-1.32x) -> FAIL" in text
    assert "over" not in tables(latest)     # without every run's rows: one run, no line over runs


def test_a_single_runs_ratio_within_its_spread_is_inconclusive():
    """A run's per-layer ratio that clears or misses its bound by less than its spread (the two costs'
    MADs, propagated) is neither a pass nor a fail: on a shared machine the margin is inside the noise."""
    import pandas as pd
    from hinabench.e2e.figures import _ratio_spread, _verdict, tables
    assert _verdict(1.30, 1.2, 0.15, True).startswith("INCONCLUSIVE") and _verdict(1.30, 1.2, 0.05, True) == "PASS"
    assert _verdict(1.10, 1.2, 0.05, True) == "FAIL" and _verdict(1.32, 1.25, 0.09, False).startswith("INCONCLUSIVE")
    assert _ratio_spread(1.3, (4.0, 0.0), (5.2, 0.0)) == 0.0
    assert _ratio_spread(2.0, (4.0, 0.4), (8.0, 0.0)) == pytest.approx(0.2)
    def rows(mad):
        return pd.DataFrame([dict(op="e2e", model="mixtral-8x7b", backend=eng, phase="decode", status="ok", layers=L,
                                  batch_size=1, prompt_tokens=128, median_ms=10.0 + per * L, mad_ms=mad, full_layers=32,
                                  tokens_per_s=5.0, ffn_share=0.8, attn_share=0.1, rel_err=0.01)
                             for L in (1, 2) for eng, per in (("hina+fused", 9.38), ("llamacpp:bf16", 8.97))])
    line = next(x for x in tables(rows(0.7)).splitlines() if "llamacpp:bf16 per layer:" in x and "hina+fused" in x)
    assert "0.96x -> INCONCLUSIVE (within its spread, +- 0.15x)" in line, line     # 9.38 +- 0.99 vs 8.97 +- 0.99
    line = next(x for x in tables(rows(0.05)).splitlines() if "llamacpp:bf16 per layer:" in x and "hina+fused" in x)
    assert "0.96x -> FAIL" in line, line


def test_a_ttft_within_its_spread_is_inconclusive():
    """TTFT against hf follows the per-layer targets' rule: within the two TTFTs' MADs, INCONCLUSIVE."""
    import pandas as pd
    from hinabench.e2e.figures import tables
    def rows(hina, mad):
        return pd.DataFrame([dict(op="e2e", model="mixtral-8x7b", backend=eng, phase="prefill", status="ok", layers=2,
                                  batch_size=1, prompt_tokens=128, median_ms=ms, mad_ms=mad, full_layers=32,
                                  tokens_per_s=128 / ms * 1e3, rel_err=0.01)
                             for eng, ms in (("hina+fused", hina), ("hf", 419.3))])
    def line(df):
        return next(x for x in tables(df).splitlines() if "TTFT(128)" in x and "<= hf" in x)
    assert line(rows(434.7, 2.0)).endswith("-> FAIL")                  # 3.7% slower, MADs of 0.5%
    assert line(rows(421.0, 2.0)).endswith("-> INCONCLUSIVE (within its spread, +- 0.01x)")
    assert line(rows(410.0, 2.0)).endswith("-> PASS")
    assert line(rows(410.0, float("nan"))).endswith("-> PASS")          # no MAD recorded: the plain comparison


def test_a_ratio_that_would_print_as_its_bound_gets_a_third_decimal():
    from hinabench.e2e.figures import _against
    assert _against(1.196, 1.2) == "1.196" and _against(1.2, 1.2) == "1.20" and _against(1.31, 1.2) == "1.31"
    assert _against(1.2504, 1.25) == "1.250" and _against(1.17, 1.25) == "1.17"


def test_where_the_roofline_gap_goes_part_by_part():
    """The fused layer's parts at two depths: each part's per-layer ms from the difference, against its bytes
    at the rows' best read probe; the timed per-layer cost less the parts' sum is what lies between them."""
    import json
    import pandas as pd
    from hinabench.e2e.figures import gap_parts, tables
    def parts(L):   # ms per step over L layers, bytes per layer
        return json.dumps({"qkv": {"ms": 0.3 * L, "bytes": 20_000_000}, "rope": {"ms": 0.02 * L, "bytes": 0},
                           "experts": {"ms": 1.0 * L + 0.5, "bytes": 80_000_000}})
    rows = [dict(op="e2e", model="qwen3-30b-a3b", backend="hina+fused", phase="decode", status="ok", layers=L,
                 batch_size=1, prompt_tokens=128, median_ms=9.0 + 1.5 * L, mad_ms=0.05, full_layers=48,
                 layer_bytes=100e6, read_gbps=gb, tokens_per_s=50.0, ffn_share=0.6, attn_share=0.2, rel_err=0.01,
                 layer_parts=parts(L), run_id="r1", timestamp="2026-12-06T01:00:00+0000",
                 fingerprint="AMD EPYC, 1S/2C/2T, L3 32 MiB")
            for L, gb in ((2, 100.0), (4, 98.0))]
    g = gap_parts(pd.DataFrame(rows))
    assert len(g) == 1 and g[0]["gbps"] == 100.0 and g[0]["per_layer_ms"] == pytest.approx(1.5)
    by = {x["part"]: x for x in g[0]["parts"]}
    assert by["experts"]["ms"] == pytest.approx(1.0) and by["experts"]["probe_ms"] == pytest.approx(0.8)
    assert by["qkv"]["excess_ms"] == pytest.approx(0.1) and by["rope"]["probe_ms"] == 0.0
    assert g[0]["roofline_ms"] == pytest.approx(1.0)
    text = tables(pd.DataFrame(rows))
    assert "Where the per-layer roofline gap goes" in text
    line = next(x for x in text.splitlines() if x.startswith("| experts |"))
    assert "| 1.000 | 80.0 | 0.800 | 1.25 | 0.200 | 62% |" in line     # 0.2 of the parts' 0.32 ms gap
    assert "| all parts | 1.320 | 100.0 | 1.000 | 1.32 | 0.320 | 100% |" in text
    assert "the timed passes: 1.500 ms a layer (1.50x" in text and "(+0.180 ms)" in text
    rows[0]["layer_parts"] = None                                       # one depth without parts: no table
    assert gap_parts(pd.DataFrame(rows)) == []


def test_paired_depths_sit_on_the_row_the_per_layer_cost_reads(tmp_path, monkeypatch):
    """With three depths the per-layer cost reads the two shallowest (figures.per_layer): the pairs are
    timed at the second one, against the first; `--no-paired` times none."""
    monkeypatch.setenv("HINABENCH_ENVS", str(tmp_path / "no-envs"))
    for flag, want in (("--paired", {1: "", 2: "1", 3: ""}), ("--no-paired", {1: "", 2: "", 3: ""})):
        out = tmp_path / f"e2e{flag}.csv"
        r = invoke("e2e", "--model", "tiny-qwen3", "--layers", "1,2,3", "--prompt", "8", "--gen", "3", "--engines", "hf",
                   "--rounds", "1", flag, "--out", str(out))
        assert r.exit_code == 0, r.output
        dec = {int(x["layers"]): x["paired_layers"] for x in read_csv(out) if x["phase"] == "decode"}
        assert dec == want, flag
