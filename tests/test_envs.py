"""`hinabench env create/list/remove` with a bare recipe (no downloads), and a worker inside that env
reaching the harness's own hinabench through the env's `hinabench-path` link."""
import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from hinabench import envs
from hinabench.cli import cli
from hinabench.cli.env import env as env_group


@pytest.fixture
def envroot(tmp_path, monkeypatch):
    monkeypatch.setenv("HINABENCH_ENVS", str(tmp_path / "envs"))
    return tmp_path / "envs"


def invoke(*args):
    return CliRunner().invoke(env_group, list(args), catch_exceptions=False)


def test_recipes_are_complete():
    r = envs.recipes()
    assert {"vllm", "kt", "ipex", "llamacpp", "empty"} <= set(r)
    for name, rec in r.items():
        assert isinstance(rec["steps"], list) and rec["description"], name
        assert all(isinstance(s, list) for s in rec["steps"]), name


def test_missing_env_says_how_to_create_it(envroot):
    ok, why = envs.usable("vllm")
    assert not ok and why == "environment 'vllm' does not exist: run `hinabench env create vllm`"


def test_create_list_remove(envroot):
    r = invoke("create", "bare", "--recipe", "empty")
    assert r.exit_code == 0, r.output
    assert "created 'bare'" in r.output
    rec = json.loads((envroot / "bare" / envs.RECORD).read_text())
    assert rec["recipe"]["name"] == "empty" and rec["seconds"] > 0 and rec["size_bytes"] > 0
    assert rec["created"] and "pip" in rec["pip_freeze"] and rec["check"]["ok"]
    link = envs.link_dir(envroot / "bare") / "hinabench"
    assert link.parent.parent == envroot / "bare" / "hinabench-path"
    assert link.is_symlink() and link.resolve() == envs.package_dir()
    assert envs.usable("bare") == (True, "")

    listed = json.loads(invoke("list", "--json").output)
    assert [e["name"] for e in listed] == ["bare"]
    assert listed[0]["complete"] and listed[0]["size_bytes"] > 0 and listed[0]["python"]
    assert "bare" in invoke("list").output

    again = CliRunner().invoke(cli, ["env", "create", "bare", "--recipe", "empty"])
    assert again.exit_code == 2 and "already exists" in again.output

    assert invoke("remove", "bare").exit_code == 0
    assert not (envroot / "bare").exists()
    gone = CliRunner().invoke(cli, ["env", "remove", "bare"])
    assert gone.exit_code == 2 and "no environment 'bare'" in gone.output


def test_failed_step_removes_the_env_and_keeps_the_log(envroot):
    # no pip in the venv: the pip step fails at once (and needs no network)
    bad = {"name": "bad", "pip": False, "steps": [["--no-index", "no-such-package"]], "packages": []}
    with pytest.raises(Exception, match="creating 'broken' failed"):
        envs.create("broken", bad, echo=lambda *_: None)
    assert not (envroot / "broken").exists()
    assert (envroot / "broken.failed.log").exists()


def test_failed_check_keeps_the_env_with_the_reason(envroot):
    rcp = {"name": "sigill", "pip": False, "steps": [], "packages": [],
           "check": "import os, signal; os.kill(os.getpid(), signal.SIGILL)"}
    rec = envs.create("ill", rcp, echo=lambda *_: None)
    assert rec["check"] == {"code": rcp["check"], "ok": False,
                            "reason": "died with SIGILL (illegal instruction: built for an ISA this CPU lacks)"}
    assert envs.usable("ill")[0]


def test_hinabench_imports_through_the_env_link(envroot):
    """The env's own interpreter (no torch there) finds the harness's package and its _C via the link."""
    envs.create("bare", {"name": "nopip", "pip": False, "steps": []}, echo=lambda *_: None)
    from hinabench.worker.proxy import _native_dir
    env = dict(os.environ, PYTHONPATH=str(envs.link_dir(envroot / "bare")))
    if _native_dir():
        env["HINABENCH_NATIVE_DIR"] = _native_dir()
    code = ("import hinabench, os; from hinabench.worker.protocol import _extend_package_path; _extend_package_path(); "
            "from hinabench import _C; print(os.path.realpath(hinabench.__file__))")
    out = subprocess.run([str(envs.python("bare")), "-c", code], env=env, capture_output=True, text=True,
                         cwd=str(envroot))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(envs.package_dir() / "__init__.py")


def test_every_recipe_pins_every_package_it_installs():
    for name, rcp in envs.recipes().items():
        for step in rcp["steps"]:
            args = [a for a in step if not a.startswith("-")]
            # the operand of --no-binary is a package name, not a requirement
            operands = {step[i + 1] for i, a in enumerate(step[:-1]) if a in ("--no-binary", "--only-binary")}
            for req in args:
                if req in operands:
                    continue
                assert "==" in req, f"recipe {name}: '{req}' is not pinned"


def test_two_harnesses_sharing_an_env_keep_their_own_links(envroot, tmp_path, monkeypatch):
    """Two checkouts (or installs) using one env at once: each worker must import its own harness."""
    env = envroot / "shared"
    env.mkdir(parents=True)
    a, b = tmp_path / "a" / "hinabench", tmp_path / "b" / "hinabench"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    monkeypatch.setattr(envs, "package_dir", lambda: a)
    da = envs.link_hinabench(env)
    monkeypatch.setattr(envs, "package_dir", lambda: b)
    db = envs.link_hinabench(env)
    assert da != db
    assert (da / "hinabench").resolve() == a and (db / "hinabench").resolve() == b   # neither re-pointed
