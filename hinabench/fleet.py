"""Fleet runs: one suite on every host of a Ray cluster, one benchmark per host at a time.

A *host* is a Ray node started with the custom resource `hinabench-host:<name>` = 1 (its name: any
word, its hostname by default in the README's recipe). A fleet run starts one actor per host that
asks for that resource (and all the node's CPUs), so two benchmarks never share a machine: a second
fleet run, or `fleet status`'s probe, waits until the host is free. The actor runs on the host with
the host's own installed hinabench (Ray imports this module there; no code is shipped) and measures
the suite point by point with hinabench's own runner, so every row's roofline comes from probes in
that host's process. It yields each stored row as soon as its point is done; the driver appends it
with `ResultStore` (one fsynced row per write) to `results/<machine-id>/<suite>-<host>.csv`, where the
machine id is the row's own. A host that dies loses nothing already streamed, and running the same
command again resumes: the driver reads the done points from each host's file and the host skips them.

The driver keeps a small JSON status file per suite (`results/.fleet/<suite>.json`) that
`hinabench fleet status` reads for progress beside the cluster's hosts and their fingerprints.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

from . import __version__
from .errors import UserError

RESOURCE_PREFIX = "hinabench-host:"
STATUS_DIR = ".fleet"
# Seconds a host waits after each row it streams: the tests' stand-in for a slow host, so a node can
# be killed between two rows deterministically. Never set it for real measurements.
HOST_DELAY_ENV = "HINABENCH_FLEET_HOST_DELAY"
INSTALL_HINT = "pip install 'hinabench[fleet]' (ray==2.60.0), on the driver and on every host"


def _ray():
    try:
        import ray
    except ImportError:
        raise UserError(f"fleet runs need Ray: {INSTALL_HINT}") from None
    return ray


def resource_name(host: str) -> str:
    return RESOURCE_PREFIX + host


def host_resources(host: str | None = None) -> str:
    """The custom resource (JSON) that makes a Ray node the fleet host `host` (default: its hostname)."""
    return json.dumps({resource_name(host or socket.gethostname()): 1})


def start_args(host: str | None = None) -> str:
    """The `ray start` option that makes a node a fleet host."""
    return f"--resources='{host_resources(host)}'"


# ---------------------------------------------------------------- the cluster's hosts

@dataclasses.dataclass
class Host:
    name: str           # the resource's suffix: stable across restarts of the node
    node_id: str        # Ray's id of the node (new each time the node starts)
    alive: bool
    cpus: float
    ip: str = ""

    @property
    def resource(self) -> str:
        return resource_name(self.name)

    @property
    def short_id(self) -> str:
        return self.node_id[:12]


def hosts_of(nodes: list[dict]) -> tuple[list[Host], list[dict]]:
    """The fleet hosts among `ray.nodes()` (of several nodes of one name, the alive one) and the
    other alive nodes (no `hinabench-host:` resource: never given a benchmark)."""
    by_name: dict[str, Host] = {}
    others = []
    for n in nodes:
        res = n.get("Resources") or {}
        names = [k[len(RESOURCE_PREFIX):] for k in res if k.startswith(RESOURCE_PREFIX)]
        if not names:
            if n.get("Alive"):
                others.append(n)
            continue
        for name in names:
            h = Host(name=name, node_id=n.get("NodeID", ""), alive=bool(n.get("Alive")),
                     cpus=float(res.get("CPU", 0)), ip=n.get("NodeManagerAddress", ""))
            old = by_name.get(name)
            if old is None or (h.alive and not old.alive):
                by_name[name] = h
    return sorted(by_name.values(), key=lambda h: h.name), others


def select_hosts(hosts: list[Host], wanted: list[str] | None) -> list[Host]:
    """The hosts named (by name or node-id prefix), or every alive host."""
    alive = [h for h in hosts if h.alive]
    if not wanted:
        if not alive:
            raise UserError("no fleet hosts in this Ray cluster: start each node with "
                            f"`ray start --address HEAD:PORT {start_args('NAME')}`")
        return alive
    out = []
    for w in wanted:
        match = [h for h in hosts if h.name == w] or [h for h in hosts if len(w) >= 6 and h.node_id.startswith(w)]
        if not match:
            known = ", ".join(h.name for h in hosts) or "none"
            raise UserError(f"no fleet host '{w}' in this Ray cluster (hosts: {known})")
        h = match[0]
        if not h.alive:
            raise UserError(f"fleet host '{w}' is not alive (its node {h.short_id} died); start it again "
                            f"with the same resource {h.resource}")
        if h not in out:
            out.append(h)
    return out


def connect(address: str):
    """ray.init against an existing cluster; a wrong address is one line, not minutes of retries."""
    ray = _ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return ray
    if address and address not in ("auto", "local"):
        m = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address.strip())
        if not m:
            raise UserError(f"--ray-address must be HOST:PORT (got '{address}')")
        if not address.startswith("ray://"):
            try:
                socket.create_connection((m.group(1), int(m.group(2))), timeout=5).close()
            except OSError as e:
                raise UserError(f"no Ray cluster answers at {address} ({e.strerror or e})") from None
    import logging
    try:
        ray.init(address=address, namespace="hinabench", logging_level=logging.ERROR, log_to_driver=False)
    except Exception as e:   # ConnectionError, a version mismatch, ...
        raise UserError(f"could not connect to the Ray cluster at {address}: {str(e).splitlines()[0]}") from None
    return ray


# ---------------------------------------------------------------- on the host

def host_identity() -> dict:
    """What a host is: its machine id and fingerprint, its hinabench."""
    from .machine.sysinfo import fingerprint, machine_id, summary
    fp = fingerprint()
    return {"machine": machine_id(fp), "fingerprint": summary(fp), "hostname": socket.gethostname(),
            "pid": os.getpid(), "hinabench": __version__, "git_rev": fp["git_rev"],
            "python": sys.executable}


def host_rows(sweep_fields: dict, skip, command: str, run_id: str):
    """On the host: {"plan": ...} first, then {"row": row} for each row as its point is measured
    (points whose every row is in `skip` are not measured), {"note": text} for what to say."""
    from .harness import runner
    from .harness.suite import Sweep, measure_groups, plan_sweep, run_config, wait_quiet
    from .harness.runner import LOAD_WARNING_CPUS
    sweep = Sweep(**sweep_fields)
    points, names = plan_sweep(sweep)
    skip = {tuple(k) for k in skip}
    keys = [(pt, [pt.key(n) for n in names]) for pt in points]
    todo = [pt for pt, ks in keys if any(k not in skip for k in ks)]
    missing = sum(1 for _, ks in keys for k in ks if k not in skip)
    yield {"plan": {"rows": len(points) * len(names), "todo": missing, "points": len(todo)}}
    cfg = run_config(sweep, command, run_id)
    delay = float(os.environ.get(HOST_DELAY_ENV) or 0)
    notes: list[str] = []   # a point's dtypes side by side, as `suite run` measures them
    groups = measure_groups(todo, names, sweep, skip, notes.append)
    yield from ({"note": n} for n in notes)
    for group in groups:
        if sweep.wait_quiet > 0:
            waited, load = wait_quiet(sweep.wait_quiet)
            if load > LOAD_WARNING_CPUS:
                yield {"note": f"{group[0]}: still {load:.2f} other CPUs busy after waiting {waited:.0f} s; "
                               f"measuring anyway (its rows will say load_warning)"}
        for row in runner.run_cohort(group, names, cfg, skip=skip):
            yield {"row": row}
            if delay:
                time.sleep(delay)


class HostRunner:
    """The actor on a host (made remote with the host's resource by the driver)."""

    def identity(self) -> dict:
        return host_identity()

    def run(self, sweep_fields: dict, skip, command: str, run_id: str):
        yield from host_rows(sweep_fields, skip, command, run_id)


# ---------------------------------------------------------------- the driver

def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def results_path(results: Path, machine: str, suite: str, host: str) -> Path:
    """Where a host's rows of a suite go: per machine id (as every results file), per host within it
    (hosts of one kind of machine share a machine id but each measures the whole suite)."""
    return Path(results) / safe_name(machine) / f"{safe_name(suite)}-{safe_name(host)}.csv"


def status_path(results: Path, suite: str) -> Path:
    return Path(results) / STATUS_DIR / f"{safe_name(suite)}.json"


class FleetRun:
    def __init__(self, sweep, name: str, suite_file: str, hosts: list[Host], results: Path,
                 resume: bool, command: str, address: str, echo=print):
        self.sweep, self.name, self.hosts = sweep, name, hosts
        self.results, self.resume, self.command, self.echo = Path(results), resume, command, echo
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + f"-fleet-{os.getpid()}"
        self.lock = threading.Lock()
        self.actors: dict[str, object] = {}
        self.stopping = False
        self.status = {
            "suite": name, "suite_file": suite_file, "run_id": self.run_id,
            "command": command, "ray_address": address,
            "driver": {"hostname": socket.gethostname(), "pid": os.getpid()},
            "started": _now(), "updated": _now(), "state": "running",
            "hosts": {h.name: {"node_id": h.node_id, "resource": h.resource, "state": "starting",
                               "machine": None, "fingerprint": None, "file": None, "rows": None,
                               "todo": None, "measured": 0, "reason": None, "last": None}
                      for h in hosts},
        }
        self.spath = status_path(self.results, name)

    # the status file: rewritten whole (atomically) on each change
    def _set(self, host: str | None = None, **kw) -> None:
        with self.lock:
            (self.status["hosts"][host] if host else self.status).update(kw)
            self.status["updated"] = _now()
            self.spath.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.spath.with_suffix(f".json.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.status, indent=1, default=str))
            os.replace(tmp, self.spath)

    def _drive(self, h: Host) -> None:
        ray = _ray()
        from ray import exceptions as rex

        from .harness.store import ResultStore
        st = self.status["hosts"][h.name]
        try:
            Runner = ray.remote(HostRunner)
            actor = Runner.options(resources={h.resource: 1}, num_cpus=h.cpus, max_restarts=0,
                                   max_task_retries=0).remote()
            self.actors[h.name] = actor
            ref = actor.identity.remote()
            if h.name in self.busy:
                self._set(h.name, state="waiting", reason=f"another benchmark or probe holds {h.resource}")
                self.echo(f"hinabench: {h.name}: waiting: {st['reason']}")
            waited = 0
            while not ray.wait([ref], timeout=60)[0]:
                waited += 60
                self._set(h.name, state="waiting", reason=f"the host has not started after {waited} s: another "
                                                          f"benchmark holds {h.resource} or its CPUs are taken")
                self.echo(f"hinabench: {h.name}: still waiting: {st['reason']}")
            ident = ray.get(ref)
            machine = ident["machine"]
            path = results_path(self.results, machine, self.name, h.name)
            stores = {machine: ResultStore(path, op=self.sweep.op)}
            stores[machine].open_for_append()
            if stores[machine].repaired:
                self.echo(f"hinabench: note: {stores[machine].repaired}")
            skip = stores[machine].done_keys() if self.resume else set()
            self._set(h.name, state="running", reason=None, machine=machine, fingerprint=ident["fingerprint"],
                      hinabench=f"{ident['hinabench']}@{ident['git_rev']}", file=str(path))
            fields = dataclasses.asdict(self.sweep)
            gen = actor.run.options(num_returns="streaming").remote(fields, sorted(skip), self.command,
                                                                     self.run_id)
            for item in gen:
                msg = ray.get(item)
                if "plan" in msg:
                    p = msg["plan"]
                    self._set(h.name, rows=p["rows"], todo=p["todo"])
                    if p["todo"] == 0:
                        self.echo(f"hinabench: {h.name}: nothing to do: all {p['rows']} row(s) are in {path}")
                elif "note" in msg:
                    self.echo(f"hinabench: {h.name}: note: {msg['note']}")
                elif "row" in msg:
                    row = msg["row"]
                    m = str(row.get("machine") or machine)
                    if m not in stores:     # the row says which machine measured it
                        stores[m] = ResultStore(results_path(self.results, m, self.name, h.name), op=self.sweep.op)
                        stores[m].open_for_append()
                    stores[m].append(row)
                    self._set(h.name, measured=st["measured"] + 1,
                              last=f"{row.get('backend')} {_point_words(row)}: {row.get('status')}")
            self._set(h.name, state="done")
        except UserError as e:
            self._set(h.name, state="failed", reason=str(e))
        except rex.RayTaskError as e:          # the host raised: its own words
            cause = getattr(e, "cause", None)
            why = str(cause) if cause is not None else str(e).strip().splitlines()[-1]
            self._set(h.name, state="failed", reason=f"{type(cause).__name__ if cause else 'error'} on the host: "
                                                    f"{why.splitlines()[0] if why else ''}")
        except rex.RayError as e:              # the actor or its node died (or we stopped it)
            if self.stopping:
                self._set(h.name, state="interrupted")
                return
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            why = next((ln for ln in lines if "because" in ln), None) or \
                next((ln for ln in lines if "died" in ln.lower()), lines[0] if lines else "")
            self._set(h.name, state="lost", reason=f"{type(e).__name__}: {why}")
        except Exception as e:                 # a driver-side bug: the host's row stream stops here
            self._set(h.name, state="failed", reason=f"{type(e).__name__}: {e}")
        finally:
            a = self.actors.pop(h.name, None)
            if a is not None:
                try:
                    ray.kill(a)                # frees the host's resource at once
                except Exception:
                    pass

    def run(self) -> int:
        avail = _ray().available_resources()
        self.busy = {h.name for h in self.hosts if avail.get(h.resource, 0) < 1}
        self._set()
        self.echo(f"hinabench fleet {self.name}: {len(self.hosts)} host(s) "
                  f"({', '.join(h.name for h in self.hosts)}) -> {self.results}/<machine>/{self.name}-<host>.csv; "
                  f"status in {self.spath}")
        threads = [threading.Thread(target=self._drive, args=(h,), daemon=True, name=f"fleet-{h.name}")
                   for h in self.hosts]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)
        except KeyboardInterrupt:
            self.stopping = True
            ray = _ray()
            for a in list(self.actors.values()):
                try:
                    ray.kill(a)
                except Exception:
                    pass
            kept = sum(s["measured"] for s in self.status["hosts"].values())
            for n, s in self.status["hosts"].items():
                if s["state"] not in ("done", "lost", "failed"):
                    self._set(n, state="interrupted")
            self._set(state="interrupted")
            self.echo(f"hinabench: interrupted: {kept} row(s) kept by this run; run the same command again "
                      f"to continue")
            return 130
        hosts = self.status["hosts"]
        bad = {n: s for n, s in hosts.items() if s["state"] != "done"}
        self._set(state="finished" if not bad else "incomplete")
        for n, s in hosts.items():
            before = (s["rows"] - s["todo"]) if s["rows"] is not None else None
            line = f"  {n} (node {s['node_id'][:12]}, machine {s['machine'] or '?'}): {s['state']}: " \
                   f"{s['measured']} row(s) measured"
            if before is not None:
                line += f", {before} already stored, of {s['rows']}"
            if s["file"]:
                line += f" -> {s['file']}"
            if s["reason"]:
                line += f" ({s['reason']})"
            self.echo(line)
        if bad:
            which = ", ".join(f"{n}: {s['state']}" for n, s in bad.items())
            self.echo(f"hinabench: {len(bad)} of {len(hosts)} host(s) did not finish ({which}); every row they "
                      f"streamed is stored: run the same command again to measure only what is missing")
            return 1
        return 0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _point_words(row: dict) -> str:
    from .problems import KINDS
    kind = KINDS.get(str(row.get("op") or "ffn"))
    cols = list(kind.key_columns if kind else ()) + ["threads", "numa"]
    return " ".join(f"{c}={row.get(c)}" for c in cols if row.get(c) not in (None, ""))


def fleet_run(suite_file: str, address: str, hosts: list[str] | None, results: str, resume: bool,
              command: str, echo=print) -> int:
    from .harness.suite import load_suite
    sweep, name = load_suite(suite_file)
    sweep.problems()                    # an unknown model or shape fails here, before any host is asked
    ray = connect(address)
    all_hosts, _ = hosts_of(ray.nodes())
    chosen = select_hosts(all_hosts, hosts)
    return FleetRun(sweep, name, suite_file, chosen, Path(results), resume, command, address, echo).run()


# ---------------------------------------------------------------- status

def read_runs(results: str) -> list[dict]:
    """The fleet runs' status files under `results`, newest first; a driver gone from this machine
    while its run said running is reported as such."""
    runs = []
    for p in sorted((Path(results) / STATUS_DIR).glob("*.json")):
        try:
            st = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        st["status_file"] = str(p)
        d = st.get("driver") or {}
        if st.get("state") == "running" and d.get("hostname") == socket.gethostname() \
                and not _pid_alive(int(d.get("pid") or 0)):
            st["state"] = "stopped (its driver is gone)"
        runs.append(st)
    return sorted(runs, key=lambda s: s.get("updated", ""), reverse=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fleet_status(address: str | None, results: str, probe_timeout: float = 60.0) -> dict:
    """Hosts (from the cluster, when an address is given) and the fleet runs' progress. An idle host
    is asked for its fingerprint by a tiny task that holds its resource (so it never runs beside a
    benchmark); a busy host's fingerprint comes from the run that holds it."""
    runs = read_runs(results)
    out: dict = {"ray_address": address, "hosts": [], "other_nodes": [], "runs": runs}
    if not address:
        return out
    ray = connect(address)
    hosts, others = hosts_of(ray.nodes())
    avail = ray.available_resources()
    known = {}
    for r in reversed(runs):                      # the newest run's word wins
        for n, s in (r.get("hosts") or {}).items():
            if s.get("fingerprint"):
                known[n] = s
    probe = ray.remote(num_cpus=0, max_retries=0)(host_identity)
    pending = {}
    for h in hosts:
        e = {"name": h.name, "node_id": h.node_id, "resource": h.resource, "alive": h.alive, "cpus": h.cpus,
             "ip": h.ip, "state": "dead" if not h.alive else ("busy" if avail.get(h.resource, 0) < 1 else "idle"),
             "machine": None, "fingerprint": None, "hinabench": None, "source": None}
        if h.alive and e["state"] == "idle":
            pending[h.name] = probe.options(resources={h.resource: 1}).remote()
        elif h.name in known:
            k = known[h.name]
            e.update(machine=k.get("machine"), fingerprint=k.get("fingerprint"), hinabench=k.get("hinabench"),
                     source="the fleet run's status file")
        out["hosts"].append(e)
    if pending:
        refs = list(pending.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=probe_timeout)
        for e in out["hosts"]:
            ref = pending.get(e["name"])
            if ref is None:
                continue
            if ref not in ready:
                e["source"] = f"no answer within {probe_timeout:.0f} s"
                ray.cancel(ref, force=True)
                continue
            try:
                ident = ray.get(ref)
                e.update(machine=ident["machine"], fingerprint=ident["fingerprint"],
                         hinabench=f"{ident['hinabench']}@{ident['git_rev']}", source="asked now")
            except Exception as ex:
                e["source"] = f"the probe failed: {str(ex).strip().splitlines()[-1]}"
    out["other_nodes"] = [{"node_id": n.get("NodeID"), "ip": n.get("NodeManagerAddress"),
                           "resources": sorted(k for k in (n.get("Resources") or {}) if not k.startswith("node:"))}
                          for n in others]
    return out
