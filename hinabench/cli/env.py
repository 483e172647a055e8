"""`hinabench env`: create, list and remove the peers' virtual environments (attached by cli.py)."""
from __future__ import annotations

import json

import click


def _gib(n) -> str:
    return "" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


@click.group()
def env():
    """The peers' virtual environments (IPEX, vLLM-CPU, kt-kernel, llama.cpp, zentorch)."""


@env.command("create")
@click.argument("name")
@click.option("--recipe", default=None, help="Recipe to use (default: the one named NAME).")
@click.option("--force", is_flag=True, help="Replace an existing environment of that name.")
def create_cmd(name, recipe, force):
    """Create environment NAME from its recipe and record it (hinabench-env.json)."""
    from .. import envs
    rec = envs.create(name, recipe, force=force, echo=click.echo)
    pk = ", ".join(f"{k} {v}" for k, v in rec["packages"].items()) or "no packages"
    click.echo(f"created '{name}' at {rec['path']} in {rec['seconds']:.0f} s: {pk}; "
               f"{_gib(rec['size_bytes'])} on disk")


@env.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_cmd(as_json):
    """The environments: path, python, key package versions, size, created when and in how long."""
    from .. import envs
    rows = envs.listing()
    if as_json:
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    if not rows:
        click.echo(f"no environments in {envs.root()}; known recipes: {', '.join(envs.recipes())}")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"hinabench environments ({envs.root()})")
    for c in ("name", "python", "packages", "check", "size", "created", "took", "path"):
        t.add_column(c)
    for r in rows:
        if not r["complete"]:
            what = ("[yellow]being created[/yellow]" if (envs.root() / f"{r['name']}.creating.log").exists()
                    else "[red]incomplete: remove and create again[/red]")
            t.add_row(r["name"], "", what, "", _gib(r.get("size_bytes")), "", "", r["path"])
            continue
        pk = ", ".join(f"{k} {v}" for k, v in (r.get("packages") or {}).items())
        c = r.get("check") or {}
        check = "ok" if c.get("ok", True) else f"[red]failed: {c.get('reason')}[/red]"
        t.add_row(r["name"], r.get("python") or "", pk, check, _gib(r.get("size_bytes")), r.get("created") or "",
                  f"{r.get('seconds') or 0:.0f} s", r["path"])
    Console().print(t)


@env.command("check")
@click.argument("name")
def check_cmd(name):
    """Run NAME's recipe check again (e.g. after the recipe changed) and record the outcome."""
    from .. import envs
    c = envs.recheck(name)
    click.echo(f"{name}: check {'passed' if c['ok'] else 'failed: ' + c['reason']}  ({c['code']})")


@env.command("remove")
@click.argument("name")
def remove_cmd(name):
    """Delete environment NAME."""
    from .. import envs
    click.echo(f"removed {envs.remove(name)}")


@env.command("recipes")
def recipes_cmd():
    """The recipes `env create` knows."""
    from .. import envs
    for n, r in envs.recipes().items():
        click.echo(f"{n:10s} {r.get('description', '')}")
