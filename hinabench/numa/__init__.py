"""NUMA: the paper's interleave-aware task partitioning (Section 5) and what it stands on.

- `model`: Equations 3-5 (the interleave function, its periods, each node's local segments,
  KernelPlan / plan_for_kernel) and the remote-traffic model; pure arithmetic.
- `linux`: the Linux side: mbind / set_mempolicy / get_mempolicy / move_pages through ctypes, the
  memory nodes and their CPUs (parse_cpulist), smaps, and the placement (page size, phase, node set)
  of a real tensor (tensor_placement).
- `placement`: the `--numa` policies (parse_policy, huge_policy, place_tensor) and the remote-traffic
  model of a backend's work partition over a problem's weight matrices (remote_model).
- `kernel_plan`: what the NUMA-partitioned kernel receives (setup: plan arrays, node CPUs) and the
  record of its last call; imported as a module (`from hinabench.numa import kernel_plan`).
- `experiment`: check_placement, the model against the kernel's own answer (`hinabench numa check`).

The public names of model, linux, placement and experiment are re-exported here, so
`from hinabench import numa as nm; nm.plan_for_kernel(...)` works. Importing the package does not
import torch (the CLI starts up without it).
"""
from . import kernel_plan
from .experiment import check_placement
from .linux import (MADV_COLLAPSE, MADV_HUGEPAGE, MADV_NOHUGEPAGE, MAP_ANONYMOUS, MAP_PRIVATE,
                    MPOL_BIND, MPOL_DEFAULT, MPOL_F_ADDR, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_MF_MOVE,
                    MPOL_MF_STRICT, MPOL_MODE_FLAGS, MPOL_NAMES, MPOL_PREFERRED,
                    MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE, PROT_READ, PROT_WRITE, NumaApi,
                    Placement, Vma, find_vmas, huge_fraction, huge_pages_range, huge_pages_ranges,
                    interleave_range, memory_nodes, memory_policy, node_cpus, numa_api, page_nodes,
                    parse_cpulist, parse_smaps, tensor_placement)
from .model import (LAYOUT_ONLY_ELEMENT_BYTES, PAGE_2M, PAGE_4K, PAGE_SIZES, PARTITIONS,
                    KernelPlan, Segment, SegmentPlan, element_size, elements_per_page,
                    interleave_function, interleave_period, local_segments, node_of, parse_page,
                    plan_for_kernel, remote_fraction_model, remote_fraction_model_ffn,
                    tiling_errors, virtual_node_report)
from .placement import WeightMatrices, huge_policy, parse_policy, place_tensor, remote_model

__all__ = [
    # model: Equations 3-5 and the remote-traffic model
    "PAGE_4K", "PAGE_2M", "PAGE_SIZES", "PARTITIONS", "LAYOUT_ONLY_ELEMENT_BYTES", "Segment",
    "SegmentPlan", "KernelPlan", "element_size", "elements_per_page", "interleave_function",
    "node_of", "interleave_period", "local_segments", "plan_for_kernel", "parse_page",
    "tiling_errors", "remote_fraction_model", "remote_fraction_model_ffn", "virtual_node_report",
    # linux
    "MPOL_DEFAULT", "MPOL_PREFERRED", "MPOL_BIND", "MPOL_INTERLEAVE", "MPOL_LOCAL",
    "MPOL_PREFERRED_MANY", "MPOL_WEIGHTED_INTERLEAVE", "MPOL_NAMES", "MPOL_MODE_FLAGS",
    "MPOL_F_ADDR", "MPOL_MF_STRICT", "MPOL_MF_MOVE", "PROT_READ", "PROT_WRITE", "MAP_PRIVATE",
    "MAP_ANONYMOUS", "MADV_HUGEPAGE", "MADV_NOHUGEPAGE", "MADV_COLLAPSE", "NumaApi", "numa_api",
    "parse_cpulist",
    "memory_nodes", "node_cpus", "memory_policy", "interleave_range", "page_nodes", "Vma",
    "parse_smaps", "find_vmas", "Placement", "tensor_placement", "huge_pages_range", "huge_pages_ranges",
    "huge_fraction",
    # placement: policies and the remote model
    "parse_policy", "huge_policy", "place_tensor", "WeightMatrices", "remote_model",
    # experiment
    "check_placement",
    # the kernel's side, as a module
    "kernel_plan",
]
