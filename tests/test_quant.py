"""Quantization (hinabench.quant), the quantized kernels (kernels.moe_ffn_quant) against both
references, the hostile inputs, and int8/fp8 through the harness."""
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hinabench import kernels, quant
from hinabench.dtypes import get_dtype
from hinabench.backends import Backend
from hinabench.errors import UserError
from hinabench.problems import FFNProblem
from hinabench.problems.ffn import moe_ffn_reference
from hinabench.problems.validate import rel_err

AVX2 = kernels.isa_status("avx2")[0]
needs_avx2 = pytest.mark.skipif(not AVX2, reason="this CPU lacks AVX2")
# every quantized micro-kernel this machine can run: the real ones, and the AVX-512 VNNI source on SIMDe
INT8_ISAS = [i for i in ("avx2", "avx512", "avx512-nobf16", "amx", "avx512-emulated", "amx-emulated",
                                     "avx512-nobf16-emulated") if kernels.isa_status(i)[0]]
FP8_ISAS = [i for i in ("avx2", "avx512", "avx512-nobf16", "amx", "avx512-emulated", "amx-emulated",
                                     "avx512-nobf16-emulated") if kernels.isa_status(i)[0]]
ISAS = {"int8": INT8_ISAS, "fp8": FP8_ISAS}


def _weights(E, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, N, K, generator=g) / math.sqrt(K)).bfloat16()


def _routing(T, E, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k, generator=g) + 0.05
    return ids, (w / w.sum(1, keepdim=True)).contiguous()


# ---- quantization ----------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(E=st.integers(1, 3), N=st.integers(1, 40), kg=st.integers(1, 4), g=st.sampled_from([32, 64, 128]),
       seed=st.integers(0, 2**16))
def test_int8_groupwise_bounds_and_determinism(E, N, kg, g, seed):
    K = kg * g
    w = _weights(E, N, K, seed)
    qw = quant.quantize_int8(w, g)
    assert qw.q.dtype == torch.int8 and tuple(qw.q.shape) == (E, N, K)
    assert tuple(qw.scale.shape) == (E, N, K // g) and qw.scale.dtype == torch.float32
    assert int(qw.q.min()) >= -127 and int(qw.q.max()) <= 127
    # every weight is within half a step of its dequantized value, and each group's max hits 127
    err = (qw.dequantize() - w.float()).abs().view(E, N, K // g, g)
    assert bool((err <= qw.scale.unsqueeze(3) * 0.5 * (1 + 1e-5) + 1e-30).all())
    assert bool((qw.q.view(E, N, K // g, g).abs().amax(3) == 127).all())
    again = quant.quantize_int8(w.clone(), g)
    assert torch.equal(again.q, qw.q) and torch.equal(again.scale, qw.scale)
    assert qw.nbytes == E * N * K + get_dtype("int8").scale_bytes(N, K, g) * E


@settings(max_examples=20, deadline=None)
@given(E=st.integers(1, 2), N=st.integers(1, 300), K=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_fp8_block_scales_deepseek_format(E, N, K, seed):
    w = _weights(E, N, K, seed)
    qw = quant.quantize_fp8(w)
    assert qw.q.dtype == torch.float8_e4m3fn
    assert tuple(qw.scale.shape) == (E, -(-N // 128), -(-K // 128))      # weight_scale_inv
    assert bool(torch.isfinite(qw.q.float()).all())
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 per weight above the subnormal range
    d, wf = qw.dequantize(), w.float()
    full = qw.scale.repeat_interleave(128, 1)[:, :N].repeat_interleave(128, 2)[:, :, :K]
    assert bool(((d - wf).abs() <= wf.abs() * 2**-4 + full * 2**-9 + 1e-30).all())
    assert float(qw.q.float().abs().max()) <= 448


def test_quantize_refuses_bad_groups_and_shapes():
    with pytest.raises(UserError, match="group size"):
        quant.quantize_int8(_weights(1, 4, 96), 48)
    with pytest.raises(ValueError, match="does not divide"):
        quant.quantize_int8(_weights(1, 4, 96), 64)
    with pytest.raises(ValueError, match="floating point"):
        quant.quantize_int8(torch.zeros(1, 4, 64, dtype=torch.int8), 32)


def test_act_quantization_matches_its_definition():
    x = torch.randn(3, 256).bfloat16()
    q, s = quant.quantize_act(x, 64)
    xf = x.float().view(3, 4, 64)
    amax = xf.abs().amax(2)
    assert torch.equal(s, amax / 127)
    inv = torch.full_like(amax, 127.0) / amax     # correctly rounded, as the kernels divide
    assert torch.equal(q.view(3, 4, 64).float(), torch.round(xf * inv.unsqueeze(2)))
    zq, zs = quant.quantize_act(torch.zeros(2, 64), 32)      # an all-zero group: scale 0, q 0
    assert not zq.any() and not zs.any()


# ---- kernels against both references ---------------------------------------------------------------
def _check_kernel(scheme, g, E, H, I, T, k, seed=0, threads=2, isa="avx2"):
    w13, wd = _weights(E, 2 * I, H, seed), _weights(E, H, I, seed + 1)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 2)).bfloat16()
    ids, tw = _routing(T, E, k, seed)
    q13, qd = quant.quantize(w13, scheme, g), quant.quantize(wd, scheme, g)
    qref = quant.moe_ffn_quant_reference(x, q13.rows(0, I), q13.rows(I, 2 * I), qd, ids, tw)
    ref = moe_ffn_reference(x, w13[:, :I], w13[:, I:], wd, ids, tw)
    out = kernels.moe_ffn_quant(x, q13, qd, ids, tw, isa=isa, threads=threads)
    err, qerr = rel_err(out, qref), rel_err(qref, ref)
    tol = get_dtype(scheme).tolerance
    assert err <= tol, f"{isa} {scheme} g{g} E{E} H{H} I{I} T{T}: rel_err {err:.3g} against the quantized reference"
    # the scheme's own error is larger than the kernel's, and bounded (it is the scheme, not a bug)
    assert qerr < (0.04 if scheme == "int8" else 0.08)
    return err, qerr


@pytest.mark.parametrize("isa", sorted(set(INT8_ISAS + FP8_ISAS)))
@pytest.mark.parametrize("scheme,g", [("int8", 32), ("int8", 64), ("int8", 128), ("fp8", 128)])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 9, 17])
def test_quant_kernel_matches_the_quantized_reference(isa, scheme, g, T):
    if isa not in ISAS[scheme]:
        pytest.skip(f"no {scheme} micro-kernel for {isa}")
    _check_kernel(scheme, g, E=4, H=256, I=384, T=T, k=2, isa=isa)


@pytest.mark.parametrize("isa", ["avx512", "avx512-emulated"])
@pytest.mark.parametrize("scheme,g", [("int8", 32), ("int8", 128), ("fp8", 128)])
def test_avx512_quant_blockings_agree_bit_for_bit(isa, scheme, g):
    """The AVX-512 INT8 and FP8 kernels' two blockings (kernels.avx512_blocking, the BF16 kernel's
    switch: zen5 takes other rows per decode tile, no prefetch at one or two tokens and tasks of 512
    rows) give the same bits, 1-5 and 9 tokens, on rows of 4096 and of 768 (more rows than a task
    of 512 takes), against the quantized reference too."""
    if isa not in ISAS[scheme]:
        pytest.skip(f"no {scheme} micro-kernel for {isa} here")
    setting = kernels.avx512_blocking(isa=isa)
    H, I = (512, 768) if isa.endswith("emulated") else (4096, 768)
    w13, wd = _weights(3, 2 * I, H, 7), _weights(3, H, I, 8)
    q13, qd = quant.quantize(w13, scheme, g), quant.quantize(wd, scheme, g)
    try:
        for T in (1, 2, 3, 4, 5, 9):
            x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).bfloat16()
            ids, tw = _routing(T, 3, 2, T)
            out = {}
            for blocking in ("default", "zen5"):
                assert kernels.avx512_blocking(blocking, isa=isa) == blocking
                out[blocking] = kernels.moe_ffn_quant(x, q13, qd, ids, tw, isa=isa, threads=2)
            assert torch.equal(out["default"], out["zen5"]), (scheme, g, T)
            qref = quant.moe_ffn_quant_reference(x, q13.rows(0, I), q13.rows(I, 2 * I), qd, ids, tw)
            assert rel_err(out["zen5"], qref) <= get_dtype(scheme).tolerance, (scheme, g, T)
    finally:
        kernels.avx512_blocking(setting, isa=isa)


@pytest.mark.parametrize("isa", INT8_ISAS)
@pytest.mark.parametrize("T", [1, 4, 5, 12])
def test_int8_group32_with_an_odd_number_of_groups(isa, T):
    """Group 32 and K an odd multiple of 32 (H = 1056: 33 groups, a last K block of one group past
    1024; I = 96): every INT8 path, whatever width its steps take, ends such a row on one group (the
    AVX-512 outer-product tiles at T = 12: a last transpose of 32 bytes, half a zmm per row)."""
    _check_kernel("int8", 32, E=2, H=1056, I=96, T=T, k=2, isa=isa)


@pytest.mark.parametrize("isa", INT8_ISAS)
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("T", [2, 3, 4])
def test_int8_one_expert_with_two_to_four_tokens(isa, g, T):
    """One expert takes T = 2, 3 or 4 tokens: the decode tiles, on AVX-512 VNNI the pair tiles (4 rows x
    one or two token pairs per zmm, four rows' or two rows' group sums reduced in one tree; T = 3 with a
    padding token), with the next tile's L2 prefetch, and a task's last tile without it."""
    _check_kernel("int8", g, E=1, H=256, I=384, T=T, k=1, isa=isa)


@pytest.mark.parametrize("isa", INT8_ISAS)
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("T", [5, 6, 8, 9, 13, 16, 23, 40])
def test_int8_one_expert_with_many_tokens(isa, g, T):
    """One expert takes all T tokens: the blocked tiles; on AVX-512 VNNI the 4- and 1-token tiles (T =
    5), the 8-token pair tiles (two tokens per zmm, the group sums reduced across lanes in int32; T = 6
    padded to 8, and 8), and from 9 tokens the outer-product tiles over 16 transposed rows, 8 tokens
    at a time and then the 1 to 7 left (T = 9, 13, 23, 40)."""
    _check_kernel("int8", g, E=1, H=256, I=384, T=T, k=1, isa=isa)


@pytest.mark.parametrize("isa", INT8_ISAS)
def test_int8_many_tokens_with_k_in_blocks(isa):
    """M x K past the kernels' whole-K limit (70 tokens x I = 4096 in the down projection: K in blocks
    of 1024, each row's sums carried across the blocks)."""
    _check_kernel("int8", 128, E=1, H=256, I=4096, T=70, k=1, isa=isa)


@pytest.mark.parametrize("isa", FP8_ISAS)
@pytest.mark.parametrize("which", ["finite", "subnormal", "sprinkled"])
@pytest.mark.parametrize("T", [2, 3])
def test_fp8_kernels_read_every_e4m3_value(isa, which, T):
    """Every finite e4m3 byte (zeros of both signs, the subnormals m * 2^-9, the largest, 448) in the
    weights of each FP8 path, which turn them into fp32 or bf16 each its own way (the AVX-512 one
    and the AMX unpack by byte tables); and weights of subnormals and zeros only, where a wrong value
    of theirs is not lost among the larger ones. Their block scale is 64 there: until 2026-12-03 the
    AVX2 kernel's bit move computed with the weights 2^-120 lower, so a subnormal e4m3 was an fp32
    subnormal in it, and with the ~1e-8 intermediates a 1/448 scale gives, its products underflowed
    (rel_err 0.88); its fp16 step (weights 2^-8 lower, fp32 normals) does not. "sprinkled": normal
    codes with one zero or subnormal in ~300, so that the AMX few-token tiles' two conversions (shifts
    for a row's 64 bytes of normals, tables where one has a zero exponent field) meet in one tile.
    T = 2 and 3: the AMX FP8 kernel's few-token tiles from 2 tokens an expert."""
    E, H, I = 1, 256, 128
    keep = (lambda b: b & 0x78 == 0) if which == "subnormal" else (lambda b: b & 0x7F != 0x7F)
    codes = torch.tensor([b for b in range(256) if keep(b)], dtype=torch.uint8)   # 254 (no NaN) or 16
    gen = torch.Generator().manual_seed(7)
    def weight(N, K):
        q = codes[torch.randint(len(codes), (E, N, K), generator=gen)]
        if which == "sprinkled":   # exponent fields 1..15 everywhere, then a few zeros and subnormals
            zero_exp = torch.tensor([b for b in range(256) if b & 0x78 == 0], dtype=torch.uint8)
            q = torch.where(q & 0x78 == 0, q | 0x08, q)
            few = torch.rand(E, N, K, generator=gen) < 1 / 300
            q = torch.where(few, zero_exp[torch.randint(16, (E, N, K), generator=gen)], q)
        q = q.view(torch.float8_e4m3fn)
        scale = torch.full((E, -(-N // 128), -(-K // 128)), 64.0 if which == "subnormal" else 1 / 448.0)
        return quant.QuantWeight("fp8", q, scale, 128)
    q13, qd = weight(2 * I, H), weight(H, I)
    assert set(q13.q.view(torch.uint8).unique().tolist()) == set(codes.tolist())
    x = torch.randn(T, H, generator=gen).bfloat16()
    ids, tw = _routing(T, E, 1)
    qref = quant.moe_ffn_quant_reference(x, q13.rows(0, I), q13.rows(I, 2 * I), qd, ids, tw)
    out = kernels.moe_ffn_quant(x, q13, qd, ids, tw, isa=isa, threads=2)
    assert rel_err(out, qref) <= get_dtype("fp8").tolerance


def test_the_emulated_int8_kernels_are_built():
    """The AVX-512 VNNI and AMX-INT8 sources run here through SIMDe / the tile emulator (when the
    emulated modules were built)."""
    for isa in ("avx512-emulated", "amx-emulated", "avx512-nobf16-emulated"):
        if kernels.isa_status(isa)[0]:
            _check_kernel("int8", 32, E=2, H=128, I=128, T=3, k=2, isa=isa)


@needs_avx2
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme=st.sampled_from(["int8", "fp8"]), g=st.sampled_from([32, 64, 128]),
       h=st.integers(1, 12), i=st.integers(1, 12), T=st.integers(1, 20), E=st.integers(1, 5),
       threads=st.integers(1, 3), seed=st.integers(0, 1000), which=st.integers(0, 7))
def test_quant_kernel_random_shapes(scheme, g, h, i, T, E, threads, seed, which):
    if scheme == "fp8":
        g = 128
    isas = ISAS[scheme]
    isa = isas[which % len(isas)]
    H, I = h * 128, i * 128
    if isa.endswith("-emulated"):   # SIMDe and the tile emulator are slow: keep the emulated shapes small
        H, I = min(H, 512), min(I, 512)
    _check_kernel(scheme, g, E=E, H=H, I=I, T=T, k=min(E, 2), seed=seed, threads=threads, isa=isa)


@pytest.mark.parametrize("model,dtype,isa", [
    ("qwen3-30b-a3b", "int8", "avx2"), ("mixtral-8x7b", "int8", "avx2"),
    ("qwen3-30b-a3b", "fp8", "avx2"), ("mixtral-8x7b", "fp8", "avx2"),
    ("qwen3-30b-a3b", "int8", "avx512-emulated"), ("qwen3-30b-a3b", "int8", "amx-emulated"),
    ("qwen3-30b-a3b", "fp8", "avx512-emulated"), ("qwen3-30b-a3b", "fp8", "avx512-nobf16-emulated")])
def test_quant_kernel_on_registry_shapes(model, dtype, isa):
    """The registry's expert shapes, through the problem (materialize quantizes as the framework would)."""
    if not kernels.isa_status(isa)[0]:
        pytest.skip(f"{isa} cannot run here")
    p = FFNProblem.create(model, 3, active_experts=1, dtype=dtype)
    d = p.materialize(rotate=False)
    out = kernels.moe_ffn_quant(d.x, d.q13, d.qdown, d.topk_ids[0], d.topk_weights, isa=isa, threads=2)
    assert rel_err(out, d.reference(0)) <= p.tolerance
    assert 0 < d.quant_err(0) < 0.08


# ---- hostile inputs ----------------------------------------------------------------------------------
@needs_avx2
def test_hostile_inputs_raise_clear_errors():
    E, H, I, T = 2, 256, 256, 3
    w13, wd = _weights(E, 2 * I, H), _weights(E, H, I)
    x = torch.randn(T, H).bfloat16()
    ids, tw = _routing(T, E, 2)
    q13, qd = quant.quantize_int8(w13, 64), quant.quantize_int8(wd, 64)
    run = lambda a, b: kernels.moe_ffn_quant(x, a, b, ids, tw, isa="avx2")  # noqa: E731
    # scales that do not match the group size
    bad = quant.QuantWeight("int8", q13.q, q13.scale[:, :, :2].contiguous(), 64)
    with pytest.raises(ValueError, match="scales have shape"):
        run(bad, qd)
    liar = quant.QuantWeight("int8", q13.q, q13.scale, 128)   # says 128, scales are for 64
    with pytest.raises(ValueError, match="scales have shape"):
        run(liar, quant.QuantWeight("int8", qd.q, qd.scale, 128))
    # a group that does not divide H or I
    q96 = quant.QuantWeight("int8", torch.zeros(E, 2 * 96, H, dtype=torch.int8), torch.ones(E, 192, 2), 128)
    with pytest.raises(ValueError, match="must divide"):
        kernels.moe_ffn_quant(x, q96, quant.QuantWeight("int8", torch.zeros(E, H, 96, dtype=torch.int8),
                                                          torch.ones(E, H, 1), 128), ids, tw, isa="avx2")
    # int8 weights passed as bf16, and bf16 passed as int8
    fake = quant.QuantWeight("int8", w13, q13.scale, 64)
    with pytest.raises(ValueError, match="must be a torch.int8"):
        run(fake, qd)
    with pytest.raises(ValueError, match="QuantWeight"):
        run(w13, qd)
    with pytest.raises(ValueError, match="moe_ffn_quant"):
        kernels.moe_ffn(x, None, None, qd.q, ids, tw, w13=q13.q, isa="avx2")
    # mixed schemes / groups, fp8 with another block
    with pytest.raises(ValueError, match="group"):
        run(q13, quant.quantize_int8(wd, 32))
    f13 = quant.quantize_fp8(w13)
    with pytest.raises(ValueError, match="is fp8"):
        run(f13, qd)
    with pytest.raises(ValueError, match="128x128"):
        kernels.moe_ffn_quant(x, quant.QuantWeight("fp8", f13.q, f13.scale, 64),
                              quant.QuantWeight("fp8", quant.quantize_fp8(wd).q, quant.quantize_fp8(wd).scale, 64),
                              ids, tw, isa="avx2")
    with pytest.raises(ValueError, match="outside"):
        kernels.moe_ffn_quant(x, q13, qd, ids + 5, tw, isa="avx2")


def test_problem_validates_the_scheme():
    with pytest.raises(UserError, match="group size"):
        FFNProblem.create("qwen3-30b-a3b", 1, dtype="int8", group=48)
    with pytest.raises(UserError, match="no scales"):
        FFNProblem.create("qwen3-30b-a3b", 1, dtype="bf16", group=64)
    with pytest.raises(UserError, match="128x128"):
        FFNProblem.create("qwen3-30b-a3b", 1, dtype="fp8", group=64)
    p = FFNProblem.create("mixtral-8x7b", 1, dtype="int8", group=32)
    # bytes judged on weights + fp32 scales: 1 + 4/32 bytes per weight
    assert p.weight_bytes == 2 * 3 * 4096 * 14336 * (1 + 4 / 32)
    assert p.key()["quant_group"] == 32 and p.key()["scale_dtype"] == "float32"
    f = FFNProblem.create("mixtral-8x7b", 1, dtype="fp8")
    assert f.weight_bytes == 2 * (3 * 4096 * 14336 + 4 * (2 * 112 * 32 + 32 * 112))
    assert FFNProblem.from_dict(p.to_dict()).key() == p.key()


# ---- the harness: int8 and fp8 rows ------------------------------------------------------------------
@needs_avx2
def test_ffn_command_int8_fp8_rows(tmp_path):
    from clihelp import invoke, read_csv
    out = tmp_path / "q.csv"
    r = invoke("ffn", "--model", "qwen3-30b-a3b", "--backends", "hina:avx2,torch:dequant,torch",
               "--dtype", "bf16,int8,fp8", "--group", "64", "--tokens", "1,3", "--rounds", "1",
               "--min-time", "0.01", "--warmup", "1", "--threads", "1", "--out", str(out))
    assert r.exit_code == 0, r.output
    rows = read_csv(out)
    by = {(x["backend"], x["dtype"], x["tokens_per_expert"]): x for x in rows}
    for dt, g in (("int8", "64"), ("fp8", "128")):
        for t in ("1", "3"):
            for b in ("hina:avx2", "torch:dequant"):
                row = by[(b, dt, t)]
                assert row["status"] == "ok", row["reason"]
                assert row["quant_group"] == g and row["scale_dtype"] == "float32"
                assert 0 < float(row["quant_err"]) < 0.08 and float(row["rel_err"]) <= 5e-3
                assert float(row["efficiency"]) > 0 and float(row["efficiency_turn"]) > 0
            assert by[("torch", dt, t)]["status"] == "unsupported"
    assert by[("hina:avx2", "bf16", "1")]["quant_group"] == "" and by[("hina:avx2", "bf16", "1")]["quant_err"] == ""
    # the three dtypes of a T took turns in the same rounds: one cohort per T, and the judge says so
    for t in ("1", "3"):
        assert len({by[(b, dt, t)]["cohort"] for b in ("hina:avx2",) for dt in ("bf16", "int8", "fp8")}) == 1
    assert by[("hina:avx2", "int8", "1")]["cohort"] != by[("hina:avx2", "int8", "3")]["cohort"]
    js = json.loads(invoke("targets", str(out), "--quant", "--backend", "hina:avx2", "--format", "json").output)
    pair = [v for v in js if v["target"] in ("int8 vs bf16", "fp8 vs int8")]
    assert len(pair) == 3 and all("side by side (one cohort" in v["why"] for v in pair), pair
    # bytes judged on weights + scales (int8 at g 64: 1 + 4/64 bytes per weight)
    p = FFNProblem.create("qwen3-30b-a3b", 1, dtype="int8", group=64)
    assert int(by[("hina:avx2", "int8", "1")]["weight_bytes"]) == p.weight_bytes
    # Figure 11 from those rows: no kt row, so over the best validated peer, named in the caption
    r = invoke("figure", "fig11", str(out), "--out", str(tmp_path / "fig"))
    assert r.exit_code == 0, r.output
    caption = (tmp_path / "fig" / "fig11.txt").read_text()
    assert "no KTransformers int8 row ran here" in caption and "torch:dequant" in caption
    assert (tmp_path / "fig" / "fig11.png").stat().st_size > 0


def test_fig11_prefers_kt_and_never_ranks_wrong_rows():
    import pandas as pd
    from hinabench.report.figures import fig11_speedups
    rows = [
        dict(model="m", tokens_per_expert=1, dtype="int8", backend="hina:avx2", status="ok", median_ms=10.0),
        dict(model="m", tokens_per_expert=1, dtype="int8", backend="torch:dequant", status="ok", median_ms=15.0),
        dict(model="m", tokens_per_expert=1, dtype="int8", backend="kt:int8", status="ok", median_ms=30.0),
        dict(model="m", tokens_per_expert=1, dtype="int8", backend="vllm:x", status="wrong", median_ms=1.0),
        dict(model="m", tokens_per_expert=1, dtype="fp8", backend="hina:avx2", status="ok", median_ms=10.0),
        dict(model="m", tokens_per_expert=1, dtype="fp8", backend="vllm:x", status="wrong", median_ms=1.0),
        dict(model="m", tokens_per_expert=1, dtype="fp8", backend="torch:dequant", status="ok", median_ms=40.0),
    ]
    sp = fig11_speedups(pd.DataFrame(rows))
    note, pts = sp["int8"]
    assert "over KTransformers (kt:int8)" in note and pts[0][3] == "kt:int8" and pts[0][4] == 3.0
    note, pts = sp["fp8"]
    assert "best validated fp8 peer" in note and pts[0][3] == "torch:dequant" and pts[0][4] == 4.0


def test_fig11_counts_llamacpp_q8_0_as_an_int8_peer():
    import pandas as pd
    from hinabench.report.figures import fig11_speedups, quant_points
    rows = [
        dict(op="ffn", model="m", tokens_per_expert=1, dtype="int8", backend="hina:avx2", status="ok", median_ms=10.0),
        dict(op="ffn", model="m", tokens_per_expert=1, dtype="int8", backend="torch:dequant", status="ok", median_ms=90.0),
        # llama.cpp quantizes the bf16 problem to Q8_0 itself: its row is a bf16 row
        dict(op="ffn", model="m", tokens_per_expert=1, dtype="bf16", backend="llamacpp:q8_0", status="ok", median_ms=12.0),
        dict(op="ffn", model="m", tokens_per_expert=1, dtype="int8", backend="llamacpp:q8_0", status="unsupported",
             median_ms=None),
        dict(op="ffn", model="m", tokens_per_expert=1, dtype="bf16", backend="hina:avx2", status="ok", median_ms=20.0),
    ]
    df = pd.DataFrame(rows)
    assert set(quant_points(df)["backend"]) == {"hina:avx2", "torch:dequant", "llamacpp:q8_0"}
    note, pts = fig11_speedups(df)["int8"]
    assert "llamacpp:q8_0" in note and pts[0][3] == "llamacpp:q8_0" and pts[0][4] == 1.2
    assert "fp8" not in fig11_speedups(df)


def test_quant_targets_are_judged_and_missing_comparisons_are_na():
    from hinabench.report.targets import judge_quant

    def r(dt, b, T, ms, status="ok", eff=None, mad=0.1):
        return dict(op="ffn", model="m", dtype=dt, backend=b, tokens_per_expert=T, threads=2, status=status,
                    median_ms=ms, mad_ms=mad, efficiency=eff, roofline_ms=1.0, bound="memory")
    rows = [r("bf16", "hina:avx2", 1, 20.0, eff=0.9), r("int8", "hina:avx2", 1, 10.0, eff=0.9),
            r("fp8", "hina:avx2", 1, 12.0, eff=0.8), r("int8", "hina:avx2", 8, 30.0, eff=0.5),
            r("int8", "torch:dequant", 8, 300.0), r("int8", "llamacpp:q8_0", 8, 1.0, status="unavailable")]
    v = {(x.T, x.target): x for x in judge_quant(rows, "hina:avx2")}
    assert v[(1, "int8 efficiency")].verdict == "pass"
    assert v[(1, "int8 vs bf16")].verdict == "pass" and v[(1, "int8 vs bf16")].got == "2.00x"
    assert v[(1, "fp8 vs int8")].verdict == "fail"               # 10/12 = 0.83x < 0.9x
    assert v[(8, "int8 peers")].verdict == "pass"
    assert v[(8, "vs q8_0")].verdict == "n/a" and v[(1, "vs q8_0")].verdict == "n/a"
    # an ISA with no FP8 micro-kernel (AMX): its INT8 is judged against hina's fastest FP8 path, named
    amx = {(x.T, x.target): x for x in judge_quant(rows + [r("int8", "hina:amx", 1, 11.0, eff=0.8)], "hina:amx")}
    assert amx[(1, "fp8 vs int8")].got == f"{11.0 / 12.0:.2f}x" and "hina:avx2" in amx[(1, "fp8 vs int8")].why


# ---- peers with a scheme of their own (Backend.quant_scheme) -------------------------------------------
def test_per_channel_int8_is_group_k_and_its_reference_follows_the_rounding_points():
    torch.manual_seed(3)
    w = torch.randn(2, 16, 256).bfloat16()
    ch = quant.quantize_int8_channel(w)
    assert ch.scale.shape == (2, 16, 1) and ch.group == 256
    amax = w.float().abs().amax(dim=2)
    assert torch.equal(ch.scale[..., 0], amax / 127)
    assert (ch.dequantize() - w.float()).abs().le(ch.scale / 2 + 1e-7).all()
    p = FFNProblem.custom(256, 128, tokens=4, dtype="int8", group=64)
    data = p.materialize(rotate=False)
    # the per-channel reference, written out: weights per row, activations per token over all of K
    q13, qd = quant.quantize_int8_channel(data.w13), quant.quantize_int8_channel(data.w_down)
    xs = quant.fake_quant_act(data.x, 256)
    out = torch.zeros(4, 256)
    for t in range(4):
        for k in range(p.A):
            e = int(data.topk_ids[0][t, k])
            w13 = q13.dequantize(e)
            h = torch.nn.functional.silu(w13[:128] @ xs[t]) * (w13[128:] @ xs[t])
            hq = quant.fake_quant_act(h.bfloat16().float()[None], 128)[0]
            out[t] += data.topk_weights[t, k] * (qd.dequantize(e) @ hq)
    assert rel_err(data.scheme_reference("int8-channel+bf16h"), out) < 1e-5
    assert data.scheme_reference(None) is data.reference(0)
    assert rel_err(data.scheme_reference("int8-channel"), data.reference(0)) > 5e-3   # another scheme
    assert data.scheme_quant_err("int8-channel") > 0
    with pytest.raises(ValueError, match="no reference"):
        data.scheme_reference("int4-channel")
    with pytest.raises(ValueError, match="no reference"):
        data.scheme_reference("int8-channel+bf16x")
    # every rounding point moves the reference, and only by bf16 rounding
    variants = ["int8-channel", "int8-channel+bf16gu", "int8-channel+bf16h", "int8-channel+bf16y",
                "int8-channel+bf16w+bf16gu+bf16h+bf16y"]
    refs = [data.scheme_reference(v) for v in variants]
    for r in refs[1:]:
        assert not torch.equal(r, refs[0]) and rel_err(r, refs[0]) < 2e-2


class _PerChannelPeer(Backend):
    """An int8 peer that quantizes per channel itself, as vLLM's and kt's INT8 MoE do."""
    name = "test:int8-channel"
    description = "per-channel W8A8, fp32 intermediates"
    dtypes = ("int8",)
    quant_scheme = "int8-channel"

    def run(self, group):
        return self.data.scheme_reference("int8-channel", group).bfloat16()


class _PerChannelUnderGroupwise(_PerChannelPeer):
    name = "test:int8-channel-claimed-groupwise"
    quant_scheme = None


class _Fp8OnlyPeer(_PerChannelPeer):
    name = "test:fp8-bf16w"
    dtypes = ("fp8",)
    quant_scheme = "fp8+bf16w"


def test_a_peers_own_scheme_is_its_reference_and_its_bytes(monkeypatch):
    from hinabench import backends as registry
    from hinabench.harness.runner import RunConfig, run_point
    registry._load()
    peers = (_PerChannelPeer, _PerChannelUnderGroupwise, _Fp8OnlyPeer)
    for cls in peers:
        monkeypatch.setitem(registry.REGISTRY, cls.name, cls)
    p = FFNProblem.custom(256, 128, tokens=2, dtype="int8", group=64)
    rows = {r["backend"]: r for r in run_point(p, [c.name for c in peers], 1,
                                               RunConfig(rounds=1, min_time=0.001, warmup=0))}
    assert rows[_Fp8OnlyPeer.name]["status"] == "unsupported"   # an fp8 peer in an int8 sweep: a row
    own, claimed = rows[_PerChannelPeer.name], rows[_PerChannelUnderGroupwise.name]
    assert own["status"] == "ok" and own["rel_err"] < 5e-3
    assert claimed["status"] == "wrong"          # judged against hina's group-wise reference
    assert own["quant_err"] != claimed["quant_err"]
    # bytes: int8 weights + one fp32 scale per row, not the group-wise scales
    assert own["weight_bytes"] == p.touched_experts() * (3 * 256 * 128 + 4 * (2 * 128 + 256))
    assert claimed["weight_bytes"] == p.weight_bytes


def test_vllm_fp8_is_validated_per_batch_as_its_kernel_picks_its_path():
    from hinabench.backends.vllm import VllmFp8, VllmInt8
    small, large = FFNProblem.create("qwen3-30b-a3b", 4, dtype="fp8"), FFNProblem.create("qwen3-30b-a3b", 5, dtype="fp8")
    assert VllmFp8.scheme_for(small) == "fp8+bf16gu+bf16h+bf16y"
    assert VllmFp8.scheme_for(large) == "fp8+bf16w+bf16gu+bf16h"
    assert VllmInt8.scheme_for(small) == VllmInt8.quant_scheme == "int8-channel+bf16h"
    d = FFNProblem.custom(256, 256, tokens=2, dtype="fp8").materialize(rotate=False)
    assert rel_err(d.scheme_reference("fp8+bf16gu+bf16h+bf16y"), d.reference(0)) < 5e-3
    with pytest.raises(ValueError, match="no reference"):
        d.scheme_reference("int8-channel")     # a per-channel int8 scheme on an fp8 problem


def test_a_workers_memory_estimate_counts_a_quantized_problems_bf16_source():
    """A peer's worker materializes the whole problem: for int8 that is the BF16 source as well as the
    int8 weights (3x their bytes), then its own copies; the kt:amxbf16 estimate once missed its copies."""
    from hinabench.backends.kt import KtAmxBf16, KtAmxInt8
    p = FFNProblem.create("mixtral-8x7b", 1, dtype="int8")
    groups = 3
    w, alloc = groups * p.group_bytes, p.allocated_bytes(groups)
    assert alloc > 2.9 * w
    from hinabench.worker.proxy import WORKER_PROCESS_BYTES
    assert KtAmxInt8.extra_bytes_estimate(w, alloc) == int(alloc + KtAmxInt8.extra_copy_factor * w) + WORKER_PROCESS_BYTES
    b = FFNProblem.create("mixtral-8x7b", 1)
    wb = groups * b.group_bytes
    # measured: kt:amxbf16's worker peaked at 3.8x Mixtral's weights (its own copy included)
    assert KtAmxBf16.extra_bytes_estimate(wb, b.allocated_bytes(groups)) >= 3.8 * wb
