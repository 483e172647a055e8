"""`hinabench fleet run | status`: a suite on every host of a Ray cluster (hinabench/fleet.py)."""
from __future__ import annotations

import json
import sys
import time

import click

from . import command_line, names

_ADDRESS = click.option("--ray-address", "address", envvar="RAY_ADDRESS", metavar="HOST:PORT",
                        help="The Ray cluster's head (as `ray start --head` printed it; default: $RAY_ADDRESS).")
_RESULTS = click.option("--results", default="results", show_default=True, type=click.Path(file_okay=False),
                        help="Results folder: rows go to RESULTS/<machine-id>/<suite>-<host>.csv.")


@click.group()
def fleet():
    """Run a suite on every host of a Ray cluster, one benchmark per host at a time.

    Each host is a Ray node started with the resource hinabench-host:<name> (`ray start ... --resources "$(hinabench fleet resources)"`)
    and its own installed hinabench."""


@fleet.command("run")
@click.argument("suite_file", metavar="SUITE", type=click.Path(dir_okay=False))
@_ADDRESS
@click.option("--hosts", default=None, help="Host names (or node-id prefixes), comma-separated (default: every alive host).")
@_RESULTS
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Skip the points each host's results file already has (--no-resume: measure all again, a new run).")
def fleet_run(suite_file, address, hosts, results, resume):
    """Run SUITE (a suites/*.toml file) on the cluster's hosts; rows are stored as they stream back.

    Exit status: 0 every host finished; 1 a host was lost or failed (its streamed rows are stored:
    run the same command again to measure only what is missing); 2 a usage error; 130 interrupted."""
    from ..errors import UserError
    from ..fleet import fleet_run as run
    if not address:
        raise UserError("give --ray-address HOST:PORT (or set RAY_ADDRESS)")
    rc = run(suite_file, address, names(hosts), results, resume, command_line(),
             echo=lambda s: click.echo(s, err=True))
    sys.exit(rc)


@fleet.command("status")
@_ADDRESS
@_RESULTS
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
def fleet_status(address, results, as_json):
    """The cluster's hosts (node id, resource, idle/busy, machine id and fingerprint) and the
    progress of the fleet runs recorded under RESULTS. Without --ray-address: the runs only."""
    from ..fleet import fleet_status as status
    st = status(address, results)
    if as_json:
        click.echo(json.dumps(st, indent=2, default=str))
        return
    if address:
        click.echo(f"hosts of the Ray cluster at {address}: {len(st['hosts'])} fleet host(s), "
                   f"{len(st['other_nodes'])} other node(s)")
        for h in st["hosts"]:
            click.echo(f"  {h['name']}  node {h['node_id'][:12]}  {h['resource']}  {h['state']}  "
                       f"cpus {h['cpus']:g}  machine {h['machine'] or '?'}  hinabench {h['hinabench'] or '?'}")
            if h["fingerprint"]:
                click.echo(f"      {h['fingerprint']}  ({h['source']})")
            elif h["source"]:
                click.echo(f"      fingerprint unknown: {h['source']}")
        for n in st["other_nodes"]:
            click.echo(f"  (not a fleet host) node {str(n['node_id'])[:12]}  resources {', '.join(n['resources'])}")
        if not st["hosts"]:
            from ..fleet import start_args
            click.echo(f"  start each host's node with `ray start --address HEAD:PORT {start_args('NAME')}`")
    runs = st["runs"]
    click.echo(f"fleet runs under {results}: {len(runs) or 'none'}")
    for r in runs:
        click.echo(f"  {r.get('suite')}: {r.get('state')}  run {r.get('run_id')}  started {r.get('started')}  "
                   f"updated {r.get('updated')} ({_ago(r.get('updated'))})  driver "
                   f"{(r.get('driver') or {}).get('hostname')}:{(r.get('driver') or {}).get('pid')}")
        for n, h in (r.get("hosts") or {}).items():
            rows, todo, got = h.get("rows"), h.get("todo"), h.get("measured") or 0
            prog = f"{rows - todo + got}/{rows} rows" if rows is not None else "?/? rows"
            line = f"      {n}: {h.get('state')}  {prog} ({got} by this run)  machine {h.get('machine') or '?'}"
            if h.get("last"):
                line += f"  last: {h['last']}"
            if h.get("reason"):
                line += f"  ({h['reason']})"
            click.echo(line)


@fleet.command("resources")
@click.option("--name", default=None, help="The host's name (default: this machine's hostname).")
def resources(name):
    """The custom resource that makes this machine's Ray node a fleet host, as JSON for
    `ray start --resources "$(hinabench fleet resources)"`."""
    from ..fleet import host_resources
    click.echo(host_resources(name))


def _ago(stamp) -> str:
    try:
        t = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z"))
    except (TypeError, ValueError):
        return "?"
    return f"{max(0, time.time() - t):.0f} s ago"
