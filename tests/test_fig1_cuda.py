"""Figure 1 (CPU vs GPU throughput by batch) and its `torch-cuda` backend: the unsupported path on a
machine without CUDA, the backend's code run on the CPU device (the same loop, probes and rounds), and
the figure drawn from synthetic stored rows, or refused with what is missing."""
import json

import pytest
import torch

from hinabench.backends import get
from hinabench.backends.torch_cuda import TorchCuda, TorchCudaGrouped, cuda_missing
from hinabench.harness.measure import RoundPlan
from hinabench.problems import FFNProblem, materialize, rel_err

from clihelp import FAST, invoke, read_csv
from synthetic import row, write_csv

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device: the unsupported path does not apply")
def test_without_cuda_torch_cuda_rows_are_unsupported_with_the_reason(tmp_results):
    ok, why = get("torch-cuda").availability()
    assert not ok and why.startswith("no CUDA device")
    if torch.version.cuda is None:
        assert "built without CUDA" in why
    args = [a if a != "torch" else "torch,torch-cuda" for a in FAST]
    r = invoke("ffn", *args, "--tokens", "1", "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = {x["backend"]: x for x in read_csv(tmp_results)}
    assert rows["torch"]["status"] == "ok"
    assert rows["torch-cuda"]["status"] == "unsupported" and rows["torch-cuda"]["reason"] == why
    assert rows["torch-cuda"]["median_ms"] == "" and rows["torch-cuda"]["rank"] == ""


class TorchOnCpu(TorchCuda):
    """torch-cuda's own code on the CPU device: what can be checked of it where no GPU is."""
    name = "torch-cuda@cpu-for-tests"
    device = "cpu"
    probe_n = 128
    probe_reps = 2


def test_the_cuda_backends_code_runs_validates_and_probes_its_own_device():
    data = materialize(FFNProblem.custom(128, 96, 5, 2, routed_experts=4, seed=3), rotate=False)
    b = TorchOnCpu(1)
    assert TorchOnCpu.availability() == (True, "")
    b.prepare(data)
    out = b.run(0)
    assert out.device.type == "cpu" and out.dtype == torch.bfloat16
    assert rel_err(out, data.reference(0)) <= data.problem.tolerance
    res = b.measure_round(0, RoundPlan(rounds=1, warmup=1, repeats=2), None)
    assert len(res.samples) == 2 and all(s > 0 for s in res.samples)
    assert [p[1] for p in res.probes] == ["cpu-amax"] * 2 and all(p[0] > 0 for p in res.probes)
    assert [p[1] for p in res.peaks] == ["cpu-bf16-matmul"] * 2 and all(p[0] > 0 for p in res.peaks)
    assert b.versions()["torch"] == torch.__version__
    b.close()
    assert not hasattr(b, "w13")


class GroupedOnCpu(TorchCudaGrouped):
    """torch-cuda:grouped's own code on the CPU device (torch's grouped_mm has a CPU path)."""
    name = "torch-cuda:grouped@cpu-for-tests"
    device = "cpu"
    probe_n = 128
    probe_reps = 2


@pytest.mark.parametrize("routing,tokens", [("same-experts", 5), ("router", 9), ("router", 1)])
def test_the_grouped_cuda_backend_matches_the_reference_in_every_rotation_group(routing, tokens):
    """Pairs sorted by expert, one grouped_mm per projection over the group's experts (ids made local
    to the group), experts that get no token included: the reference in every rotation group."""
    p = FFNProblem.custom(128, 96, tokens, 2, routed_experts=6, seed=4, routing=routing)
    data = materialize(p, llc_bytes=200_000)   # an L3 this small: several rotation groups
    assert data.groups >= 2
    ok, why = TorchCudaGrouped.availability()
    assert ok or why.startswith("no CUDA device")
    b = GroupedOnCpu(1)
    b.prepare(data)
    for g in range(data.groups):
        out = b.run(g)
        assert out.dtype == torch.bfloat16 and rel_err(out, data.reference(g)) <= data.problem.tolerance, g
    b.close()
    assert get("torch-cuda:grouped").name == "torch-cuda:grouped"


def _cpu_and_gpu(root, gpu_status="ok"):
    cpu = write_csv(root / "amd-f25m1-2t-1n" / "ffn.csv", [
        row(b, t, median_ms=m * t ** 0.5) for b, m in (("torch", 60.0), ("hina:avx2", 30.0)) for t in (1, 4, 16, 64)
    ] + [row("torch-cuda", 1, "unsupported", reason=cuda_missing() or "no CUDA device: synthetic")])
    gpu_rows = [row("torch-cuda", t, gpu_status, machine="gpu-h200-host", median_ms=0.5 + 0.01 * t,
                    reason=None if gpu_status == "ok" else "no CUDA device: synthetic",
                    versions=json.dumps({"torch": "2.13.0+cu128", "device": "NVIDIA H200 [synthetic]"}))
                for t in (1, 4, 16, 64)]
    gpu = write_csv(root / "gpu-h200-host" / "ffn.csv", gpu_rows)
    return cpu.parent, gpu.parent


def test_fig1_is_drawn_from_cpu_and_gpu_rows_of_two_machines(tmp_path):
    cpu, gpu = _cpu_and_gpu(tmp_path / "results")
    out = tmp_path / "fig"
    r = invoke("figure", "fig1", str(cpu), str(gpu), "--out", str(out))
    assert r.exit_code == 0, r.output
    png, txt = out / "fig1.png", out / "fig1.txt"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    side = txt.read_text()
    assert "tokens/s = batch tokens / median latency" in side
    assert f"made by: hinabench figure fig1 {cpu} {gpu}" in side
    assert "synthetic rows for the tests" in side            # the commands that made the rows


def test_fig1_names_what_is_missing(tmp_path):
    cpu, gpu = _cpu_and_gpu(tmp_path / "r", gpu_status="unsupported")
    r = invoke("figure", "fig1", str(cpu), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2
    assert "no ok rows of the CUDA backend (torch-cuda): torch-cuda: unsupported (no CUDA device" in r.output
    r = invoke("figure", "fig1", str(gpu), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no ok rows of the CUDA backend" in r.output and "no rows of a CPU backend" in r.output
    other = write_csv(tmp_path / "q" / "r.csv", [row("torch-cuda", 1, model="qwen3-30b-a3b", machine="gpu")])
    r = invoke("figure", "fig1", str(cpu), str(other), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "of one model and routing" in r.output and "qwen3-30b-a3b (same-experts)" in r.output
    assert not (tmp_path / "o" / "fig1.png").exists()


def test_fig10_refuses_rows_of_several_machines(tmp_path):
    cpu, gpu = _cpu_and_gpu(tmp_path / "r")
    r = invoke("figure", "fig10", str(cpu), str(gpu), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "draws one machine's rows" in r.output and "hinabench report" in r.output
