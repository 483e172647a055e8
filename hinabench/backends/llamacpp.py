"""`llamacpp:*`: llama.cpp's MoE FFN as ggml runs it, in the `llamacpp` environment.

llama-cpp-python, built from source for this CPU, carries libggml*; this adapter calls ggml's C API
through ctypes (no llama model, no GGUF file): the graph llama.cpp builds for a MoE FFN —
MUL_MAT_ID for gate and up, SiLU(gate) * up, MUL_MAT_ID for down, each slot's output scaled by its
routing weight and the slots added — computed on ggml's CPU backend with `threads` threads.
- `llamacpp:bf16`  expert weights as GGML_TYPE_BF16 (a copy in ggml's memory: counted in extra_bytes)
- `llamacpp:q8_0`  expert weights quantised to Q8_0 with ggml_quantize_chunk (validated against the
                   BF16 reference like every row; Q8_0 reads ~53% of BF16's bytes, and the roofline
                   column still uses the problem's BF16 bytes, so its %bw can exceed what BF16 could)
Unlike llama.cpp's test-backend-ops, which reuses the same experts every iteration (in cache at
Qwen3-30B-A3B's shape), calls rotate over the problem's weight groups (one graph per group).
"""
from __future__ import annotations

from . import register
from ..worker.proxy import WorkerBackend


class _LlamaCpp(WorkerBackend):
    env_name = "llamacpp"
    module = "llamacpp"
    packages = ("llama-cpp-python", "torch")


@register
class LlamaCppBf16(_LlamaCpp):
    name = "llamacpp:bf16"
    variant = "bf16"
    description = "llama.cpp/ggml MUL_MAT_ID MoE FFN on BF16 experts (CPU backend, via ggml's C API)"


@register
class LlamaCppQ8(_LlamaCpp):
    name = "llamacpp:q8_0"
    variant = "q8_0"
    weight_bytes_factor = 34 / 64   # Q8_0: 32 int8 + one fp16 scale per 32 weights, vs 64 bytes of BF16
    description = "llama.cpp/ggml MUL_MAT_ID MoE FFN on Q8_0-quantised experts (CPU backend, via ggml's C API)"
    extra_copy_factor = 0.6


# ---- worker side ----------------------------------------------------------------------------------
GGML_TYPE = {"f32": 0, "q8_0": 8, "i32": 26, "bf16": 30}


def _libs():
    """ggml's libraries from the llama_cpp package (loaded RTLD_GLOBAL: base, then cpu)."""
    import ctypes
    import glob
    import os
    import llama_cpp
    root = os.path.dirname(llama_cpp.__file__)
    found = {}
    for name in ("ggml-base", "ggml-cpu", "ggml"):
        hits = sorted(glob.glob(os.path.join(root, "**", f"lib{name}.so*"), recursive=True))
        if hits:
            found[name] = ctypes.CDLL(hits[0], mode=ctypes.RTLD_GLOBAL)
    if "ggml-base" not in found and "ggml" not in found:
        raise RuntimeError(f"no libggml*.so under {root}")
    return found


class _Api:
    """ggml's C functions through ctypes: the FFN graph's here, others bound with fn() (attention)."""

    def __init__(self):
        import ctypes as C
        self.libs = _libs()

        class InitParams(C.Structure):
            _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]
        self.InitParams = InitParams
        fn = self.fn
        P, I64 = C.c_void_p, C.c_int64
        self.init = fn("ggml_init", P, InitParams)
        self.free = fn("ggml_free", None, P)
        self.new_2d = fn("ggml_new_tensor_2d", P, P, C.c_int, I64, I64)
        self.new_3d = fn("ggml_new_tensor_3d", P, P, C.c_int, I64, I64, I64)
        self.mul_mat_id = fn("ggml_mul_mat_id", P, P, P, P, P)
        self.silu = fn("ggml_silu", P, P, P)
        self.mul = fn("ggml_mul", P, P, P, P)
        self.add = fn("ggml_add", P, P, P, P)
        self.view_2d = fn("ggml_view_2d", P, P, P, I64, I64, C.c_size_t, C.c_size_t)
        self.new_graph = fn("ggml_new_graph", P, P)
        self.build = fn("ggml_build_forward_expand", None, P, P)
        self.compute = fn("ggml_graph_compute_with_ctx", C.c_int, P, P, C.c_int)
        self.get_data = fn("ggml_get_data", P, P)
        self.nbytes = fn("ggml_nbytes", C.c_size_t, P)
        self.row_size = fn("ggml_row_size", C.c_size_t, C.c_int, I64)
        self.quantize = fn("ggml_quantize_chunk", C.c_size_t, C.c_int, P, P, I64, I64, I64, P)
        try:
            fn("ggml_cpu_init", None)()
        except RuntimeError:
            pass
        # run_graph: a plan and work buffer per (graph, threads); None where this ggml has no ggml_graph_plan
        self._plans: dict = {}
        self._plan_fn = self._graph_compute = None
        if self.has("ggml_graph_plan"):
            class CPlan(C.Structure):   # ggml-cpu.h's struct ggml_cplan
                _fields_ = [("work_size", C.c_size_t), ("work_data", C.c_void_p), ("n_threads", C.c_int),
                            ("threadpool", C.c_void_p), ("abort_callback", C.c_void_p),
                            ("abort_callback_data", C.c_void_p), ("use_ref", C.c_bool)]
            self._plan_fn = fn("ggml_graph_plan", CPlan, P, C.c_int, P)
            self._graph_compute = fn("ggml_graph_compute", C.c_int, P, C.POINTER(CPlan))

    def fn(self, name, res, *args):
        """ggml's function `name` with its ctypes result and argument types (RuntimeError if absent)."""
        for lib in self.libs.values():
            f = getattr(lib, name, None)
            if f is not None:
                f.restype, f.argtypes = res, list(args)
                return f
        raise RuntimeError(f"ggml has no {name}")

    def run_graph(self, ctx, graph, threads: int) -> int:
        """Compute `graph` on `threads` threads with a work buffer planned once per graph and kept here.
        (ggml_graph_compute_with_ctx would allocate a fresh work buffer in the context on every call:
        a timed loop of thousands of calls runs the context's pool dry.)"""
        import ctypes as C
        if self._plan_fn is None:
            return self.compute(ctx, graph, threads)
        key = (graph, threads)
        if key not in self._plans:
            plan = self._plan_fn(graph, threads, None)
            buf = C.create_string_buffer(max(1, int(plan.work_size)) + 64)
            plan.work_data = C.addressof(buf)
            self._plans[key] = (plan, buf)
        plan, _ = self._plans[key]
        return self._graph_compute(graph, C.byref(plan))

    def overhead(self, tensors: int, graphs: int) -> int:
        """Bytes a context needs beyond tensor data: `tensors` tensor objects and `graphs` default graphs."""
        import ctypes as C
        t = self.fn("ggml_tensor_overhead", C.c_size_t)()
        g = self.fn("ggml_graph_overhead", C.c_size_t)()
        return tensors * (t + 64) + graphs * g

    def has(self, name: str) -> bool:
        return any(getattr(lib, name, None) is not None for lib in self.libs.values())


class LlamaCppPeer:
    def __init__(self, variant: str, threads: int):
        self.variant, self.threads = variant, threads
        self.ctx = None

    def prepare(self, data) -> None:
        import ctypes
        import torch
        from ..worker.protocol import PeerUnsupported
        if self.variant not in ("bf16", "q8_0"):
            raise PeerUnsupported(f"llamacpp has no variant '{self.variant}'")
        p, E, G = data.problem, data.num_experts, data.groups
        H, I, T, A = p.H, p.I, p.T, p.A
        if self.variant == "q8_0" and (H % 32 or I % 32):
            raise PeerUnsupported(f"Q8_0 needs rows divisible by 32 (H={H}, I={I})")
        api = self.api = _Api()
        wt = GGML_TYPE[self.variant]
        wbytes = E * (2 * I * api.row_size(wt, H) + H * api.row_size(wt, I))
        act = 4 * T * (H + 4 * A * I + 3 * A * H) * G
        mem = wbytes + act + api.overhead(6 + G * (8 + 2 * A), G) + (64 << 20)
        self.ctx = api.init(api.InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate {mem} bytes")
        ctx = self.ctx
        self.gate = api.new_3d(ctx, wt, H, I, E)
        self.up = api.new_3d(ctx, wt, H, I, E)
        self.down = api.new_3d(ctx, wt, I, H, E)
        for dst, src in ((self.gate, data.w_gate), (self.up, data.w_up), (self.down, data.w_down)):
            self._fill(dst, src, wt)
        self.weight_bytes = sum(api.nbytes(t) for t in (self.gate, self.up, self.down))
        # input [H, 1, T] f32 (shared by every expert slot), like llama.cpp's build_moe_ffn
        self.x = api.new_3d(ctx, GGML_TYPE["f32"], H, 1, T)
        xf = data.x.float().contiguous()
        ctypes.memmove(api.get_data(self.x), xf.data_ptr(), xf.numel() * 4)
        self.graphs, self.outs, self.keep = [], [], []
        for g in range(G):
            ids = api.new_2d(ctx, GGML_TYPE["i32"], A, T)
            idt = data.topk_ids[g].to(torch.int32).contiguous()
            ctypes.memmove(api.get_data(ids), idt.data_ptr(), idt.numel() * 4)
            w = api.new_3d(ctx, GGML_TYPE["f32"], 1, A, T)
            wtn = data.topk_weights.float().contiguous()
            ctypes.memmove(api.get_data(w), wtn.data_ptr(), wtn.numel() * 4)
            gate = api.mul_mat_id(ctx, self.gate, self.x, ids)          # [I, A, T]
            up = api.mul_mat_id(ctx, self.up, self.x, ids)
            h = api.mul(ctx, api.silu(ctx, gate), up)
            y = api.mul_mat_id(ctx, self.down, h, ids)                  # [H, A, T]
            y = api.mul(ctx, y, w)
            out = None
            for k in range(A):                                         # sum over the A slots
                v = api.view_2d(ctx, y, H, T, H * A * 4, k * H * 4)
                out = v if out is None else api.add(ctx, out, v)
            gf = api.new_graph(ctx)
            api.build(gf, out)
            self.graphs.append(gf)
            self.outs.append(out)
            self.keep.append((idt, wtn))
        self.T, self.H = T, H
        self.shape = {"E": E, "A": A, "G": G}

    def _fill(self, dst, src, wt) -> None:
        """Copy [E, rows, cols] bf16 weights into a ggml tensor, as BF16 or quantised to Q8_0."""
        import ctypes
        import torch
        api = self.api
        base = api.get_data(dst)
        E, rows, cols = src.shape
        row_bytes = api.row_size(wt, cols)
        for e in range(E):
            if wt == GGML_TYPE["bf16"]:
                m = src[e].contiguous()
                ctypes.memmove(base + e * rows * row_bytes, m.data_ptr(), rows * cols * 2)
            else:
                step = max(1, (32 << 20) // (cols * 4))
                for r0 in range(0, rows, step):
                    f = src[e, r0:r0 + step].float().contiguous()
                    # start=0: ggml offsets both src and dst by `start`; we hand it the chunk itself
                    api.quantize(wt, f.data_ptr(), base + (e * rows + r0) * row_bytes, 0, f.shape[0], cols, None)

    def run(self, group: int):
        import ctypes
        import torch
        rc = self.api.run_graph(self.ctx, self.graphs[group], self.threads)
        if rc != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned status {rc}")
        out = torch.empty(self.T, self.H, dtype=torch.float32)
        ctypes.memmove(out.data_ptr(), self.api.get_data(self.outs[group]), self.T * self.H * 4)
        return out.to(torch.bfloat16)

    def buffers(self):
        """What the kernel reads: ggml's copies of each group's experts."""
        api, d = self.api, self.shape
        out = []
        for t in (self.gate, self.up, self.down):
            per = api.nbytes(t) // d["E"]
            out += [(api.get_data(t) + g * d["A"] * per, d["A"] * per) for g in range(d["G"])]
        return out

    def extra_bytes(self) -> int:
        return int(self.weight_bytes)

    def versions(self) -> dict:
        return {"ggml_weight_type": self.variant}

    def close(self) -> None:
        if self.ctx:
            self.api.free(self.ctx)
            self.ctx = None


def make_peer(variant: str, threads: int) -> LlamaCppPeer:
    return LlamaCppPeer(variant, threads)
