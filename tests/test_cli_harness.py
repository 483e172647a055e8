"""The harness end to end through click's CliRunner: storage, resume, error paths, sysinfo."""
import csv
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hinabench import backends as registry
from hinabench.backends.base import Backend
from hinabench.cli import cli
from hinabench.harness.store import COLUMNS, ResultStore, rank_rows
from hinabench.machine.sysinfo import llc_bytes
from hinabench.problems import FFNProblem

from clihelp import FAST, invoke
from clihelp import read_csv as read_rows

STORED_FIG11 = Path(__file__).resolve().parents[1] / "results" / "amd-f25m1-2t-1n" / "fig11-i.csv"   # committed rows


def test_ffn_writes_validated_rows_with_roofline(tmp_results):
    r = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = read_rows(tmp_results)
    assert [row["tokens_per_expert"] for row in rows] == ["1", "2"]
    for row in rows:
        assert row["status"] == "ok" and row["rank"] == "1"
        assert float(row["rel_err"]) < float(row["tolerance"])
        for col in ("median_ms", "mad_ms", "p10_ms", "p90_ms", "read_gbps", "peak_gflops", "roofline_ms",
                    "pct_bw", "efficiency"):
            assert float(row[col]) > 0, col
        assert float(row["efficiency"]) == pytest.approx(float(row["roofline_ms"]) / float(row["median_ms"]))
        # qwen3-30b: 75 MB a call; on a 32 MiB L3 rotated over 2 groups (the rule: problems/base.py)
        expect = FFNProblem.create("qwen3-30b-a3b", 1).rotation_groups(llc_bytes())
        assert row["rotation_groups"] == str(expect)
        assert "hinabench ffn" in row["command"] and row["fingerprint"]
    assert "torch" in r.output and "rows written to" in r.output


def test_show_prints_stored_rows_filtered_in_every_format(tmp_results):
    assert invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(tmp_results)).exit_code == 0
    md = invoke("show", str(tmp_results), "--tokens", "2", "--backends", "torch", "--format", "markdown")
    assert md.exit_code == 0, md.output
    lines = md.output.splitlines()
    assert lines[0].startswith("**") and lines[0].endswith("**") and lines[1] == ""   # each table under its title
    assert lines[2].startswith("| backend | T | thr |") and lines[4].startswith("| torch | 2 | 1 | ok | 1 |")
    assert len([ln for ln in lines if ln.startswith("| torch")]) == 1
    assert any(ln.startswith("Machine: ") for ln in lines)
    assert any(ln.startswith("Made by: `hinabench ffn") for ln in lines)
    table = invoke("show", str(tmp_results))
    assert table.exit_code == 0 and "qwen3-30b-a3b bf16" in table.output and "made by:" in table.output
    js = json.loads(invoke("show", str(tmp_results), "--threads", "1", "--format", "json").output)
    assert [r["tokens_per_expert"] for r in js] == [1, 2] and js[0]["rank"] == 1
    csv_out = invoke("show", str(tmp_results), "--status", "ok", "--format", "csv").output
    assert [r["tokens_per_expert"] for r in csv.DictReader(csv_out.splitlines())] == ["1", "2"]
    none = invoke("show", str(tmp_results), "--backends", "hina")
    assert none.exit_code == 2 and "no stored row matches" in none.output
    missing = invoke("show", str(tmp_results) + ".nope")
    assert missing.exit_code == 2 and "no results file" in missing.output


def test_resume_skips_done_points_and_keeps_them(tmp_results):
    assert invoke("ffn", *FAST, "--tokens", "1", "--out", str(tmp_results)).exit_code == 0
    first = read_rows(tmp_results)
    r = invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(tmp_results), "--resume")
    assert r.exit_code == 0, r.output
    rows = read_rows(tmp_results)
    assert [row["tokens_per_expert"] for row in rows] == ["1", "2"]
    assert rows[0] == first[0]


def test_json_output(tmp_results):
    r = CliRunner(mix_stderr=False).invoke(cli, ["ffn", *FAST, "--tokens", "1", "--out", str(tmp_results),
                                                 "--json"]) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames \
        else CliRunner().invoke(cli, ["ffn", *FAST, "--tokens", "1", "--out", str(tmp_results), "--json"])
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    assert rows[0]["backend"] == "torch" and set(COLUMNS) <= set(rows[0])


@pytest.mark.parametrize("args, msg", [
    (["ffn", "--model", "gpt-5"], "unknown model 'gpt-5'; known models: mixtral-8x7b"),
    (["ffn", "--tokens", "0"], "at least 1"),
    (["ffn", "--tokens", "1,x"], "comma-separated list"),
    (["ffn", "--experts", "9"], "9 active experts asked, but mixtral-8x7b has 8"),
    (["ffn", "--backends", "nope"], "unknown backend 'nope'"),
    (["ffn", "--dtype", "fp64"], "unknown dtype 'fp64'"),
    (["ffn", "--threads", "999"], "--threads must be between 1 and"),
    (["ffn", "--group", "64", "--dtype", "bf16,fp8"], "group (--group) sets int8's scale groups, and this sweep has no int8"),
    (["bandwidth", "--threads", "0"], "--threads must be between 1 and"),
    (["peak", "--threads", "1,999"], "--threads must be between 1 and"),
    (["overlap", "--threads", "999"], "--threads must be between 1 and"),
    (["e2e", "--model", "qwen3-30b-a3b", "--threads", "999"], "--threads must be between 1 and"),
    (["reproduce", "--threads", "999", "--plan-only"], "--threads must be between 1 and"),
    (["ffn", "--resume"], "--resume needs --out"),
    (["ffn", "--out", "/proc/hinabench.csv", "--backends", "torch"], "is not writable"),
    (["bandwidth", "--size", "1"], "under 4x the last-level cache"),
    (["overlap", "--size", "1"], "under 4x the last-level cache"),
    (["overlap", "--work", "1,-2"], "--work values must be >= 0 (got -2)"),
    (["overlap", "--ahead", "x"], "--ahead must be a comma-separated list"),
    (["suite", "run", "/nonexistent.toml"], "no suite file"),
    (["figure", "fig10", "/nonexistent.csv"], "no results file"),
])
def test_user_errors_are_one_line_without_traceback(args, msg):
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert msg in r.output
    assert "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0


@pytest.mark.parametrize("args", [
    ["figure", "fig11", str(STORED_FIG11), "--out", "/proc/hinabench-out"],
    ["report", str(STORED_FIG11), "--out", "/proc/hinabench-out"],
    ["reproduce", "--plan-only", "--only", "fig11", "--out", "/proc/hinabench-out"],
])
def test_an_output_folder_that_cannot_be_made_is_a_user_error(args):
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert "--out /proc/hinabench-out cannot be written" in r.output and "Traceback" not in r.output


def test_a_results_file_has_one_writer_at_a_time(tmp_results):
    # another run holds the file (a resume started while the first run still measures)
    first = ResultStore(tmp_results, op="ffn")
    first.open_for_append()
    r = CliRunner().invoke(cli, ["ffn", *FAST, "--tokens", "1", "--out", str(tmp_results)])
    assert r.exit_code == 2, r.output
    assert "is being written by another hinabench run (pid " in r.output and "Traceback" not in r.output
    first.close()
    assert invoke("ffn", *FAST, "--tokens", "1", "--out", str(tmp_results)).exit_code == 0
    assert invoke("ffn", *FAST, "--tokens", "1", "--out", str(tmp_results), "--resume").exit_code == 0  # released


def test_more_memory_than_available_is_refused_before_allocating(monkeypatch, tmp_results):
    import hinabench.harness.runner as runner
    monkeypatch.setattr(runner, "meminfo", lambda: {"MemAvailable": 100 << 20})
    r = CliRunner().invoke(cli, ["ffn", "--model", "mixtral-8x7b", "--tokens", "1", "--backends", "torch",
                                 "--out", str(tmp_results)])
    assert r.exit_code == 2
    assert "needs 1.0 GiB" in r.output or "needs" in r.output
    assert "only 0.1 GiB is available" in r.output


class Exploding(Backend):
    name = "test:exploding"
    description = "raises in run()"

    def run(self, group):
        raise RuntimeError("kaboom")


class Wrong(Backend):
    name = "test:wrong"
    description = "returns garbage fast"

    def run(self, group):
        return torch.zeros(self.data.x.shape, dtype=torch.bfloat16)


class Missing(Backend):
    name = "test:missing"
    description = "not here"
    missing_status = "unavailable"

    @classmethod
    def availability(cls):
        return False, "its environment does not exist: run `hinabench env create missing`"

    def run(self, group):
        raise AssertionError("never called")


def test_failing_wrong_and_missing_backends_become_rows(monkeypatch, tmp_results):
    registry._load()
    for cls in (Exploding, Wrong, Missing):
        monkeypatch.setitem(registry.REGISTRY, cls.name, cls)
    r = invoke("ffn", *FAST[:2], "--backends", "torch,test:exploding,test:wrong,test:missing", "--tokens", "1",
               "--rounds", "2", "--min-time", "0.01", "--threads", "1", "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = {row["backend"]: row for row in read_rows(tmp_results)}
    assert rows["test:exploding"]["status"] == "failed" and "kaboom" in rows["test:exploding"]["reason"]
    assert rows["test:wrong"]["status"] == "wrong" and rows["test:wrong"]["rank"] == ""
    assert rows["test:wrong"]["reason"].endswith("> tolerance 0.02: the output is all zeros")
    assert float(rows["test:wrong"]["median_ms"]) > 0          # timed, flagged, not ranked
    assert rows["test:missing"]["status"] == "unavailable" and "env create" in rows["test:missing"]["reason"]
    assert rows["torch"]["status"] == "ok" and rows["torch"]["rank"] == "1"


def test_store_parquet_and_rank(tmp_path):
    pytest.importorskip("pyarrow")
    s = ResultStore(tmp_path / "r.parquet")
    s.check_writable()
    rows = [{"backend": "a", "model": "m", "tokens_per_expert": 1, "status": "ok", "median_ms": 2.0},
            {"backend": "b", "model": "m", "tokens_per_expert": 1, "status": "ok", "median_ms": 1.0},
            {"backend": "c", "model": "m", "tokens_per_expert": 1, "status": "wrong", "median_ms": 0.1}]
    rank_rows(rows)
    assert [r["rank"] for r in rows] == [2, 1, None]
    for r in rows:
        s.append(r)
    assert [r["backend"] for r in s.rows()] == ["a", "b", "c"]
    assert len(s.done_keys()) == 3


def test_sysinfo_json_matches_cpuid():
    r = invoke("sysinfo", "--json")
    fp = json.loads(r.output)
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    assert fp["isa"]["avx512_bf16"] == ("avx512_bf16" in flags)
    assert fp["isa"]["amx_tile"] == ("amx_tile" in flags)
    assert len(fp["numa_nodes"]) >= 1 and fp["caches"]["L3"] > 0
    assert isinstance(fp["perf_hw_counters"], bool)
    if not fp["perf_hw_counters"]:
        assert fp["perf_reason"]
    line = invoke("sysinfo", "--summary").output.strip()
    assert "NUMA node" in line and "hinabench" in line


def _dram_mib() -> int:
    """The smallest buffer (MiB) the probe commands accept: they refuse one under 4x the LLC."""
    return max(160, -(-4 * llc_bytes() // 2**20))


def test_models_bandwidth_peak_commands():
    r = invoke("models", "--json")
    assert {m["name"] for m in json.loads(r.output)} >= {"mixtral-8x7b", "deepseek-v3"}
    size = _dram_mib()
    r = invoke("bandwidth", "--threads", "1", "--size", str(size), "--passes", "1", "--json")
    rows = json.loads(r.output)
    assert all(row["best_gbps"] > 0.5 for row in rows)
    r = invoke("peak", "--threads", "1", "--json")
    assert any(row["roofline_unit"] for row in json.loads(r.output))


def test_overlap_probe():
    from hinabench.machine import probes
    # the model: B = 20, C = 10 GB/s; serial 1/R = 0.15, overlapped 0.1
    assert probes.overlap_fraction(20, 10, 10) == pytest.approx(1.0)
    assert probes.overlap_fraction(20, 10, 1 / 0.15) == pytest.approx(0.0)
    assert probes.overlap_fraction(20, 10, 8) == pytest.approx(0.5)
    assert probes.overlap_fraction(10, 20, 8) == pytest.approx(0.5)     # symmetric in B and C
    # the loop: more work per line is slower on an L1-resident buffer; a prefetch past the end is harmless
    import torch
    buf = torch.ones(probes.OVERLAP_L1_BYTES, dtype=torch.bfloat16)
    c0, c8 = (probes.compute_only_gbps(buf.data_ptr(), 1, w, seconds=0.01) for w in (0, 8))
    assert c0 > c8 > 0
    assert probes.stream_work_gbps(buf.data_ptr(), buf.numel() * 2, 2, 1, ahead=1 << 20) > 0
    size = _dram_mib()
    r = invoke("overlap", "--threads", "1", "--work", "0,2", "--ahead", "0", "--size", str(size), "--passes", "1",
               "--json")
    rows = json.loads(r.output)
    assert [row["work"] for row in rows] == [0, 2] and rows[0]["overlap"] is None
    assert all(row["combined_gbps"] > 0.5 and row["compute_gbps"] > 0 for row in rows)
    assert isinstance(rows[1]["overlap"], float)


def test_suite_and_figure(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text('name = "tiny"\n[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [1, 2]\nbackends = ["torch"]\n'
                     'threads = [1]\nrounds = 1\nmin_time = 0.01\nwarmup = 1\n')
    out = tmp_path / "tiny.csv"
    assert invoke("suite", "run", str(suite), "--out", str(out)).exit_code == 0
    assert len(read_rows(out)) == 2
    r = invoke("figure", "fig10", str(out), "--out", str(tmp_path / "fig"))
    assert r.exit_code == 0
    assert (tmp_path / "fig" / "fig10.png").stat().st_size > 10_000
    assert "hinabench suite run" in (tmp_path / "fig" / "fig10.txt").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nmodels = ["qwen3-30b-a3b"]\ntokens = [1]\nbogus = 1\n')
    r = CliRunner().invoke(cli, ["suite", "run", str(bad)])
    assert r.exit_code == 2 and "unknown [sweep] keys ['bogus']" in r.output


def test_every_shipped_suite_loads():
    from pathlib import Path
    from hinabench.models import get_model
    from hinabench.harness.suite import load_suite
    suites = sorted((Path(__file__).resolve().parent.parent / "suites").glob("*.toml"))
    assert len(suites) >= 4
    for path in suites:
        sweep, name = load_suite(str(path))
        assert name == path.stem and sweep.tokens, path
        for m in sweep.models:
            get_model(m)  # raises for an unknown model


class NoBf16(Backend):
    name = "test:nobf16"
    description = "an int8-only backend"
    dtypes = ("int8",)

    def run(self, group):
        raise AssertionError("never called")


def test_dtype_a_backend_lacks_is_a_user_error(monkeypatch):
    registry._load()
    monkeypatch.setitem(registry.REGISTRY, NoBf16.name, NoBf16)
    r = CliRunner().invoke(cli, ["ffn", "--backends", "test:nobf16", "--dtype", "bf16"])
    assert r.exit_code == 2 and "backend test:nobf16 has no bf16 path (it has: int8)" in r.output


def test_interrupted_sweep_keeps_measured_points_and_resumes(monkeypatch, tmp_results):
    import hinabench.harness.runner as runner
    real = runner.run_cohort
    calls = []

    def interrupt_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_cohort", interrupt_second)
    r = CliRunner().invoke(cli, ["ffn", *FAST, "--tokens", "1,2", "--out", str(tmp_results)])
    assert r.exit_code == 130
    assert "interrupted: 1 row(s) kept" in r.output and "--resume" in r.output
    assert [row["tokens_per_expert"] for row in read_rows(tmp_results)] == ["1"]
    monkeypatch.setattr(runner, "run_cohort", real)
    assert invoke("ffn", *FAST, "--tokens", "1,2", "--out", str(tmp_results), "--resume").exit_code == 0
    assert [row["tokens_per_expert"] for row in read_rows(tmp_results)] == ["1", "2"]


def test_numa_policies_and_perf_columns(tmp_results):
    r = invoke("ffn", *FAST, "--tokens", "1", "--numa", "default,interleave,bind:0", "--perf",
               "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = {row["numa"]: row for row in read_rows(tmp_results)}
    assert set(rows) == {"default", "interleave", "bind:0"}
    assert rows["default"]["remote_fraction_model"] == "" and "first touch" in rows["default"]["remote_fraction_basis"]
    assert rows["interleave"]["placement_model_valid"] == "True"
    assert rows["interleave"]["work_partition"] == "row-split"
    n_nodes = len(json.loads(invoke("sysinfo", "--json").output)["numa_nodes"])
    if n_nodes == 1:
        assert float(rows["interleave"]["remote_fraction_model"]) == 0.0
        assert float(rows["bind:0"]["remote_fraction_model"]) == 0.0
    for row in rows.values():
        assert row["status"] == "ok"
        assert row["perf_status"] in ("ok", "unsupported", "error")
        if row["perf_status"] != "ok":                 # never a made-up number
            assert row["perf_reason"] and row["remote_fraction_perf"] == "" and row["dram_remote_loads"] == ""


def test_a_thp_policy_is_its_own_point_with_its_page_share(tmp_results):
    """--numa default,default+thp: two points, each row saying how much of what the kernel reads sits
    on transparent huge pages: none without +thp in THP's `madvise` mode (the development machines'),
    all of it under +thp, or a note that says why not."""
    r = invoke("ffn", *FAST, "--tokens", "1", "--numa", "default,default+thp", "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = {row["numa"]: row for row in read_rows(tmp_results)}
    assert set(rows) == {"default", "default+thp"}
    assert all(row["status"] == "ok" for row in rows.values())
    thp = json.loads(invoke("sysinfo", "--json").output)["thp"]
    if thp == "madvise":
        assert float(rows["default"]["weight_huge_fraction"]) == 0.0
    got = float(rows["default+thp"]["weight_huge_fraction"])
    # where the kernel had no free 2 MiB pages (a long test session's page cache) it falls back to
    # 4 KiB pages, and the row says so rather than pass for a huge-page measurement
    assert got > 0.9 or "huge pages: " in rows["default+thp"]["note"], rows["default+thp"]
    if thp == "never":
        assert got == 0.0


def test_unknown_numa_policy_is_a_user_error():
    r = CliRunner().invoke(cli, ["ffn", "--numa", "spread"])
    assert r.exit_code == 2 and "unknown NUMA policy 'spread'" in r.output
    r = CliRunner().invoke(cli, ["ffn", "--numa", "bind:7"])
    assert r.exit_code == 2 and "no memory node 7" in r.output


def test_fig15_from_numa_rows(tmp_path):
    out = tmp_path / "n.csv"
    assert invoke("ffn", *FAST, "--tokens", "1", "--numa", "interleave", "--perf", "--out", str(out)).exit_code == 0
    r = invoke("figure", "fig15", str(out), "--out", str(tmp_path))
    assert r.exit_code == 0 and (tmp_path / "fig15.png").stat().st_size > 10_000
    plain = tmp_path / "plain.csv"
    assert invoke("ffn", *FAST, "--tokens", "1", "--out", str(plain)).exit_code == 0
    r = CliRunner().invoke(cli, ["figure", "fig15", str(plain)])
    assert r.exit_code == 2 and "--numa interleave" in r.output


class Hungry(Backend):
    name = "test:hungry"
    description = "prepare() would take 1 TiB more (a peer's copies of the weights, estimated)"

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated, problem_bytes_allocated=0):
        return 1 << 40

    def run(self, group):
        raise AssertionError("never called: it does not fit beside the others")


def test_a_backend_that_does_not_fit_beside_the_others_is_a_row_and_the_rest_run(monkeypatch, tmp_results):
    """Every peer's process holds its own copies of the weights through the interleaved rounds: the ones
    that do not fit beside the earlier ones become `unavailable` rows that say so; the others run."""
    registry._load()
    monkeypatch.setitem(registry.REGISTRY, Hungry.name, Hungry)
    r = invoke("ffn", *FAST[:2], "--backends", "torch,test:hungry", "--tokens", "1", "--rounds", "1",
               "--min-time", "0.01", "--threads", "1", "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    rows = {row["backend"]: row for row in read_rows(tmp_results)}
    assert rows["torch"]["status"] == "ok"
    assert rows["test:hungry"]["status"] == "unavailable"
    assert "not run beside the other 1 backend(s)" in rows["test:hungry"]["reason"]
    assert "run it with fewer --backends" in rows["test:hungry"]["reason"]


class HungryInt8(Hungry):
    name = "test:hungry-int8"
    description = "an int8-only peer that would take 1 TiB"
    dtypes = ("int8",)


def test_a_backend_with_no_path_for_the_dtype_takes_no_memory(monkeypatch):
    """In a sweep over dtypes a peer of another dtype is an unsupported row: its copies are not counted
    against the backends of this point (an fp8 sweep once lost its fp8 peers to the int8 peers' estimate)."""
    from hinabench.harness.runner import RunConfig, run_point
    from hinabench.problems import FFNProblem
    registry._load()
    for cls in (Hungry, HungryInt8):
        monkeypatch.setitem(registry.REGISTRY, cls.name, cls)
    p = FFNProblem.custom(128, 128, tokens=1)
    rows = {r["backend"]: r for r in run_point(p, ["torch", HungryInt8.name], 1,
                                               RunConfig(rounds=1, min_time=0.001, warmup=0))}
    assert rows["torch"]["status"] == "ok"
    assert rows[HungryInt8.name]["status"] == "unsupported" and "no bf16 path" in rows[HungryInt8.name]["reason"]


class Turns(Backend):
    """The torch loop on bf16, int8 or fp8 points (dequantized), recording whose turn each round was."""
    name = "test:turns"
    description = "records the order of its turns"
    dtypes = ("bf16", "int8", "fp8")
    turns: list = []

    def prepare(self, data):
        self.data = data

    def run(self, group):
        return self.data.scheme_reference(self.scheme_for(self.data.problem), group) \
            if self.data.problem.dtype != "bf16" else self.data.reference(group)

    def measure_round(self, rnd, plan, counter=None):
        Turns.turns.append((rnd, self.data.problem.dtype))
        return super().measure_round(rnd, plan, counter)


def test_dtypes_of_a_point_take_turns_in_the_same_rounds(monkeypatch, tmp_results):
    """A sweep's bf16 / int8 / fp8 points of one model and T are one cohort: every round visits each of
    them (so their ratio carries no drift of the host between them), the rows share a `cohort` id, and
    the next T is another cohort; --dtypes-apart measures each point on its own (no cohort)."""
    registry._load()
    monkeypatch.setitem(registry.REGISTRY, Turns.name, Turns)
    Turns.turns = []
    args = ["--model", "qwen3-30b-a3b", "--backends", Turns.name, "--rounds", "3", "--min-time", "0.001",
            "--repeats", "1", "--warmup", "0", "--threads", "1", "--dtype", "bf16,int8,fp8", "--tokens", "1,2"]
    r = invoke("ffn", *args, "--out", str(tmp_results))
    assert r.exit_code == 0, r.output
    # T = 1's three dtypes through rounds 0, 1, 2, then T = 2's
    assert [rnd for rnd, _ in Turns.turns] == [0, 0, 0, 1, 1, 1, 2, 2, 2] * 2
    assert {dt for rnd, dt in Turns.turns[:3]} == {"bf16", "int8", "fp8"}
    rows = read_rows(tmp_results)
    assert all(row["status"] == "ok" for row in rows), [row["reason"] for row in rows]
    by_t = {}
    for row in rows:
        by_t.setdefault(row["tokens_per_expert"], set()).add(row["cohort"])
    assert len(by_t["1"]) == 1 and len(by_t["2"]) == 1 and by_t["1"] != by_t["2"] and "" not in by_t["1"]
    Turns.turns = []
    apart = tmp_results.with_name("apart.csv")
    assert invoke("ffn", *args, "--dtypes-apart", "--out", str(apart)).exit_code == 0
    assert [rnd for rnd, _ in Turns.turns] == [0, 1, 2] * 6
    assert {row["cohort"] for row in read_rows(apart)} == {""}


def test_turn_efficiency_pairs_each_turn_with_its_own_probes():
    """A kernel at the memory system's rate in every turn, on a host whose bandwidth halves between
    turns: `efficiency` (one roofline from the best probe over the median of all samples) reads 0.67,
    `efficiency_turn` (each turn's roofline over its own median) reads 1.0; a wrong row gets neither."""
    from hinabench.harness.runner import _roofline, _turn_efficiency
    turns = [([0.020] * 3, [50.0, 49.0], []), ([0.040] * 3, [25.0, 24.0], []), ([0.020] * 3, [50.0, 50.0], [])]
    row = {"weight_bytes": 1e9, "flops": 1.0, "median_ms": 20.0, "read_gbps": 50.0, "status": "ok"}
    _roofline(row, 1000.0, "unit")
    _turn_efficiency(row, turns)
    assert row["efficiency"] == pytest.approx(1.0) and row["efficiency_turn"] == pytest.approx(1.0)
    row = {"weight_bytes": 1e9, "flops": 1.0, "median_ms": 30.0, "read_gbps": 50.0, "status": "ok"}
    _roofline(row, 1000.0, "unit")
    _turn_efficiency(row, turns[:2] + [([0.040] * 3, [25.0, 25.0], [])])
    assert row["efficiency"] == pytest.approx(20 / 30) and row["efficiency_turn"] == pytest.approx(1.0)
    # compute-bound turns use the turn's own peak
    row = {"weight_bytes": 1.0, "flops": 2e9, "median_ms": 20.0, "read_gbps": 50.0, "status": "ok"}
    _turn_efficiency(row, [([0.020], [50.0], [100.0]), ([0.040], [50.0], [50.0])])
    assert row["efficiency_turn"] == pytest.approx(1.0)
    wrong = {"weight_bytes": 1e9, "flops": 1.0, "status": "wrong"}
    _turn_efficiency(wrong, turns)
    assert "efficiency_turn" not in wrong
