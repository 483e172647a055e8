"""The register-only peak probes (kernels/probes/probes_<isa>.cpp over probes/loops.h), compiled from
their own sources with the flags CMakeLists.txt gives them: each loop must keep its ten chains. The
AVX-512 BF16 probe started them all at zero until 2026-12-03; equal chains compute equal values, GCC
merged them into one, and the probe read ten times one chain's latency-bound rate (Zen 4: 754-782
GFLOP/s for 2 threads, ~460 in truth). Checked on the object code, not by timing: a timed check flaked
on a loaded machine."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def isa_flags(name: str) -> list[str]:
    m = re.search(rf'set\({name}\s+"([^"]+)"\)', (ROOT / "CMakeLists.txt").read_text())
    assert m, f"CMakeLists.txt no longer sets {name}"
    return m.group(1).split(";")


@pytest.mark.skipif(not (shutil.which("g++") and shutil.which("objdump")), reason="needs g++ and objdump")
@pytest.mark.parametrize("source, flags, symbol, insn, chains", [
    # 20 chains: two 512-bit vdpbf16ps a cycle, each ~6 cycles long, on Zen 5 (probes_avx512.cpp)
    ("probes_avx512.cpp", "ISA_AVX512", "_ZN4hina13dpbf16_avx512El", "vdpbf16ps", 20),
    ("probes_avx512.cpp", "ISA_AVX512", "_ZN4hina10fma_avx512El", "vfmadd", 20),
    ("probes_avx512.cpp", "ISA_AVX512", "_ZN4hina13dpbusd_avx512El", "vpdpbusd", 10),
    ("probes_avx2.cpp", "ISA_AVX2", "_ZN4hina8fma_avx2El", "vfmadd", 10),
    # the products do not depend on the chains: an asm barrier keeps the vpmaddwd in the loop
    ("probes_avx2.cpp", "ISA_AVX2", "_ZN4hina11maddwd_avx2El", "vpmaddwd", 10),
    # the AVX2 INT8 kernel's sign-trick step: x changes every step (the same asm barrier)
    ("probes_avx2.cpp", "ISA_AVX2", "_ZN4hina12maddubs_avx2El", "vpmaddubsw", 10),
    ("probes_amx.cpp", "ISA_AMX", "_ZN4hina11tdpbf16_amxEl", "tdpbf16ps", 4),
    ("probes_amx.cpp", "ISA_AMX", "_ZN4hina11tdpbssd_amxEl", "tdpbssd", 4),
])
def test_peak_loop_keeps_its_chains(tmp_path, source, flags, symbol, insn, chains):
    obj = tmp_path / "probe.o"
    subprocess.run(["g++", "-O3", "-std=gnu++17", *isa_flags(flags), "-I", str(ROOT / "kernels"), "-c",
                    str(ROOT / "kernels" / "probes" / source), "-o", str(obj)], check=True)
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], check=True, capture_output=True,
                         text=True).stdout
    body = dis.split(f"<{symbol}>:\n", 1)
    assert len(body) == 2, f"{symbol} not in {source}'s object code"
    n = body[1].split("\n\n", 1)[0].count(insn)
    assert n >= chains, f"{n} {insn} in {symbol}: its chains were merged or hoisted"


def test_int8_rows_are_judged_against_the_int8_unit_where_there_is_one():
    """vpdpbusd does twice vdpbf16ps's operations and four times an fp32 FMA's: an INT8 row judged
    against those read efficiencies above 1 (a Xeon without AVX512_BF16, 2026-12-03: 1.21). The best
    int8 unit the CPU has: AMX's tdpbssd, VNNI's vpdpbusd, AVX2's vpmaddubsw step (every x86-64 with
    AVX2; the AVX2 kernel's own step, not the int16 vpmaddwd form it left on 2026-12-07)."""
    from hinabench.machine import probes
    units = probes._C.peak_units()
    assert probes.peak_unit("bf16") == probes.peak_unit()
    int8_units = [u for u in ("amx-int8", "avx512-vnni-int8", "avx2-int8-maddubs") if u in units]
    if "avx2-fma-fp32" in units:
        assert {"avx2-int8-maddubs", "avx2-int16-madd"} <= set(units)
    assert probes.peak_unit("int8") == (int8_units[0] if int8_units else probes.peak_unit())
    assert probes.peak_unit("fp8") == probes.peak_unit()   # weight-only: its FMAs are bf16/fp32
