"""The results store under damage and re-runs, every renderer, suite validation, `hinabench linear`."""
import json

import pytest
from click.testing import CliRunner

from hinabench.cli import cli
from hinabench.harness.store import ResultStore, read_rows
from hinabench.report.render import FORMATS

from clihelp import FAST, invoke
from clihelp import read_csv as csv_rows


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("store") / "r.csv"
    r = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(path))
    assert r.exit_code == 0, r.output
    return path


def test_a_torn_last_row_is_cut_and_measured_again(stored, tmp_path):
    path = tmp_path / "torn.csv"
    data = stored.read_bytes()
    path.write_bytes(data[: len(data) - 40])          # the second row, torn by an interrupted write
    shown = invoke("show", str(path))                 # readers name the damage, never a traceback
    assert shown.exit_code == 0 and "line 3: not a whole row" in shown.output
    r = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(path), "--resume")
    assert r.exit_code == 0, r.output
    assert "the last row was torn" in r.output
    rows = csv_rows(path)
    assert [row["tokens_per_expert"] for row in rows] == ["1", "2"] and all(row["status"] == "ok" for row in rows)


def test_a_file_that_is_not_results_is_refused(tmp_path):
    for text in ("garbage\x00 not csv at all\n", "a,b,c\n1,2,3\n"):
        path = tmp_path / "other.csv"
        path.write_text(text)
        r = invoke("ffn", *FAST, "--tokens", "1", "--out", str(path), "--resume")
        assert r.exit_code == 2 and "is not a results file of ffn rows" in r.output
        assert path.read_text() == text                    # never appended to
        s = invoke("show", str(path))
        assert s.exit_code == 2 and "is not a results file" in s.output


def test_a_rerun_appends_a_run_and_readers_take_the_latest(stored, tmp_path):
    path = tmp_path / "rerun.csv"
    path.write_bytes(stored.read_bytes())
    r = invoke("ffn", *FAST, "--tokens", "1", "--out", str(path))
    assert r.exit_code == 0 and "this run appends its own" in r.output
    assert len(csv_rows(path)) == 3
    assert len(read_rows([path])) == 2 and len(read_rows([path], latest=False)) == 3
    s = invoke("show", str(path), "--format", "csv")
    assert "1 row(s) superseded" in s.output
    assert len(json.loads(invoke("show", str(path), "--all", "--format", "json").stdout)) == 3
    done = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(path), "--resume")
    assert done.exit_code == 0 and "nothing to do" in done.output and len(csv_rows(path)) == 3


def test_every_format_renders_show_and_targets(stored):
    for fmt in FORMATS:
        r = invoke("show", str(stored), "--format", fmt)
        assert r.exit_code == 0 and "qwen3-30b-a3b" in r.output, fmt
    assert len(invoke("show", str(stored), "--format", "jsonl").output.strip().splitlines()) == 2
    r = invoke("targets", str(stored), "--backend", "torch", "--format", "jsonl")
    assert r.exit_code == 0 and all(json.loads(x)["backend"] == "torch" for x in r.output.strip().splitlines())


@pytest.mark.parametrize("opt", [["--rounds", "0"], ["--repeats", "-5"], ["--warmup", "-1"],
                                 ["--min-time", "0"], ["--experts", "0"]])
def test_numeric_options_are_bounded(opt, tmp_path):
    r = CliRunner().invoke(cli, ["ffn", *FAST, "--tokens", "1", "--out", str(tmp_path / "x.csv"), *opt])
    assert r.exit_code == 2 and "Invalid value" in r.output and not (tmp_path / "x.csv").exists()


def test_a_row_is_never_stored_without_a_status(tmp_path):
    with pytest.raises(ValueError, match="without a status"):
        ResultStore(tmp_path / "r.csv").append({"backend": "torch"})


@pytest.mark.parametrize("body, msg", [
    ('[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = "1,2"\n', "'tokens' must be a list of whole numbers"),
    ('[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [1]\nthreads = 2\n', "'threads' must be a list"),
    ('[sweeep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [1]\n', "unknown top-level key or section 'sweeep' (did you mean 'sweep'?)"),
    ('[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [0]\n', "'tokens' values must be at least 1"),
    ('[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [1]\nrounds = 0\n', "'rounds' must be at least 1"),
])
def test_suites_are_validated_with_one_line_per_problem(body, msg, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(body)
    r = CliRunner().invoke(cli, ["suite", "run", str(path)])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_linear_validates_torch_and_hina_and_names_what_cannot_run(tmp_path):
    out = tmp_path / "lin.csv"
    r = invoke("linear", "--model", "qwen3-30b-a3b", "--proj", "qkv", "--tokens", "1,8",
               "--backends", "torch,onednn,hina:avx2", "--rounds", "1", "--min-time", "0.01", "--warmup", "1",
               "--threads", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = csv_rows(out)
    by = {(row["backend"], row["batch_tokens"]): row for row in rows}
    for b in ("torch", "hina:avx2"):
        for t in ("1", "8"):
            row = by[(b, t)]
            assert row["status"] == "ok" and row["op"] == "linear" and row["proj"] == "qkv", row
            assert (row["out_features"], row["in_features"]) == ("5120", "2048")
            assert float(row["rel_err"]) < float(row["tolerance"]) and float(row["efficiency"]) > 0
    for t in ("1", "8"):
        od = by[("onednn:prepacked", t)]
        assert od["status"] in ("ok", "unsupported") and (od["status"] == "ok" or od["reason"])
    bad = CliRunner().invoke(cli, ["linear", "--backends", "vllm"])
    assert bad.exit_code == 2 and "has no linear path" in bad.output


def test_a_source_folder_shadowing_the_installed_package_is_named(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    src = Path(__file__).resolve().parents[1]
    shutil.copytree(src / "hinabench", tmp_path / "hinabench",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "_build_info.py"))
    (tmp_path / "pyproject.toml").write_text((src / "pyproject.toml").read_text())
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([sys.executable, "-c", "import hinabench; print(hinabench.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env=env).stdout
    if str(tmp_path) not in where:
        pytest.skip("an editable install's import finder comes before the current directory: nothing shadows it")
    r = subprocess.run([sys.executable, "-c", "from hinabench.native import load; load('_C')"], cwd=tmp_path,
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "shadows the installed package" in r.stderr and "pip install --no-build-isolation -e ." in r.stderr


def test_rows_carry_their_own_peak_and_flag_moved_denominators(stored):
    from hinabench.harness.runner import _denominators
    rows = csv_rows(stored)
    for row in rows:
        assert float(row["peak_gflops"]) >= float(row["peak_gflops_min"]) > 0
        assert float(row["peak_gflops_machine"]) >= float(row["peak_gflops"])
        assert row["denominators_moved"] in ("True", "False")
    r = {"fingerprint": "test-machine-x"}
    _denominators(r, [(20.0, "avx2"), (21.0, "avx2")], [(250.0, "avx2-fma-fp32"), (160.0, "avx2-fma-fp32")], 2)
    assert r["denominators_moved"] is True and r["peak_gflops_min"] == 160.0     # an SMT sibling showed up
    r = {"fingerprint": "test-machine-x"}
    _denominators(r, [(20.0, "avx2"), (21.0, "avx2")], [(250.0, "avx2-fma-fp32"), (240.0, "avx2-fma-fp32")], 2)
    assert r["denominators_moved"] is False


def test_progress_names_the_backend_and_round_and_counts_every_turn():
    from hinabench.harness.runner import RunConfig, run_point
    from hinabench.problems import FFNProblem
    events = []
    cfg = RunConfig(rounds=2, warmup=1, min_time=0.01, max_time=1.0, command="test")
    run_point(FFNProblem.custom(256, 256, 2, 2), ["torch", "onednn:runtime"], 1, cfg,
              progress=lambda what, units: events.append((what, units)))
    assert sum(u for _, u in events) == 2 * 2                       # backends x rounds
    assert any(w and "torch · round 2/2" in w for w, _ in events)


def test_help_and_models_say_what_is_true():
    r = invoke("suite", "run", "--help")
    assert "<suite>-<model>-<time>.csv" in r.output
    from click.testing import CliRunner
    from hinabench.cli import cli
    out = CliRunner().invoke(cli, ["models"], terminal_width=100).output
    assert "qwen3-235b-a22b" in out and "mixtral-8x22b" in out


def test_wait_quiet_waits_for_a_busy_machine_then_says_so(tmp_path):
    import subprocess
    import sys
    from hinabench.harness.suite import wait_quiet
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        waited, load = wait_quiet(1.0, poll=0.25)
        assert waited >= 1.0 and load > 0.25
        # the timed window as long as a real run's (--min-time's default): /proc/stat counts in clock ticks
        # (10 ms), and FAST's 10 ms window read a busy CPU as idle in one full run of 2026-12-05
        r = invoke("ffn", *FAST, "--min-time", "0.3", "--tokens", "1", "--out", str(tmp_path / "w.csv"),
                   "--wait-quiet", "0.5")
        assert r.exit_code == 0 and "still" in r.output and "other CPUs busy after waiting" in r.output
        row = csv_rows(tmp_path / "w.csv")[0]
        assert row["load_warning"] == "True"
        assert "eff is not comparable" in r.output
    finally:
        busy.kill()
        busy.wait()


def test_a_normal_fill_row_is_not_stored_in_a_file_from_before_the_fill_column(stored, tmp_path):
    """Rows of a file without `fill` read back as fill=binades: a `--fill normal` row there would be
    another point under the same key, so it is refused with the way out, and nothing is appended."""
    path = tmp_path / "old.csv"
    rows = csv_rows(stored)
    old_cols = [c for c in rows[0] if c != "fill"]
    import csv as _csv
    with open(path, "w", newline="") as f:
        w = _csv.DictWriter(f, fieldnames=old_cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerow(rows[0])
    before = path.read_bytes()
    r = invoke("ffn", *FAST, "--tokens", "1", "--fill", "normal", "--out", str(path))
    assert r.exit_code != 0 and "write to a new file" in r.output and "Traceback" not in r.output, r.output
    assert path.read_bytes() == before
    r = invoke("ffn", *FAST, "--tokens", "1", "--fill", "bogus", "--out", str(path))
    assert r.exit_code == 2 and "bogus" in r.output


def test_a_file_of_an_older_schema_is_resumed_in_its_own_columns(stored, tmp_path):
    path = tmp_path / "old.csv"
    rows = csv_rows(stored)
    old_cols = [c for c in rows[0] if c not in ("op", "routing", "batch_tokens", "note", "run_id",
                                                  "peak_gflops_min", "peak_gflops_machine", "denominators_moved")]
    import csv as _csv
    with open(path, "w", newline="") as f:
        w = _csv.DictWriter(f, fieldnames=old_cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerow(rows[0])                                   # T = 1 measured by "an older hinabench"
    r = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(path), "--resume")
    assert r.exit_code == 0 and "written by an older hinabench" in r.output, r.output
    got = csv_rows(path)
    assert list(got[0]) == old_cols and [x["tokens_per_expert"] for x in got] == ["1", "2"]
