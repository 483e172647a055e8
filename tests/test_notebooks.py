"""The notebooks are executed as Jupyter executes them (nbclient, an ipykernel of this interpreter),
started from the repository root and from notebooks/; a cell that raises fails the test."""
import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra")
pytest.importorskip("ipykernel", reason="ipykernel is in the test extra")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "hinabench-tests"


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernelspec for this very interpreter (the one with hinabench installed), found first: a
    machine-wide `python3` kernel may be another Python."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "hinabench tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def execute(path: Path, cwd: Path, kernel_name: str):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return nb


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("cwd", [ROOT, ROOT / "notebooks"], ids=["from-root", "from-notebooks"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, cwd, kernel):
    nb = execute(path, cwd, kernel)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)     # every code cell ran
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    if path.name == "explore_results.ipynb":                           # it read the stored rows
        text = "".join(o.get("text", "") for o in code[0]["outputs"] if o.get("output_type") == "stream")
        machines = sum(1 for d in (ROOT / "results").iterdir() if d.is_dir())   # one folder per machine
        assert f"rows of {machines} machine(s)" in text and str(ROOT / "results") in text


def test_a_broken_notebook_fails(tmp_path, kernel):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from hinabench.harness.store import load_frame"),
                nbformat.v4.new_code_cell("load_frame(['no-such-results.csv'])")]
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="no results file at no-such-results.csv"):
        execute(path, tmp_path, kernel)
