"""What the machine is, measured and printed before any figure (LIKWID's topology-first habit).

`fingerprint()` is stored with every result row; `summary()` is its one-line form for notes and
figure captions.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import platform
import re
import subprocess
from pathlib import Path

from .cpuinfo import parse_cpuinfo, parse_cpulist, read_cpuinfo

ISA_FLAGS = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8"]


def _read(path: str, default: str = "") -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return default


def parse_size(text: str) -> int:
    """'32768K' / '1024 kB' / '32M' -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.I)
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def cpu_identity() -> dict:
    c = parse_cpuinfo(read_cpuinfo())
    return {"vendor": c.vendor if c.vendor != "unknown" else (platform.processor() or "unknown"),
            "model_name": c.model_name or "unknown", "family": max(c.family, 0), "model": max(c.model, 0)}


def caches() -> dict:
    """Data/unified caches of cpu0 by level: {'L1d': bytes, 'L2': bytes, 'L3': bytes}."""
    out = {}
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        level, kind = _read(f"{d}/level"), _read(f"{d}/type")
        if kind == "Instruction":
            continue
        name = f"L{level}" + ("d" if kind == "Data" else "")
        out[name] = parse_size(_read(f"{d}/size"))
    return out


def llc_bytes() -> int:
    c = caches()
    return max(c.values()) if c else 32 << 20


def topology() -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    cores, sockets = set(), set()
    for c in parse_cpulist(_read("/sys/devices/system/cpu/online", "0")):
        pkg = _read(f"/sys/devices/system/cpu/cpu{c}/topology/physical_package_id", "0")
        core = _read(f"/sys/devices/system/cpu/cpu{c}/topology/core_id", str(c))
        sockets.add(pkg)
        cores.add((pkg, core))
    return {"sockets": len(sockets), "cores": len(cores), "threads": os.cpu_count() or len(cpus),
            "usable_cpus": cpus}


def check_threads(threads, flag: str = "--threads") -> None:
    """A user error unless every thread count is between 1 and the CPUs this process may use (more would
    oversubscribe the cores and time the scheduler)."""
    ncpu = len(topology()["usable_cpus"])
    if any(t < 1 or t > ncpu for t in threads):
        from ..errors import UserError
        raise UserError(f"{flag} must be between 1 and {ncpu} (the CPUs this process may use)")


def numa_nodes() -> list[dict]:
    nodes = []
    for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*"),
                    key=lambda p: int(p.rsplit("node", 1)[1])):
        mem = 0
        for line in _read(f"{d}/meminfo").splitlines():
            if "MemTotal" in line:
                mem = parse_size(line.split(":")[1].strip())
        nodes.append({"node": int(d.rsplit("node", 1)[1]), "cpus": parse_cpulist(_read(f"{d}/cpulist")),
                      "mem_bytes": mem})
    return nodes or [{"node": 0, "cpus": topology()["usable_cpus"], "mem_bytes": meminfo()["MemTotal"]}]


def meminfo() -> dict:
    out = {}
    for line in _read("/proc/meminfo").splitlines():
        k, _, v = line.partition(":")
        out[k] = parse_size(v.strip())
    return out


def thp_mode() -> str:
    m = re.search(r"\[(\w+)\]", _read("/sys/kernel/mm/transparent_hugepage/enabled"))
    return m.group(1) if m else "unknown"


def perf_hw_counters() -> tuple[bool, str]:
    """Does `perf stat` count a hardware event here? (True, "") or (False, why)."""
    from .perf import probe
    return probe(("instructions",))


def isa() -> dict:
    from ..native import load
    _C = load("_C")
    f = _C.cpu_features()
    out = {k: bool(f.get(k, False)) for k in ISA_FLAGS}
    out["amx_os_permission"] = f["amx_permission"]
    out["amx_usable"] = bool(f["os_amx"])
    return out


def onednn_version() -> str:
    import torch
    m = re.search(r"MKL-DNN v([\d.]+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


def _built_from() -> str:
    try:
        from .._build_info import GIT_REV
        return GIT_REV
    except ImportError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def git_revision() -> str:
    """The checkout's revision when run from one (editable installs), else the one built from."""
    here = Path(__file__).resolve().parents[1]       # the hinabench package
    if not (here.parent / ".git").exists():
        return _built_from()
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=10", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return _built_from()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict:
    import torch

    from .. import __version__
    perf_ok, perf_why = perf_hw_counters()
    mi = meminfo()
    return {
        "cpu": cpu_identity(), "topology": topology(), "caches": caches(), "isa": isa(),
        "numa_nodes": numa_nodes(), "mem_total_bytes": mi.get("MemTotal", 0), "thp": thp_mode(),
        "perf_hw_counters": perf_ok, "perf_reason": perf_why,
        "kernel": platform.release(), "python": platform.python_version(),
        "torch": torch.__version__, "onednn": onednn_version(),
        "hinabench": __version__, "git_rev": git_revision(), "host": platform.node(),
    }


MACHINE_ID_ENV = "HINABENCH_MACHINE_ID"


def machine_id(fp: dict | None = None) -> str:
    """A short, stable name for this kind of machine: results are stored per machine.
    $HINABENCH_MACHINE_ID replaces it (a name of letters, digits, '.', '_', '-'): to keep apart the
    results of hosts that are the same kind of machine, or several Ray nodes on one machine."""
    override = os.environ.get(MACHINE_ID_ENV, "").strip()
    if override:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", override):
            from ..errors import UserError
            raise UserError(f"{MACHINE_ID_ENV}={override!r} is not a machine id: use up to 64 letters, "
                            f"digits, '.', '_' or '-' (it names a folder under results/)")
        return override
    fp = fp or fingerprint()
    c = fp["cpu"]
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(c["vendor"], c["vendor"].lower())
    return f"{vendor}-f{c['family']}m{c['model']}-{fp['topology']['threads']}t-{len(fp['numa_nodes'])}n"


def summary(fp: dict | None = None) -> str:
    """The one-line form: for notes and figure captions."""
    fp = fp or fingerprint()
    c, t, i = fp["cpu"], fp["topology"], fp["isa"]
    have = [k for k in ISA_FLAGS if i.get(k)]
    lacks = [k for k in ("avx512f", "avx512_bf16", "amx_tile") if not i.get(k)]
    l3 = fp["caches"].get("L3", 0) >> 20
    return (f"{c['model_name']} (family {c['family']} model {c['model']}), {t['sockets']}S/{t['cores']}C/"
            f"{t['threads']}T, L3 {l3} MiB, ISA {'+'.join(have) or 'none'}"
            + (f" (no {', '.join(lacks)})" if lacks else "")
            + f", {len(fp['numa_nodes'])} NUMA node(s), {fp['mem_total_bytes'] / 2**30:.0f} GiB, THP {fp['thp']}, "
            f"perf hw counters {'yes' if fp['perf_hw_counters'] else 'no'}, linux {fp['kernel']}, "
            f"torch {fp['torch']}, oneDNN {fp['onednn']}, hinabench {fp['hinabench']}@{fp['git_rev']}")


def to_json(fp: dict | None = None) -> str:
    return json.dumps(fp or fingerprint(), indent=2, sort_keys=False)
