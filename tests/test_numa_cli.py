"""`hinabench numa plan|check` through click's CliRunner, on the `numa` group itself."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hinabench import numa as nm
from hinabench.cli.numa import DTYPE_CHOICES, numa


def run(*args):
    return CliRunner().invoke(numa, list(args))


def test_plan_json_reproduces_figure_7b():
    r = run("plan", "--shape", "14336x6144", "--nodes", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (d["T_x"], d["T_y"]) == (2, 4096)
    assert d["segments"]["0"] == [[0, 0, 2048], [0, 4096, 6144], [1, 2048, 4096]]
    assert d["remote_fraction_model"]["hina"] == 0.0


@pytest.mark.parametrize("K, T_x", [(4096, 1), (14336, 2), (2048, 2), (768, 16)])
def test_plan_paper_periods(K, T_x):
    d = json.loads(run("plan", "--shape", f"4096x{K}", "--nodes", "2", "--json").output)
    assert (d["T_x"], d["T_y"]) == (T_x, 4096)


def test_plan_table_int8_2m():
    r = run("plan", "--shape", "64x4096", "--nodes", "4", "--dtype", "int8", "--page", "2m")
    assert r.exit_code == 0, r.output
    assert "T_x = 2048" in r.output and "T_y = 8388608" in r.output   # 2^23 / gcd(4096, 2^23)
    assert "row-split 0.750" in r.output     # 256 KiB: all in one 2 MiB page of node 0


@pytest.mark.parametrize("args", [
    ["plan", "--shape", "4096x0", "--nodes", "2"],
    ["plan", "--shape", "4096x-5"],
    ["plan", "--shape", "4096"],
    ["plan", "--shape", "axb"],
    ["plan", "--shape", "32x32", "--nodes", "0"],
    ["plan", "--shape", "32x32", "--phase", "3"],
    ["check", "--shape", "0x32"],
    ["check", "--shape", "32x32", "--virtual-nodes", "0"],
])
def test_bad_input_is_one_line_no_traceback(args):
    r = run(*args)
    assert r.exit_code != 0
    assert not isinstance(r.exception, (ValueError, OSError, ZeroDivisionError))
    lines = [l for l in r.output.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), r.output
    assert "Traceback" not in r.output


def test_check_json_with_virtual_nodes():
    r = run("check", "--shape", "256x6144", "--virtual-nodes", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["mismatches"] == 0 and d["pages_checked"] == 256 * 6144 * 2 // 4096
    assert d["placement_model_valid"]
    v = d["virtual"]
    assert v["tiles_exactly_once"] and v["remote_fraction_model_hina"] == 0.0
    assert (v["T_x"], v["T_y"]) == (2, 4096)


def test_check_table():
    r = run("check", "--shape", "64x2048")
    assert r.exit_code == 0, r.output
    assert "mismatches vs model" in r.output and "placement_model_valid" in r.output


@pytest.mark.parametrize("nodes", [2, 3])
def test_check_runs_the_kernel_with_virtual_nodes(nodes):
    r = run("check", "--shape", "256x6144", "--virtual-nodes", str(nodes), "--json")
    assert r.exit_code == 0, r.output
    k = json.loads(r.output)["virtual"]["kernel"]
    assert k["bit_identical"]                        # partitioned == plain, to the bit
    assert k["remote_bytes"] == 0 and k["rows_bad"] == 0
    assert k["bytes_read"] == k["weight_bytes"]      # every weight byte read once across the nodes
    assert k["rel_err"] < 2e-2
    r = run("check", "--shape", "256x6144", "--virtual-nodes", str(nodes))
    assert r.exit_code == 0 and "bit-identical True" in r.output


def test_dtype_choices_are_the_dtype_tables_and_resolve():
    from hinabench import dtypes
    whole = {n for n, d in dtypes.DTYPES.items() if d.element_bytes == int(d.element_bytes)}
    assert whole <= set(DTYPE_CHOICES)
    assert all(nm.element_size(d) >= 1 for d in DTYPE_CHOICES)


def test_numa_cli_and_package_import_without_torch():
    """`hinabench` starts up without torch: the numa group and the package must not pull it in."""
    code = "import sys, hinabench.cli.numa, hinabench.numa; assert 'torch' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
