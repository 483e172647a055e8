// Every pybind11 binding of hinabench's C++ side: the main module `_C` (probes, fills, the HiNa-MoE
// operator) and the emulated builds `_C_amx_emu`, `_C_avx512_emu` (the operator, and the software
// tile unit's own entry points), which compile this file with HINA_EMU_MODULE_NAME set
// (kernels/emu/emulated.cmake). Everything takes raw addresses and sizes; the Python side
// (hinabench/kernels.py, hinabench/probes.py) validates tensors before calling in. No other file
// includes pybind11: the operator itself is plain C++ (ops/moe_ffn.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <optional>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ops/attention.h"
#include "ops/layer.h"
#include "ops/moe_ffn.h"
#include "ops/numa_partition.h"  // numa_stats
#if defined(HINA_EMU_AMX)
#include "emu/tile_emulator.h"
#endif
#if !defined(HINA_EMU_MODULE_NAME)
#include "common.h"
#endif

namespace py = pybind11;
using namespace hina;

namespace {

// A pointer field of MoeCall, seen from Python as an address (int, e.g. tensor.data_ptr()).
template <class T>
void address_field(py::class_<MoeCall>& cls, const char* name, T* MoeCall::*field) {
  cls.def_property(
      name, [field](const MoeCall& c) { return reinterpret_cast<uintptr_t>(c.*field); },
      [field](MoeCall& c, uintptr_t v) { c.*field = reinterpret_cast<T*>(v); });
}

// The HiNa-MoE operator: one argument struct, MoeCall(**fields), then moe_ffn(call).
void register_moe(py::module_& m) {
  // module_local: the main and the emulated modules each bind their own MoeCall in one process
  py::class_<MoeCall> call(m, "MoeCall", py::module_local(),
      "The arguments of one moe_ffn call (see kernels/ops/moe_ffn.h): MoeCall(x=..., T=..., ...); "
      "pointers as addresses, strides in elements. An unknown field name raises AttributeError.");
  call.def(py::init([](const py::kwargs& fields) {
    MoeCall c;
    py::object self = py::cast(&c, py::return_value_policy::reference);
    for (auto item : fields) py::setattr(self, item.first, item.second);
    return c;
  }));
  address_field(call, "x", &MoeCall::x);
  call.def_readwrite("T", &MoeCall::T).def_readwrite("H", &MoeCall::H)
      .def_readwrite("I", &MoeCall::I).def_readwrite("ldx", &MoeCall::ldx);
  address_field(call, "w_gate", &MoeCall::w_gate);
  call.def_readwrite("gate_es", &MoeCall::gate_es).def_readwrite("gate_rs", &MoeCall::gate_rs);
  address_field(call, "w_up", &MoeCall::w_up);
  call.def_readwrite("up_es", &MoeCall::up_es).def_readwrite("up_rs", &MoeCall::up_rs);
  address_field(call, "w_down", &MoeCall::w_down);
  call.def_readwrite("down_es", &MoeCall::down_es).def_readwrite("down_rs", &MoeCall::down_rs)
      .def_readwrite("E", &MoeCall::E);
  address_field(call, "topk_ids", &MoeCall::topk_ids);
  call.def_readwrite("k", &MoeCall::k);
  address_field(call, "topk_weights", &MoeCall::topk_weights);
  address_field(call, "out", &MoeCall::out);
  call.def_readwrite("isa", &MoeCall::isa).def_readwrite("threads", &MoeCall::threads)
      .def_readwrite("numa_nodes", &MoeCall::numa_nodes);
  address_field(call, "mat_plan", &MoeCall::mat_plan);
  address_field(call, "plan_hdr", &MoeCall::plan_hdr);
  address_field(call, "seg_off", &MoeCall::seg_off);
  address_field(call, "segs", &MoeCall::segs);
  call.def_readwrite("node_cpus", &MoeCall::node_cpus);
  // quantized weights (kernels/quant.h): dtype 0 bf16, 1 int8, 2 fp8; scales by address
  call.def_property("dtype", [](const MoeCall& c) { return int(c.dtype); },
                    [](MoeCall& c, int v) {
                      if (v < 0 || v > 2) throw std::invalid_argument("dtype must be 0 (bf16), 1 (int8) or 2 (fp8)");
                      c.dtype = Dtype(v);
                    });
  call.def_readwrite("group", &MoeCall::group);
  address_field(call, "s_gate", &MoeCall::s_gate);
  call.def_readwrite("s_gate_es", &MoeCall::s_gate_es).def_readwrite("s_gate_rs", &MoeCall::s_gate_rs);
  address_field(call, "s_up", &MoeCall::s_up);
  call.def_readwrite("s_up_es", &MoeCall::s_up_es).def_readwrite("s_up_rs", &MoeCall::s_up_rs);
  address_field(call, "s_down", &MoeCall::s_down);
  call.def_readwrite("s_down_es", &MoeCall::s_down_es).def_readwrite("s_down_rs", &MoeCall::s_down_rs);

  m.def("moe_isas", &moe_isas, "The micro-kernels built into this module (not all usable here).");
  m.def(
      "moe_ffn",
      [](const MoeCall& c) {
        py::gil_scoped_release release;
        moe_ffn(c);
      },
      py::arg("call"),
      "HiNa-MoE expert FFN on raw buffers (validated by hinabench.kernels.moe_ffn): topk_ids int32 "
      "[T,k], topk_weights fp32 [T,k], out bf16 [T,H], all contiguous. numa_nodes > 0: Algorithm 2 on "
      "that many nodes with the flat plans (int32 mat_plan [3E], int64 plan_hdr [P,4] = T_x, phase "
      "bytes, page bytes, seg_off base; int32 seg_off, int32 segs [S,3]); node_cpus[j]: CPUs to bind "
      "node j's threads to (empty: no binding). Raises ValueError for bad input.");
  // The weights' fields of `call` are set once by the caller (hinabench.kernels.moe_ffn_prepare); each
  // call brings the tokens' own. int64 ids (what torch.topk returns) are range-checked and narrowed
  // here, in one pass, so the caller runs no torch op on them.
  m.def(
      "moe_ffn_tokens",
      [](const MoeCall& weights, uintptr_t x, int64_t T, int64_t ldx, uintptr_t topk_ids, bool ids_int64,
         int64_t k, uintptr_t topk_weights, uintptr_t out, int threads) {
        MoeCall c = weights;
        c.x = reinterpret_cast<const bf16_t*>(x);
        c.T = T; c.ldx = ldx; c.k = k; c.threads = threads;
        c.topk_weights = reinterpret_cast<const float*>(topk_weights);
        c.out = reinterpret_cast<bf16_t*>(out);
        std::vector<int32_t> narrowed;
        if (ids_int64) {
          const int64_t* ids = reinterpret_cast<const int64_t*>(topk_ids);
          narrowed.resize(size_t(T * k));
          for (int64_t i = 0; i < T * k; ++i) {
            if (ids[i] < 0 || ids[i] >= c.E) throw bad_expert_id(ids[i], c.E);
            narrowed[size_t(i)] = int32_t(ids[i]);
          }
          c.topk_ids = narrowed.data();
        } else {
          c.topk_ids = reinterpret_cast<const int32_t*>(topk_ids);   // range-checked by the operator
        }
        py::gil_scoped_release release;
        moe_ffn(c);
      },
      py::arg("weights"), py::arg("x"), py::arg("T"), py::arg("ldx"), py::arg("topk_ids"), py::arg("ids_int64"),
      py::arg("k"), py::arg("topk_weights"), py::arg("out"), py::arg("threads"),
      "moe_ffn with the weights' fields of `weights` (a MoeCall) and the tokens' given here (validated by "
      "hinabench.kernels.PreparedMoe): topk_ids [T,k] int64 (ids_int64) or int32, contiguous.");
  m.def("moe_numa_debug", [](bool on) { numa_stats().enabled = on; }, py::arg("enabled"),
        "Testing: count, per node, the weight bytes the partitioned kernel reads and check coverage.");
  m.def("moe_numa_stats", [] {
    const NumaStats& st = numa_stats();
    py::dict d;
    d["bytes"] = st.bytes;
    d["remote_bytes"] = st.remote_bytes;
    d["tasks"] = st.tasks;
    d["rows_checked"] = st.rows_checked;
    d["rows_bad"] = st.rows_bad;
    d["first_error"] = st.first_error;
    return d;
  }, "Testing: what the last partitioned call read (with moe_numa_debug(True)).");
  m.def(
      "avx512_blocking",
      [](const std::optional<std::string>& choice) {
        if (choice) set_avx512_blocking(*choice);
        return py::make_tuple(std::string(avx512_blocking()), std::string(avx512_tiles_name()));
      },
      py::arg("choice") = py::none(),
      "The AVX-512 kernels' blocking: auto (Zen 5's on AMD family >= 26, xeon on Intel), default, zen5 "
      "or xeon (the same bits); sets it when given. Returns (the setting, the blocking in effect).");
  m.def("moe_scratch_bytes", &moe_last_scratch_bytes,
        "Scratch bytes (packed I, activations, y rows) the last moe_ffn call used.");
  m.def(
      "linear",
      [](uintptr_t x, int64_t T, int64_t K, int64_t ldx, std::vector<uintptr_t> w, std::vector<int64_t> N,
         std::vector<int64_t> ldw, std::vector<uintptr_t> out, const std::string& isa, int threads) {
        if (w.size() != N.size() || w.size() != ldw.size() || w.size() != out.size())
          throw std::invalid_argument("linear: w, N, ldw and out must have one entry per matrix");
        LinearCall c;
        c.x = reinterpret_cast<const bf16_t*>(x);
        c.T = T; c.K = K; c.ldx = ldx;
        for (size_t i = 0; i < w.size(); ++i)
          c.weights.push_back({reinterpret_cast<const bf16_t*>(w[i]), N[i], ldw[i], reinterpret_cast<bf16_t*>(out[i])});
        c.isa = isa;
        c.threads = threads;
        py::gil_scoped_release release;
        linear(c);
      },
      py::kw_only(), py::arg("x"), py::arg("T"), py::arg("K"), py::arg("ldx"), py::arg("w"), py::arg("N"),
      py::arg("ldw"), py::arg("out"), py::arg("isa"), py::arg("threads"),
      "y_i = x W_i^T on raw buffers (validated by hinabench.kernels.linear / linear_group), keywords only: "
      "x bf16 [T, K] (row stride ldx); per matrix i: W_i bf16 [N_i, K] (row stride ldw_i), out_i bf16 "
      "[T, N_i] contiguous.");
}

// Decode / extend attention (ops/attention.h) on raw buffers; hinabench/kernels.py validates first.
void register_attention(py::module_& m) {
  m.def("attention_isas", &attn_isas, "The attention micro-kernels built into this module.");
  m.def(
      "attention",
      [](uintptr_t q, int64_t q_ts, int64_t q_hs, uintptr_t out, int64_t o_ts, int64_t o_hs, uintptr_t k,
         uintptr_t v, std::vector<int64_t> k_strides, std::vector<int64_t> v_strides, uintptr_t block_table,
         int64_t bt_stride, int block_size, int num_blocks, int B, int h_q, int h_kv, int d, uintptr_t q_start,
         uintptr_t kv_len, float sm_scale, int kv_splits, const std::string& isa, int threads) {
        if (k_strides.size() != 4 || v_strides.size() != 4)
          throw std::invalid_argument("k_strides and v_strides are (seq, tok, head, block)");
        AttnCall c;
        c.q = reinterpret_cast<const bf16_t*>(q); c.q_ts = q_ts; c.q_hs = q_hs;
        c.out = reinterpret_cast<bf16_t*>(out); c.o_ts = o_ts; c.o_hs = o_hs;
        c.k = reinterpret_cast<const bf16_t*>(k); c.v = reinterpret_cast<const bf16_t*>(v);
        c.k_seq = k_strides[0]; c.k_tok = k_strides[1]; c.k_head = k_strides[2]; c.k_blk = k_strides[3];
        c.v_seq = v_strides[0]; c.v_tok = v_strides[1]; c.v_head = v_strides[2]; c.v_blk = v_strides[3];
        c.block_table = reinterpret_cast<const int32_t*>(block_table); c.bt_stride = bt_stride;
        c.block_size = block_size; c.num_blocks = num_blocks;
        c.B = B; c.h_q = h_q; c.h_kv = h_kv; c.d = d;
        c.q_start = reinterpret_cast<const int32_t*>(q_start);
        c.kv_len = reinterpret_cast<const int32_t*>(kv_len);
        c.sm_scale = sm_scale; c.kv_splits = kv_splits; c.isa = isa; c.threads = threads;
        py::gil_scoped_release release;
        attention(c);
      },
      py::kw_only(), py::arg("q"), py::arg("q_ts"), py::arg("q_hs"), py::arg("out"), py::arg("o_ts"),
      py::arg("o_hs"), py::arg("k"), py::arg("v"), py::arg("k_strides"), py::arg("v_strides"),
      py::arg("block_table"), py::arg("bt_stride"), py::arg("block_size"), py::arg("num_blocks"), py::arg("B"),
      py::arg("h_q"), py::arg("h_kv"), py::arg("d"), py::arg("q_start"), py::arg("kv_len"), py::arg("sm_scale"),
      py::arg("kv_splits"), py::arg("isa"), py::arg("threads"),
      "Decode/extend attention on raw buffers (validated by hinabench.kernels.decode_attention / "
      "extend_attention); raises ValueError for bad input.");
  m.def(
      "attention_fused_step",
      [](std::optional<bool> on) {
        if (on) set_attn_fused_step(*on);
        return attn_fused_step();
      },
      py::arg("enabled") = py::none(),
      "Whether the attention kernels' fused step (AttnMicroKernel::step) is used where a kernel has one "
      "(the same bits either way); sets it when given. Returns the setting.");
  m.def("attention_last_schedule", [] {
    const AttnSchedule s = attn_last_schedule();
    py::dict d;
    d["tasks"] = s.tasks; d["splits"] = s.splits; d["block_rows"] = s.block_rows;
    return d;
  });
}

// A decode step's fields from the binding's arguments (the caches' addresses are the caller's to set).
DecodeStep decode_step(uintptr_t x, int64_t B, uintptr_t cos, uintptr_t sin, int64_t rope_stride, int64_t kv_seq,
                       int64_t kv_tok, int64_t kv_head, int64_t pos, uintptr_t out, int threads) {
  DecodeStep s;
  s.x = reinterpret_cast<const bf16_t*>(x); s.B = B;
  s.cos = reinterpret_cast<const bf16_t*>(cos); s.sin = reinterpret_cast<const bf16_t*>(sin);
  s.rope_stride = rope_stride;
  s.kv_seq = kv_seq; s.kv_tok = kv_tok; s.kv_head = kv_head; s.pos = pos;
  s.out = reinterpret_cast<bf16_t*>(out); s.threads = threads;
  return s;
}

// Decode steps of decoder layers (ops/layer.h): DecoderLayer(**fields) once per layer (hinabench/
// kernels_layer.py fills it from checked tensors), then decoder_stack_decode per step over one layer or many.
void register_layer(py::module_& m) {
  py::class_<DecoderLayer>(m, "DecoderLayer", py::module_local(),
      "The weights and shapes of one decoder layer (kernels/ops/layer.h); pointers as addresses.")
      .def(py::init([](const MoeCall& experts, const py::kwargs& kw) {
        DecoderLayer L;
        L.experts = experts;
        auto ptr = [](py::handle v) { return reinterpret_cast<const bf16_t*>(v.cast<uintptr_t>()); };
        for (auto item : kw) {
          const std::string k = item.first.cast<std::string>();
          py::handle v = item.second;
          if (k == "H") L.H = v.cast<int64_t>();
          else if (k == "h_q") L.h_q = v.cast<int64_t>();
          else if (k == "h_kv") L.h_kv = v.cast<int64_t>();
          else if (k == "d") L.d = v.cast<int64_t>();
          else if (k == "eps") L.eps = v.cast<float>();
          else if (k == "in_norm") L.in_norm = ptr(v);
          else if (k == "post_norm") L.post_norm = ptr(v);
          else if (k == "q_norm") L.q_norm = ptr(v);
          else if (k == "k_norm") L.k_norm = ptr(v);
          else if (k == "wq") L.wq = ptr(v);
          else if (k == "ldq") L.ldq = v.cast<int64_t>();
          else if (k == "wk") L.wk = ptr(v);
          else if (k == "ldk") L.ldk = v.cast<int64_t>();
          else if (k == "wv") L.wv = ptr(v);
          else if (k == "ldv") L.ldv = v.cast<int64_t>();
          else if (k == "wo") L.wo = ptr(v);
          else if (k == "ldo") L.ldo = v.cast<int64_t>();
          else if (k == "router") L.router = ptr(v);
          else if (k == "ldr") L.ldr = v.cast<int64_t>();
          else if (k == "E") L.E = v.cast<int64_t>();
          else if (k == "top_k") L.top_k = v.cast<int>();
          else if (k == "norm_topk") L.norm_topk = v.cast<bool>();
          else if (k == "topk_bf16") L.topk_bf16 = v.cast<bool>();
          else if (k == "sm_scale") L.sm_scale = v.cast<float>();
          else if (k == "linear_isa") L.linear_isa = v.cast<std::string>();
          else if (k == "attn_isa") L.attn_isa = v.cast<std::string>();
          else throw std::invalid_argument("DecoderLayer: unknown field '" + k + "'");
        }
        return L;
      }), py::arg("experts"));
  m.def(
      "decoder_stack_decode",
      [](std::vector<const DecoderLayer*> layers, uintptr_t x, int64_t B, uintptr_t cos, uintptr_t sin,
         int64_t rope_stride, std::vector<uintptr_t> k_caches, std::vector<uintptr_t> v_caches, int64_t kv_seq,
         int64_t kv_tok, int64_t kv_head, int64_t pos, uintptr_t out, int threads) {
        const DecodeStep s = decode_step(x, B, cos, sin, rope_stride, kv_seq, kv_tok, kv_head, pos, out, threads);
        std::vector<bf16_t*> ks, vs;
        for (uintptr_t p : k_caches) ks.push_back(reinterpret_cast<bf16_t*>(p));
        for (uintptr_t p : v_caches) vs.push_back(reinterpret_cast<bf16_t*>(p));
        py::gil_scoped_release release;
        decoder_stack_decode(layers, s, ks, vs);
      },
      py::arg("layers"), py::arg("x"), py::arg("B"), py::arg("cos"), py::arg("sin"), py::arg("rope_stride"),
      py::arg("k_caches"), py::arg("v_caches"), py::arg("kv_seq"), py::arg("kv_tok"), py::arg("kv_head"),
      py::arg("pos"), py::arg("out"), py::arg("threads"),
      "Every layer of a decoder stack in turn (validated by hinabench.kernels_layer.PreparedStack): layer i "
      "appends at `pos` of k_caches[i], v_caches[i] (one geometry for all).");
  m.def(
      "decoder_layer_profile",
      [](bool on) {
        LayerProfile& p = layer_profile();
        py::dict d;
        d["norms"] = p.norms; d["qkv"] = p.qkv; d["rope"] = p.rope; d["attention"] = p.attention; d["o"] = p.o;
        d["router"] = p.router; d["experts"] = p.experts; d["adds"] = p.adds; d["calls"] = p.calls;
        d["touched"] = p.touched;
        p = LayerProfile();
        p.on = on;
        return d;
      },
      py::arg("on"),
      "What the decoder_layer_decode calls since the last call of this spent (seconds per part, calls, each "
      "call's distinct experts), zeroed; profiling then on or off.");
}

#if defined(HINA_EMU_AMX)
// ---- the software tile unit's own entry points, for tests/test_tile_emulator.py --------------------
void register_tile_emulator(py::module_& m) {
  auto sub = m.def_submodule("tile", "the software AMX tile unit (tests of its semantics)");
  // Load a 64-byte configuration (raises RuntimeError on #GP), then run `program`: a list of
  // (op, *args) with op in load/stream_load (tile, offset, stride), store (tile, offset, stride),
  // zero (tile), and dpbf16ps/dpbssd/dpbsud/dpbusd/dpbuud (dst, a, b), on the bytearray `mem`.
  // Releases the tiles afterwards.
  sub.def("run", [](py::bytes cfg, py::list program, py::bytearray mem) {
    std::string c = cfg;
    if (c.size() != 64) throw std::invalid_argument("the tile configuration is 64 bytes");
    char* base = PyByteArray_AsString(mem.ptr());
    const size_t size = size_t(PyByteArray_Size(mem.ptr()));
    struct Release { ~Release() { _tile_release(); } } release;
    _tile_loadconfig(c.data());
    for (auto item : program) {
      auto op = item.cast<py::tuple>();
      const std::string name = op[0].cast<std::string>();
      auto mem_at = [&](size_t off, long stride) {  // 16 rows of 64 bytes must fit
        if (stride < 0 || off + size_t(stride) * 15 + 64 > size)
          throw std::out_of_range("tile access outside mem");
        return base + off;
      };
      if (name == "load" || name == "stream_load" || name == "store") {
        const int t = op[1].cast<int>();
        const size_t off = op[2].cast<size_t>();
        const long stride = op[3].cast<long>();
        char* p = mem_at(off, stride);
        if (name == "load") _tile_loadd(t, p, stride);
        else if (name == "stream_load") _tile_stream_loadd(t, p, stride);
        else _tile_stored(t, p, stride);
      } else if (name == "zero") {
        _tile_zero(op[1].cast<int>());
      } else {
        const int d = op[1].cast<int>(), a = op[2].cast<int>(), b = op[3].cast<int>();
        if (name == "dpbf16ps") _tile_dpbf16ps(d, a, b);
        else if (name == "dpbssd") _tile_dpbssd(d, a, b);
        else if (name == "dpbsud") _tile_dpbsud(d, a, b);
        else if (name == "dpbusd") _tile_dpbusd(d, a, b);
        else if (name == "dpbuud") _tile_dpbuud(d, a, b);
        else throw std::invalid_argument("unknown tile op '" + name + "'");
      }
    }
  }, py::arg("cfg"), py::arg("program"), py::arg("mem"));
  sub.def("storeconfig_after_load", [](py::bytes cfg) {
    std::string c = cfg;
    if (c.size() != 64) throw std::invalid_argument("the tile configuration is 64 bytes");
    alignas(64) char out[64];
    _tile_loadconfig(c.data());
    _tile_storeconfig(out);
    _tile_release();
    return py::bytes(out, 64);
  });
}
#endif

}  // namespace

#if defined(HINA_EMU_MODULE_NAME)
PYBIND11_MODULE(HINA_EMU_MODULE_NAME, m) {
  m.doc() = "HiNa-MoE operator with an emulated ISA (tests only: runs anywhere, slowly)";
  register_moe(m);
  register_attention(m);
  register_layer(m);
#if defined(HINA_EMU_AMX)
  register_tile_emulator(m);
#endif
}
#else
PYBIND11_MODULE(_C, m) {
  m.doc() = "hinabench C++ kernels: probes, deterministic fills, HiNa-MoE operators";

  m.def("cpu_features", [] {
    const auto& f = cpu_features();
    py::dict d;
    d["avx2"] = f.avx2; d["fma"] = f.fma; d["f16c"] = f.f16c;
    d["avx512f"] = f.avx512f; d["avx512bw"] = f.avx512bw; d["avx512vl"] = f.avx512vl;
    d["avx512dq"] = f.avx512dq; d["avx512_bf16"] = f.avx512_bf16;
    d["avx512_vnni"] = f.avx512_vnni; d["avx512_fp16"] = f.avx512_fp16; d["avx512_vbmi"] = f.avx512_vbmi;
    d["amx_tile"] = f.amx_tile; d["amx_bf16"] = f.amx_bf16; d["amx_int8"] = f.amx_int8;
    d["os_avx512"] = f.os_avx512; d["os_amx"] = f.os_amx; d["amx_permission"] = f.amx_permission;
    d["amd"] = f.amd; d["family"] = f.family;
    return d;
  });
  m.def("isa_usable", &isa_usable, py::arg("isa"));

  m.def("read_variants", &read_variants);
  m.def(
      "read_pass",
      [](const std::vector<std::pair<uintptr_t, size_t>>& bufs, int threads, const std::string& variant) {
        std::vector<Buffer> b;
        for (auto& [p, n] : bufs) b.push_back({reinterpret_cast<const void*>(p), n});
        py::gil_scoped_release release;
        return read_pass(b, threads, variant);
      },
      py::arg("buffers"), py::arg("threads"), py::arg("variant"),
      "Read every (address, bytes) buffer once with `threads` threads; returns seconds.");
  m.def(
      "stream_work_pass",
      [](uintptr_t p, size_t bytes, int threads, int work, int64_t ahead, int repeat) {
        py::gil_scoped_release release;
        return stream_work_pass(reinterpret_cast<const void*>(p), bytes, threads, work, ahead, repeat);
      },
      py::arg("address"), py::arg("bytes"), py::arg("threads"), py::arg("work"), py::arg("ahead") = 0,
      py::arg("repeat") = 1,
      "The overlap probe: `threads` threads sweep their shares of the buffer `repeat` times, `work` rounds "
      "of 8 FMAs (128 FLOP) per 64-byte line on the line's values, a prefetch `ahead` bytes ahead per line "
      "when ahead > 0; returns seconds.");
  m.def("peak_units", &peak_units);
  m.def(
      "peak_flops",
      [](const std::string& unit, int threads, double seconds) {
        py::gil_scoped_release release;
        return peak_flops(unit, threads, seconds);
      },
      py::arg("unit"), py::arg("threads"), py::arg("seconds") = 0.2);
  m.def(
      "fill_bf16",
      [](uintptr_t dst, size_t n, uint64_t seed, float scale, int threads, const std::string& law) {
        if (law != "binades" && law != "normal")
          throw std::invalid_argument("fill law must be 'binades' or 'normal' (got '" + law + "')");
        py::gil_scoped_release release;
        if (law == "normal")
          fill_bf16_normal(reinterpret_cast<uint16_t*>(dst), n, seed, scale, threads);
        else
          fill_bf16(reinterpret_cast<uint16_t*>(dst), n, seed, scale, threads);
      },
      py::arg("dst"), py::arg("n"), py::arg("seed"), py::arg("scale"), py::arg("threads") = 0,
      py::arg("law") = "binades");

  register_moe(m);
  register_attention(m);
  register_layer(m);
}
#endif
