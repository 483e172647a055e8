"""The Linux side of NUMA: memory policies and page placement through ctypes, and the placement
model of a real tensor.

mbind / set_mempolicy / get_mempolicy / move_pages (libnuma if present, else raw syscalls), the
memory nodes and their CPUs, /proc/self/smaps parsing, and `tensor_placement`: which NUMA node holds
each page of a tensor when its pages are interleaved (`numactl --interleave=all`, or
`mbind`/`set_mempolicy` with MPOL_INTERLEAVE). What Linux does (mm/mempolicy.c, `get_vma_policy` +
`interleave_nid`, v6.7 and later; before 6.7 the same arithmetic sat in `interleave_nid` +
`offset_il_node`):

    ilx  = (vma->vm_pgoff >> order) + ((addr - vma->vm_start) >> (PAGE_SHIFT + order))
    node = the (ilx mod n)-th node of the policy's node set

For a private anonymous mapping `vm_pgoff = vm_start >> PAGE_SHIFT` (mm/mmap.c, do_mmap: "Set
pgoff according to addr for anon_vma"), so with 4 KiB pages (order 0) `ilx = addr >> 12`: the
node depends only on the address. With transparent huge pages the folio order is 9, the
granularity is 2 MiB, and `ilx` counts 2 MiB folios from `vm_pgoff >> 9` (which equals
`addr >> 21` only when the VMA starts 2 MiB-aligned; we use the kernel's formula, not the
shortcut). The model takes both exactly: a page size and an address *phase* per tensor.
Not modelled, but detected and reported (`Placement.valid = False` and a reason):
file-backed mappings (page-cache pages come from the task policy's round-robin counter,
`interleave_nodes()`: by allocation order, not by address), shmem/memfd/shared-anonymous
mappings (`ilx` is biased by the inode number), weighted interleave, a tensor spanning two
VMAs, a mix of 4 KiB and 2 MiB pages, and any policy that is not interleave.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable

from .model import PAGE_2M, PAGE_4K
from ..machine.cpuinfo import parse_cpulist  # the one CPU-list parser

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE = 5, 6
MPOL_NAMES = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local",
              5: "preferred-many", 6: "weighted-interleave"}
MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)   # STATIC_NODES, RELATIVE_NODES, NUMA_BALANCING
MPOL_F_ADDR = 1 << 1
MPOL_MF_STRICT = 1 << 0
MPOL_MF_MOVE = 1 << 1
# mmap / madvise, for buffers placed by hand (check_placement, the tests)
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
_MASK_WORDS = 16                                  # 1024 node bits, >= any MAX_NUMNODES we meet
_SYSCALLS = {"x86_64": {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "move_pages": 279},
             "aarch64": {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "move_pages": 239}}


def memory_nodes() -> list[int]:
    """Nodes with memory that this process may allocate on (what --interleave=all uses)."""
    try:
        with open("/sys/devices/system/node/has_memory") as f:
            nodes = parse_cpulist(f.read())
    except OSError:
        return [0]
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^Mems_allowed_list:\s*(\S+)", f.read(), re.M)
        if m:
            allowed = set(parse_cpulist(m.group(1)))
            nodes = [n for n in nodes if n in allowed] or nodes
    except OSError:
        pass
    return nodes


def node_cpus(node: int) -> list[int]:
    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return parse_cpulist(f.read())


class NumaApi:
    """mbind / set_mempolicy / get_mempolicy / move_pages through libnuma if present, else syscall."""

    def __init__(self, use_libnuma: bool = True):
        self.libc = ctypes.CDLL(None, use_errno=True)
        # mmap / munmap / madvise for the buffers `check_placement` (and the tests) place by hand
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.nr = _SYSCALLS.get(platform.machine())
        self.libnuma = None
        if use_libnuma:
            name = ctypes.util.find_library("numa") or "libnuma.so.1"
            try:
                self.libnuma = ctypes.CDLL(name, use_errno=True)
            except OSError:
                pass
        self.via = "libnuma" if self.libnuma is not None else "syscall"
        if self.libnuma is None and self.nr is None:
            raise OSError(f"no libnuma and no syscall numbers for {platform.machine()}")

    def _call(self, name: str, *args) -> int:
        if self.libnuma is not None:
            fn = getattr(self.libnuma, name)
            fn.restype = ctypes.c_long
            r = fn(*args)
        else:
            self.libc.syscall.restype = ctypes.c_long
            r = self.libc.syscall(ctypes.c_long(self.nr[name]), *args)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"{name}: {os.strerror(e)}")
        return r

    @staticmethod
    def mask(nodes: Iterable[int]):
        m = (ctypes.c_ulong * _MASK_WORDS)()
        for n in nodes:
            m[n // 64] |= 1 << (n % 64)
        return m

    def mbind(self, addr: int, length: int, mode: int, nodes: Iterable[int], flags: int = 0) -> None:
        # maxnode: the kernel drops the last bit (get_nodes: --maxnode), as numactl passes max+2.
        self._call("mbind", ctypes.c_void_p(addr), ctypes.c_ulong(length), ctypes.c_int(mode),
                   self.mask(nodes), ctypes.c_ulong(_MASK_WORDS * 64), ctypes.c_uint(flags))

    def set_mempolicy(self, mode: int, nodes: Iterable[int] = ()) -> None:
        nodes = list(nodes)
        self._call("set_mempolicy", ctypes.c_int(mode), self.mask(nodes) if nodes else None,
                   ctypes.c_ulong(_MASK_WORDS * 64 if nodes else 0))

    def get_mempolicy(self, addr: int | None = None) -> tuple[int, list[int]]:
        mode = ctypes.c_int(0)
        m = (ctypes.c_ulong * _MASK_WORDS)()
        self._call("get_mempolicy", ctypes.byref(mode), m, ctypes.c_ulong(_MASK_WORDS * 64),
                   ctypes.c_void_p(addr or 0), ctypes.c_ulong(MPOL_F_ADDR if addr else 0))
        nodes = [w * 64 + b for w in range(_MASK_WORDS) for b in range(64) if m[w] >> b & 1]
        return mode.value & ~MPOL_MODE_FLAGS, nodes

    def move_pages_query(self, addrs: list[int]) -> list[int]:
        """move_pages(0, n, pages, nodes=NULL, status, 0): each page's node, or -errno."""
        n = len(addrs)
        pages = (ctypes.c_void_p * n)(*addrs)
        status = (ctypes.c_int * n)()
        self._call("move_pages", ctypes.c_int(0), ctypes.c_ulong(n), pages, None, status,
                   ctypes.c_int(0))
        return list(status)


_numa_api: NumaApi | None = None


def numa_api() -> NumaApi:
    global _numa_api
    if _numa_api is None:
        _numa_api = NumaApi()
    return _numa_api


@contextmanager
def memory_policy(policy: str, nodes: Iterable[int] | None = None):
    """Set this thread's memory policy for the allocations inside the block, then restore the
    previous one: policy "interleave" (numactl --interleave), "bind" (--membind) or "default"
    (first touch). Allocations made by other threads are not affected (set_mempolicy is per task).
    """
    modes = {"interleave": MPOL_INTERLEAVE, "bind": MPOL_BIND, "default": MPOL_DEFAULT}
    if policy not in modes:
        raise ValueError(f"unknown memory policy '{policy}'; known: {', '.join(modes)}")
    api = numa_api()
    old_mode, old_nodes = api.get_mempolicy(None)
    nodes = list(nodes) if nodes is not None else memory_nodes()
    api.set_mempolicy(modes[policy], nodes if policy != "default" else ())
    try:
        yield
    finally:
        api.set_mempolicy(old_mode, old_nodes if old_mode not in (MPOL_DEFAULT, MPOL_LOCAL) else ())


def interleave_range(address: int, nbytes: int, nodes: Iterable[int] | None = None) -> None:
    """mbind(MPOL_INTERLEAVE) over the pages of [address, address + nbytes): a VMA policy, so it
    holds whichever thread first touches the pages (a task policy from memory_policy() holds only
    for the calling thread -- OpenMP workers filling a tensor would place it by first touch).
    Pages already present are migrated (MPOL_MF_MOVE). Call between allocation and first touch.
    """
    start = address // PAGE_4K * PAGE_4K
    end = (address + nbytes + PAGE_4K - 1) // PAGE_4K * PAGE_4K
    numa_api().mbind(start, end - start, MPOL_INTERLEAVE,
                     list(nodes) if nodes is not None else memory_nodes(), MPOL_MF_MOVE)


def huge_pages_range(address: int, nbytes: int, collapse: bool = False) -> str:
    """Ask for transparent huge pages over the 2 MiB-aligned interior of [address, address + nbytes)
    (madvise MADV_HUGEPAGE: what THP's `madvise` mode waits for; the edges stay 4 KiB). Before the
    first touch that is enough: the faults allocate 2 MiB pages. For pages already present,
    `collapse` also asks MADV_COLLAPSE (Linux 6.1+) to copy them into huge pages now.
    Returns "" on success, else why not (no THP here, a refused madvise): best effort, stated."""
    start = (address + PAGE_2M - 1) // PAGE_2M * PAGE_2M
    end = (address + nbytes) // PAGE_2M * PAGE_2M
    if end <= start:
        return "smaller than one 2 MiB page"
    libc = numa_api().libc
    if libc.madvise(start, end - start, MADV_HUGEPAGE) != 0:
        return f"madvise(MADV_HUGEPAGE) failed: {os.strerror(ctypes.get_errno())}"
    if collapse and libc.madvise(start, end - start, MADV_COLLAPSE) != 0:
        return f"madvise(MADV_COLLAPSE) failed: {os.strerror(ctypes.get_errno())}"
    return ""


def huge_pages_ranges(ranges: Iterable[tuple[int, int]], collapse: bool = True) -> str:
    """huge_pages_range over (address, nbytes) pairs (a peer's buffers, filled already: collapse).
    "" when every range of at least one 2 MiB page was advised, else the first reason one was not."""
    why = ""
    for address, nbytes in ranges:
        w = huge_pages_range(address, nbytes, collapse=collapse)
        if w and w != "smaller than one 2 MiB page":
            why = why or w
    return why


def huge_fraction(ranges: Iterable[tuple[int, int]], smaps_text: str | None = None) -> float:
    """The share of the bytes of `ranges` ((address, nbytes) pairs) that sit on transparent huge pages,
    from smaps: each VMA's AnonHugePages, spread over the part of the VMA the ranges cover (exact
    when a range's VMA holds nothing else on huge pages, as a weight tensor's own mmap does)."""
    vmas = parse_smaps(smaps_text)
    total = huge = 0
    for address, nbytes in ranges:
        total += nbytes
        for v in vmas:
            lo, hi = max(v.start, address), min(v.end, address + nbytes)
            if hi <= lo:
                continue
            thp = v.fields.get("AnonHugePages", 0)
            rss = v.fields.get("Rss", 0)
            if isinstance(thp, int) and isinstance(rss, int) and rss:
                huge += (hi - lo) * min(1.0, thp / rss)
    return huge / total if total else 0.0


def page_nodes(addresses: list[int]) -> list[int]:
    """The kernel's answer: the node of the page at each address (move_pages, no target nodes).
    Negative values are -errno (-ENOENT: page not present, -EFAULT: not mapped)."""
    out: list[int] = []
    api = numa_api()
    for i in range(0, len(addresses), 65536):
        out.extend(api.move_pages_query(addresses[i:i + 65536]))
    return out


@dataclass
class Vma:
    start: int
    end: int
    perms: str
    offset: int
    path: str
    fields: dict = field(default_factory=dict)    # smaps "Key: value kB" lines, in bytes


def parse_smaps(smaps_text: str | None = None) -> list[Vma]:
    """Every VMA of /proc/self/smaps (header line plus its "Key: value" fields)."""
    if smaps_text is None:
        with open("/proc/self/smaps") as f:
            smaps_text = f.read()
    vmas: list[Vma] = []
    for line in smaps_text.splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) \S+ \d+\s*(.*)$", line)
        if m:
            vmas.append(Vma(int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                            int(m.group(4), 16), m.group(5).strip()))
            continue
        if vmas:
            k, _, v = line.partition(":")
            v = v.strip()
            vmas[-1].fields[k] = int(v[:-3]) * 1024 if v.endswith(" kB") else v
    return vmas


def find_vmas(address: int, nbytes: int, smaps_text: str | None = None) -> list[Vma]:
    """The VMAs covering [address, address + nbytes), in order; [] if any byte is unmapped."""
    out: list[Vma] = []
    end = address + max(nbytes, 1)
    for v in parse_smaps(smaps_text):
        if v.end > address and v.start < end:
            out.append(v)
    covered = address
    for v in out:
        if v.start > covered:
            return []
        covered = max(covered, v.end)
    return out if covered >= end else []


@dataclass(frozen=True)
class Placement:
    """How a tensor's bytes are placed, as far as the model can say (see the module docstring)."""
    address: int
    nbytes: int
    page_bytes: int
    phase: int                        # bytes: tensor start within the cycle of len(node_ids) pages
    node_ids: tuple[int, ...]         # policy node set; model node index i is node_ids[i]
    policy: str
    backing: str                      # anonymous-private | file | shmem | unknown
    valid: bool                       # placement_model_valid
    reason: str = ""
    vm_start: int = 0
    vm_pgoff: int = 0

    def interleave_index(self, addr: int) -> int:
        """mm/mempolicy.c get_vma_policy: (vm_pgoff >> order) + ((addr - vm_start) >> shift),
        at the folio's aligned address (a THP fault allocates at addr & HPAGE_PMD_MASK)."""
        shift = self.page_bytes.bit_length() - 1
        order = shift - 12
        folio = addr & ~(self.page_bytes - 1)
        return (self.vm_pgoff >> order) + ((folio - self.vm_start) >> shift)

    def model_node(self, addr: int) -> int:
        """interleave_nid: the (ilx mod n)-th node of the policy's node set."""
        return self.node_ids[self.interleave_index(addr) % len(self.node_ids)]

    def as_row(self) -> dict:
        return {"placement_model_valid": self.valid, "placement_reason": self.reason,
                "placement_page_bytes": self.page_bytes, "placement_phase": self.phase,
                "placement_nodes": ",".join(map(str, self.node_ids)),
                "placement_policy": self.policy, "placement_backing": self.backing}


def _effective_policy(address: int) -> tuple[str, list[int], str]:
    """(policy name, node set, note): the VMA's policy (mbind) if any, else the task's (numactl)."""
    try:
        api = numa_api()
        mode, nodes = api.get_mempolicy(address)
        src = "vma"
        if mode == MPOL_DEFAULT:
            mode, nodes = api.get_mempolicy(None)
            src = "task"
    except OSError as e:
        return "unknown", [], f"get_mempolicy failed: {e}"
    return MPOL_NAMES.get(mode, f"mode-{mode}"), nodes, src


def tensor_placement(address: int, nbytes: int, smaps_text: str | None = None,
                     policy: tuple[str, list[int]] | None = None) -> Placement:
    """Detect, for a tensor at [address, address + nbytes), the page size, phase and node set of
    its interleaving, or say why the address model does not apply. Call after the pages are
    touched (the page size is read from smaps) and while the policy that placed them is in force
    (a task policy set by memory_policy() is gone after its block), or pass `policy` =
    (name, node set) as it was at allocation. `smaps_text` is for tests."""
    vmas = find_vmas(address, nbytes, smaps_text)
    if policy is None:
        pols = {(pol, tuple(ns)) for pol, ns, _ in
                (_effective_policy(max(v.start, address)) for v in vmas)}
        pol, nodes = (next(iter(pols)) if len(pols) == 1 else ("mixed", ()))
        nodes = list(nodes)
    else:
        pol, nodes = policy
    nodes = nodes or memory_nodes()
    base = dict(address=address, nbytes=nbytes, node_ids=tuple(nodes), policy=pol)

    def invalid(reason: str, backing: str = "unknown", page: int = PAGE_4K) -> Placement:
        return Placement(page_bytes=page, phase=address % (page * len(nodes)), backing=backing,
                         valid=False, reason=reason, **base)

    if not vmas:
        return invalid("tensor not (wholly) mapped according to /proc/self/smaps")
    for vma in vmas:
        path = vma.path
        shared = vma.perms[3:4] == "s"
        if path.startswith(("/memfd:", "/SYSV", "/dev/zero", "/dev/shm")) or \
                (shared and not path.startswith("/")):
            return invalid("shmem/memfd/shared-anonymous mapping: the interleave index is biased "
                           "by the inode number, not modelled", "shmem")
        if path.startswith("/"):
            return invalid(f"file-backed mapping ({path}): page-cache pages are interleaved "
                           "round-robin by allocation order, not by address", "file")
    if pol == "mixed":
        return invalid("the tensor's VMAs have different memory policies", "anonymous-private")
    if pol == "weighted-interleave":
        return invalid("weighted interleave: nodes get pages in proportion to their weights, "
                       "not modelled", "anonymous-private")
    if pol != "interleave":
        return invalid(f"memory policy is '{pol}', not interleave: the interleave model does "
                       "not apply (first touch / bind decide)", "anonymous-private")
    thps = [v.fields.get("AnonHugePages", 0) for v in vmas]
    thps = [t if isinstance(t, int) else 0 for t in thps]
    if any(thps) and len(vmas) > 1:
        return invalid("transparent huge pages in a tensor spanning several VMAs: the 2 MiB "
                       "interleave index restarts per VMA", "anonymous-private")
    # Private anonymous VMAs (mmap, brk) have vm_pgoff = vm_start >> 12 and keep it linear across
    # splits and merges, so with 4 KiB pages ilx = addr >> 12 even across VMA boundaries.
    vma = vmas[0]
    thp, rss = vma.fields.get("AnonHugePages", 0), vma.fields.get("Rss", 0)
    if isinstance(thp, str) or isinstance(rss, str):
        thp, rss = 0, 0
    if thp == 0:
        page = PAGE_4K
    else:
        lo = (vma.start + PAGE_2M - 1) // PAGE_2M * PAGE_2M
        hi = vma.end // PAGE_2M * PAGE_2M
        inside = lo <= address and address + nbytes <= hi
        if inside and thp >= hi - lo:
            page = PAGE_2M
        else:
            return invalid(f"mixed page sizes: {thp // 1024} KiB of {rss // 1024} KiB resident "
                           "in the VMA are transparent huge pages", "anonymous-private")
    pgoff = vma.start >> 12          # private anonymous: vm_pgoff = vm_start >> PAGE_SHIFT
    p = Placement(page_bytes=page, phase=0, backing="anonymous-private", valid=True,
                  reason="", vm_start=vma.start, vm_pgoff=pgoff, **base)
    n = len(nodes)
    phase = (p.interleave_index(address) % n) * page + address % page
    return Placement(page_bytes=page, phase=phase, backing="anonymous-private", valid=True,
                     reason="", vm_start=vma.start, vm_pgoff=pgoff, **base)
