"""Every kernel source that loads a tile configuration does it through kernels/isa/amx/tiles.h.

GCC 12's `_tile_loadconfig` gives LDTILECFG an 8-byte memory operand, and at -O3 the stores to the
configuration's rows and colsb were dropped as dead: every AMX call died with SIGILL on the first real
AMX machine (2026-12-01). The emulated build, which the tests run on CPUs without AMX, cannot show it
(its LDTILECFG is a function call that reads all 64 bytes), so the rule is checked on the sources.
"""
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def test_tile_config_loads_go_through_tiles_h():
    users = [p for p in KERNELS.rglob("*.cpp") if "_tile_loadconfig(" in p.read_text()]
    assert users, "no AMX source found"
    for p in users:
        text = p.read_text()
        if "register_tile_emulator" in text:      # bindings.cpp: the emulator's own entry points only
            continue
        assert '#include "isa/amx/tiles.h"' in text, f"{p.relative_to(KERNELS)} loads tile configurations without isa/amx/tiles.h"
        assert "#include <immintrin.h>" not in text.split('#include "isa/amx/tiles.h"')[0], p


def test_tiles_h_names_all_64_bytes():
    text = (KERNELS / "isa" / "amx" / "tiles.h").read_text()
    assert "unsigned char bytes[64]" in text and '"ldtilecfg %0"' in text
    assert "#define _tile_loadconfig(cfg) ::hina::tile_loadconfig_64(cfg)" in text
