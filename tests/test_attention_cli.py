"""`hinabench attn` end to end (both phases, both layouts, validated rows in the store), the attention
figure from stored rows, the attention suites, the torch paths' memory guard, and vLLM-CPU's attention
op and llama.cpp's flash attention in their own environments (skipped with the reason when an env is
missing)."""
from pathlib import Path

import pytest

from hinabench import envs
from hinabench.backends.base import Unsupported
from hinabench.backends.torch_attention import check_transient
from hinabench.harness.runner import RunConfig, run_point
from hinabench.harness.suite import load_suite
from hinabench.problems import AttentionProblem

from clihelp import invoke, read_csv

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--rounds", "1", "--min-time", "0.01", "--warmup", "1", "--threads", "1"]


def test_attn_runs_both_phases_and_layouts_into_validated_rows(tmp_path):
    out = tmp_path / "attn.csv"
    res = invoke("attn", "--model", "qwen3-30b-a3b", "--phase", "decode,extend", "--context", "40,100",
                 "--batch", "1,2", "--extend", "8", "--layout", "paged,contiguous", "--block-size", "16",
                 "--backends", "hina,torch", *FAST, "--out", str(out))
    assert res.exit_code == 0, res.output
    rows = read_csv(out)
    assert {r["op"] for r in rows} == {"attention"}
    assert {(r["phase"], r["layout"]) for r in rows} == {(p, l) for p in ("decode", "extend")
                                                         for l in ("paged", "contiguous")}
    ran = [r for r in rows if r["backend"] in ("hina:avx2", "torch", "torch:sdpa")]
    assert ran and all(r["status"] == "ok" for r in ran), [(r["backend"], r["reason"]) for r in ran]
    for r in ran:
        assert float(r["rel_err"]) < float(r["tolerance"])
        assert int(r["weight_bytes"]) > 0 and float(r["gbps"]) > 0 and r["command"].startswith("hinabench attn")
    ext = [r for r in ran if r["phase"] == "extend"][0]
    assert int(ext["extend"]) == 8 and int(ext["kv_tokens"]) == int(ext["batch"]) * (int(ext["context"]) + 8)
    # the figure, from those stored rows only
    res = invoke("figure", "attn", str(out), "--out", str(tmp_path / "fig"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "fig" / "attn.png").stat().st_size > 10_000
    assert "hinabench attn" in (tmp_path / "fig" / "attn.txt").read_text()


def test_deepseek_is_refused_in_one_line():
    res = invoke("attn", "--model", "deepseek-v3", *FAST)
    assert res.exit_code != 0 and "MLA" in res.output and "Traceback" not in res.output


def test_attention_suites_load():
    sweep, name = load_suite(str(ROOT / "suites" / "attn.toml"))
    pts = sweep.points([2])
    assert name == "attn" and len(pts) == 2 * 2 * 4 * 3
    assert {p.problem.layout for p in pts} == {"paged", "contiguous"}
    sweep, _ = load_suite(str(ROOT / "suites" / "attn-extend.toml"))
    assert {(p.problem.phase, p.problem.extend) for p in sweep.points([2])} == {("extend", 128), ("extend", 512)}


def test_torch_paths_refuse_points_whose_copies_would_not_fit():
    big = AttentionProblem.create("qwen3-30b-a3b", "decode", 16, 32768)
    with pytest.raises(Unsupported, match="GiB"):
        check_transient(big, True, "torch")
    check_transient(AttentionProblem.create("qwen3-30b-a3b", "decode", 1, 4096), False, "torch:sdpa")


@pytest.mark.skipif(not envs.usable("vllm")[0], reason=envs.usable("vllm")[1])
def test_vllm_cpu_attention_op_validates_on_a_ragged_paged_batch():
    p = AttentionProblem.custom(16, 4, 128, [70, 33, 200], phase="extend", extend=5, layout="paged", block_size=32)
    cfg = RunConfig(rounds=1, warmup=1, min_time=0.02, max_time=1.0, command="test")
    rows = {r["backend"]: r for r in run_point(p, ["vllm:attn"], 1, cfg, data=p.materialize(rotate=False))}
    r = rows["vllm:attn"]
    assert r["status"] == "ok", r["reason"]
    assert r["rel_err"] < r["tolerance"] and r["versions"]["vllm_attn_isa"]


@pytest.mark.skipif(not envs.usable("ipex")[0], reason=envs.usable("ipex")[1])
@pytest.mark.parametrize("phase", ["decode", "extend"])
def test_ipex_paged_attention_validates_on_a_ragged_paged_batch(phase):
    """IPEX's decode and varlen ops on its own cache, filled by its own writer; on an AVX2-only CPU the
    row is `unsupported` with the reason, never a crash."""
    p = AttentionProblem.custom(16, 4, 128, [70, 33, 200], phase=phase, extend=5 if phase == "extend" else 1,
                                layout="paged", block_size=32)
    cfg = RunConfig(rounds=1, warmup=1, min_time=0.02, max_time=1.0, command="test")
    r = {r["backend"]: r for r in run_point(p, ["ipex:paged-attn"], 1, cfg, data=p.materialize(rotate=False))}
    r = r["ipex:paged-attn"]
    if r["status"] == "unsupported":
        assert "AVX-512" in r["reason"]
        return
    assert r["status"] == "ok", r["reason"]
    assert r["rel_err"] < r["tolerance"] and r["extra_bytes"] >= p.weight_bytes


@pytest.mark.skipif(not envs.usable("llamacpp")[0], reason=envs.usable("llamacpp")[1])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_llamacpp_flash_attention_validates_on_a_ragged_extend_batch(layout):
    # ragged lengths (the mask hides the cells past each sequence) and the causal triangle of extend
    p = AttentionProblem.custom(16, 4, 128, [70, 33, 200], phase="extend", extend=5, layout=layout, block_size=16)
    cfg = RunConfig(rounds=1, warmup=1, min_time=0.02, max_time=1.0, command="test")
    r = {r["backend"]: r for r in run_point(p, ["llamacpp:fa"], 1, cfg, data=p.materialize(rotate=False))}["llamacpp:fa"]
    assert r["status"] == "ok", r["reason"]
    assert r["rel_err"] < r["tolerance"]
    assert r["extra_bytes"] >= p.weight_bytes     # its own copy of K and V, each sequence padded to the longest


def _row(backend, median, status="ok", **kw):
    r = dict(op="attention", model="qwen3-30b-a3b", phase="decode", layout="paged", block_size=32, batch=1,
             context=4096, extend=0, ragged=False, threads=2, numa="default", backend=backend, status=status,
             median_ms=median, mad_ms=0.01, reason="", read_gbps=30.0, peak_gflops=200.0,
             weight_bytes=4096 * 4 * 128 * 4, flops=4 * 32 * 128 * 4096, gbps=8.0, gflops=100.0)
    r.update(kw)
    return r


def test_attention_targets_judge_stored_rows():
    from hinabench.report.attn_targets import judge_attention
    rows = [_row("hina:avx2", 0.40), _row("torch:sdpa", 1.0), _row("vllm:attn", 0.5),
            _row("llamacpp:fa", None, status="unsupported", reason="no adapter"),
            _row("hina:avx2", 5.0, phase="extend", extend=128), _row("torch:sdpa", 4.0, phase="extend", extend=128)]
    v = {(x.target, x.T): x for x in judge_attention(rows[:4], "hina:avx2")}
    roof = v[("roofline", 4096)]
    assert roof.verdict == "fail" and "compute-bound" in roof.why    # 0.28 ms of bytes, 0.34 ms of FLOPs
    assert v[("sdpa", 4096)].verdict == "pass"                        # 1.0 / 0.40 = 2.5x
    assert v[("llamacpp", 4096)].verdict == "n/a" and "no adapter" in v[("llamacpp", 4096)].why
    assert v[("vllm (info)", 4096)].verdict == "pass"
    ext = [x for x in judge_attention(rows, "hina:avx2") if x.target == "extend"][0]
    assert ext.verdict == "fail" and "efficiency" in ext.why
