"""NUMA: the paper's interleave-aware partitioning (Section 5) and everything it stands on.

- `model`: Equations 3-5 (the interleave function, its periods, each node's local segments, the
  kernel's plan) and the remote-traffic model; pure arithmetic.
- `linux`: the Linux side: mbind / set_mempolicy / get_mempolicy / move_pages through ctypes, memory
  nodes and their CPUs, smaps, and the placement (page size, phase, node set) of a real tensor.
- `experiment`: `check_placement`, the model against the kernel's own answer (`hinabench numa check`).

The public names of these modules are re-exported here: `from hinabench import numa as nm`.
"""
from . import kernel_plan
from .experiment import check_placement
from .linux import (MADV_HUGEPAGE, MADV_NOHUGEPAGE, MAP_ANONYMOUS, MAP_PRIVATE, MPOL_BIND,
                    MPOL_DEFAULT, MPOL_F_ADDR, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_MF_MOVE,
                    MPOL_MF_STRICT, MPOL_MODE_FLAGS, MPOL_NAMES, MPOL_PREFERRED,
                    MPOL_PREFERRED_MANY, MPOL_WEIGHTED_INTERLEAVE, PROT_READ, PROT_WRITE, Placement,
                    Vma, NumaApi, find_vmas, interleave_range, memory_nodes,
                    memory_policy, node_cpus, numa_api, page_nodes, parse_cpulist, parse_smaps, tensor_placement)
from .placement import WeightMatrices, parse_policy, place_tensor, remote_model
from .model import (LAYOUT_ONLY_ELEMENT_BYTES, PAGE_2M, PAGE_4K, PAGE_SIZES, PARTITIONS, KernelPlan, Segment,
                    SegmentPlan, element_size, elements_per_page, interleave_function, interleave_period,
                    local_segments, node_of, parse_page, plan_for_kernel, remote_fraction_model,
                    remote_fraction_model_ffn, tiling_errors, virtual_node_report)
