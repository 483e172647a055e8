"""`hinabench fleet`: a suite on every host of a Ray cluster.

The cluster is real: `ray.cluster_utils.Cluster` starts a head (no CPUs) and two worker nodes on this
machine, each a fleet host (`hinabench-host:a`, `hinabench-host:b`, one CPU each) with its own machine
id ($HINABENCH_MACHINE_ID in the node's environment), bound to 127.0.0.1 only. The CLI runs as a
separate driver process, as a user would run it. Node b is a slow host ($HINABENCH_FLEET_HOST_DELAY)
so that it can be killed between its two rows deterministically.
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hinabench.errors import UserError
from hinabench.fleet import Host, hosts_of, results_path, select_hosts, start_args

CLI = [sys.executable, "-c", "from hinabench.cli import main; main()"]   # run with cwd outside the checkout
SUITE = """name = "tiny"
[sweep]
models = ["qwen3-30b-a3b"]
tokens = [1, 2]
backends = ["torch"]
threads = [1]
rounds = 1
min_time = 0.01
warmup = 1
"""
# Ray on this machine: loopback only (it would otherwise pick the interface facing the default route),
# no usage reporting.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


# ---------------------------------------------------------------- without a cluster

def test_machine_id_override(monkeypatch):
    from hinabench.machine import sysinfo
    monkeypatch.setenv("HINABENCH_MACHINE_ID", "rack3-node7")
    assert sysinfo.machine_id() == "rack3-node7"
    monkeypatch.setenv("HINABENCH_MACHINE_ID", "../etc")
    with pytest.raises(UserError, match="not a machine id"):
        sysinfo.machine_id()


def test_hosts_are_the_nodes_with_a_host_resource():
    nodes = [
        {"NodeID": "head0", "Alive": True, "Resources": {"memory": 1.0}},
        {"NodeID": "dead1", "Alive": False, "Resources": {"CPU": 2.0, "hinabench-host:b": 1.0}},
        {"NodeID": "aaaa11", "Alive": True, "Resources": {"CPU": 4.0, "hinabench-host:a": 1.0}},
        {"NodeID": "bbbb22", "Alive": True, "Resources": {"CPU": 2.0, "hinabench-host:b": 1.0}},
        {"NodeID": "cccc33", "Alive": False, "Resources": {"CPU": 2.0, "hinabench-host:c": 1.0}},
    ]
    hosts, others = hosts_of(nodes)
    assert [(h.name, h.node_id, h.alive, h.cpus) for h in hosts] == [
        ("a", "aaaa11", True, 4.0), ("b", "bbbb22", True, 2.0), ("c", "cccc33", False, 2.0)]
    assert [n["NodeID"] for n in others] == ["head0"]
    assert [h.name for h in select_hosts(hosts, None)] == ["a", "b"]          # every alive host
    assert [h.name for h in select_hosts(hosts, ["b"])] == ["b"]
    with pytest.raises(UserError, match="no fleet host 'z'.*hosts: a, b, c"):
        select_hosts(hosts, ["z"])
    with pytest.raises(UserError, match="'c' is not alive"):
        select_hosts(hosts, ["c"])
    with pytest.raises(UserError, match="no fleet hosts in this Ray cluster"):
        select_hosts([Host("a", "x", False, 1)], None)


def test_results_sit_per_machine_and_per_host(tmp_path):
    assert results_path(tmp_path, "amd-f25m1-2t-1n", "fig10", "node 3") == \
        tmp_path / "amd-f25m1-2t-1n" / "fig10-node_3.csv"
    assert start_args("a") == """--resources='{"hinabench-host:a": 1}'"""
    from clihelp import invoke
    r = invoke("fleet", "resources", "--name", "a")
    assert r.exit_code == 0 and json.loads(r.output) == {"hinabench-host:a": 1}


def test_fleet_run_needs_an_address(tmp_path):
    (tmp_path / "s.toml").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run(CLI + ["fleet", "run", "s.toml"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "--ray-address" in r.stderr
    r = subprocess.run(CLI + ["fleet", "run", "s.toml", "--ray-address", "127.0.0.1:9"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2 and "no Ray cluster answers at 127.0.0.1:9" in r.stderr, r.stderr


# ---------------------------------------------------------------- a real local cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'hinabench[fleet]'")
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    from ray._private import ray_constants
    ray_constants.ENABLE_RAY_CLUSTER = False      # read at import: the same as the variable above
    from ray.cluster_utils import Cluster
    c = None
    here, work = os.getcwd(), tmp_path_factory.mktemp("hosts")
    os.chdir(work)                                # the nodes' (and their workers') working folder
    # the node's death is noticed in about a second (Ray's default: tens of seconds)
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
            "health_check_initial_delay_ms": 0}
    try:
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1", "_system_config": fast})
        c.workdir = work
        nodes = {"a": add_host(c, "a"), "b": add_host(c, "b", slow=True)}
        c.wait_for_nodes()
    except Exception as e:
        if c is not None:
            c.shutdown()
        pytest.skip(f"Ray could not start a local cluster here: {type(e).__name__}: {e}")
    finally:
        os.chdir(here)
    c.hosts = nodes
    yield c
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def add_host(c, name, slow=False):
    env = {"HINABENCH_MACHINE_ID": f"fleet-{name}"}
    if slow:
        env["HINABENCH_FLEET_HOST_DELAY"] = "120"     # after each row: killed long before the next
    here = os.getcwd()
    os.chdir(c.workdir)
    try:
        return c.add_node(num_cpus=1, resources={f"hinabench-host:{name}": 1}, node_ip_address="127.0.0.1",
                          env_vars=env)
    finally:
        os.chdir(here)


_DRIVERS: list = []   # fleet drivers started with popen=True, stopped after their test whatever its outcome


@pytest.fixture(autouse=True)
def _stop_drivers():
    """A test that fails while its driver runs must not leave that run holding a host for the next test
    (seen: one failure made the next test's host never free)."""
    yield
    while _DRIVERS:
        p = _DRIVERS.pop()
        if p.poll() is None:
            p.send_signal(signal.SIGINT)          # the driver's own stop: its hosts freed
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()


def fleet(c, tmp_path, *args, popen=False):
    cmd = CLI + ["fleet", *args, "--ray-address", c.address, "--results", str(tmp_path / "results")]
    env = {**os.environ, **RAY_ENV}
    if popen:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
        _DRIVERS.append(p)
        return p
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def data_lines(path):
    """Rows stored in a results file so far (0 before it exists: the store's writability check creates
    and removes it before the first row, so it can vanish between an exists() and a read)."""
    try:
        return max(0, path.read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def suite(tmp_path):
    (tmp_path / "tiny.toml").write_text(SUITE)
    return "tiny.toml"


def test_fleet_run_on_named_hosts_stores_rows_per_machine_and_resumes(cluster, tmp_path):
    r = fleet(cluster, tmp_path, "run", suite(tmp_path), "--hosts", "a")
    assert r.returncode == 0, r.stderr
    a = tmp_path / "results" / "fleet-a" / "tiny-a.csv"
    got = rows(a)
    assert sorted(int(x["tokens_per_expert"]) for x in got) == [1, 2]
    assert {x["status"] for x in got} == {"ok"} and {x["machine"] for x in got} == {"fleet-a"}
    assert all(x["command"].startswith("hinabench fleet run tiny.toml") and x["run_id"] for x in got)
    assert all(float(x["read_gbps"]) > 0 for x in got)           # the host's own same-process probe
    assert not (tmp_path / "results" / "fleet-b").exists()       # b was not named
    st = json.loads((tmp_path / "results" / ".fleet" / "tiny.json").read_text())
    assert st["state"] == "finished" and st["hosts"]["a"]["measured"] == 2 and list(st["hosts"]) == ["a"]
    # the same command again: nothing to measure, nothing appended
    r = fleet(cluster, tmp_path, "run", suite(tmp_path), "--hosts", "a")
    assert r.returncode == 0, r.stderr
    assert "a: nothing to do" in r.stderr and len(rows(a)) == 2


def test_fleet_interrupted_then_status_lists_hosts_fingerprints_and_progress(cluster, tmp_path):
    res = tmp_path / "results"
    b = res / "fleet-b" / "tiny-b.csv"
    p = fleet(cluster, tmp_path, "run", suite(tmp_path), "--hosts", "b", popen=True)
    t0 = time.monotonic()
    def counted():   # the driver's own count (its status file), written just after the row: wait for both
        try:
            st = json.loads((res / ".fleet" / "tiny.json").read_text())
            return st["hosts"]["b"]["measured"]
        except (OSError, ValueError, KeyError):
            return 0
    while data_lines(b) < 1 or counted() < 1:
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 240, "host b never streamed a row"
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)                 # Ctrl-C on the driver: the host is stopped and freed
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted: 1 row(s) kept" in err and [int(x["tokens_per_expert"]) for x in rows(b)] == [1]

    r = fleet(cluster, tmp_path, "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    hosts = {h["name"]: h for h in st["hosts"]}
    assert set(hosts) == {"a", "b"}
    for name, h in hosts.items():                # both idle again: each asked for its fingerprint
        assert h["alive"] and h["state"] == "idle" and h["resource"] == f"hinabench-host:{name}"
        assert h["machine"] == f"fleet-{name}" and "ISA" in h["fingerprint"] and h["source"] == "asked now"
        assert h["node_id"] == cluster.hosts[name].node_id
    assert len(st["other_nodes"]) == 1           # the head: no hinabench-host resource
    (run,) = st["runs"]
    assert run["state"] == "interrupted" and list(run["hosts"]) == ["b"]
    assert run["hosts"]["b"]["state"] == "interrupted" and run["hosts"]["b"]["measured"] == 1
    r = fleet(cluster, tmp_path, "status")       # the same, in words
    assert r.returncode == 0 and "tiny: interrupted" in r.stdout and "b: interrupted  1/2 rows" in r.stdout
    r = fleet(cluster, tmp_path, "run", suite(tmp_path), "--hosts", "x")
    assert r.returncode == 2 and "no fleet host 'x'" in r.stderr and "hosts: a, b" in r.stderr


def test_fleet_node_killed_mid_suite_keeps_its_rows_and_a_rerun_resumes(cluster, tmp_path):
    res = tmp_path / "results"
    a, b = res / "fleet-a" / "tiny-a.csv", res / "fleet-b" / "tiny-b.csv"
    p = fleet(cluster, tmp_path, "run", suite(tmp_path), popen=True)
    t0 = time.monotonic()
    while data_lines(b) < 1:                     # b's first row streamed back and stored
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 240, "host b never streamed a row"
        time.sleep(0.05)
    # while b measures, its resource is held: status does not probe it, and shows the run's progress
    s = fleet(cluster, tmp_path, "status", "--json")
    assert s.returncode == 0, s.stderr
    st = json.loads(s.stdout)
    hb = next(h for h in st["hosts"] if h["name"] == "b")
    assert hb["state"] == "busy" and hb["source"] == "the fleet run's status file" and hb["machine"] == "fleet-b"
    run = st["runs"][0]
    assert run["state"] == "running" and run["hosts"]["b"]["measured"] == 1 and run["hosts"]["b"]["rows"] == 2

    cluster.remove_node(cluster.hosts.pop("b"), allow_graceful=False)      # the host dies mid-suite
    out, err = p.communicate(timeout=240)
    assert p.returncode == 1, err
    assert "b (node" in err and "lost" in err and "run the same command again" in err
    kept = rows(b)
    assert [int(x["tokens_per_expert"]) for x in kept] == [1] and kept[0]["machine"] == "fleet-b"
    assert b.read_bytes().endswith(b"\n")                                    # whole rows only
    assert sorted(int(x["tokens_per_expert"]) for x in rows(a)) == [1, 2]   # a was not disturbed
    st = json.loads((res / ".fleet" / "tiny.json").read_text())
    assert st["state"] == "incomplete" and st["hosts"]["b"]["state"] == "lost"
    assert st["hosts"]["a"]["state"] == "done"

    # the host comes back (a new node, the same resource and machine): only the missing point is measured
    cluster.hosts["b"] = add_host(cluster, "b")
    cluster.wait_for_nodes()
    r = fleet(cluster, tmp_path, "run", suite(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "a: nothing to do" in r.stderr
    final = rows(b)
    assert sorted(int(x["tokens_per_expert"]) for x in final) == [1, 2]     # each point once
    assert final[0]["run_id"] != final[1]["run_id"]
    st = json.loads((res / ".fleet" / "tiny.json").read_text())
    assert st["state"] == "finished" and st["hosts"]["b"]["measured"] == 1 and st["hosts"]["a"]["measured"] == 0
    assert st["hosts"]["b"]["node_id"] == cluster.hosts["b"].node_id
