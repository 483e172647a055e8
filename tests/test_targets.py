"""`hinabench targets`: the kernel's performance targets judged on stored rows."""
import csv
import json

from click.testing import CliRunner

from hinabench.cli import cli
from hinabench.harness.store import COLUMNS
from hinabench.report.targets import judge

WB = 704643072


def row(backend, T, median, status="ok", eff=None, mad=1.0, wb=WB, reason=""):
    return {"backend": backend, "model": "mixtral-8x7b", "tokens_per_expert": T, "threads": 2,
            "numa": "default", "status": status, "median_ms": median if status == "ok" else None,
            "mad_ms": mad, "efficiency": eff, "weight_bytes": wb, "roofline_ms": 40.0, "bound": "memory",
            "reason": reason, "fingerprint": "test machine"}


def verdicts(rows, backend="hina:avx512"):
    return {(v.T, v.target): v for v in judge(rows, backend)}


def test_efficiency_bars_by_regime():
    v = verdicts([row("hina:avx512", 2, 44, eff=0.91), row("hina:avx512", 8, 50, eff=0.74),
                  row("hina:avx512", 6, 50, eff=0.1), row("hina:avx512", 256, 50, eff=0.80)])
    assert v[(2, "efficiency")].verdict == "pass" and v[(2, "efficiency")].want == ">= 0.90"
    assert v[(8, "efficiency")].verdict == "fail" and v[(8, "efficiency")].want == ">= 0.75"
    assert (6, "efficiency") not in v                       # T = 5..7: no target
    assert v[(256, "efficiency")].verdict == "pass"


def test_onednn_and_peers_comparisons():
    rows = [row("hina:avx512", 1, 15.0, eff=0.95), row("onednn:prepacked", 1, 20.0),
            row("vllm:vec", 1, 15.5), row("ipex:tpp", 1, 14.9, mad=0.5),      # a tie within MAD
            row("llamacpp:q8_0", 1, 8.0, wb=WB // 2),                          # other bytes: not a peer
            row("kt:llamafile", 1, 1.0, status="wrong"),                       # wrong: never a peer
            row("hina:avx512", 16, 30.0, eff=0.8), row("onednn:prepacked", 16, 29.0),
            row("vllm:vec", 16, 31.0, mad=0.5),
            row("hina:avx512", 32, 30.0, eff=0.8), row("vllm:vec", 32, 30.5)]          # faster, not by the MAD
    v = verdicts(rows)
    assert v[(1, "onednn")].verdict == "pass" and "1.33x" in v[(1, "onednn")].got
    assert v[(1, "peers")].verdict == "pass" and "ipex:tpp" in v[(1, "peers")].got
    assert "tie within MAD" in v[(1, "peers")].got
    assert v[(16, "onednn")].verdict == "fail"
    assert v[(16, "peers")].verdict == "pass" and "vllm:vec" in v[(16, "peers")].got
    assert v[(32, "peers")].verdict == "fail" and "tie within MAD" in v[(32, "peers")].got


def test_zentorch_is_a_peer():
    # AMD's ZenDNN extension reads the same bf16 weights: on Zen 4 it is the peer to beat
    v = verdicts([row("hina:avx512", 1, 15.0, eff=0.95, mad=0.1), row("vllm:vec", 1, 16.0, mad=0.1),
                  row("zentorch:bf16", 1, 12.0, mad=0.1)])
    assert v[(1, "peers")].verdict == "fail" and "zentorch:bf16" in v[(1, "peers")].got


def test_missing_comparisons_are_na_never_pass():
    rows = [row("hina:avx512", 1, 44, eff=0.9),
            row("onednn:prepacked", 1, None, status="unsupported", reason="no bf16 here"),
            row("vllm:amx", 1, None, status="unsupported"), row("hina:avx512", 2, None, status="failed")]
    v = verdicts(rows, "hina:avx512")
    assert v[(1, "onednn")].verdict == "n/a" and "no bf16 here" in v[(1, "onednn")].why
    assert v[(1, "peers")].verdict == "n/a" and "vllm:amx" in v[(1, "peers")].why
    assert v[(2, "all")].verdict == "n/a"


def test_cli_auto_picks_the_best_isa_and_reports_counts(tmp_path):
    f = tmp_path / "r.csv"
    rows = [row("hina:avx2", 1, 44, eff=0.91), row("hina:avx512", 1, 30, eff=0.95),
            row("hina:amx", 1, None, status="unsupported"), row("vllm:vec", 1, 45)]
    with open(f, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    r = CliRunner().invoke(cli, ["targets", str(f), "--format", "markdown"])
    assert r.exit_code == 0, r.output
    assert "hina:avx512: 2 pass, 0 fail, 1 n/a of 3 targets" in r.output and "machine: test machine" in r.output
    js = json.loads(CliRunner().invoke(cli, ["targets", str(f), "--backend", "hina:avx2", "--format", "json"]).output)
    assert {v["target"] for v in js} == {"efficiency", "numa", "peers"}     # the AVX2 path's own set
    bad = CliRunner().invoke(cli, ["targets", str(f), "--backend", "hina:nope"])
    assert bad.exit_code == 2 and "no bf16 row of hina:nope" in bad.output


def test_the_avx2_paths_own_targets():
    def r(backend, T, median, model="mixtral-8x7b", **kw):
        out = row(backend, T, median, **kw)
        out["model"] = model
        return out
    rows = [r("hina:avx2", 1, 50, eff=0.91), r("vllm:vec", 1, 52, mad=0.5), r("hina:avx2-numa", 1, 50.5),
            r("hina:avx2", 2, 50, model="qwen3-30b-a3b", eff=0.81),
            r("hina:avx2", 4, 50, model="deepseek-v3", eff=0.85),
            r("hina:avx2", 8, 50, eff=0.4), r("vllm:vec", 8, 60, mad=0.5), r("hina:avx2-numa", 8, 53),
            r("hina:avx2", 16, 50, eff=0.56), r("vllm:vec", 16, 70),
            r("hina:avx2", 64, 50, eff=0.58)]
    rows[8].update(gflops=120.0, gemm_gflops=135.0)       # 0.89x the GEMM: pass
    rows[10].update(gflops=100.0, gemm_gflops=135.0)      # 0.74x: fail
    v = verdicts(rows, "hina:avx2")
    assert v[(1, "efficiency")].verdict == "pass" and v[(1, "efficiency")].want == ">= 0.90"
    assert v[(2, "efficiency")].verdict == "pass" and v[(2, "efficiency")].want == ">= 0.80"   # Qwen3's bar
    assert v[(4, "efficiency")].verdict == "fail"
    assert (8, "efficiency") not in v                                                        # no bar at T = 8
    assert v[(16, "efficiency")].want == ">= 0.55" and v[(64, "efficiency")].want == ">= 0.60"
    assert v[(64, "efficiency")].verdict == "fail"
    assert v[(16, "gemm")].verdict == "pass" and v[(64, "gemm")].verdict == "fail"
    assert v[(1, "peers")].verdict == "pass"                       # faster by more than the MAD
    assert v[(8, "peers")].verdict == "fail" and "1.20x" in v[(8, "peers")].got              # < 1.3x
    assert v[(16, "peers")].verdict == "pass" and v[(16, "peers")].want == ">= 1.3x the best peer"
    assert v[(1, "numa")].verdict == "pass"                        # 0.5 ms slower: within the MAD
    assert v[(8, "numa")].verdict == "fail"
    assert v[(2, "numa")].verdict == "n/a" and "no row" in v[(2, "numa")].why
    assert not any(k[1] == "onednn" for k in v)


def test_gemm_ceiling_is_torchs_fp32_gemm():
    from hinabench.machine.probes import gemm_gflops
    g = gemm_gflops(1, (128, 256, 256), reps=2)
    assert 0.1 < g < 10_000
