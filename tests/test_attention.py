"""Decode and extend attention (hinabench.kernels.decode_attention / extend_attention) against the fp32
SDPA reference of the `attention` problem kind: the registry's shapes, random shapes (hypothesis: l
from 1 to thousands, not multiples of any tile or chunk, ragged batches, shuffled block tables, both
layouts), forced KV splits, and hostile inputs."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

from hinabench import kernels
from hinabench.errors import UserError
from hinabench.problems import AttentionProblem, get_kind, problem_from_dict, rel_err
from hinabench.problems.attention import sdpa_reference

TOL = 5e-3       # bf16 output: ~2e-3 from the final rounding; the problem's own tolerance is 2e-2
ISAS = [i for i in ("scalar", "avx2", "avx512", "avx512-nobf16", "amx", "avx512-emulated", "amx-emulated",
                                "avx512-nobf16-emulated") if kernels.isa_status(i)[0]]
EMULATED = ("avx512-emulated", "amx-emulated", "avx512-nobf16-emulated")
FAST = [i for i in ISAS if i not in EMULATED]     # the emulated paths are slow: they get small shapes


def call(d, group=0, isa="avx2", threads=2, kv_splits=0):
    k, v, table = d.cache(group)
    p = d.problem
    if p.phase == "decode":
        return kernels.decode_attention(d.q, k, v, d.kv_lens, block_table=table, isa=isa, threads=threads,
                                        kv_splits=kv_splits)
    return kernels.extend_attention(d.q, k, v, d.prefix_lens(), d.q_lens, block_table=table, isa=isa,
                                    threads=threads, kv_splits=kv_splits)


def check(d, out, what, group=0):
    ref = d.reference(group)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(ref.shape), what
    err = rel_err(out, ref)
    assert err <= TOL, f"{what}: rel err {err:.3g}"


# ---- the problem kind ----------------------------------------------------------------------------
def test_attention_is_a_problem_kind_with_bytes_and_flops():
    assert get_kind("attention") is AttentionProblem
    p = AttentionProblem.create("qwen3-30b-a3b", "decode", 4, 4096, layout="paged")
    assert (p.h_q, p.h_kv, p.head_dim) == (32, 4, 128)
    assert p.weight_bytes == 4 * 4096 * 4 * 128 * 2 * 2
    assert p.flops == 4 * 32 * 128 * 4 * 4096
    e = AttentionProblem.create("mixtral-8x7b", "extend", 1, 4096, 128, layout="contiguous")
    assert e.kv_lens() == [4096 + 128]
    assert e.flops == 4 * 32 * 128 * (128 * 4096 + 128 * 129 // 2)
    assert e.key()["extend"] == 128 and e.key()["block_size"] == 0
    q = problem_from_dict(e.to_dict())
    assert q.key() == e.key() and q.weight_bytes == e.weight_bytes


def test_deepseek_mla_is_refused_with_its_reason():
    with pytest.raises(UserError, match="MLA"):
        AttentionProblem.create("deepseek-v3", "decode", 1, 1024)


def test_every_other_model_has_its_attention_facts():
    from hinabench.models import MODELS
    for m in MODELS.values():
        assert m.rope_theta > 0
        if m.attention == "gqa":
            assert m.attention_heads % m.kv_heads == 0 and m.head_dim % 16 == 0
            AttentionProblem.create(m, "decode", 1, 64)
    assert MODELS["qwen3-30b-a3b"].qk_norm and not MODELS["mixtral-8x7b"].qk_norm


def test_paged_tables_are_shuffled_permutations_and_groups_rotate():
    p = AttentionProblem.create("qwen3-30b-a3b", "decode", 3, 200, layout="paged", block_size=16)
    d = p.materialize(llc_bytes=1 << 20)
    assert d.groups > 1
    per = sum(p.blocks_per_seq())
    for g in range(d.groups):
        used = torch.cat([d.block_tables[g, b, :n] for b, n in enumerate(p.blocks_per_seq())])
        assert sorted(used.tolist()) == list(range(g * per, (g + 1) * per))
        assert used.tolist() != sorted(used.tolist())
    assert len(d.group_buffers(1)) == 2


def test_reference_matches_torch_sdpa_with_gqa():
    p = AttentionProblem.custom(8, 2, 64, [37, 100], phase="extend", extend=5, layout="contiguous")
    d = p.materialize(rotate=False)
    for b in range(2):
        k, v = d.gathered(0, b)
        q = d.q[b * 5:(b + 1) * 5].float()
        L = int(d.kv_lens[b])
        mask = torch.arange(L).unsqueeze(0) <= (L - 5 + torch.arange(5)).unsqueeze(1)
        ref = F.scaled_dot_product_attention(q.transpose(0, 1), k.float().transpose(0, 1),
                                             v.float().transpose(0, 1), attn_mask=mask, enable_gqa=True)
        ours = sdpa_reference(d.q[b * 5:(b + 1) * 5], k, v, L - 5, 4)
        torch.testing.assert_close(ours, ref.transpose(0, 1), rtol=1e-4, atol=1e-5)


# ---- the kernels on the registry's shapes ----------------------------------------------------------
@pytest.mark.parametrize("isa", FAST)
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "mixtral-8x7b", "qwen2-57b-a14b", "qwen3-235b-a22b"])
@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_decode_on_registry_shapes(isa, model, layout):
    d = AttentionProblem.create(model, "decode", 2, 777, layout=layout, ragged=True).materialize(rotate=False)
    check(d, call(d, isa=isa), f"{isa} {model} {layout}")


@pytest.mark.parametrize("isa", FAST)
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "mixtral-8x7b", "qwen2-57b-a14b"])
def test_extend_on_registry_shapes(isa, model):
    d = AttentionProblem.create(model, "extend", 2, 300, 37, layout="paged", ragged=True).materialize(rotate=False)
    check(d, call(d, isa=isa), f"{isa} {model} extend")


def test_batch_one_decode_is_split_over_the_kv_sequence_and_merged():
    if "avx2" not in ISAS:
        pytest.skip("no AVX2 here")
    d = AttentionProblem.create("qwen3-30b-a3b", "decode", 1, 4096).materialize(rotate=False)
    out = call(d, threads=2)
    sched = kernels.attention_last_schedule("avx2")
    assert sched["splits"] > 1 and sched["tasks"] >= 8, sched
    check(d, out, "batch 1 split")
    one = call(d, threads=2, kv_splits=1)
    # the paged cache is token-major ([blocks, block_size, h_kv, d]): one task takes every KV head
    assert kernels.attention_last_schedule("avx2")["tasks"] == 1
    check(d, one, "batch 1 unsplit")
    # a head-major cache (HF's contiguous [B, h_kv, L, d]) takes one task per KV head
    c = AttentionProblem.create("qwen3-30b-a3b", "decode", 1, 4096, layout="contiguous").materialize(rotate=False)
    check(c, call(c, threads=2, kv_splits=1), "contiguous unsplit")
    assert kernels.attention_last_schedule("avx2")["tasks"] == 4


@pytest.mark.parametrize("isa", FAST)
def test_other_rotation_groups_and_vllm_head_major_layout(isa):
    p = AttentionProblem.create("mixtral-8x7b", "decode", 2, 300, layout="paged", block_size=32)
    d = p.materialize(llc_bytes=1 << 20)
    check(d, call(d, group=d.groups - 1, isa=isa), "last group", group=d.groups - 1)
    # the same cache as vLLM-CPU lays it out: [num_blocks, h_kv, block_size, d]
    k, v, table = d.cache(0)
    kh, vh = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    out = kernels.decode_attention(d.q, kh, vh, d.kv_lens, block_table=table, head_major=True, isa=isa, threads=2)
    check(d, out, "head-major paged")


def test_amx_decode_with_small_query_groups_runs_the_avx512_kernel():
    """On AMX, decode with query groups of at most 4 rows (Mixtral-8x7B's G = 4) runs the AVX-512 kernel
    without vdpbf16ps (measured faster there, kernels/ops/attention.cpp): the same bits as isa
    avx512-nobf16, and the reference's answer; Qwen3-30B-A3B's G = 8 and extend keep the tiles, and match
    the reference."""
    if not ("amx" in ISAS and "avx512-nobf16" in ISAS):
        pytest.skip("this CPU cannot run the native amx and avx512-nobf16 builds")
    for phase, layout, B, L, n in (("decode", "paged", 2, 1500, 1), ("decode", "contiguous", 1, 4100, 1)):
        d = AttentionProblem.create("mixtral-8x7b", phase, B, L, n, layout=layout, ragged=B > 1).materialize(rotate=False)
        a, b = call(d, isa="amx"), call(d, isa="avx512-nobf16")
        assert torch.equal(a, b), (phase, layout)
        check(d, a, f"amx {phase} {layout} G=4")
    for model, phase, n in (("qwen3-30b-a3b", "decode", 1), ("mixtral-8x7b", "extend", 9)):
        d = AttentionProblem.create(model, phase, 2, 700, n, layout="paged", ragged=True).materialize(rotate=False)
        check(d, call(d, isa="amx"), f"amx {model} {phase}")


@pytest.mark.parametrize("isa", ["avx512", "avx512-emulated"])
def test_avx512_blockings_agree_bit_for_bit(isa):
    """The AVX-512 kernel's two blockings (kernels.avx512_blocking, shared with the FFN kernel: zen5
    prefetches into L1, the next step's rows in reading order) differ only in what is prefetched when:
    the same bits, decode and extend, paged (token-major: every head a task) and contiguous, with and
    without KV splits, and the reference's answer."""
    if isa not in ISAS:
        pytest.skip(f"the {isa} build is not here or this CPU cannot run it")
    small = isa.endswith("emulated")
    cases = [("decode", "paged", 2, 300 if small else 1500, 1), ("decode", "contiguous", 1, 200 if small else 4100, 1),
             ("extend", "paged", 2, 90 if small else 400, 21), ("extend", "contiguous", 1, 70, 9)]
    setting = kernels.avx512_blocking(isa=isa)
    try:
        for phase, layout, B, L, n in cases:
            p = AttentionProblem.create("mixtral-8x7b", phase, B, L, n if phase == "extend" else 1, layout=layout,
                                        ragged=B > 1)
            d = p.materialize(rotate=False)
            for splits in (0, 3):
                out = {}
                for blocking in ("default", "zen5"):
                    assert kernels.avx512_blocking(blocking, isa=isa) == blocking
                    out[blocking] = call(d, isa=isa, kv_splits=splits)
                assert torch.equal(out["default"], out["zen5"]), (phase, layout, splits)
                check(d, out["zen5"], f"{isa} zen5 {phase} {layout} splits={splits}")
    finally:
        kernels.avx512_blocking(setting, isa=isa)


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512-nobf16", "avx512-emulated"])
def test_fused_step_gives_the_three_calls_bits(isa):
    """A kernel's fused step (an unmasked chunk of 32 keys: scores, the online-softmax step and P x V for
    every query row at once) against the three calls it replaces: the same bits, for groups of 4, 8 and 7
    query heads (7: AVX-512 pads the rows to a multiple of 4, AVX2 takes the three calls), 12 (AVX2: a
    group of 8 rows, then one of 4, as its scores take them) and 16, decode and extend (the causal
    triangle's chunks take the three calls), paged and contiguous, with and without KV splits."""
    if isa not in ISAS:
        pytest.skip(f"the {isa} build is not here or this CPU cannot run it")
    small = isa.endswith("emulated")
    cases = [(8, 1, 128, [300 if small else 2000], "decode", 1, "paged"),
             (4, 2, 128, [200 if small else 1100, 77], "decode", 1, "contiguous"),
             (7, 1, 64, [150 if small else 700], "decode", 1, "paged"),
             (8, 1, 96, [120 if small else 500], "extend", 19, "contiguous"),
             (12, 1, 32, [90], "extend", 5, "paged"),
             (12, 1, 64, [150 if small else 600], "decode", 1, "contiguous"),
             (16, 2, 128, [100 if small else 900], "decode", 1, "paged")]
    assert kernels.attention_fused_step(isa=isa) is True
    try:
        for G, h_kv, d, lengths, phase, n, layout in cases:
            p = AttentionProblem.custom(G * h_kv, h_kv, d, lengths, phase=phase, extend=n, layout=layout,
                                        block_size=16)
            data = p.materialize(rotate=False)
            for splits in (0, 1):
                out = {}
                for fused in (True, False):
                    assert kernels.attention_fused_step(fused, isa=isa) is fused
                    out[fused] = call(data, isa=isa, kv_splits=splits)
                assert torch.equal(out[True], out[False]), (G, d, phase, layout, splits)
                check(data, out[True], f"{isa} fused G={G} d={d} {phase} {layout} splits={splits}")
    finally:
        kernels.attention_fused_step(True, isa=isa)


# ---- the AVX-512 BF16 and AMX micro-kernels' sources, run here on SIMDe and on the tile emulator
# (vdpbf16ps / tdpbf16ps scores on K rows as they are, the query block packed once, V converted on demand)
@pytest.mark.parametrize("isa", EMULATED)
@pytest.mark.parametrize("case", [
    dict(h_q=8, h_kv=1, d=128, lengths=[45, 3], phase="decode", extend=1, layout="paged", bs=16),
    dict(h_q=12, h_kv=4, d=80, lengths=[70], phase="extend", extend=9, layout="contiguous", bs=16),
    dict(h_q=7, h_kv=1, d=48, lengths=[0, 33], phase="extend", extend=4, layout="paged", bs=32),
    dict(h_q=32, h_kv=4, d=128, lengths=[100], phase="decode", extend=1, layout="contiguous", bs=16),
    dict(h_q=20, h_kv=1, d=64, lengths=[17, 40], phase="extend", extend=3, layout="paged", bs=16),
])
def test_simd_and_tile_sources_emulated(isa, case):
    if isa not in ISAS:
        pytest.skip(f"the {isa} build is not here")
    p = AttentionProblem.custom(case["h_q"], case["h_kv"], case["d"], case["lengths"], phase=case["phase"],
                                extend=case["extend"], layout=case["layout"], block_size=case["bs"])
    d = p.materialize(rotate=False)
    check(d, call(d, isa=isa, threads=2, kv_splits=2 if case["phase"] == "decode" else 0), f"{isa} {p}")


# ---- random shapes (hypothesis) ----------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h_kv=st.sampled_from([1, 2, 4]), G=st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 16]),
       d=st.sampled_from([16, 64, 80, 128]),
       lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
       phase=st.sampled_from(["decode", "extend"]), n=st.integers(1, 40),
       layout=st.sampled_from(["paged", "contiguous"]), bs=st.sampled_from([16, 32, 128]),
       splits=st.sampled_from([0, 1, 3]), seed=st.integers(0, 1000))
def test_random_shapes_match_the_reference(h_kv, G, d, lengths, phase, n, layout, bs, splits, seed):
    if "avx2" not in ISAS:
        pytest.skip("no AVX2 here")
    if phase == "decode":
        n = 1
    else:
        lengths = [x - 1 for x in lengths]           # prefixes from 0
    p = AttentionProblem.custom(G * h_kv, h_kv, d, lengths, phase=phase, extend=n, layout=layout,
                                block_size=bs, seed=seed)
    data = p.materialize(rotate=False)
    check(data, call(data, kv_splits=splits), str(p))


# ---- hostile inputs ----------------------------------------------------------------------------------
def _small():
    return AttentionProblem.custom(8, 2, 64, [50, 70], layout="paged", block_size=16).materialize(rotate=False)


def test_block_table_out_of_range_is_a_value_error():
    d = _small()
    k, v, table = d.cache(0)
    bad = table.clone()
    bad[1, 2] = k.shape[0]
    with pytest.raises(ValueError, match="outside"):
        kernels.decode_attention(d.q, k, v, d.kv_lens, block_table=bad)
    bad[1, 2] = -1
    with pytest.raises(ValueError, match="outside"):
        kernels.decode_attention(d.q, k, v, d.kv_lens, block_table=bad)
    # entries past a sequence's last block are never read, so they may hold anything
    ok = table.clone()
    ok[0, -1] = 10 ** 6 if ok.shape[1] > 4 else ok[0, -1]
    kernels.decode_attention(d.q, k, v, d.kv_lens, block_table=ok)


def test_zero_length_and_bad_heads_and_head_dims_are_value_errors():
    d = _small()
    k, v, table = d.cache(0)
    with pytest.raises(ValueError, match="l = 0"):
        kernels.decode_attention(d.q, k, v, [0, 70], block_table=table)
    with pytest.raises(ValueError, match="multiple of h_kv"):
        kernels.decode_attention(d.q[:, :7], k, v, d.kv_lens, block_table=table)
    q = torch.zeros(1, 4, 576, dtype=torch.bfloat16)
    kc = torch.zeros(1, 1, 8, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 576"):
        kernels.decode_attention(q, kc, kc, [8])
    q = torch.zeros(1, 4, 40, dtype=torch.bfloat16)
    kc = torch.zeros(1, 1, 8, 40, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim 40"):
        kernels.decode_attention(q, kc, kc, [8])
    with pytest.raises(ValueError, match="bfloat16"):
        kernels.decode_attention(d.q.float(), k, v, d.kv_lens, block_table=table)
    with pytest.raises(ValueError, match="query token"):
        kernels.extend_attention(d.q, k, v, [0, 0], [0, 2], block_table=table)


def test_an_isa_this_cpu_lacks_is_refused_not_run():
    for isa in ("avx512", "avx512-nobf16", "amx"):
        if not kernels.isa_status(kernels.isa_variant(isa))[0]:
            with pytest.raises(kernels.IsaUnavailable, match="cannot run here"):
                kernels.resolve_attention_isa(isa)
    assert kernels.resolve_attention_isa("auto") in ("amx", "avx512", "avx512-nobf16", "avx2", "scalar")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(isa=st.sampled_from(EMULATED), h_kv=st.sampled_from([1, 2]), G=st.sampled_from([1, 3, 8, 17]),
       d=st.sampled_from([16, 48, 64]), lengths=st.lists(st.integers(1, 120), min_size=1, max_size=3),
       phase=st.sampled_from(["decode", "extend"]), n=st.integers(1, 9), bs=st.sampled_from([16, 32]),
       layout=st.sampled_from(["paged", "contiguous"]), seed=st.integers(0, 100))
def test_random_shapes_on_the_emulated_sources(isa, h_kv, G, d, lengths, phase, n, bs, layout, seed):
    if isa not in ISAS:
        pytest.skip(f"the {isa} build is not here")
    if phase == "decode":
        n = 1
    else:
        lengths = [x - 1 for x in lengths]
    p = AttentionProblem.custom(G * h_kv, h_kv, d, lengths, phase=phase, extend=n, layout=layout, block_size=bs,
                                seed=seed)
    data = p.materialize(rotate=False)
    check(data, call(data, isa=isa, threads=2), f"{isa} {p}")


@pytest.mark.parametrize("isa", FAST)
@pytest.mark.parametrize("phase", ["decode", "extend"])
def test_a_plan_is_the_call_checked_once_and_reads_the_tensors_as_they_are_when_run(isa, phase):
    d = AttentionProblem.create("qwen3-30b-a3b", phase, 2, 300, 17 if phase == "extend" else 1,
                                layout="paged", ragged=True).materialize(rotate=False)
    k, v, table = d.cache(0)
    if phase == "decode":
        plan = kernels.decode_attention_plan(d.q, k, v, d.kv_lens, block_table=table, isa=isa, threads=2)
    else:
        plan = kernels.extend_attention_plan(d.q, k, v, d.prefix_lens(), d.q_lens, block_table=table, isa=isa,
                                             threads=2)
    out = plan()
    assert out is plan.out and plan() is out          # one output tensor, reused
    check(d, out, f"{isa} {phase} plan")
    assert torch.equal(out, call(d, isa=isa))
    saved = d.q.clone()
    d.q.mul_(-1)                                       # new contents, same tensor: the plan reads them
    flipped = plan().clone()
    assert torch.equal(flipped, call(d, isa=isa))
    d.q.copy_(saved)
    with pytest.raises(ValueError):                     # checked when made, as the call itself is
        kernels.decode_attention_plan(d.q[:, :7], k, v, d.kv_lens, block_table=table, isa=isa)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_three_calls_ablation_backend_gives_hinas_bits_and_restores_the_switch(isa):
    """hina:<isa>-3calls runs hina:<isa>'s attention with the fused step off, call by call: the same
    output bits, and the module's switch back on after each call (hina:<isa> in the same process keeps
    its step)."""
    if isa not in ISAS:
        pytest.skip(f"this CPU cannot run the {isa} build")
    from hinabench.backends import get
    p = AttentionProblem.create("qwen3-30b-a3b", "decode", 1, 700, layout="paged")
    d = p.materialize(rotate=False)
    out = {}
    for name in (f"hina:{isa}", f"hina:{isa}-3calls"):
        b = get(name)(threads=2)
        b.supports(d)
        b.prepare(d)
        out[name] = b.run_attention(0)
        assert kernels.attention_fused_step(isa=isa) is True
    assert torch.equal(out[f"hina:{isa}"], out[f"hina:{isa}-3calls"])
    check(d, out[f"hina:{isa}-3calls"], f"hina:{isa}-3calls")
    assert get(f"hina:{isa}-3calls").ops == ("attention",)


def test_sglang_attention_adapter_reads_the_paged_cache_as_a_token_pool(monkeypatch):
    """`sglang:attn` hands SGLang's kernels the problem's own paged cache as their token pool and its block
    slots as req_to_token. vLLM's _C is not here (CI), so stand-ins with SGLang's calling convention and
    semantics (decode.cpp / extend.cpp: the prefix through req_to_token, extend's new rows from k_extend /
    v_extend, causal over them) compute what the kernel would from what the adapter passes."""
    import types

    from hinabench.backends import sglang_attention as sa
    from hinabench.backends import vllm as vb
    from hinabench.worker.protocol import PeerUnsupported

    def attend(q, k, v, scale, prefix):   # q [n, h_q, d], k / v [L, h_kv, d]
        G = q.shape[1] // k.shape[1]
        k, v = k.float().repeat_interleave(G, 1), v.float().repeat_interleave(G, 1)
        s = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
        s = s.masked_fill(torch.arange(k.shape[0]) > prefix + torch.arange(q.shape[0])[:, None], float("-inf"))
        return torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)

    def decode(q, kpool, vpool, out, key, value, loc, logits, r2t, req, seq_lens, scale, cap, cross, sw, enc, sinks):
        assert key is None and logits.shape[:2] == q.shape[:2] and logits.shape[3] == vpool.shape[2] + 1
        for b in range(q.shape[0]):
            idx = r2t[int(req[b]), : int(seq_lens[b])]
            out[b] = attend(q[b: b + 1], kpool[idx], vpool[idx], scale, int(seq_lens[b]) - 1)[0].to(out.dtype)

    def extend(q, kext, vext, out, kpool, vpool, r2t, req, seq_lens, ext_lens, ext_start, max_ext, scale, cap,
               cross, sw, enc, sinks, tree):
        for b in range(len(seq_lens)):
            n, s0, L = int(ext_lens[b]), int(ext_start[b]), int(seq_lens[b])
            idx = r2t[int(req[b]), : L - n]
            k, v = torch.cat([kpool[idx], kext[s0: s0 + n]]), torch.cat([vpool[idx], vext[s0: s0 + n]])
            out[s0: s0 + n] = attend(q[s0: s0 + n], k, v, scale, L - n).to(out.dtype)

    monkeypatch.setattr(vb, "_load_kernels",
                        lambda variant: types.SimpleNamespace(decode_attention_cpu=decode, extend_attention_cpu=extend))
    for phase, n in (("decode", 1), ("extend", 7)):
        d = AttentionProblem.custom(8, 2, 64, [37, 100], phase=phase, extend=n, layout="paged").materialize(rotate=False)
        peer = sa.make_peer("sgl", 2)
        peer.prepare(d)
        check(d, peer.run(0), f"sglang:attn {phase}")
    d = AttentionProblem.custom(8, 2, 64, [37], layout="contiguous").materialize(rotate=False)
    with pytest.raises(PeerUnsupported, match="token pool"):
        sa.make_peer("sgl", 2).prepare(d)
