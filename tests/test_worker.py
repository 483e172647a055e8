"""The worker protocol and crash isolation, for real: workers in the main environment (the `selftest`
peer of hinabench/worker/protocol.py) that compute, kill themselves with SIGILL or SIGKILL, hang, or raise."""
import json
import os
import subprocess
import sys

import pytest
import torch

from hinabench import backends as registry
from hinabench.backends.base import Unsupported
from hinabench.worker.proxy import WorkerBackend, WorkerFailed
from hinabench.harness.measure import RoundPlan
from hinabench.problems import FFNProblem, materialize
from hinabench.problems import rel_err
from hinabench.harness.runner import RunConfig, run_point
from hinabench.worker.protocol import decode_tensor, encode_tensor

PROBLEM = FFNProblem.custom(hidden_size=64, intermediate_size=32, tokens_per_expert=3, active_experts=2,
                            routed_experts=4, seed=7)


def selftest(variant, timeout=60.0, prepare_timeout=60.0):
    return type(f"SelfTest_{variant}", (WorkerBackend,), {
        "name": f"selftest:{variant}", "description": f"selftest worker ({variant})", "module": "selftest",
        "variant": variant, "timeout": timeout, "prepare_timeout": prepare_timeout,
        "packages": ("torch",)})


@pytest.fixture
def registered():
    """Register selftest backends for one test (after the real ones are loaded), then remove them."""
    registry.names()
    added = []

    def add(cls):
        registry.REGISTRY[cls.name] = cls
        added.append(cls.name)
        return cls.name
    yield add
    for n in added:
        registry.REGISTRY.pop(n, None)


@pytest.fixture(scope="module")
def data():
    return materialize(PROBLEM, rotate=False)


def test_tensor_round_trip_is_exact():
    t = torch.randn(5, 7).to(torch.bfloat16)
    msg = json.loads(json.dumps(encode_tensor(t)))
    assert msg["shape"] == [5, 7] and torch.equal(decode_tensor(msg), t)


def test_protocol_by_hand():
    """The raw protocol: hello, an error reply, a bad version, close."""
    p = subprocess.Popen([sys.executable, "-m", "hinabench.worker"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    msgs = [{"v": 1, "op": "hello", "packages": ["torch"]}, {"v": 1, "op": "round", "rnd": 0, "plan": {}},
            {"v": 2, "op": "hello"}, {"v": 1, "op": "close"}]
    out, err = p.communicate("".join(json.dumps(m) + "\n" for m in msgs), timeout=60)
    replies = [json.loads(line) for line in out.splitlines()]
    assert p.returncode == 0, err
    assert replies[0]["ok"] and replies[0]["versions"]["torch"] == torch.__version__
    assert replies[1] == {"ok": False, "status": "failed", "reason": "'round' before a successful 'prepare'"}
    assert not replies[2]["ok"] and "protocol version 2" in replies[2]["reason"]
    assert replies[3] == {"ok": True}


def test_worker_validates_and_measures(data):
    b = selftest("naive")(1)
    try:
        b.prepare(data)
        out = b.run(0)
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (PROBLEM.T, PROBLEM.H)
        assert rel_err(out, data.reference(0)) < 1e-2      # same weights, rebuilt from the seed
        res = b.measure_round(0, RoundPlan(rounds=1, warmup=1, repeats=3))
        assert len(res.samples) == 3 and all(s > 0 for s in res.samples)
        assert len(res.probes) == 2 and res.probes[0][0] > 0
        v = b.versions()
        assert v["torch"] == torch.__version__ and "OMP_NUM_THREADS" in v["env_vars"]
        pid = b.proc.pid
    finally:
        b.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sigill_is_unsupported(data):
    b = selftest("sigill")(1)
    with pytest.raises(Unsupported, match=r"worker died with SIGILL \(illegal instruction\): selftest:sigill"):
        b.prepare(data)
    b.close()


def test_cpp_abort_not_supported_is_unsupported_with_the_message(data):
    b = selftest("abort")(1)
    with pytest.raises(Unsupported, match='aborted with "selftest kernel not supported"'):
        b.prepare(data)
    b.close()


def test_peer_unsupported_reply(data):
    b = selftest("unsupported")(1)
    with pytest.raises(Unsupported, match="needs an ISA this CPU lacks"):
        b.prepare(data)
    b.close()


def test_hang_is_a_timeout_and_the_group_is_killed(data):
    b = selftest("hang", prepare_timeout=3)(1)
    with pytest.raises(WorkerFailed) as e:
        b.prepare(data)
    assert e.value.status == "timeout" and "did not answer 'prepare' within 3 s" in e.value.reason
    assert b.proc.poll() is not None
    b.close()


def test_sigkill_is_failed_with_the_signal(data):
    b = selftest("sigkill")(1)
    with pytest.raises(WorkerFailed) as e:
        b.prepare(data)
    assert e.value.status == "failed" and "SIGKILL" in e.value.reason
    b.close()


def test_sweep_goes_on_past_crashes_hangs_and_errors(registered, data):
    """One point through the runner: each crash is a row with its status, and the others are timed."""
    names = [registered(selftest(v, timeout=4)) for v in
             ("naive", "sigill-run", "raise", "wrong", "hang-round")]
    cfg = RunConfig(rounds=2, warmup=1, min_time=0.01, max_time=1.0, command="test")
    rows = {r["backend"]: r for r in run_point(PROBLEM, names + ["torch"], 1, cfg, data=data)}
    ok = rows["selftest:naive"]
    assert ok["status"] == "ok" and ok["rel_err"] < 1e-2 and ok["median_ms"] > 0 and ok["pct_bw"] > 0
    assert ok["versions"]["env"] == "(harness interpreter)"
    assert rows["torch"]["status"] == "ok"
    r = rows["selftest:sigill-run"]
    assert r["status"] == "unsupported" and "SIGILL (illegal instruction)" in r["reason"], r["reason"]
    assert rows["selftest:raise"]["status"] == "failed"
    assert "RuntimeError: selftest: the peer raised in prepare" in rows["selftest:raise"]["reason"]
    assert rows["selftest:wrong"]["status"] == "wrong" and rows["selftest:wrong"]["median_ms"] > 0
    # the adapter's own diagnosis (note()) rides on the reason of a wrong row, after the harness's
    assert rows["selftest:wrong"]["reason"].endswith("; selftest: doubled on purpose")
    assert "selftest: doubled" not in str(rows["selftest:naive"].get("reason"))
    # a wrong output is timed but shows no rates: its bytes and flops were not the problem's
    assert rows["selftest:wrong"]["efficiency"] is None and rows["selftest:wrong"]["gbps"] is None
    hang = rows["selftest:hang-round"]
    assert hang["status"] == "timeout" and "did not answer 'round'" in hang["reason"], hang["reason"]
    assert "process group was killed" in hang["reason"]


def test_a_worker_that_dies_or_prints_garbage_mid_protocol_is_a_failed_row(registered, data, tmp_path):
    """Fault injection: the protocol's pipe gets garbage, or the worker exits, in the timed loop; each
    is a `failed` row that says what happened, and every other row of the point is stored intact."""
    from hinabench.harness.store import ResultStore
    names = [registered(selftest(v, timeout=8)) for v in ("garbage-round", "exit-round", "naive")]
    cfg = RunConfig(rounds=2, warmup=1, min_time=0.01, max_time=1.0, command="test")
    store = ResultStore(tmp_path / "r.csv")
    rows = {r["backend"]: r for r in run_point(PROBLEM, names, 1, cfg, data=data, store=store)}
    g = rows["selftest:garbage-round"]
    assert g["status"] == "failed" and "not JSON" in g["reason"] and "garbage" in g["reason"], g["reason"]
    x = rows["selftest:exit-round"]
    assert x["status"] == "failed" and "exited with code 3 during 'round'" in x["reason"], x["reason"]
    assert rows["selftest:naive"]["status"] == "ok"
    stored = {r["backend"]: r for r in store.rows()}
    assert set(stored) == set(names) and stored["selftest:naive"]["status"] == "ok"
