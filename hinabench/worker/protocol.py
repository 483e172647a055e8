"""The worker: one peer's kernel in its own process (and usually its own virtual environment).

Run as `<env python> -m hinabench.worker`, with PYTHONPATH pointing at the env's `hinabench-path/<key>`
(a symlink to the harness's own package, see envs.py). Protocol, version 1: one JSON object per line
on stdin, one reply per line on stdout; no pickle, no tensors but the validation output.

  {"v":1, "op":"hello"}                      -> {"ok":true, "versions":{...}, "env":{...}}
  {"v":1, "op":"prepare", "problem":{...}, "llc_bytes":N, "rotate":true, "groups":R,
   "backend":"vllm:sgl", "module":"vllm", "variant":"sgl", "threads":2}
                                             -> {"ok":true, "prepare_ms":..., "extra_bytes":..., "groups":R,
                                                 "versions":{...}, "note":"..."}
  {"v":1, "op":"validate", "group":0}        -> {"ok":true, "shape":[T,H], "dtype":"bf16", "data":base64}
  {"v":1, "op":"round", "rnd":0, "plan":{...}} -> {"ok":true, "result": RoundResult.as_dict()}
  {"v":1, "op":"close"}                      -> {"ok":true}; the worker exits
Any error: {"ok":false, "status":"unsupported"|"failed", "reason":"..."}.

The worker rebuilds the problem from its seed with `Problem.materialize` (hinabench/problems) (the same bits as
the harness's, whatever torch this env has), so no weights cross the pipe; it times its own calls with
`hinabench.measure.measure_round`, with a read probe over its own weight buffers in its own process.

A peer adapter is a module under hinabench.backends with a `make_peer(variant, threads)` function
returning an object with prepare(data), run(group) -> out [T, H], and optionally extra_bytes(),
buffers() (what the kernel reads: packed copies), versions(), note() (what its adapter knows goes
wrong for this problem here: added to the reason of a `wrong` row) and close(). Imports stay minimal here:
a peer's torch must not be asked for more of hinabench than the problem and the measurement.
"""
from __future__ import annotations

import base64
import ctypes
import importlib
import json
import os
import signal
import sys
import time
import traceback

PROTOCOL = 1
ENV_PREFIXES = ("OMP_", "KMP_", "ONEDNN_", "DNNL_", "MKL_", "GOMP_", "VLLM_", "GGML_", "LLAMA_",
                "IPEX_", "KT_", "LD_PRELOAD", "TORCH_", "ATEN_", "ZENDNN", "ZENTORCH_")


PROTOCOL_FD = [-1]   # the protocol's own descriptor (the selftest's garbage variant writes on it)


class PeerUnsupported(Exception):
    """Raised by a peer adapter: this variant cannot run here (a row with status `unsupported`)."""


def _extend_package_path() -> None:
    """An editable install keeps the compiled _C apart from the sources: let `hinabench._C` find it."""
    import hinabench
    native = os.environ.get("HINABENCH_NATIVE_DIR")
    if native and native not in hinabench.__path__:
        hinabench.__path__.append(native)


def relevant_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def package_versions(names) -> dict[str, str]:
    from importlib import metadata
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def encode_tensor(t) -> dict:
    import torch
    t = t.detach().to(torch.bfloat16).contiguous()
    raw = ctypes.string_at(t.data_ptr(), t.numel() * 2) if t.numel() else b""
    return {"shape": list(t.shape), "dtype": "bf16", "data": base64.b64encode(raw).decode("ascii")}


def decode_tensor(msg: dict):
    import torch
    raw = base64.b64decode(msg["data"])
    if not raw:
        return torch.empty(msg["shape"], dtype=torch.bfloat16)
    return torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(msg["shape"]).clone()



# ---- the selftest peer: the worker protocol and crash isolation, tested in the main environment ----
class SelfTestPeer:
    """`selftest:<variant>`: naive (the torch loop), sigill (kills itself with SIGILL in prepare, as an
    AMX-only path does on a CPU without AMX), sigill-run (the same in the first call), hang (sleeps
    forever in prepare), hang-round (in the timed loop), raise (an exception), unsupported, wrong
    (a result off by 2x), sigkill (dies by SIGKILL, as the OOM killer kills), garbage-round (writes
    garbage on the protocol's pipe in the timed loop), exit-round (exits with code 3 in the timed loop),
    abort (an uncaught C++
    exception whose what() says "not supported")."""

    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads
        self.calls = 0

    def prepare(self, data) -> None:
        v = self.variant
        self.data = data
        if v == "sigill":
            os.kill(os.getpid(), signal.SIGILL)
        if v == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if v == "abort":               # what a C++ library's uncaught exception looks like
            sys.stderr.write("terminate called after throwing an instance of 'std::runtime_error'\n"
                             "  what():  selftest kernel not supported\n")
            sys.stderr.flush()
            os.abort()
        if v == "hang":
            time.sleep(3600)
        if v == "raise":
            raise RuntimeError("selftest: the peer raised in prepare")
        if v == "unsupported":
            raise PeerUnsupported("selftest: this variant needs an ISA this CPU lacks")
        if v not in ("naive", "sigill-run", "hang-round", "wrong", "garbage-round", "exit-round"):
            raise PeerUnsupported(f"selftest has no variant '{v}'")

    def run(self, group: int):
        import torch
        import torch.nn.functional as F
        self.calls += 1
        if self.variant == "sigill-run":
            os.kill(os.getpid(), signal.SIGILL)
        if self.variant == "hang-round" and self.calls > 1:
            time.sleep(3600)
        if self.variant == "garbage-round" and self.calls > 1:   # a library writing on the protocol's pipe
            os.write(PROTOCOL_FD[0], b"\x00\x01 garbage from the peer, not JSON\n")
        if self.variant == "exit-round" and self.calls > 1:      # dies mid-protocol without a signal
            os._exit(3)
        d = self.data
        x, w, ids = d.x, d.topk_weights, d.topk_ids[group].long()
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            h = F.silu(F.linear(x[tok], d.w_gate[e])) * F.linear(x[tok], d.w_up[e])
            out.index_add_(0, tok, F.linear(h, d.w_down[e]).float() * w[tok, slot].unsqueeze(1))
        if self.variant == "wrong":
            out *= 2
        return out.to(x.dtype)

    def versions(self) -> dict:
        return {}

    def note(self) -> str:
        return "selftest: doubled on purpose" if self.variant == "wrong" else ""


def make_peer(module: str, variant: str, threads: int):
    if module == "selftest":
        return SelfTestPeer(variant, threads)
    mod = importlib.import_module(f"hinabench.backends.{module}")
    return mod.make_peer(variant, threads)


# ---- the loop --------------------------------------------------------------------------------------
class Worker:
    def __init__(self):
        self.peer = None
        self.data = None
        self.read_buffers: list = []   # what the peer's kernel reads (prepare): probed, put on huge pages
        self.state = None
        self.threads = 1
        self.module = ""
        self.perf = None

    def hello(self, msg: dict) -> dict:
        import torch
        from .. import __version__
        v = {"torch": torch.__version__, "python": sys.version.split()[0], "hinabench": __version__}
        v.update(package_versions(msg.get("packages", [])))
        return {"versions": v, "env": relevant_env(), "pid": os.getpid(), "executable": sys.executable,
                "prefix": sys.prefix}

    def prepare(self, msg: dict) -> dict:
        import torch
        self.threads = int(msg.get("threads", 1))
        torch.set_num_threads(self.threads)
        from ..problems import problem_from_dict
        problem = problem_from_dict(msg["problem"])
        kw = {"numa": msg["numa"]} if msg.get("numa", "default") != "default" else {}
        self.data = problem.materialize(llc_bytes=int(msg["llc_bytes"]), rotate=bool(msg.get("rotate", True)),
                                **kw)
        want = msg.get("groups")
        if want is not None and self.data.groups != int(want):
            raise RuntimeError(f"rotation groups differ: harness {want}, worker {self.data.groups}")
        self.module = msg.get("module") or msg["backend"].split(":")[0]
        self.peer = make_peer(self.module, msg.get("variant", ""), self.threads)
        t0 = time.perf_counter()
        self.peer.prepare(self.data)
        prepare_ms = (time.perf_counter() - t0) * 1e3
        extra = int(getattr(self.peer, "extra_bytes", lambda: 0)())
        versions = dict(getattr(self.peer, "versions", lambda: {})())
        note = str(getattr(self.peer, "note", lambda: "")() or "")
        # what this peer's kernel reads: its own copies (buffers()), else the problem's weights; under
        # a '+thp' policy its copies go on huge pages too (they were allocated by the peer, not placed)
        from ..numa.linux import huge_fraction, huge_pages_ranges
        from ..numa.placement import huge_policy
        bufs = getattr(self.peer, "buffers", None)
        ranges = self.read_buffers = bufs() if bufs else self.data.buffers()
        huge_why = huge_pages_ranges(ranges) if huge_policy(msg.get("numa", "default")) else ""
        return {"prepare_ms": prepare_ms, "extra_bytes": extra, "groups": self.data.groups,
                "versions": versions, "note": note, "huge_fraction": huge_fraction(ranges),
                "huge_reason": huge_why}

    def validate(self, msg: dict) -> dict:
        out = self.peer.run(int(msg.get("group", 0)))
        return encode_tensor(out)

    def round(self, msg: dict) -> dict:
        from ..harness.measure import MeasureState, RoundPlan, measure_round
        if self.state is None:
            self.state = MeasureState()
        plan = RoundPlan(**msg["plan"])
        d = self.data
        buffers = self.read_buffers   # the peer's own copies, else the problem's weights (prepare)
        counter = None
        if msg.get("perf"):
            if self.perf is None:
                import contextlib

                from ..machine.perf import PerfSession
                self.perf_stack = contextlib.ExitStack()   # open across messages, closed in perf_result
                self.perf = self.perf_stack.enter_context(PerfSession())  # this process: the kernel's threads
            counter = self.perf
        args = (self.peer.run, int(msg["rnd"]), plan, self.state, buffers, self.threads, d.groups)
        res = measure_round(*args, counter, dtype=d.problem.dtype)
        return {"result": res.as_dict()}

    def perf_result(self, msg: dict) -> dict:
        if self.perf is None:
            return {"perf": {"remote_fraction_perf": None, "dram_local_loads": None, "dram_remote_loads": None,
                             "perf_status": "unsupported", "perf_reason": "the worker counted no round"}}
        self.perf_stack.close()
        row, self.perf = self.perf.result.row(), None
        return {"perf": row}

    def handle(self, msg: dict) -> dict:
        if msg.get("v") != PROTOCOL:
            return {"ok": False, "status": "failed",
                    "reason": f"protocol version {msg.get('v')} asked, this worker speaks {PROTOCOL}"}
        op = msg.get("op")
        fn = {"hello": self.hello, "prepare": self.prepare, "validate": self.validate,
              "round": self.round, "perf_result": self.perf_result}.get(op)
        if fn is None:
            return {"ok": False, "status": "failed", "reason": f"unknown op '{op}'"}
        if op in ("validate", "round", "perf_result") and self.peer is None:
            return {"ok": False, "status": "failed", "reason": f"'{op}' before a successful 'prepare'"}
        try:
            out = fn(msg)
        except PeerUnsupported as e:
            return {"ok": False, "status": "unsupported", "reason": str(e)}
        except MemoryError:
            return {"ok": False, "status": "failed", "reason": f"out of memory in '{op}'"}
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" (at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
            traceback.print_exc(file=sys.stderr)
            first = (str(e).strip().splitlines() or [""])[0]
            return {"ok": False, "status": "failed", "reason": f"{type(e).__name__}: {first}{where}"}
        out["ok"] = True
        return out


def main() -> int:
    # The protocol owns the original stdout; anything a peer library prints (to fd 1, from C or Python)
    # goes to stderr instead, which the harness keeps for the reason of a crash.
    import faulthandler
    faulthandler.enable()            # a segfault leaves its Python stack in the stderr tail
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    PROTOCOL_FD[0] = proto.fileno()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _extend_package_path()
    w = Worker()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError as e:
            reply = {"ok": False, "status": "failed", "reason": f"bad JSON: {e}"}
        else:
            if msg.get("op") == "close":
                close = getattr(w.peer, "close", None)
                if close:
                    close()
                proto.write(json.dumps({"ok": True}) + "\n")
                return 0
            reply = w.handle(msg)
        proto.write(json.dumps(reply) + "\n")
    return 0
