"""Local vs remote DRAM traffic from hardware counters, for the timed loop only (Figure 15).

Counter tables are data (LIKWID's performance groups are the model): hinabench/machine/perf_events/*.toml,
one per vendor/microarchitecture, each with

    [match]    vendor, family, models (ranges, hex)   -- against /proc/cpuinfo
    [events]   local = "...", remote = "..."          -- perf event names, by role
    [metrics]  remote_fraction = "remote / (local + remote)"   -- formulas over the roles

Supporting a new CPU is a new file. `select_table` picks the one matching this CPU, or says none.

`PerfSession` runs `perf stat -x ';' --control fd:CTL,ACK --delay=-1 -e ... -p <pid>` beside the
process, with counting disabled until `enable()` and stopped again at `disable()`, so the counts
cover exactly the timed loop. When perf is missing, the table's events are not supported (probed
once per event set with `perf stat -e <events> true`, cached), or no table matches this CPU, the
result has status "unsupported" and a reason -- never a number.

perf's CSV output (`perf stat -x SEP`, perf-stat(1) "CSV FORMAT"), one line per event:

    [timestamp (-I);] [cpu/core/socket id (-A, --per-*);] [cpus aggregated;]
    value; unit; event; [variance% (-r: perf 6.x prints it here, after the event, although
    the man page lists it after the percentage)]; run-time; percentage-running;
    [metric value; metric unit]

`value` is `<not supported>` or `<not counted>` when there is no count; lines starting with '#'
are comments, and metric-only lines have every field before the metric empty.
"""
from __future__ import annotations

import ast
import functools
import operator
import os
import select
import shutil
import signal
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .cpuinfo import CpuId, parse_cpuinfo, read_cpuinfo  # noqa: F401  (perf.CpuId: the tables match it)

TABLE_DIR = Path(__file__).parent / "perf_events"
COLUMNS = ("remote_fraction_perf", "dram_local_loads", "dram_remote_loads", "perf_status",
           "perf_reason")
NO_VALUE = {"<not supported>": "not supported", "<not counted>": "not counted"}


# ---------------------------------------------------------------------------------------------
# CPU identity and counter tables
# ---------------------------------------------------------------------------------------------

def _in_ranges(model: int, ranges: list[str]) -> bool:
    for r in ranges:
        lo, _, hi = str(r).partition("-")
        if int(lo, 0) <= model <= int(hi or lo, 0):
            return True
    return False


@dataclass(frozen=True)
class CounterTable:
    name: str
    description: str
    vendor: str
    family: int
    models: tuple[str, ...]
    events: dict                  # role -> perf event name
    metrics: dict                 # metric name -> formula over the roles
    encodings: dict = field(default_factory=dict)
    path: str = ""

    def matches(self, cpu: CpuId) -> bool:
        return (cpu.vendor == self.vendor and cpu.family == self.family
                and _in_ranges(cpu.model, list(self.models)))


def load_table(path: str | Path) -> CounterTable:
    with open(path, "rb") as f:
        d = tomllib.load(f)
    m = d["match"]
    table = CounterTable(d["name"], d.get("description", ""), m["vendor"], int(m["family"]),
                         tuple(m["models"]), dict(d["events"]), dict(d["metrics"]),
                         dict(d.get("encodings", {})), str(path))
    for name, formula in table.metrics.items():      # formulas may only name the table's roles
        unknown = _formula_names(formula) - set(table.events)
        if unknown:
            raise ValueError(f"{path}: metric {name} uses unknown roles {sorted(unknown)}")
    return table


def load_tables(directory: str | Path = TABLE_DIR) -> list[CounterTable]:
    return [load_table(p) for p in sorted(Path(directory).glob("*.toml"))]


def select_table(cpuinfo: str | CpuId | None = None,
                 tables: list[CounterTable] | None = None) -> tuple[CounterTable | None, str]:
    """(table, "") for this CPU, or (None, why not)."""
    cpu = cpuinfo if isinstance(cpuinfo, CpuId) else parse_cpuinfo(
        read_cpuinfo() if cpuinfo is None else cpuinfo)
    tables = load_tables() if tables is None else tables
    hits = [t for t in tables if t.matches(cpu)]
    if not hits:
        return None, (f"no counter table in hinabench/machine/perf_events matches {cpu}; "
                      "add one (vendor, family, models, events, metrics)")
    if len(hits) > 1:
        return None, f"counter tables overlap for {cpu}: {', '.join(t.name for t in hits)}"
    return hits[0], ""


# ---------------------------------------------------------------------------------------------
# Formulas: + - * / and parentheses over role names; nothing else is evaluated
# ---------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def _formula_names(formula: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(formula, mode="eval")) if isinstance(n, ast.Name)}


def evaluate_formula(formula: str, values: dict[str, float | None]) -> float | None:
    """The metric's value, or None if a count is missing or a denominator is zero."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            v = values.get(node.id)
            if v is None:
                raise LookupError(node.id)
            return float(v)
        raise ValueError(f"unsupported syntax in formula '{formula}'")
    try:
        return ev(ast.parse(formula, mode="eval"))
    except (LookupError, ZeroDivisionError):
        return None


# ---------------------------------------------------------------------------------------------
# perf stat -x output
# ---------------------------------------------------------------------------------------------

@dataclass
class PerfCount:
    event: str
    value: float | None           # None when perf printed <not supported> / <not counted>
    unit: str = ""
    run_time: int | None = None   # ns the counter ran
    percent_running: float | None = None
    status: str = "counted"       # counted | not supported | not counted
    reason: str = ""
    variance: str = ""            # with -r, e.g. "9.35%"
    metric_value: float | None = None
    metric_unit: str = ""
    timestamp: float | None = None
    aggregation: tuple[str, ...] = ()


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def parse_perf_stat_csv(text: str, sep: str = ";", interval: bool = False,
                        aggregation_fields: int = 0) -> list[PerfCount]:
    """Parse `perf stat -x SEP` output (see the module docstring for the field order).

    `interval`: -I was given (a leading timestamp); `aggregation_fields`: how many leading id
    fields -A / --per-socket / --per-core add (1 for -A, 2 for --per-socket/--per-core).
    """
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = [x.strip() for x in line.split(sep)]
        ts = None
        if interval:
            ts, f = _num(f[0]), f[1:]
        agg, f = tuple(f[:aggregation_fields]), f[aggregation_fields:]
        if len(f) < 3 or not f[2]:
            continue                      # a metric-only line, or not an event line
        value_s, unit, event, rest = f[0], f[1], f[2], f[3:]
        variance = ""
        if rest and rest[0].endswith("%"):
            variance, rest = rest[0], rest[1:]
        run_time = int(rest[0]) if len(rest) > 0 and rest[0].isdigit() else None
        pct = _num(rest[1]) if len(rest) > 1 else None
        mval = _num(rest[2]) if len(rest) > 2 and rest[2] else None
        munit = rest[3] if len(rest) > 3 else ""
        if value_s in NO_VALUE:
            status = NO_VALUE[value_s]
            reason = (f"perf stat: {event} {value_s}" +
                      (" (the PMU or this event is unavailable)" if status == "not supported"
                       else " (the counter never ran: disabled, multiplexed out, or the task "
                            "did not run)"))
            out.append(PerfCount(event, None, unit, run_time, pct, status, reason, variance,
                                 None, "", ts, agg))
            continue
        value = _num(value_s)
        if value is None:
            out.append(PerfCount(event, None, unit, run_time, pct, "not counted",
                                 f"perf stat: unparsable value '{value_s}' for {event}",
                                 variance, None, "", ts, agg))
            continue
        out.append(PerfCount(event, value, unit, run_time, pct, "counted", "", variance, mval,
                             munit, ts, agg))
    return out


def sum_counts(counts: list[PerfCount]) -> dict[str, PerfCount]:
    """One count per event (sums interval / per-CPU lines); any missing line makes it missing."""
    by: dict[str, PerfCount] = {}
    for c in counts:
        prev = by.get(c.event)
        if prev is None:
            by[c.event] = PerfCount(**{**c.__dict__})
        elif prev.value is not None and c.value is not None:
            prev.value += c.value
        elif c.value is None:
            by[c.event] = PerfCount(**{**c.__dict__})
    return by


# ---------------------------------------------------------------------------------------------
# Can this machine count? (probed once per event set)
# ---------------------------------------------------------------------------------------------

def _virtualization_note() -> str:
    cpu = parse_cpuinfo(read_cpuinfo())
    core_pmu = any(Path("/sys/bus/event_source/devices", d).exists()
                   for d in ("cpu", "cpu_core", "cpu_atom"))
    notes = []
    if "hypervisor" in cpu.flags:
        notes.append("virtual machine (cpuinfo flag 'hypervisor') without PMU passthrough"
                     if not core_pmu else "virtual machine (cpuinfo flag 'hypervisor')")
    if not core_pmu:
        notes.append("no core PMU under /sys/bus/event_source/devices")
    return "; ".join(notes)


@functools.lru_cache(maxsize=None)
def probe(events: tuple[str, ...], perf: str = "perf") -> tuple[bool, str]:
    """(True, "") if `perf stat -e <events> true` counts every event; else (False, reason)."""
    exe = shutil.which(perf)
    if exe is None:
        return False, f"perf not found on PATH ({perf})"
    try:
        p = subprocess.run([exe, "stat", "-x", ";", "-e", ",".join(events), "true"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"perf stat failed to run: {e}"
    err = p.stderr
    note = _virtualization_note()
    if p.returncode != 0:
        first = next((l.strip() for l in err.splitlines() if l.strip()), f"exit {p.returncode}")
        if "event syntax error" in err or "Cannot find PMU" in err or "unknown" in err.lower():
            why = f"perf stat does not know the events {', '.join(events)} on this machine"
        elif "paranoid" in err or "ermission" in err or "Access to performance" in err:
            why = ("perf stat: not permitted (kernel.perf_event_paranoid = "
                   f"{_read('/proc/sys/kernel/perf_event_paranoid')})")
        else:
            why = f"perf stat failed: {first}"
        return False, why + (f" ({note})" if note else "")
    counts = sum_counts(parse_perf_stat_csv(err))
    missing = [e for e in events if e not in counts or counts[e].value is None]
    if missing:
        kinds = {counts[e].status for e in missing if e in counts} or {"not counted"}
        if kinds == {"not supported"}:
            hw, _ = probe(("instructions",), perf) if events != ("instructions",) else (False, "")
            what = "hardware events" if not hw else f"events {', '.join(missing)}"
            return False, (f"perf stat: {what} <not supported> on this machine"
                           + (f" ({note})" if note else ""))
        return False, (f"perf stat: {', '.join(missing)} "
                       f"{'/'.join(sorted(kinds))} in a probe run" + (f" ({note})" if note else ""))
    return True, ""


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# The result and the session
# ---------------------------------------------------------------------------------------------

@dataclass
class PerfResult:
    status: str                   # ok | unsupported | error
    reason: str = ""
    table: str = ""
    counts: dict = field(default_factory=dict)      # role -> PerfCount
    metrics: dict = field(default_factory=dict)     # metric -> float | None

    def row(self) -> dict:
        """The row columns: remote_fraction_perf, dram_local_loads, dram_remote_loads,
        perf_status, perf_reason. Missing values are None, never a number."""
        def val(role):
            c = self.counts.get(role)
            return int(c.value) if c is not None and c.value is not None else None
        return {"remote_fraction_perf": self.metrics.get("remote_fraction"),
                "dram_local_loads": val("local"), "dram_remote_loads": val("remote"),
                "perf_status": self.status, "perf_reason": self.reason}


def result_from_counts(table: CounterTable, counts: dict[str, PerfCount],
                       events: dict[str, str] | None = None) -> PerfResult:
    """Map perf's counts back to the table's roles and evaluate its metrics.
    `events`: role -> event actually passed to perf (the raw encodings, if those were used)."""
    events = events or table.events
    by_role = {role: counts.get(ev) for role, ev in events.items()}
    missing = [f"{events[r]}: {c.status if c else 'no line in perf output'}"
               for r, c in by_role.items() if c is None or c.value is None]
    values = {r: (c.value if c is not None else None) for r, c in by_role.items()}
    metrics = {name: evaluate_formula(f, values) for name, f in table.metrics.items()}
    reason = "; ".join(missing)
    zero = [n for n, v in metrics.items() if v is None and not missing]
    if zero:
        reason = f"{', '.join(zero)} undefined (zero denominator: no DRAM traffic counted)"
    return PerfResult("ok" if not missing else "unsupported", reason, table.name,
                      {r: c for r, c in by_role.items() if c is not None}, metrics)


class PerfSession:
    """Count the table's events for one process, only between enable() and disable().

        with PerfSession() as perf:        # after warm-up, so every worker thread exists
            perf.enable()
            for _ in range(iters): run()   # the timed loop
            perf.disable()
        row.update(perf.result.row())

    perf attaches with -p to the threads that exist when it starts (and counts the children
    they create later, perf's default inherit). If anything is missing, enable()/disable() do
    nothing and `result` says "unsupported" and why.
    """

    def __init__(self, pid: int | None = None, table: CounterTable | None = None,
                 cpuinfo: str | None = None, perf: str = "perf", timeout: float = 10.0):
        self.pid = os.getpid() if pid is None else pid
        self.perf = perf
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.result: PerfResult | None = None
        self._fds: list[int] = []
        self._enabled = False
        if table is None:
            table, why = select_table(cpuinfo)
            if table is None:
                self.result = PerfResult("unsupported", why)
        self.table = table
        self.events = dict(table.events) if table is not None else {}
        if self.result is None:
            ok, why = probe(tuple(self.events.values()), perf)
            if not ok and set(table.encodings) == set(table.events):
                # perf may lack the JSON names (old perf, or no core PMU): try the raw encodings
                raw_ok, raw_why = probe(tuple(table.encodings.values()), perf)
                if raw_ok:
                    ok, self.events = True, dict(table.encodings)
                else:
                    why = f"{raw_why}; this perf does not know the events by name either"
            if not ok:
                self.result = PerfResult("unsupported", why, table.name)

    @property
    def supported(self) -> bool:
        """False when the session was decided unsupported up front (its reason is in result)."""
        return self.result is None or self.proc is not None

    def __enter__(self) -> "PerfSession":
        if self.result is not None:
            return self
        ctl_r, self._ctl_w = os.pipe()
        self._ack_r, ack_w = os.pipe()
        self._fds = [self._ctl_w, self._ack_r]
        fd, self._out = tempfile.mkstemp(prefix="hinabench-perf-", suffix=".csv")
        os.close(fd)
        cmd = [shutil.which(self.perf) or self.perf, "stat", "-x", ";", "-o", self._out,
               "--control", f"fd:{ctl_r},{ack_w}", "--delay=-1",
               "-e", ",".join(self.events.values()), "-p", str(self.pid)]
        try:
            self.proc = subprocess.Popen(cmd, pass_fds=(ctl_r, ack_w), stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        except OSError as e:
            self.result = PerfResult("unsupported", f"perf stat failed to start: {e}",
                                     self.table.name)
        finally:
            os.close(ctl_r)
            os.close(ack_w)
        return self

    def _command(self, cmd: str) -> None:
        if self.proc is None:
            return
        os.write(self._ctl_w, (cmd + "\n").encode())
        ready, _, _ = select.select([self._ack_r], [], [], self.timeout)
        if not ready:
            raise TimeoutError(f"perf stat did not acknowledge '{cmd}' within {self.timeout} s")
        os.read(self._ack_r, 64)

    def enable(self) -> None:
        """Start counting (returns once perf acknowledged: the next instruction is counted)."""
        self._command("enable")
        self._enabled = self.proc is not None

    def disable(self) -> None:
        self._command("disable")
        self._enabled = False

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            if self._enabled:
                self.disable()
        except (OSError, TimeoutError):
            pass
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        text = Path(self._out).read_text() if os.path.exists(self._out) else ""
        try:
            os.unlink(self._out)
        except OSError:
            pass
        counts = sum_counts(parse_perf_stat_csv(text))
        if not counts:
            first = next((l for l in (err or "").splitlines() if l.strip()), "no output")
            self.result = PerfResult("error", f"perf stat produced no counts: {first}",
                                     self.table.name)
        else:
            self.result = result_from_counts(self.table, counts, self.events)
        self.proc = None


def unsupported_row(reason: str) -> dict:
    return PerfResult("unsupported", reason).row()
