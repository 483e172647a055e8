import math

import pytest
import torch

from hinabench import _C
from hinabench.errors import UserError
from hinabench.models import MODELS, get_model, UnknownModel
from hinabench.problems import FFNProblem, fill_bf16, materialize, problem_from_dict
from hinabench.problems import diagnose, moe_ffn_reference, rel_err


def test_reference_against_hand_computed_case():
    # H = 2, I = 1, two experts, one token routed to both with weights 0.25 / 0.75.
    x = torch.tensor([[1.0, 2.0]])
    w_gate = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])      # gate_0 = x0 = 1, gate_1 = x1 = 2
    w_up = torch.tensor([[[0.0, 1.0]], [[1.0, 1.0]]])        # up_0 = 2, up_1 = 3
    w_down = torch.tensor([[[1.0], [2.0]], [[-1.0], [0.5]]])  # [E, H, I]
    ids = torch.tensor([[0, 1]])
    w = torch.tensor([[0.25, 0.75]])
    silu = lambda v: v / (1 + math.exp(-v))  # noqa: E731
    h0, h1 = silu(1.0) * 2.0, silu(2.0) * 3.0
    expect = torch.tensor([[0.25 * h0 * 1.0 + 0.75 * h1 * -1.0, 0.25 * h0 * 2.0 + 0.75 * h1 * 0.5]])
    out = moe_ffn_reference(x, w_gate, w_up, w_down, ids, w)
    assert torch.allclose(out, expect, rtol=1e-6, atol=1e-6)


def test_rel_err():
    a = torch.tensor([3.0, 4.0])
    assert rel_err(a, a) == 0
    assert rel_err(a * 1.01, a) == pytest.approx(0.01)
    assert rel_err(torch.tensor([float("nan"), 1.0]), a) == math.inf
    assert rel_err(torch.zeros(3), a) == math.inf


def test_diagnose_says_what_is_wrong():
    ref = torch.randn(6, 32)
    assert diagnose(torch.zeros(6, 32), ref, 0.02) == "the output is all zeros"
    assert diagnose(torch.zeros(5, 32), ref, 0.02) == "shape [5, 32], expected [6, 32]"
    nan = ref.clone()
    nan[2, 3] = float("nan")
    assert diagnose(nan, ref, 0.02) == "1 of 192 values are NaN or Inf"
    some = ref.clone()
    some[4] = 0
    assert diagnose(some, ref, 0.02) == "1 of 6 tokens wrong (first: token 4), 1 token row(s) all zero"
    assert diagnose(2 * ref, ref, 0.02) == "every token wrong; |out|/|ref| = 2"


def test_registry_has_the_papers_models():
    for name in ["mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b",
                 "qwen2-57b-a14b"]:
        assert name in MODELS
    m = get_model("Mixtral-8x7B")
    assert (m.hidden_size, m.intermediate_size, m.routed_experts, m.top_k) == (4096, 14336, 8, 2)
    assert (get_model("deepseek-v3").hidden_size, get_model("deepseek-v3").intermediate_size) == (7168, 2048)
    with pytest.raises(UnknownModel, match="known models: mixtral-8x7b"):
        get_model("gpt-5")


def test_problem_construction_and_sizes():
    p = FFNProblem.create("qwen3-30b-a3b", 3)
    assert (p.H, p.I, p.A, p.T) == (2048, 768, 8, 3)
    assert p.weight_bytes == 8 * 3 * 2048 * 768 * 2
    assert p.flops == 2 * 3 * 8 * 3 * 2048 * 768
    d = materialize(FFNProblem.custom(64, 96, 5, 3, routed_experts=8), rotate=False)
    assert d.w13.shape == (3, 192, 64) and d.w_down.shape == (3, 64, 96)
    assert d.w_gate.shape == (3, 96, 64) and d.w_up.shape == (3, 96, 64)
    assert d.w_gate.stride() == (192 * 64, 64, 1)        # views into w13, rows contiguous
    assert d.x.shape == (5, 64) and d.x.dtype == torch.bfloat16
    ids = d.topk_ids[0]
    assert ids.dtype == torch.int32 and ids.shape == (5, 3)
    for row in ids.tolist():                               # every token uses all A experts, once
        assert sorted(row) == [0, 1, 2]
    assert torch.all(d.topk_weights > 0)
    assert torch.allclose(d.topk_weights.sum(1), torch.ones(5))


@pytest.mark.parametrize("kw, msg", [
    (dict(tokens_per_expert=0), "at least 1"),
    (dict(tokens_per_expert=1, active_experts=9), "has 8 routed experts"),
    (dict(tokens_per_expert=1, dtype="fp64"), "unknown dtype"),
])
def test_problem_errors(kw, msg):
    with pytest.raises(UserError, match=msg):
        FFNProblem.create("mixtral-8x7b", **kw)


def test_rotation_policy():
    llc = 32 << 20
    mixtral = FFNProblem.create("mixtral-8x7b", 1)        # 704 MB a call: over 4 LLCs, one group
    assert mixtral.rotation_groups(llc) == 1
    qwen = FFNProblem.create("qwen3-30b-a3b", 1)          # 75.5 MB a call
    r = qwen.rotation_groups(llc)
    assert r == 2 and (r - 1) * qwen.weight_bytes >= 2 * llc
    small = FFNProblem.custom(256, 512, 1, 2)
    r = small.rotation_groups(llc)
    assert (r - 1) * small.weight_bytes >= 2 * llc
    d = materialize(small, llc_bytes=4 << 20)
    assert d.groups == small.rotation_groups(4 << 20)
    # the groups are disjoint experts and disjoint memory
    seen = set()
    for g in range(d.groups):
        assert set(d.topk_ids[g].flatten().tolist()) == set(d.group_experts(g))
        for addr, n in d.group_buffers(g):
            assert addr not in seen
            seen.add(addr)
            assert n == small.A * small.H * small.I * 2 * (2 if n > small.A * small.H * small.I * 2 else 1)


def test_normal_fill_spreads_over_many_binades():
    """`--fill normal` (kernels/fill.cpp): a bell curve of standard deviation `scale`, the same whatever
    the thread count, with the small magnitudes trained weights have and the default fill's two binades
    lack (an AVX2 FP8 conversion that made them fp32 denormals took microcode assists on Intel cores:
    suites on the default fill could not show it)."""
    a = torch.empty(200_003, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    _C.fill_bf16(a.data_ptr(), a.numel(), 7, 0.05, 1, "normal")
    _C.fill_bf16(b.data_ptr(), b.numel(), 7, 0.05, 2, "normal")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    f = a.float()
    assert torch.isfinite(f).all() and abs(f.mean().item()) < 1e-3 and abs(f.std().item() - 0.05) < 1e-3
    assert 0.005 < (f.abs() < 0.05 / 64).float().mean().item() < 0.03     # a normal law: ~1.25%
    assert f.abs().max().item() <= 0.05 * 2 * 3 ** 0.5 * 1.01             # four uniforms: bounded
    fill_bf16(b, 7, 0.05)
    assert not torch.equal(a.view(torch.int16), b.view(torch.int16))
    with pytest.raises(ValueError, match="fill law"):
        _C.fill_bf16(a.data_ptr(), 1, 7, 0.05, 1, "gauss")
    from hinabench.cli.run import ffn                # its --fill choices are the laws, written out
    from hinabench.problems.base import FILL_LAWS
    assert tuple(next(o for o in ffn.params if o.name == "fill").type.choices) == FILL_LAWS


def test_the_fill_is_part_of_an_ffn_problem():
    p = FFNProblem.create("qwen3-30b-a3b", 2, dtype="fp8", fill="normal")
    q = problem_from_dict(p.to_dict())             # what a peer's worker rebuilds
    assert q.to_dict() == p.to_dict() and q.key() == p.key() and q.fill == "normal"
    assert p.key()["fill"] == "normal" and "normal fill" in str(p)
    assert FFNProblem.create("qwen3-30b-a3b", 2).key()["fill"] == "binades"
    with pytest.raises(UserError, match="unknown fill"):
        FFNProblem.create("qwen3-30b-a3b", 2, fill="gauss")
    a = materialize(FFNProblem.custom(256, 128, 2, 2, seed=3), rotate=False)
    b = materialize(FFNProblem.custom(256, 128, 2, 2, seed=3, fill="normal"), rotate=False)
    assert a.x.float().abs().min() >= 0.25 and b.x.float().abs().min() < 0.01
    assert not torch.equal(a.w13, b.w13)


def test_fill_is_deterministic_and_thread_independent():
    a = torch.empty(100_003, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    _C.fill_bf16(a.data_ptr(), a.numel(), 7, 0.05, 1)
    _C.fill_bf16(b.data_ptr(), b.numel(), 7, 0.05, 2)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    fill_bf16(b, 8, 0.05)
    assert not torch.equal(a.view(torch.int16), b.view(torch.int16))
    f = a.float().abs()
    assert torch.isfinite(f).all() and f.min() > 0.05 / 4 and f.max() < 0.05 * 2
    assert abs(a.float().mean().item()) < 1e-3
