"""The register-only peak loop (kernels/probes/loops.h) compiled as the probes compile it: its ten
chains must stay ten. The AVX-512 BF16 probe started them all at zero until 2026-12-03; equal chains
compute equal values, GCC merged them into one, and the probe read ten times one chain's latency-bound
rate (Zen 4: 754-782 GFLOP/s for 2 threads, ~460 in truth). Checked on the object code, not by timing:
a timed check flaked on a loaded machine."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["-O3", "-std=gnu++17", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16", "-mfma"]


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("objdump")), reason="needs g++ and objdump")
@pytest.mark.parametrize("init, op, insn", [
    ("_mm512_setzero_ps()", "_mm512_dpbf16_ps(a, x, y)", "vdpbf16ps"),       # the probe's own start
    ("_mm512_set1_ps(1.0f)", "_mm512_dpbf16_ps(a, x, y)", "vdpbf16ps"),
    ("_mm512_setzero_ps()", "_mm512_fmadd_ps(a, _mm512_castsi512_ps(z), _mm512_set1_ps(1e-7f))", "vfmadd"),
])
def test_peak_loop_keeps_its_ten_chains(tmp_path, init, op, insn):
    src = tmp_path / "probe.cpp"
    src.write_text(
        '#include "probes/loops.h"\n'
        "namespace hina {\n"
        "double probe(int64_t n) {\n"
        "  const __m512i z = _mm512_set1_epi32(0x3f7ffff0);\n"
        "  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);\n"
        f"  return peak_loop({init}, [=](__m512 a) {{ (void)x; (void)y; (void)z; return {op}; }}, 64, n);\n"
        "}\n"
        "}  // namespace hina\n")
    obj = tmp_path / "probe.o"
    subprocess.run(["g++", *FLAGS, "-I", str(ROOT / "kernels"), "-c", str(src), "-o", str(obj)], check=True)
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], check=True, capture_output=True,
                         text=True).stdout
    assert dis.count(insn) >= 10, f"{dis.count(insn)} {insn} in the loop: its chains were merged"
