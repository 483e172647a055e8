"""Weights under page interleaving, and the paper's interleave-aware task partitioning (Section 5).

Two halves:

1. **The placement model** -- which NUMA node holds each element of a weight tensor when its pages
   are interleaved (`numactl --interleave=all`, or `mbind`/`set_mempolicy` with MPOL_INTERLEAVE).
   What Linux does (mm/mempolicy.c, `get_vma_policy` + `interleave_nid`, v6.7 and later; before
   6.7 the same arithmetic sat in `interleave_nid` + `offset_il_node`):

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

2. **Local segments** -- Equations 3-5, generalised from the paper's assumptions (4 KiB pages of
   2,048 bf16 elements, a tensor starting on a page of node 0) to any element size, page size and
   phase. A segment `(x, y_start, y_end)` is the part of row x of a row-major `[N, K]` weight that
   lies in one page; y_end is exclusive (the paper writes `(0, 0~2047)` for our `(0, 0, 2048)`).

Node *indices* 0..n-1 (the paper's id_numa) index the policy's node set in ascending order; with
`--interleave=all` on a two-socket machine index i is node i. `Placement.node_ids` maps them back.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import platform
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterable, NamedTuple

PAGE_4K = 4096
PAGE_2M = 2 * 1024 * 1024
PAGE_SIZES = {"4k": PAGE_4K, "2m": PAGE_2M}
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "int8": 1, "fp32": 4}
PARTITIONS = ("hina", "row-split", "per-node-copy", "tp-split")


class Segment(NamedTuple):
    """Data segment (x, y_start ~ y_end) of Section 5.2; y_end exclusive."""
    x: int
    y_start: int
    y_end: int


# ---------------------------------------------------------------------------------------------
# Section 5.2: the placement function and its periods
# ---------------------------------------------------------------------------------------------

def elements_per_page(page_bytes: int = PAGE_4K, elem_bytes: int = 2) -> int:
    """Elements per page: the paper's 2,048 (4 KiB / 2-byte bf16)."""
    if page_bytes <= 0 or elem_bytes <= 0 or page_bytes % elem_bytes:
        raise ValueError(f"a page of {page_bytes} B does not hold whole {elem_bytes}-byte elements")
    return page_bytes // elem_bytes


def _validate(N: int, K: int, elem_bytes: int, nodes: int, page_bytes: int, phase: int) -> int:
    """Check the arguments; return the phase in elements, reduced into [0, E * nodes)."""
    if N < 1 or K < 1:
        raise ValueError(f"weight shape must be positive (got N={N}, K={K})")
    if nodes < 1:
        raise ValueError(f"need at least one NUMA node (got {nodes})")
    E = elements_per_page(page_bytes, elem_bytes)
    if phase < 0 or phase % elem_bytes:
        raise ValueError(f"phase must be a non-negative multiple of the element size "
                         f"{elem_bytes} B (got {phase})")
    return (phase // elem_bytes) % (E * nodes)


def interleave_function(x: int, y: int, K: int, nodes: int, elem_bytes: int = 2,
                        page_bytes: int = PAGE_4K, phase: int = 0) -> int:
    """Eq. 3: f(x, y) = (phase + x*K + y) mod (E * N_numa), E elements per page, phase in bytes."""
    E = elements_per_page(page_bytes, elem_bytes)
    return (phase // elem_bytes + x * K + y) % (E * nodes)


def node_of(x: int, y: int, K: int, nodes: int, elem_bytes: int = 2, page_bytes: int = PAGE_4K,
            phase: int = 0) -> int:
    """Eq. 5: element (x, y) is on node index id with id*E <= f(x, y) < (id + 1)*E."""
    E = elements_per_page(page_bytes, elem_bytes)
    return interleave_function(x, y, K, nodes, elem_bytes, page_bytes, phase) // E


def interleave_period(K: int, nodes: int, elem_bytes: int = 2,
                      page_bytes: int = PAGE_4K) -> tuple[int, int]:
    """Eq. 4: (T_x, T_y) = (E*N_numa / gcd(K, E*N_numa), E*N_numa). Independent of the phase.

    f(x + T_x, y) = f(x, y) and f(x, y + T_y) = f(x, y); T_x is the smallest such row period.
    """
    if K < 1 or nodes < 1:
        raise ValueError(f"need K >= 1 and nodes >= 1 (got K={K}, nodes={nodes})")
    cycle = elements_per_page(page_bytes, elem_bytes) * nodes
    return cycle // math.gcd(K, cycle), cycle


def _row_segments(x: int, K: int, nodes: int, E: int, phase_e: int) -> Iterable[tuple[int, Segment]]:
    """Row x cut at page boundaries: (node index, segment) for each piece, left to right."""
    start = phase_e + x * K                      # linear element index of (x, 0) in the cycle
    y = 0
    while y < K:
        page = (start + y) // E
        y_end = min(K, (page + 1) * E - start)
        yield page % nodes, Segment(x, y, y_end)
        y = y_end


@dataclass(frozen=True)
class SegmentPlan:
    """T_x, T_y and each node's segments within the first period of x (Section 5.2's S_index)."""
    N: int
    K: int
    elem_bytes: int
    nodes: int
    page_bytes: int
    phase: int                                    # bytes, reduced into [0, page_bytes * nodes)
    T_x: int
    T_y: int
    segments: tuple[tuple[Segment, ...], ...]     # segments[node index] = ((x, y_start, y_end), ...)

    @property
    def rows_in_period(self) -> int:
        """Rows listed: min(T_x, N) (the paper assumes T_x < N)."""
        return min(self.T_x, self.N)

    def rows_like(self, x: int) -> range:
        """All rows sharing row x's segments: x, x + T_x, x + 2*T_x, ... < N (Eq. 4)."""
        return range(x, self.N, self.T_x)

    def all_segments(self, node: int) -> Iterable[Segment]:
        """Every segment of node `node` over the whole [N, K] weight, by periodicity in x."""
        for s in self.segments[node]:
            for x in self.rows_like(s.x):
                yield Segment(x, s.y_start, s.y_end)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["segments"] = {str(i): [list(s) for s in segs] for i, segs in enumerate(self.segments)}
        return d


def local_segments(N: int, K: int, elem_bytes: int = 2, nodes: int = 2,
                   page_bytes: int = PAGE_4K, phase: int = 0) -> SegmentPlan:
    """Section 5.2 in two steps: the periods (Eq. 4), then each node's segments for x < T_x (Eq. 5).

    `phase` is where the tensor's first byte falls in the interleave cycle of `nodes` pages, in bytes:
    0 is the paper's assumption (the tensor starts at the beginning of a page of node index 0).
    """
    phase_e = _validate(N, K, elem_bytes, nodes, page_bytes, phase)
    E = elements_per_page(page_bytes, elem_bytes)
    T_x, T_y = interleave_period(K, nodes, elem_bytes, page_bytes)           # Eq. 4
    per_node: list[list[Segment]] = [[] for _ in range(nodes)]
    for x in range(min(T_x, N)):                                             # Eq. 5, x in [0, T_x)
        for node, seg in _row_segments(x, K, nodes, E, phase_e):
            per_node[node].append(seg)
    return SegmentPlan(N, K, elem_bytes, nodes, page_bytes, phase_e * elem_bytes, T_x, T_y,
                       tuple(tuple(s) for s in per_node))


@dataclass(frozen=True)
class KernelPlan:
    """What the NUMA-partitioned kernel needs (Algorithm 2): per node, S_index = [(x, y_start,
    y_end), ...] for x < T_x; the kernel walks rows x, x + T_x, ... with the same y-ranges."""
    N: int
    K: int
    T_x: int
    T_y: int
    nodes: int
    page_bytes: int
    phase: int
    elem_bytes: int
    s_index: tuple[tuple[tuple[int, int, int], ...], ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["s_index"] = [[list(s) for s in node] for node in self.s_index]
        return d


def plan_for_kernel(N: int, K: int, nodes: int, page: int | str = PAGE_4K, phase: int = 0,
                    elem_bytes: int = 2) -> KernelPlan:
    """The kernel's input: periods and per-node S_index (plain ints, ready for a C++ binding)."""
    page_bytes = parse_page(page)
    p = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    return KernelPlan(N, K, p.T_x, p.T_y, nodes, page_bytes, p.phase, elem_bytes,
                      tuple(tuple(tuple(s) for s in segs) for segs in p.segments))


def parse_page(page: int | str) -> int:
    if isinstance(page, int):
        if page not in PAGE_SIZES.values():
            raise ValueError(f"page size must be 4 KiB or 2 MiB (got {page} B)")
        return page
    key = str(page).strip().lower()
    if key not in PAGE_SIZES:
        raise ValueError(f"page size must be one of {', '.join(PAGE_SIZES)} (got '{page}')")
    return PAGE_SIZES[key]


def tiling_errors(plan: SegmentPlan) -> list[str]:
    """Empty if the nodes' segments tile [N, K] exactly once; else what is wrong.

    Rows with the same x mod T_x share segments (Eq. 4), so checking x < min(T_x, N) covers all N.
    """
    errors = []
    for x in range(plan.rows_in_period):
        segs = sorted((s for node in plan.segments for s in node if s.x == x), key=lambda s: s[1])
        y = 0
        for s in segs:
            if s.y_start != y or s.y_end <= s.y_start:
                errors.append(f"row {x}: segment {tuple(s)} after y={y}")
            y = max(y, s.y_end)
        if y != plan.K:
            errors.append(f"row {x}: covered up to {y}, not K={plan.K}")
    return errors


# ---------------------------------------------------------------------------------------------
# Remote-traffic model (issue 5, item 5; Figure 15 where counters are missing)
# ---------------------------------------------------------------------------------------------

def _row_node_elements(plan: SegmentPlan) -> list[list[int]]:
    """counts[r][i]: elements of a row with x mod T_x = r that lie on node index i."""
    counts = [[0] * plan.nodes for _ in range(plan.rows_in_period)]
    for i, segs in enumerate(plan.segments):
        for s in segs:
            counts[s.x][i] += s.y_end - s.y_start
    return counts


def _rows_with_residue(r0: int, r1: int, r: int, T: int) -> int:
    """How many x in [r0, r1) have x mod T == r."""
    def upto(n: int) -> int:          # x in [0, n) with x mod T == r
        return 0 if n <= r else (n - r - 1) // T + 1
    return upto(r1) - upto(r0)


def remote_fraction_model(partition: str, N: int, K: int, elem_bytes: int = 2, nodes: int = 2,
                          page_bytes: int = PAGE_4K, phase: int = 0) -> float:
    """Fraction of an [N, K] weight's bytes that the partition's threads read from a remote node.

    - "hina": each node's threads read only their local segments (Section 5.2) -> 0 under the model
      (computed, not assumed: every segment is checked against Eq. 5).
    - "row-split": output rows split evenly across all threads of all nodes in order, as oneDNN and
      IPEX do; node j's threads hold the j-th contiguous block of rows, [floor(jN/n), floor((j+1)N/n)).
    - "per-node-copy" / "tp-split": KTransformers allocates each node's part on that node -> 0.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition '{partition}'; known: {', '.join(PARTITIONS)}")
    plan = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    if partition in ("per-node-copy", "tp-split") or nodes == 1:
        return 0.0
    E = elements_per_page(page_bytes, elem_bytes)
    phase_e = plan.phase // elem_bytes
    remote = 0
    if partition == "hina":
        for j, segs in enumerate(plan.segments):
            for s in segs:
                first = (phase_e + s.x * K + s.y_start) // E % nodes
                last = (phase_e + s.x * K + s.y_end - 1) // E % nodes
                if first != j or last != j:
                    remote += (s.y_end - s.y_start) * len(plan.rows_like(s.x))
    else:  # row-split
        counts = _row_node_elements(plan)
        T = plan.T_x
        for j in range(nodes):
            r0, r1 = j * N // nodes, (j + 1) * N // nodes
            for r, per_node in enumerate(counts):
                rows = _rows_with_residue(r0, r1, r, T)
                remote += rows * (K - per_node[j])
    return remote / (N * K)


def remote_fraction_model_ffn(partition: str, hidden: int, intermediate: int, experts: int = 1,
                              elem_bytes: int = 2, nodes: int = 2, page_bytes: int = PAGE_4K,
                              phase: int = 0) -> float:
    """Byte-weighted remote fraction over an FFN's w13 [E, 2I, H] and w_down [E, H, I] (row-major,
    as hinabench.problem stores them): each expert's matrix is partitioned on its own, at the phase
    its offset in the contiguous storage gives it. w13 starts at `phase`, w_down at phase 0
    (a separate allocation; pass the real phases via tensor_placement for a measured layout)."""
    total = remote = 0.0
    for rows, cols, base in ((2 * intermediate, hidden, phase), (hidden, intermediate, 0)):
        mat = rows * cols * elem_bytes
        for e in range(experts):
            f = remote_fraction_model(partition, rows, cols, elem_bytes, nodes, page_bytes,
                                      base + e * mat)
            remote += f * mat
            total += mat
    return remote / total if total else 0.0


def virtual_node_report(N: int, K: int, nodes: int, elem_bytes: int = 2, page: int | str = PAGE_4K,
                        phase: int = 0) -> dict:
    """The model's side of the virtual-node mode: N virtual nodes on one real node."""
    page_bytes = parse_page(page)
    plan = local_segments(N, K, elem_bytes, nodes, page_bytes, phase)
    errors = tiling_errors(plan)
    return {"virtual_nodes": nodes, "shape": [N, K], "T_x": plan.T_x, "T_y": plan.T_y,
            "segments_per_node": [len(s) for s in plan.segments],
            "tiles_exactly_once": not errors, "tiling_errors": errors[:5],
            "remote_fraction_model_hina": remote_fraction_model("hina", N, K, elem_bytes, nodes,
                                                                page_bytes, phase),
            "remote_fraction_model_row_split": remote_fraction_model("row-split", N, K, elem_bytes,
                                                                     nodes, page_bytes, phase)}


# ---------------------------------------------------------------------------------------------
# Linux: policies, placement of a real address range, and the kernel's answer (move_pages)
# ---------------------------------------------------------------------------------------------

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE = 5, 6
MPOL_NAMES = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local",
              5: "preferred-many", 6: "weighted-interleave"}
MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)   # STATIC_NODES, RELATIVE_NODES, NUMA_BALANCING
MPOL_F_ADDR = 1 << 1
MPOL_MF_STRICT = 1 << 0
_MASK_WORDS = 16                                  # 1024 node bits, >= any MAX_NUMNODES we meet
_SYSCALLS = {"x86_64": {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "move_pages": 279},
             "aarch64": {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "move_pages": 239}}


def _parse_list(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (sysfs and /proc list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def memory_nodes() -> list[int]:
    """Nodes with memory that this process may allocate on (what --interleave=all uses)."""
    try:
        with open("/sys/devices/system/node/has_memory") as f:
            nodes = _parse_list(f.read())
    except OSError:
        return [0]
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^Mems_allowed_list:\s*(\S+)", f.read(), re.M)
        if m:
            allowed = set(_parse_list(m.group(1)))
            nodes = [n for n in nodes if n in allowed] or nodes
    except OSError:
        pass
    return nodes


def node_cpus(node: int) -> list[int]:
    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return _parse_list(f.read())


class _Numa:
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


_numa_api: _Numa | None = None


def numa_api() -> _Numa:
    global _numa_api
    if _numa_api is None:
        _numa_api = _Numa()
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


MPOL_MF_MOVE = 1 << 1


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


def find_vma(address: int, smaps_text: str | None = None) -> Vma | None:
    """The VMA holding `address`."""
    vmas = find_vmas(address, 1, smaps_text)
    return vmas[0] if vmas else None


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


def tensor_segments(address: int, N: int, K: int, elem_bytes: int, nodes: int,
                    page_bytes: int = PAGE_4K, phase: int | None = None) -> SegmentPlan:
    """Each node's element segments for a real tensor: the phase is the address's position in the
    cycle (private anonymous memory in a VMA aligned to the page size), unless given."""
    if phase is None:
        phase = address % (page_bytes * nodes)
    return local_segments(N, K, elem_bytes, nodes, page_bytes, phase)


# ---------------------------------------------------------------------------------------------
# `hinabench numa check`: allocate under MPOL_INTERLEAVE, ask the kernel, compare with the model
# ---------------------------------------------------------------------------------------------

PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15


def check_placement(N: int, K: int, elem_bytes: int = 2, nodes: list[int] | None = None,
                    page: int | str = PAGE_4K, max_mismatches: int = 8) -> dict:
    """Allocate an [N, K] weight (mmap anonymous + mbind MPOL_INTERLEAVE over `nodes`), touch it,
    ask the kernel where every 4 KiB page is (move_pages with nodes=NULL), and compare with the
    placement model. With 2 MiB requested the buffer is 2 MiB-aligned and madvised MADV_HUGEPAGE;
    the page size actually seen is read back from smaps and is what the model uses."""
    page_bytes = parse_page(page)
    nodes = sorted(nodes or memory_nodes())
    nbytes = N * K * elem_bytes
    if N < 1 or K < 1:
        raise ValueError(f"weight shape must be positive (got {N}x{K})")
    api = numa_api()
    libc = api.libc
    length = (nbytes + PAGE_2M - 1) // PAGE_2M * PAGE_2M
    map_len = length + PAGE_2M
    base = libc.mmap(None, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        start = (base + PAGE_2M - 1) // PAGE_2M * PAGE_2M
        libc.madvise(start, length, MADV_HUGEPAGE if page_bytes == PAGE_2M else MADV_NOHUGEPAGE)
        api.mbind(start, length, MPOL_INTERLEAVE, nodes, MPOL_MF_STRICT)
        ctypes.memset(start, 1, nbytes)                                  # first touch: fault in
        placement = tensor_placement(start, nbytes)
        addrs = list(range(start, start + nbytes, PAGE_4K))
        seen = page_nodes(addrs)
        mismatches, absent, by_node = [], 0, {}
        for a, s in zip(addrs, seen):
            if s < 0:
                absent += 1
                continue
            by_node[s] = by_node.get(s, 0) + 1
            want = placement.model_node(a) if placement.valid else None
            if want is not None and s != want and len(mismatches) < max_mismatches:
                mismatches.append({"offset": a - start, "kernel": s, "model": want})
        n_mis = sum(1 for a, s in zip(addrs, seen)
                    if s >= 0 and placement.valid and s != placement.model_node(a))
        return {"shape": [N, K], "elem_bytes": elem_bytes, "bytes": nbytes,
                "nodes": nodes, "page_requested": page_bytes, "page_seen": placement.page_bytes,
                "policy": placement.policy, "numa_api": api.via,
                "pages_checked": len(addrs) - absent, "pages_absent": absent,
                "pages_per_node": {str(k): v for k, v in sorted(by_node.items())},
                "mismatches": n_mis, "first_mismatches": mismatches,
                "placement_model_valid": placement.valid, "placement_reason": placement.reason,
                "phase": placement.phase}
    finally:
        libc.munmap(base, map_len)
