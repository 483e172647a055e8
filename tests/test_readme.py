"""The README's test command is the one CI runs; both set-up commands are in the README."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    ci = [l for l in (ROOT / ".ci" / "run").read_text().splitlines() if l.startswith("python3 -m venv")]
    assert len(ci) == 1
    readme = (ROOT / "README.md").read_text()
    assert ci[0] in readme


def test_readme_main_job_command_pins_torch_first():
    readme = (ROOT / "README.md").read_text()
    main = [l for l in readme.splitlines() if "hinabench ffn --model mixtral-8x7b" in l and l.startswith("python3")]
    assert main, "the README must keep the one-line main-job command"
    assert main[0].index("torch==2.13.0") < main[0].index("pip install .")
