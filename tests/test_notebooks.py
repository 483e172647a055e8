"""The notebooks run: their code cells, in order, from the repository root and from notebooks/."""
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cwd", [ROOT, ROOT / "notebooks"])
@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs(nb, cwd, monkeypatch):
    monkeypatch.chdir(cwd)
    cells = json.loads(nb.read_text())["cells"]
    env: dict = {}
    for i, c in enumerate(cells):
        if c["cell_type"] == "code":
            exec(compile("".join(c["source"]), f"{nb.name}[{i}]", "exec"), env)
    assert os.getcwd() == str(cwd)
