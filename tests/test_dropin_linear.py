"""hina+l's drop-in (hinabench/e2e/dropin_linear.py): sibling projections of one input run as one
`linear_group` call and give exactly what separate calls give; a transformers router (not an
nn.Linear) runs its own forward with F.linear on the HiNa kernel; on=False puts torch's back."""
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hinabench import kernels  # noqa: E402
from hinabench.e2e import dropin_linear as DL  # noqa: E402


def tiny_qwen3(experts=32):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=experts, num_experts_per_tok=2, decoder_sparse_step=1)
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).eval()


def per_linear_only(model):
    """hina+l as it was before groups and routers: each nn.Linear on its own call, routers on torch."""
    DL.use_hina_linear(model, on=False)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.forward = types.MethodType(DL.hina_linear_forward, mod)


def test_q_k_v_run_as_one_group_and_match_separate_calls(monkeypatch):
    model = tiny_qwen3()
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(1))
    per_linear_only(model)
    with torch.inference_mode():
        separate = model(input_ids=ids).logits
    prepared = []
    real_prepare = DL.linear_prepare
    monkeypatch.setattr(DL, "linear_prepare",
                        lambda ws: prepared.append([tuple(w.shape) for w in ws]) or real_prepare(ws))
    DL.use_hina_linear(model)
    with torch.inference_mode():
        grouped = model(input_ids=ids).logits
        n = len(prepared)
        assert torch.equal(model(input_ids=ids).logits, grouped) and len(prepared) == n   # weights checked once
    assert [len(p) for p in prepared if len(p) > 1] == [3, 3]   # q, k, v of each layer: one call
    assert prepared.count([(32, 64)]) == 2                     # each layer's router on the kernel
    # the router's logits are now rounded by the kernel, not by torch: equal up to bf16 rounding
    assert (grouped.float() - separate.float()).abs().max() <= 0.05 * separate.float().abs().max()
    DL.use_hina_linear(model, on=False)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_group_member_called_on_another_tensor_computes_its_own():
    lin = [torch.nn.Linear(64, n, bias=False).to(torch.bfloat16) for n in (64, 32, 32)]
    group = DL._Siblings(lin)
    x, z = torch.randn(2, 64).to(torch.bfloat16), torch.randn(2, 64).to(torch.bfloat16)
    q = group.forward(lin[0], x)
    assert torch.equal(q, kernels.linear(x, lin[0].weight))
    k = group.forward(lin[1], z)                               # not the tensor the group saw: its own call
    assert torch.equal(k, kernels.linear(z, lin[1].weight))
    x.mul_(2)                                                  # modified in place since: recomputed
    assert torch.equal(group.forward(lin[2], x), kernels.linear(x, lin[2].weight))


def test_a_router_takes_the_kernel_only_where_its_shape_fits():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    for experts, on_kernel in ((32, True), (8, False)):
        model = tiny_qwen3(experts)
        router = next(m for m in model.modules() if isinstance(m, Qwen3MoeTopKRouter))
        assert DL._is_router(router)
        x = torch.randn(5, 64).to(torch.bfloat16)
        want = router(x)
        DL.use_hina_linear(model)
        got = router(x)
        assert "forward" in router.__dict__
        assert torch.equal(got[2], want[2]) or not on_kernel     # top-k ids (random weights: no near-ties here)
        if on_kernel:
            assert torch.equal(got[0], kernels.linear(x, router.weight))
        else:
            assert torch.equal(got[0], want[0])                  # 8 experts: F.linear, as transformers does
