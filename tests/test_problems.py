"""Problem kinds, points and the row key: the harness's spine (hinabench/problems, harness/points.py)."""
import pytest
import torch

from hinabench.dtypes import DTYPES, get_dtype
from hinabench.errors import UserError
from hinabench.harness.points import Point, row_key
from hinabench.harness.store import COLUMNS, ResultStore, schema
from hinabench.harness.suite import Sweep
from hinabench.models import MODELS, get_model
from hinabench.problems import (KINDS, FFNProblem, LinearProblem, moe_ffn_reference, problem_from_dict,
                                rel_err)


def test_every_kind_round_trips_through_a_dict():
    for p in (FFNProblem.create("qwen3-30b-a3b", 3), FFNProblem.create("mixtral-8x7b", 5, routing="router"),
              LinearProblem.create("qwen3-30b-a3b", "qkv", 4)):
        q = problem_from_dict(p.to_dict())
        assert type(q) is type(p) and q.key() == p.key()


def test_ffn_names_batch_tokens_and_tokens_per_expert_apart():
    same = FFNProblem.create("qwen3-30b-a3b", 4)
    assert same.batch_tokens == same.tokens_per_expert == 4 and same.weight_bytes == 8 * 3 * 2048 * 768 * 2
    routed = FFNProblem.create("qwen3-30b-a3b", 16, routing="router", seed=3)
    ids = routed.routing_ids()
    assert ids.shape == (16, 8) and ids.dtype == torch.int32
    assert all(len(set(row)) == 8 for row in ids.tolist())           # top-8 distinct experts per token
    touched = routed.touched_experts()
    assert touched == len(set(ids.flatten().tolist())) and 8 < touched <= 128
    assert routed.tokens_per_expert == pytest.approx(16 * 8 / touched, abs=0.01)
    assert routed.weight_bytes == touched * 3 * 2048 * 768 * 2
    assert routed.flops == 2 * 16 * 8 * 3 * 2048 * 768
    # the same seed routes the same way in every process: the ids come from the counter-based hash
    assert torch.equal(FFNProblem.create("qwen3-30b-a3b", 16, routing="router", seed=3).routing_ids(), ids)
    with pytest.raises(UserError, match="unknown routing"):
        FFNProblem.create("qwen3-30b-a3b", 1, routing="random")


def test_router_data_matches_its_reference_and_rotates_over_all_experts():
    p = FFNProblem.custom(64, 96, 7, 2, routed_experts=6, routing="router", seed=1)
    d = p.materialize(llc_bytes=1 << 20)
    assert d.experts_per_group == 6 and d.num_experts == 6 * d.groups
    for g in range(d.groups):
        assert set(d.topk_ids[g].flatten().tolist()) <= set(d.group_experts(g))
    ref = moe_ffn_reference(d.x, d.w_gate, d.w_up, d.w_down, d.topk_ids[0], d.topk_weights)
    assert rel_err(d.reference(0), ref) == 0


def test_linear_problem_shapes_from_the_registry():
    for m in MODELS.values():
        for name, (n, k) in m.projections().items():
            assert n > 0 and k > 0 and n % 32 == 0 and k % 32 == 0, (m.name, name)
    q = get_model("qwen3-30b-a3b").projections()
    assert q["qkv"] == ((32 + 2 * 4) * 128, 2048) and q["o"] == (2048, 32 * 128) and q["lm_head"] == (151936, 2048)
    assert set(get_model("deepseek-v3").projections()) == {"q_a", "q_b", "kv_a", "kv_b", "o", "lm_head"}
    p = LinearProblem.create("qwen3-30b-a3b", "qkv", 8)
    assert (p.N, p.K) == (5120, 2048) and p.weight_bytes == 5120 * 2048 * 2 and p.flops == 2 * 8 * 5120 * 2048
    d = LinearProblem.custom(96, 64, 3).materialize(rotate=False)
    assert d.w.shape == (1, 96, 64) and d.x.shape == (3, 64)
    assert torch.allclose(d.reference(0), d.x.float() @ d.w[0].float().T)
    with pytest.raises(UserError, match="has no projection 'qkv'.*q_a"):
        LinearProblem.create("deepseek-v3", "qkv", 1)
    with pytest.raises(UserError, match="at least 1"):
        LinearProblem.create("qwen3-30b-a3b", "o", 0)


def test_dtypes_are_one_table():
    bf16 = get_dtype("bf16")
    assert bf16.element_bytes == 2 and bf16.tolerance == 2e-2 and bf16.torch_dtype == torch.bfloat16
    assert FFNProblem.create("qwen3-30b-a3b", 1).tolerance == bf16.tolerance
    from hinabench.backends.hina import HinaAvx2
    assert HinaAvx2.dtypes == tuple(d for d in DTYPES if "avx2" in DTYPES[d].kernel_isas)
    with pytest.raises(UserError, match="unknown dtype 'fp64'"):
        get_dtype("fp64")


def test_row_key_is_the_point_and_reads_old_rows():
    p = Point(FFNProblem.create("qwen3-30b-a3b", 2), 1, "default")
    row = {"backend": "torch", **p.columns()}
    assert p.key("torch") == row_key(row)
    # a row stored before op/routing/batch_tokens existed, read back from CSV (strings)
    old = {"backend": "torch", "model": "qwen3-30b-a3b", "dtype": "bf16", "tokens_per_expert": "2",
           "experts": "8", "threads": "1", "numa": "default"}
    assert row_key(old) == p.key("torch")
    assert row_key(row, backend=False) == p.key()
    lin = Point(LinearProblem.create("qwen3-30b-a3b", "o", 2), 1)
    assert lin.key("torch") != p.key("torch")


def test_a_sweep_is_the_product_of_its_axes():
    s = Sweep(models=["qwen3-30b-a3b", "mixtral-8x7b"], tokens=[1, 4], routing=["same-experts", "router"],
              numa=["default"])
    pts = s.points([1, 2])
    assert len(pts) == 2 * 2 * 2 * 2 and len({pt.key("x") for pt in pts}) == len(pts)
    assert [str(pt.problem.model.name) for pt in pts[:8]] == ["qwen3-30b-a3b"] * 8
    lin = Sweep(op="linear", models=["qwen3-30b-a3b"], tokens=[1]).points([1])
    assert [pt.problem.proj for pt in lin] == ["qkv", "o", "lm_head"]


def test_schema_per_kind_and_unknown_columns_are_errors(tmp_path):
    assert set(schema("ffn")) >= {"model", "tokens_per_expert", "experts", "hidden_size", "routing", "op"}
    assert COLUMNS == schema("ffn")
    assert {"proj", "out_features", "in_features", "batch_tokens"} <= set(schema("linear"))
    for op in KINDS:
        assert len(set(schema(op))) == len(schema(op))
    store = ResultStore(tmp_path / "r.csv")
    with pytest.raises(ValueError, match="outside the ffn schema.*bogus"):
        store.append({"backend": "torch", "bogus": 1})
