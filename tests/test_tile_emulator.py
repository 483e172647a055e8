"""The software AMX tile unit (kernels/emu/tile_emulator.h) against a NumPy oracle of the SDM semantics.

The emulator is what makes the AMX micro-kernel testable on CPUs without AMX, so its semantics are
pinned here instruction by instruction: LDTILECFG limits (palette 1: 8 tiles, rows <= 16,
colsb <= 64), TILELOADD/TILESTORED data movement, TDPBF16PS (bf16 pairs, fp32 FMA steps in SDM
order, RNE, DAZ on inputs, FTZ on results) and the int8 TDPB[SU][SU]D forms (int32 wrap-around).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

emu = pytest.importorskip("hinabench._C_amx_emu", reason="the AMX emulator module is not built")
tile = emu.tile


def cfg(shapes: dict[int, tuple[int, int]], palette: int = 1, reserved: bytes = b"\0" * 14,
        extra: dict[int, tuple[int, int]] | None = None) -> bytes:
    """A 64-byte tile configuration: shapes = {tile: (rows, colsb)}."""
    colsb = [0] * 16
    rows = [0] * 16
    for t, (r, c) in {**shapes, **(extra or {})}.items():
        rows[t], colsb[t] = r, c
    return struct.pack("<BB14s16H16B", palette, 0, reserved, *colsb, *rows)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def daz(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(0) * np.sign(x), x).astype(np.float32)


def oracle_dpbf16ps(c: np.ndarray, a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """SDM TDPBF16PS: c [M, N] fp32; a [M, 2K] bf16 bits; b [K, 2N] bf16 bits (VNNI pairs).
    Sequential in k, then the even and the odd element of the pair; each step one fp32 FMA (the
    product is exact, the sum computed exactly in float64 for these inputs, rounded once to fp32),
    inputs DAZ, results FTZ."""
    M, N = c.shape
    K = a_bits.shape[1] // 2
    a = daz(bf16_to_f32(a_bits)).astype(np.float64)
    b = daz(bf16_to_f32(b_bits)).astype(np.float64)
    acc = c.astype(np.float32).copy()
    for k in range(K):
        for e in range(2):
            prod = a[:, 2 * k + e][:, None] * b[k, e::2][None, :N]
            acc = daz((daz(acc).astype(np.float64) + prod).astype(np.float32))
    return acc


def run_dp(op: str, M: int, K: int, N: int, a: bytes, b: bytes, c: bytes,
           lda: int = 64, ldb: int = 64, ldc: int = 64) -> bytes:
    """C (tmm0, M x 4N bytes) op= A (tmm1, M x 4K) . B (tmm2, K x 4N); returns C's bytes."""
    A_OFF, B_OFF, C_OFF = 0, 4096, 8192
    mem = bytearray(12288 + 1024)
    for off, data, ld, cols in ((A_OFF, a, lda, 4 * K), (B_OFF, b, ldb, 4 * N), (C_OFF, c, ldc, 4 * N)):
        rows = len(data) // cols
        for r in range(rows):
            mem[off + r * ld: off + r * ld + cols] = data[r * cols:(r + 1) * cols]
    config = cfg({0: (M, 4 * N), 1: (M, 4 * K), 2: (K, 4 * N)})
    tile.run(config, [("load", 1, A_OFF, lda), ("load", 2, B_OFF, ldb), ("load", 0, C_OFF, ldc),
                      (op, 0, 1, 2), ("store", 0, C_OFF, ldc)], mem)
    return b"".join(bytes(mem[C_OFF + r * ldc: C_OFF + r * ldc + 4 * N]) for r in range(M))


def random_bf16(rng, shape, lo_exp=-1, hi_exp=1) -> np.ndarray:
    """bf16 bits with exponents in [lo_exp, hi_exp], random sign and mantissa (no zeros)."""
    sign = rng.integers(0, 2, shape, dtype=np.uint16) << 15
    exp = (rng.integers(lo_exp, hi_exp + 1, shape) + 127).astype(np.uint16) << 7
    mant = rng.integers(0, 128, shape, dtype=np.uint16)
    return (sign | exp | mant).astype(np.uint16)


@pytest.mark.parametrize("M,K,N", [(16, 16, 16), (1, 16, 1), (3, 8, 5), (16, 1, 16), (7, 13, 11)])
def test_dpbf16ps_matches_oracle(M, K, N):
    rng = np.random.default_rng(M * 1000 + K * 10 + N)
    a = random_bf16(rng, (M, 2 * K))
    b = random_bf16(rng, (K, 2 * N))
    c = rng.uniform(-4, 4, (M, N)).astype(np.float32)
    got = np.frombuffer(run_dp("dpbf16ps", M, K, N, a.tobytes(), b.tobytes(), c.tobytes()),
                        np.float32).reshape(M, N)
    np.testing.assert_array_equal(got, oracle_dpbf16ps(c, a, b))


def test_dpbf16ps_order_is_sequential_fp32():
    # 1 + 2^-24 + 2^-24 in the SDM's order (two separate fp32 FMA steps, RNE) stays 1.0, while a
    # pair summed first (2^-23) would give 1 + 2^-23.
    M, K, N = 1, 1, 1
    two_m12 = np.array([0x3980], np.uint16)            # 2^-12 in bf16
    a = np.array([[two_m12[0], two_m12[0]]], np.uint16)
    b = np.array([[two_m12[0], two_m12[0]]], np.uint16)
    c = np.array([[1.0]], np.float32)
    got = np.frombuffer(run_dp("dpbf16ps", M, K, N, a.tobytes(), b.tobytes(), c.tobytes()), np.float32)
    assert got[0] == np.float32(1.0)
    assert got[0] == oracle_dpbf16ps(c, a, b)[0, 0]


def test_dpbf16ps_daz_and_ftz():
    M, K, N = 2, 1, 1
    denormal = 0x0001                                   # the smallest bf16 denormal
    tiny = 0x1C80                                       # 2^-70: its square 2^-140 is an fp32 denormal
    a = np.array([[denormal, 0x3F80], [tiny, 0]], np.uint16)   # row 0: denormal*1 + 1*1 ; row 1: tiny*tiny
    b = np.array([[0x3F80, 0x3F80]], np.uint16)
    c = np.zeros((M, N), np.float32)
    got = np.frombuffer(run_dp("dpbf16ps", M, K, N, a.tobytes(), b.tobytes(), c.tobytes()), np.float32)
    assert got[0] == 1.0                                # the denormal input read as zero (DAZ)
    b2 = np.array([[tiny, 0]], np.uint16)
    got2 = np.frombuffer(run_dp("dpbf16ps", M, K, N, a.tobytes(), b2.tobytes(), c.tobytes()), np.float32)
    assert got2[1] == 0.0                               # 2^-140 flushed (FTZ), not a denormal
    assert np.float32(2.0 ** -70) * np.float32(2.0 ** -70) != 0  # (IEEE would keep it)


@pytest.mark.parametrize("op,sa,sb", [("dpbssd", True, True), ("dpbsud", True, False),
                                      ("dpbusd", False, True), ("dpbuud", False, False)])
def test_int8_dot_products_wrap(op, sa, sb):
    rng = np.random.default_rng(len(op))
    M, K, N = 16, 16, 16
    a = rng.integers(0, 256, (M, 4 * K), dtype=np.uint8)
    b = rng.integers(0, 256, (K, 4 * N), dtype=np.uint8)
    c = rng.integers(-2**31, 2**31, (M, N), dtype=np.int64).astype(np.int32)
    c[0, :] = 2**31 - 5                                 # forces wrap-around for positive sums
    av = a.view(np.int8).astype(np.int64) if sa else a.astype(np.int64)
    bv = b.view(np.int8).astype(np.int64) if sb else b.astype(np.int64)
    want = c.astype(np.int64).copy()
    for k in range(K):
        for i in range(4):
            want += av[:, 4 * k + i][:, None] * bv[k, i::4][None, :]
    want = ((want + 2**31) % 2**32 - 2**31).astype(np.int32)
    got = np.frombuffer(run_dp(op, M, K, N, a.tobytes(), b.tobytes(), c.tobytes()), np.int32).reshape(M, N)
    np.testing.assert_array_equal(got, want)


def test_load_store_move_rows_by_colsb():
    mem = bytearray(range(256)) * 8 + bytearray(2048)   # source pattern, then a zeroed region
    src, dst, stride = 0, 2048, 100
    tile.run(cfg({3: (5, 12)}), [("load", 3, src, stride), ("store", 3, dst, 64)], mem)
    for r in range(16):
        row = bytes(mem[dst + r * 64: dst + (r + 1) * 64])
        if r < 5:
            assert row[:12] == bytes(mem[src + r * stride: src + r * stride + 12])
            assert row[12:] == b"\0" * 52                # TILESTORED writes colsb bytes per row only
        else:
            assert row == b"\0" * 64                     # and rows bytes only


def test_stream_load_is_the_same_data_movement_and_zero():
    mem = bytearray(range(256)) * 16
    out = bytearray(mem)
    tile.run(cfg({0: (16, 64), 1: (16, 64)}),
             [("stream_load", 0, 0, 64), ("store", 0, 2048, 64), ("load", 1, 0, 64), ("zero", 1),
              ("store", 1, 3072, 64)], out)
    assert out[2048:3072] == mem[0:1024]
    assert out[3072:4096] == b"\0" * 1024


def test_load_zeroes_what_it_does_not_load():
    # A partial load (rows 2, colsb 8) followed by a dot product over the full shape: anything
    # left from a previous full load must read as zero.
    M, K, N = 2, 2, 2
    mem = bytearray(8192)
    ones = np.full(64, 0x3F80, np.uint16).tobytes() * 16        # 1.0 everywhere
    mem[0:1024] = ones
    config = cfg({0: (M, 4 * N), 1: (M, 4 * K), 2: (K, 4 * N)})
    tile.run(config, [("load", 1, 0, 64), ("load", 2, 0, 64), ("zero", 0), ("dpbf16ps", 0, 1, 2),
                      ("store", 0, 4096, 64)], mem)
    got = np.frombuffer(bytes(mem[4096:4096 + 8]), np.float32)
    assert (got == 2 * K).all()                                  # exactly K pairs of 1*1


@pytest.mark.parametrize("bad,match", [
    (dict(palette=2), "palette"),
    (dict(shapes={0: (17, 64)}), "rows"),
    (dict(shapes={0: (16, 65)}), "colsb"),
    (dict(reserved=b"\1" + b"\0" * 13), "reserved"),
    (dict(extra={8: (1, 4)}), "palette 1"),
])
def test_ldtilecfg_limits_are_gp(bad, match):
    kw = {"shapes": {0: (16, 64)}, **bad}
    with pytest.raises(RuntimeError, match=f"#GP.*{match}|{match}.*"):
        tile.run(cfg(kw.pop("shapes"), **kw), [], bytearray(2048))


def test_palette_zero_releases_and_unconfigured_use_is_ud():
    assert tile.storeconfig_after_load(cfg({}, palette=0)) == b"\0" * 64
    c = cfg({0: (16, 64), 2: (4, 8)})
    assert tile.storeconfig_after_load(c) == c
    with pytest.raises(RuntimeError, match="#UD.*LDTILECFG"):
        tile.run(cfg({}, palette=0), [("zero", 0)], bytearray(2048))
    with pytest.raises(RuntimeError, match="#UD.*unconfigured tmm1"):
        tile.run(cfg({0: (16, 64)}), [("zero", 1)], bytearray(2048))


@pytest.mark.parametrize("shapes,op,match", [
    ({0: (4, 16), 1: (5, 32), 2: (8, 16)}, ("dpbf16ps", 0, 1, 2), "dst.rows != src1.rows"),
    ({0: (4, 16), 1: (4, 32), 2: (8, 20)}, ("dpbf16ps", 0, 1, 2), "dst.colsb != src2.colsb"),
    ({0: (4, 16), 1: (4, 32), 2: (7, 16)}, ("dpbf16ps", 0, 1, 2), "src1.colsb / 4 != src2.rows"),
    ({0: (4, 16), 1: (4, 16), 2: (4, 16)}, ("dpbf16ps", 0, 0, 2), "distinct"),
    ({0: (4, 18), 1: (4, 16), 2: (4, 18)}, ("dpbssd", 0, 1, 2), "multiples of 4"),
])
def test_dot_product_shape_rules_are_ud(shapes, op, match):
    with pytest.raises(RuntimeError, match=match):
        tile.run(cfg(shapes), [op], bytearray(4096))
