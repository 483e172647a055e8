"""Each peer's adapter on a tiny problem, in its own environment: runs when `hinabench env create NAME`
has made it, skipped with the reason when not. What a variant cannot run on this CPU must come back as
an `unsupported` row with the reason, never a crash of the harness."""
import pytest

from hinabench import backends as registry
from hinabench import envs
from hinabench.problems import FFNProblem, materialize
from hinabench.harness.runner import RunConfig, run_point

PROBLEM = FFNProblem.custom(hidden_size=256, intermediate_size=256, tokens_per_expert=4, active_experts=2,
                            routed_experts=8, seed=3)


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def needs_env(name):
    ok, why = envs.usable(name)
    return pytest.mark.skipif(not ok, reason=why)


def rows(names):
    cfg = RunConfig(rounds=2, warmup=1, min_time=0.02, max_time=1.0, command="test")
    data = materialize(PROBLEM, rotate=False)
    return {r["backend"]: r for r in run_point(PROBLEM, names, 1, cfg, data=data)}


def assert_ok(r, env):
    assert r["status"] == "ok", r["reason"]
    assert r["rel_err"] < r["tolerance"] and r["median_ms"] > 0 and r["pct_bw"] > 0
    assert r["versions"]["env"] == env and r["versions"]["torch"]


def test_missing_env_is_unavailable_with_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("HINABENCH_ENVS", str(tmp_path))
    r = rows(["vllm:vec"])["vllm:vec"]
    assert r["status"] == "unavailable"
    assert r["reason"] == "environment 'vllm' does not exist: run `hinabench env create vllm`"


@needs_env("vllm")
def test_vllm():
    got = rows(["vllm:vec", "vllm:sgl", "vllm:amx"])
    assert_ok(got["vllm:vec"], "vllm")
    assert got["vllm:vec"]["extra_bytes"] == PROBLEM.weight_bytes       # one packed copy of the weights
    has_bf16 = "avx512_bf16" in cpu_flags()
    for v in ("vllm:sgl", "vllm:amx"):
        if has_bf16 and (v == "vllm:sgl" or "amx_tile" in cpu_flags()):
            assert_ok(got[v], "vllm")
        else:
            assert got[v]["status"] == "unsupported" and "SIGILL" in got[v]["reason"], got[v]["reason"]


@needs_env("kt")
def test_kt():
    got = rows(["kt:amxbf16", "kt:avx2bf16", "kt:llamafile"])
    build = got["kt:avx2bf16"]["versions"]["kt_kernel_build"] if got["kt:avx2bf16"]["versions"] else None
    for name, r in got.items():
        assert r["status"] in ("ok", "unsupported"), (name, r["reason"])
        if r["status"] == "unsupported":
            assert any(w in r["reason"] for w in ("build for this CPU", "divisible", "not supported")), r["reason"]
        else:
            assert_ok(r, "kt")
    if "avx512_bf16" not in cpu_flags():
        assert got["kt:amxbf16"]["status"] == "unsupported"
        assert build == "avx2" and got["kt:avx2bf16"]["status"] == "ok"


@needs_env("llamacpp")
def test_llamacpp():
    got = rows(["llamacpp:bf16", "llamacpp:q8_0"])
    assert_ok(got["llamacpp:bf16"], "llamacpp")
    assert_ok(got["llamacpp:q8_0"], "llamacpp")     # Q8_0 stays within the BF16 tolerance here
    assert got["llamacpp:q8_0"]["extra_bytes"] < got["llamacpp:bf16"]["extra_bytes"]


@needs_env("ipex")
def test_ipex():
    got = rows(["ipex:tpp", "ipex:fused"])
    flags = cpu_flags()
    for name, r in got.items():
        if {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags:
            if name == "ipex:fused" and "amx_tile" not in flags:
                assert r["status"] == "unsupported", r["reason"]
            else:
                assert_ok(r, "ipex")
        else:   # IPEX checks the ISA itself and says so: an unsupported row with its words
            assert r["status"] == "unsupported" and "IPEX refuses on this CPU" in r["reason"], r["reason"]


def test_kt_rows_say_that_its_own_thread_pool_quantizes_times_at_threads_equal_cpus():
    import os
    ncpu = len(os.sched_getaffinity(0))
    kt = registry.get("kt:avx2bf16")
    assert "scheduler ticks" in kt.note(ncpu) and "not the harness's" in kt.note(ncpu)
    if ncpu > 1:
        assert kt.note(ncpu - 1) == ""
    assert registry.get("torch").note(ncpu) == ""
