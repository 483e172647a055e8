"""Results of several machines: folders, globs and Parquet datasets read as one set of rows, rows of
different machines kept apart, re-runs resolved by the stated rule (latest per point per machine)."""
import json

import pytest

from hinabench.errors import UserError
from hinabench.harness.store import load_frame, read_rows, results_files

from clihelp import invoke
from synthetic import row, two_machines, write_csv, write_parquet


def test_two_machine_folders_read_side_by_side(tmp_path):
    a, b = two_machines(tmp_path / "results")
    rows = read_rows([a, b])
    assert len(rows) == 11                   # the same points on two machines never supersede each other
    assert {r["machine"] for r in rows} == {"amd-f25m1-2t-1n", "intel-spr-112t-2n"}
    assert len(read_rows([tmp_path / "results"])) == 11      # the results/ tree itself
    assert len(read_rows([str(tmp_path / "results" / "*")])) == 11   # a glob of machine folders
    assert len(read_rows([str(tmp_path / "results" / "**" / "*.csv")])) == 11


def test_show_puts_machines_in_a_column_and_names_each_fingerprint(tmp_path):
    a, b = two_machines(tmp_path / "results")
    md = invoke("show", str(a), str(b), "--tokens", "1", "--backends", "torch", "--format", "markdown")
    assert md.exit_code == 0, md.output
    lines = md.output.splitlines()
    assert lines[0].startswith("**") and lines[2].startswith("| machine | backend | T | thr |")
    assert any(ln.startswith("| amd-f25m1-2t-1n | torch | 1 |") for ln in lines)
    assert any(ln.startswith("| intel-spr-112t-2n | torch | 1 |") for ln in lines)
    machine = next(ln for ln in lines if ln.startswith("Machine: "))
    assert "amd-f25m1-2t-1n: AMD EPYC" in machine and "intel-spr-112t-2n: Intel Xeon" in machine
    table = invoke("show", str(tmp_path / "results" / "*"))      # statuses and reasons stay visible
    assert table.exit_code == 0
    for text in ("unsupported", "timeout", "wrong", "no AMX tiles", "did not answer within 600 s"):
        assert text in table.output, text
    one = invoke("show", str(a), "--format", "markdown")       # one machine: no machine column
    assert one.output.splitlines()[2].startswith("| backend | T | thr |")


def test_a_parquet_dataset_is_a_folder_of_parquet_files(tmp_path):
    ds = tmp_path / "dataset"
    write_parquet(ds / "machine=amd-f25m1-2t-1n" / "part-0.parquet",
                  [row("torch", t, machine=None) for t in (1, 2)])
    write_parquet(ds / "machine=intel-spr-112t-2n" / "part-0.parquet",
                  [row("torch", t, machine=None) for t in (1, 2)])
    (ds / "_SUCCESS").write_text("")
    df = load_frame([ds])
    assert len(df) == 4 and sorted(set(df["machine"])) == ["amd-f25m1-2t-1n", "intel-spr-112t-2n"]
    mixed = read_rows([ds, write_csv(tmp_path / "more" / "r.csv", [row("torch", 4)])])
    assert len(mixed) == 5
    js = json.loads(invoke("show", str(ds), "--format", "json").output)
    assert len(js) == 4


def test_the_latest_run_of_a_point_wins_by_timestamp_and_all_keeps_every_run(tmp_path):
    # The newer run sits in the file read first: the timestamp decides, not the reading order.
    new = write_csv(tmp_path / "r" / "a-new.csv", [row("torch", 1, median_ms=55.0, run_id="run-2",
                                                       timestamp="2026-02-01T00:00:00+0000")])
    old = write_csv(tmp_path / "r" / "b-old.csv", [row("torch", 1, median_ms=70.0, run_id="run-1",
                                                       timestamp="2026-01-01T00:00:00+0000")])
    notes = []
    rows = read_rows([tmp_path / "r"], notes)
    assert [(r["run_id"], r["median_ms"]) for r in rows] == [("run-2", 55.0)]
    assert any("1 row(s) superseded" in n for n in notes)
    assert len(read_rows([new, old], latest=False)) == 2
    shown = invoke("show", str(tmp_path / "r"), "--all", "--format", "markdown")
    assert shown.exit_code == 0
    lines = shown.output.splitlines()
    assert lines[2].rstrip().endswith("| run |")
    assert sum(1 for ln in lines if "| run-1 |" in ln) == 1 and sum(1 for ln in lines if "| run-2 |" in ln) == 1
    # the same timestamp (two runs within a second): the one read later wins, as in one file
    same = write_csv(tmp_path / "s" / "r.csv", [row("torch", 1, median_ms=1.0, run_id="x"),
                                                row("torch", 1, median_ms=2.0, run_id="y")])
    assert [r["run_id"] for r in read_rows([same])] == ["y"]


def test_damage_inside_folders_is_named_not_fatal(tmp_path):
    a, _ = two_machines(tmp_path / "results")
    data = (a / "ffn.csv").read_bytes()
    (a / "torn.csv").write_bytes(data[: len(data) - 30])      # a torn last row
    (a / "notes.csv").write_text("a,b\n1,2\n")                # not a results file
    shown = invoke("show", str(tmp_path / "results"))
    assert shown.exit_code == 0, shown.output
    assert "torn.csv line" in shown.output and "not a whole row" in shown.output
    assert "notes.csv is not a results file" in shown.output and "skipped" in shown.output
    named = invoke("show", str(a / "notes.csv"))               # named on its own: an error, as before
    assert named.exit_code == 2 and "is not a results file" in named.output


def test_empty_folders_and_globs_are_errors_that_name_them(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no results files .* under"):
        results_files([tmp_path / "empty"])
    r = invoke("show", str(tmp_path / "nothing-*"))
    assert r.exit_code == 2 and "no results files match" in r.output
    r = invoke("show", str(tmp_path / "empty"))
    assert r.exit_code == 2 and "no results files" in r.output


def test_targets_judge_one_machine_at_a_time(tmp_path):
    a, b = two_machines(tmp_path / "results")
    r = invoke("targets", str(a), str(b), "--backend", "hina:amx")
    assert r.exit_code == 2 and "targets judges one machine's rows" in r.output
    assert invoke("targets", str(b), "--backend", "hina:amx").exit_code == 0
