"""The harness side of a peer: a Backend whose kernel runs in a worker process (hinabench/worker/protocol.py).

The worker lives in the peer's own virtual environment (envs.py), in its own process group, and
speaks JSON lines over pipes. What the harness sees:
  - the env is missing            -> availability() is False: a row `unavailable` with the command
  - the worker reports an error   -> Unsupported (row `unsupported`) or WorkerFailed("failed", ...)
  - the worker dies by SIGILL     -> Unsupported: "worker died with SIGILL (illegal instruction): ..."
  - it dies by another signal     -> WorkerFailed("failed", signal + the tail of its stderr)
  - it does not answer in time    -> its process group is killed: WorkerFailed("timeout", ...)
and the sweep goes on with the other backends.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from typing import ClassVar

import torch

from ..harness.measure import RoundPlan, RoundResult
from ..problems import ProblemData
from ..backends.base import Backend, Unsupported

_LIVE: "weakref.WeakSet[WorkerBackend]" = weakref.WeakSet()


class WorkerFailed(Exception):
    """A worker-backed backend could not produce a result: `status` is a row status
    ("failed" or "timeout"), `reason` the row's reason."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _native_dir() -> str | None:
    """Where the harness's compiled _C lives, if not beside the sources (an editable install)."""
    import hinabench
    from hinabench import _C
    pkg = os.path.realpath(os.path.dirname(hinabench.__file__))
    native = os.path.realpath(os.path.dirname(_C.__file__))
    return None if native == pkg else native


WORKER_PROCESS_BYTES = 512 << 20


class WorkerBackend(Backend):
    env_name: ClassVar[str | None] = None     # None: the harness's own interpreter (tests)
    module: ClassVar[str] = ""                # hinabench.backends.<module>.make_peer runs in the worker
    variant: ClassVar[str] = ""
    packages: ClassVar[tuple[str, ...]] = ()  # distributions whose versions go in every row
    missing_status: ClassVar[str] = "unavailable"
    timeout: ClassVar[float] = 300.0          # seconds for hello/validate (a first call may pack), plus a round's budget
    start_timeout: ClassVar[float] = 180.0     # importing a peer's torch on a busy machine takes a while
    prepare_timeout: ClassVar[float] = 1800.0  # materialising Mixtral's groups and packing take minutes
    extra_copy_factor: ClassVar[float] = 1.0  # packed copies the peer keeps, in units of the weights

    def __init__(self, threads: int):
        super().__init__(threads)
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self._stderr = None
        self._hello: dict = {}
        self._prepared: dict = {}
        self._call_s = 0.0

    # ---- availability ------------------------------------------------------------------------------
    @classmethod
    def availability(cls) -> tuple[bool, str]:
        if cls.env_name is None:
            return True, ""
        from .. import envs
        return envs.usable(cls.env_name)

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated: int, problem_bytes_allocated: int = 0) -> int:
        # the worker's own copy of the problem (all of it: a quantized problem's BF16 source too), what
        # the peer packs and copies, in units of the problem's weights, and the process itself (an
        # interpreter with torch and the peer's libraries: 0.2-0.4 GiB measured for kt's and vLLM's)
        own = max(problem_bytes_allocated, weight_bytes_allocated)
        return int(own + weight_bytes_allocated * cls.extra_copy_factor) + WORKER_PROCESS_BYTES

    # ---- the process -------------------------------------------------------------------------------
    def _command(self) -> tuple[list[str], dict[str, str], str]:
        env = dict(os.environ)
        env.pop("PYTHONHOME", None)
        env["PYTHONUNBUFFERED"] = "1"
        env["OMP_NUM_THREADS"] = str(self.threads)
        native = _native_dir()
        if native:
            env["HINABENCH_NATIVE_DIR"] = native
        if self.env_name is None:
            return [sys.executable, "-m", "hinabench.worker"], env, tempfile.gettempdir()
        from .. import envs
        path = envs.prepare_launch(self.env_name)
        env["PYTHONPATH"] = str(envs.link_dir(path))
        env["VIRTUAL_ENV"] = str(path)
        env["PATH"] = f"{path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(envs.recipe_runtime_env(self.env_name))
        return [str(envs.python(self.env_name)), "-m", "hinabench.worker"], env, str(path)

    def _start(self) -> None:
        cmd, env, cwd = self._command()
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, env=env, cwd=cwd, start_new_session=True)
        _LIVE.add(self)

    def _stderr_tail(self, lines: int = 6, chars: int = 800) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            n = self._stderr.tell()
            self._stderr.seek(max(0, n - 16384))
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        # faulthandler's dump (stack frames, the list of extension modules) says less than the
        # lines before it: drop it from the tail, keep "Fatal Python error: ..." and C++'s what()
        keep = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("  File ", "Extension modules:"))
                and not ln.startswith(("Current thread", "Thread 0x", "<no Python frame>"))]
        return " | ".join(keep[-lines:])[-chars:]

    def _what(self) -> str:
        """The message of an uncaught C++ exception (`terminate called ... what(): ...`), if any."""
        tail = self._stderr_tail(lines=60, chars=100000)
        # with several threads the runtime's lines interleave: look inside lines, not only at starts
        for ln in reversed(tail.split(" | ")):
            i = ln.find("what():")
            if i >= 0 and ln[i + len("what():"):].strip():
                return ln[i + len("what():"):].strip()
        m = re.search(r"[\w.' -]*not supported[\w.' -]*", tail)
        return m.group(0).strip() if m else ""

    def _kill(self) -> None:
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def _death(self, what: str) -> Exception:
        try:
            rc = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._kill()
            return WorkerFailed("failed", f"worker closed its output during '{what}' but did not exit: killed")
        sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
        tail = self._stderr_tail()
        if sig == signal.SIGILL:
            return Unsupported(f"worker died with SIGILL (illegal instruction): {self.name} needs an ISA "
                               f"this CPU lacks (during '{what}'{self._fault_frame()})")
        what_msg = self._what()
        if sig == signal.SIGABRT and what_msg and "not supported" in what_msg.lower():
            return Unsupported(f"{self.name}: the peer aborted with \"{what_msg}\" (worker died with SIGABRT "
                               f"during '{what}')")
        if sig:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            hint = " (the kernel's OOM killer sends this: out of memory?)" if sig == signal.SIGKILL else ""
            return WorkerFailed("failed", f"worker died with {name}{hint} during '{what}'"
                                          + (f"; stderr: {tail}" if tail else ""))
        return WorkerFailed("failed", f"worker exited with code {rc} during '{what}'"
                                      + (f"; stderr: {tail}" if tail else ""))

    def _fault_frame(self) -> str:
        """The innermost Python frame faulthandler printed for a fatal signal: ', at file:line in fn'."""
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", "replace").splitlines()
        except (OSError, ValueError, AttributeError):
            return ""
        for ln in (x.strip() for x in lines):
            if ln.startswith('File "') and not ln.startswith('File "<'):   # skip importlib's frozen frames
                try:
                    path, rest = ln[6:].split('", line ', 1)
                    return f", at {'/'.join(path.split('/')[-2:])}:{rest}"
                except ValueError:
                    return ""
        return ""

    def _readline(self, timeout: float) -> bytes | None:
        """One line from the worker; b"" at end of file; None when `timeout` seconds pass first."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _request(self, msg: dict, timeout: float) -> dict:
        what = msg["op"]
        if self.proc is None:
            raise WorkerFailed("failed", f"no worker for '{what}' (prepare failed or the worker was closed)")
        if self.proc.poll() is not None:
            raise self._death(what)
        msg = {"v": 1, **msg}
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._death(what) from None
        line = self._readline(timeout)
        if line is None:
            self._kill()
            raise WorkerFailed("timeout", f"worker did not answer '{what}' within {timeout:.0f} s: "
                                          f"its process group was killed")
        if line == b"":
            raise self._death(what)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            self._kill()
            raise WorkerFailed("failed", f"worker answered '{what}' with something not JSON: {line[:200]!r}")
        if not reply.get("ok"):
            reason = reply.get("reason", "no reason given")
            if reply.get("status") == "unsupported":
                raise Unsupported(reason)
            raise WorkerFailed(reply.get("status", "failed"), reason)
        return reply

    # ---- the Backend interface ---------------------------------------------------------------------
    def prepare(self, data: ProblemData) -> None:
        super().prepare(data)
        from ..machine.sysinfo import llc_bytes
        p = data.problem
        llc = llc_bytes()
        rotate = not (data.groups == 1 and p.rotation_groups(llc) != 1)
        self._start()
        self._hello = self._request({"op": "hello", "packages": list(self.packages)}, self.start_timeout)
        self._prepared = self._request(
            {"op": "prepare", "problem": p.to_dict(), "llc_bytes": llc,
             "rotate": rotate, "numa": getattr(data, "numa", "default"), "groups": data.groups, "backend": self.name, "module": self.module,
             "variant": self.variant, "threads": self.threads}, self.prepare_timeout)

    def run(self, group: int) -> torch.Tensor:
        """Validation only: the worker runs `group` once and sends its output back."""
        from .protocol import decode_tensor
        t0 = time.perf_counter()
        reply = self._request({"op": "validate", "group": group}, self.timeout)
        self._call_s = max(self._call_s, time.perf_counter() - t0)
        return decode_tensor(reply)

    def measure_round(self, rnd: int, plan: RoundPlan, counter=None) -> RoundResult:
        # the round's own budget (samples, warm-ups, probes) plus room; a hang past it is a timeout
        limit = self.timeout + plan.max_time + (plan.warmup + 3) * 2 * self._call_s
        reply = self._request({"op": "round", "rnd": rnd, "plan": plan.as_dict(),
                               "perf": counter is not None}, limit)
        return RoundResult.from_dict(reply["result"])

    def perf_session(self):
        """perf counts inside the worker, around its own sample loop (a PerfSession there)."""
        return _WorkerPerf(self)

    def extra_bytes(self) -> int:
        return int(self._prepared.get("extra_bytes", 0))

    def prepare_ms(self) -> float | None:
        """The peer's own preparation time, measured inside the worker (the runner's prepare_ms also
        counts starting the worker and materialising its copy of the problem)."""
        return self._prepared.get("prepare_ms")

    def note(self) -> str:
        return str(self._prepared.get("note") or "")

    def huge_pages(self) -> tuple[float | None, str]:
        """The share of the bytes the peer's kernel reads that sit on transparent huge pages, in its
        own process, and why a '+thp' policy could not put them there ("" if it could)."""
        return self._prepared.get("huge_fraction"), str(self._prepared.get("huge_reason") or "")

    def versions(self) -> dict:
        v = dict(self._hello.get("versions", {}))
        v.update(self._prepared.get("versions", {}))
        v["env"] = self.env_name or "(harness interpreter)"
        v["env_vars"] = self._hello.get("env", {})
        if self._prepared.get("prepare_ms") is not None:
            v["peer_prepare_ms"] = round(self._prepared["prepare_ms"], 1)
        return v

    def close(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                p.stdin.write(b'{"v": 1, "op": "close"}\n')
                p.stdin.flush()
                p.wait(10)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if p is not None:
            for f in (p.stdin, p.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.proc = None
        super().close()


class _WorkerResultRow:
    def __init__(self, row: dict):
        self._row = row

    def row(self) -> dict:
        return dict(self._row)


class _WorkerPerf:
    """The runner's perf session for a worker-backed backend: the worker keeps a PerfSession on
    itself, enabled around its samples only; leaving this one asks the worker for the counts."""

    def __init__(self, backend: WorkerBackend):
        self.backend = backend
        self.result = None

    def __enter__(self):
        return self

    def enable(self) -> None:       # the worker enables its own session around its samples
        pass

    def disable(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        try:
            row = self.backend._request({"op": "perf_result"}, 60)["perf"]
        except (WorkerFailed, Unsupported) as e:
            row = {"remote_fraction_perf": None, "dram_local_loads": None, "dram_remote_loads": None,
                   "perf_status": "unsupported", "perf_reason": f"no counts from the worker: {e}"}
        self.result = _WorkerResultRow(row)


@atexit.register
def _kill_all() -> None:
    for b in list(_LIVE):
        b._kill()
