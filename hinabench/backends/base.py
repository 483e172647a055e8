"""The backend interface: every kernel hinabench times, ours and the peers', is one of these.

The runner drives a backend as:  availability() -> prepare(data) [timed apart] -> run(group) ...
and checks `run`'s output against the float32 reference on the same problem before timing it.
A backend serves the problem kinds in `ops` ("ffn", "linear", ...): `run` calls `run_<kind>`.
"""
from __future__ import annotations

from abc import ABC
from typing import ClassVar

import torch

from ..harness.measure import MeasureState, RoundPlan, RoundResult, measure_round
from ..problems import ProblemData


class Unsupported(Exception):
    """This backend cannot run this problem on this machine (a row with status `unsupported`)."""


class Backend(ABC):
    name: ClassVar[str]            # registry key, "family:variant" where there are variants
    description: ClassVar[str]     # one line a reader can trust: what code path this is
    dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    ops: ClassVar[tuple[str, ...]] = ("ffn",)     # problem kinds it has a path for
    # How the backend splits a weight matrix's work across threads, for the remote-traffic model
    # (hinabench.numa.remote_fraction_model): "row-split" (output rows across all threads, as
    # oneDNN / IPEX / torch do), "hina" (Section 5's local segments), "tp-split", "per-node-copy".
    work_partition: ClassVar[str] = "row-split"
    # Bytes of weights it reads per element, against the problem's dtype (BF16 = 1.0): a backend that
    # quantizes on its own (llama.cpp Q8_0: 34 bytes per 32 weights) is judged on what it reads.
    weight_bytes_factor: ClassVar[float] = 1.0
    # A quantized problem's peer that quantizes in a scheme of its own ("int8-channel": one scale per
    # output row, activations per token; "+bf16w", "+bf16gu", "+bf16h", "+bf16y": it computes on weights
    # unpacked to bf16, stores the gate/up outputs, the intermediate, each expert's weighted output in
    # bf16) is validated against that scheme's reference
    # (FFNData.scheme_reference), and judged on that scheme's bytes; None: the problem's own scheme.
    quant_scheme: ClassVar[str | None] = None

    @classmethod
    def scheme_for(cls, problem) -> str | None:
        """The scheme its rows of `problem` are validated against (quant_scheme unless it depends on
        the problem, as a kernel whose numerics change with the batch does)."""
        return cls.quant_scheme

    @classmethod
    def read_bytes(cls, problem) -> int:
        """Bytes of weights (and scales) one call reads, as the roofline counts them."""
        if (cls.quant_scheme or "").startswith("int8-channel"):   # int8 weights + one fp32 scale per output row
            return problem.touched_experts() * (3 * problem.H * problem.I + 4 * (2 * problem.I + problem.H))
        return int(problem.weight_bytes * cls.weight_bytes_factor)

    def __init__(self, threads: int):
        self.threads = threads
        self.data: ProblemData | None = None

    @classmethod
    def availability(cls) -> tuple[bool, str]:
        """(True, "") if it can run in this process; else (False, why / how to get it)."""
        return True, ""

    def supports(self, data: ProblemData) -> None:
        """Raise Unsupported with the reason if this problem is out of reach."""
        if data.problem.kind not in self.ops:
            raise Unsupported(f"{self.name} has no {data.problem.kind} path (it has: {', '.join(self.ops)})")
        if data.problem.dtype not in self.dtypes:
            raise Unsupported(f"{self.name} has no {data.problem.dtype} path "
                              f"(it has: {', '.join(self.dtypes)})")

    def prepare(self, data: ProblemData) -> None:
        """Layout conversion and other one-time work; the runner times it apart from `run`."""
        self.supports(data)
        self.data = data

    def run(self, group: int) -> torch.Tensor:
        """One call on rotation group `group` (run_ffn: out [B, H]; run_linear: y [B, N])."""
        return getattr(self, f"run_{self.data.problem.kind}")(group)

    def measure_round(self, rnd: int, plan: RoundPlan, counter=None) -> RoundResult:
        """This backend's turn in round `rnd`. In-process: time self.run here; a worker-backed
        backend does the same inside its own process (and probes its own buffers there).
        `counter`: the perf session from perf_session(), enabled around the samples only."""
        if getattr(self, "_state", None) is None:
            self._state = MeasureState()
        d = self.data
        return measure_round(self.run, rnd, plan, self._state, d.buffers(), self.threads, d.groups, counter,
                             dtype=d.problem.dtype)

    def perf_session(self):
        """A perf session on the process that runs the kernel (this one, for in-process backends)."""
        from ..machine.perf import PerfSession
        return PerfSession()

    def extra_bytes(self) -> int:
        """Bytes this backend allocated beyond the problem's own tensors (packed copies, ...)."""
        return 0

    @classmethod
    def extra_bytes_estimate(cls, weight_bytes_allocated: int, problem_bytes_allocated: int = 0) -> int:
        """Before allocating anything: how much more memory prepare() will take. weight_bytes_allocated:
        the weights (and scales) of every rotation group in the problem's dtype; problem_bytes_allocated:
        all the problem materializes (a quantized problem keeps its BF16 source too)."""
        return 0

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    @classmethod
    def row_note(cls, threads: int) -> str:
        """A caveat that every row of this backend at `threads` should carry (the row's `note`), or ''."""
        return ""

    def note(self) -> str:
        """What the backend knows goes wrong for this problem on this machine (a library's fault found
        and diagnosed by its adapter), or "": added to the reason of a row whose output is off."""
        return ""

    def close(self) -> None:
        self.data = None
