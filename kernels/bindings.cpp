// The one pybind11 module of hinabench's C++ side. It takes raw addresses and sizes; the Python
// side (hinabench/kernels.py, hinabench/probes.py) validates tensors before calling in.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common.h"
#include "microkernel.h"

namespace py = pybind11;
using namespace hina;

PYBIND11_MODULE(_C, m) {
  m.doc() = "hinabench C++ kernels: probes, deterministic fills, HiNa-MoE operators";

  m.def("cpu_features", [] {
    const auto& f = cpu_features();
    py::dict d;
    d["avx2"] = f.avx2; d["fma"] = f.fma; d["f16c"] = f.f16c;
    d["avx512f"] = f.avx512f; d["avx512bw"] = f.avx512bw; d["avx512vl"] = f.avx512vl;
    d["avx512dq"] = f.avx512dq; d["avx512_bf16"] = f.avx512_bf16;
    d["avx512_vnni"] = f.avx512_vnni; d["avx512_fp16"] = f.avx512_fp16;
    d["amx_tile"] = f.amx_tile; d["amx_bf16"] = f.amx_bf16; d["amx_int8"] = f.amx_int8;
    d["os_avx512"] = f.os_avx512; d["os_amx"] = f.os_amx; d["amx_permission"] = f.amx_permission;
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
      [](uintptr_t dst, size_t n, uint64_t seed, float scale, int threads) {
        py::gil_scoped_release release;
        fill_bf16(reinterpret_cast<uint16_t*>(dst), n, seed, scale, threads);
      },
      py::arg("dst"), py::arg("n"), py::arg("seed"), py::arg("scale"), py::arg("threads") = 0);

  register_moe(m);
  register_linear(m);
}
