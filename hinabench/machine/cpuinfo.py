"""The one parser of /proc/cpuinfo and the one parser of Linux CPU lists ("0-3,8,10-11")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CpuId:
    vendor: str
    family: int
    model: int
    model_name: str = ""
    flags: frozenset = frozenset()

    def __str__(self) -> str:
        return f"{self.vendor} family {self.family} model {self.model:#x} ({self.model_name})"


def parse_cpuinfo(text: str) -> CpuId:
    """The first processor's vendor_id, cpu family, model (decimal in /proc/cpuinfo) and flags."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if info:
                break
            continue
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    return CpuId(info.get("vendor_id", "unknown"), int(info.get("cpu family", -1) or -1),
                 int(info.get("model", -1) or -1), info.get("model name", ""),
                 frozenset(info.get("flags", "").split()))


def read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]: the sysfs / procfs list format (cpulist, has_memory,
    Mems_allowed_list, Cpus_allowed_list). Raises ValueError for anything else."""
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out
