"""One decoder layer's decode step as one native call (hinabench.kernels_layer, kernels/ops/layer.cpp) and
engine hina+fused (hinabench/e2e/dropin_layer.py): against an fp32 reference of the layer on every path
this machine can run (native and emulated), real and random shapes; against transformers' own layer
(hina+l+a: the same kernels, transformers' glue) step by step; hostile inputs."""
import math

import pytest
import torch
from hypothesis import assume, example, given, settings, strategies as st

from hinabench import kernels
from hinabench.kernels_layer import decoder_layer_prepare
from hinabench.problems import rel_err

PATHS = [p for p in ["scalar", "avx2", "avx512", "avx512-nobf16", "amx", "avx512-emulated", "amx-emulated",
                       "avx512-nobf16-emulated"]
         if kernels.isa_status(p)[0]]
NEAR_TIE = 0.05   # logits: bf16 rounds a logit of ~3 by up to ~0.008, the router's inputs more
TOL = 1e-2   # bf16 activations rounded at every op, as transformers' layer rounds them, against fp32 throughout
# The drawn layers are 64 wide: the norm-wise error over 64 outputs spreads wider. Every path, the scalar
# one included, makes the same roundings: over 300 draws of the strategy below (2026-12-07) scalar, avx512
# and amx-emulated read median 0.0035, max 0.0080-0.0093; CI drew an example (the @example below) at
# 0.0100 on avx512 / amx(-emulated), 0.0087 on scalar, 0.0092 on avx512-nobf16: the scheme's tail, not a path's fault.
TOL_DRAWN = 1.5e-2


def attn_isa(isa: str) -> str:
    """The attention kernel in the same module as `isa`'s (scalar where it has none of its own)."""
    from hinabench.kernels_attention import attention_isas
    return isa if isa in attention_isas(isa) else "scalar"


class Layer:
    """A random decoder layer: bf16 weights, an fp32 reference of its decode step."""

    def __init__(self, H, I, E, k, h_q, h_kv, d, qk_norm, norm_topk=True, topk_bf16=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).bfloat16()   # noqa: E731
        self.H, self.E, self.k, self.h_q, self.h_kv, self.d = H, E, k, h_q, h_kv, d
        self.norm_topk, self.topk_bf16 = norm_topk, topk_bf16
        self.in_norm, self.post_norm = 1 + r(H, scale=0.1), 1 + r(H, scale=0.1)
        self.q_norm, self.k_norm = (1 + r(d, scale=0.1), 1 + r(d, scale=0.1)) if qk_norm else (None, None)
        s = 1 / math.sqrt(H)
        self.wq, self.wk, self.wv = r(h_q * d, H, scale=s), r(h_kv * d, H, scale=s), r(h_kv * d, H, scale=s)
        self.wo = r(H, h_q * d, scale=1 / math.sqrt(h_q * d))
        self.router = r(E, H, scale=3 * s)            # logits of std ~3: top-k decisions well apart
        self.w13, self.w_down = r(E, 2 * I, H, scale=s), r(E, H, I, scale=1 / math.sqrt(I))
        self.eps = 1e-6

    def prepare(self, isa):
        return decoder_layer_prepare(
            experts=kernels.moe_ffn_prepare(None, None, self.w_down, w13=self.w13, isa=isa), in_norm=self.in_norm,
            post_norm=self.post_norm, q_norm=self.q_norm, k_norm=self.k_norm, wq=self.wq, wk=self.wk, wv=self.wv,
            wo=self.wo, router=self.router, h_q=self.h_q, h_kv=self.h_kv, eps=self.eps, top_k=self.k,
            norm_topk=self.norm_topk, topk_bf16=self.topk_bf16, attn_isa=attn_isa(isa))

    def reference(self, x, cos, sin, keys, values, pos):
        """fp32 throughout: (out [B, H], the new K [B, h_kv, d], V, the router's smallest top-k margin)."""
        f = lambda t: None if t is None else t.float()   # noqa: E731
        H, d, h_q, h_kv = self.H, self.d, self.h_q, self.h_kv
        B = x.shape[0]

        def norm(v, w):
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps) * f(w)

        def rope(v):   # v [B, h, d]
            c, s_ = f(cos)[:, None], f(sin)[:, None]
            rot = torch.cat((-v[..., d // 2:], v[..., :d // 2]), -1)
            return v * c + rot * s_
        x = f(x)
        n = norm(x, self.in_norm)
        q = (n @ f(self.wq).T).view(B, h_q, d)
        k = (n @ f(self.wk).T).view(B, h_kv, d)
        v = (n @ f(self.wv).T).view(B, h_kv, d)
        if self.q_norm is not None:
            q, k = norm(q, self.q_norm), norm(k, self.k_norm)
        q, k = rope(q), rope(k)
        K = torch.cat((f(keys[:, :, :pos]), k[:, :, None]), 2)       # [B, h_kv, pos + 1, d]
        V = torch.cat((f(values[:, :, :pos]), v[:, :, None]), 2)
        G = h_q // h_kv
        K, V = K.repeat_interleave(G, 1), V.repeat_interleave(G, 1)
        p = torch.softmax((q[:, :, None] @ K.transpose(-1, -2)) / math.sqrt(d), -1)
        a = (p @ V).reshape(B, h_q * d)
        h = x + a @ f(self.wo).T
        n2 = norm(h, self.post_norm)
        probs = torch.softmax(n2 @ f(self.router).T, -1)
        top = torch.topk(probs, min(self.k + 1, self.E), -1)
        lp = top.values.log()   # the margin in logits (log-probs differ by the same)
        margin = float((lp[:, self.k - 1] - lp[:, self.k]).min()) if self.k < self.E else 1.0
        tw, ti = top.values[:, :self.k], top.indices[:, :self.k]
        if self.norm_topk:
            tw = tw / tw.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        I = self.w_down.shape[2]
        for t in range(B):
            for s in range(self.k):
                e = int(ti[t, s])
                gu = n2[t] @ f(self.w13[e]).T
                y[t] += tw[t, s] * ((torch.nn.functional.silu(gu[:I]) * gu[I:]) @ f(self.w_down[e]).T)
        return h + y, k, v, margin


def step_inputs(lay: Layer, B: int, pos: int, cap: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, lay.H, generator=g).bfloat16()
    theta = torch.arange(lay.d // 2) / (lay.d // 2)
    ang = (pos + torch.arange(B)[:, None]) * 10000 ** (-theta)
    cos = torch.cat((ang.cos(), ang.cos()), -1).bfloat16()
    sin = torch.cat((ang.sin(), ang.sin()), -1).bfloat16()
    keys = torch.randn(B, lay.h_kv, cap, lay.d, generator=g).bfloat16()
    values = torch.randn(B, lay.h_kv, cap, lay.d, generator=g).bfloat16()
    return x, cos, sin, keys, values


def check(lay: Layer, isa: str, B: int, pos: int, cap: int | None = None, seed: int = 1, drawn: bool = False,
          tol: float = TOL):
    # a top-k near-tie (logits closer than bf16 rounding moves them) may flip an expert: no verdict on such
    # data; a drawn example is discarded, fixed data takes the next seed whose router decisions are clear
    for attempt in range(1 if drawn else 20):
        x, cos, sin, keys, values = step_inputs(lay, B, pos, cap or pos + 3, seed + 1000 * attempt)
        ref, k_new, v_new, margin = lay.reference(x, cos, sin, keys, values, pos)
        if margin > NEAR_TIE:
            break
    if drawn:
        assume(margin > NEAR_TIE)
    assert margin > NEAR_TIE
    before = keys.clone()
    out = lay.prepare(isa)(x, cos, sin, keys, values, pos)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (B, lay.H)
    err = rel_err(out, ref)
    assert err <= tol, f"{isa} B={B} pos={pos}: rel err {err:.3g}"
    # the new K and V written at `pos`, nothing else of the caches touched
    assert rel_err(keys[:, :, pos], k_new) <= TOL and rel_err(values[:, :, pos], v_new) <= 1e-2
    mask = torch.ones(keys.shape[2], dtype=torch.bool)
    mask[pos] = False
    assert torch.equal(keys[:, :, mask], before[:, :, mask])


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("shape", [
    # H, I, E, k, h_q, h_kv, d, q/k norm: Qwen3-30B-A3B's heads and widths cut down, Mixtral's (E = 8: the router's
    # loop path), MHA
    (128, 64, 32, 4, 8, 2, 32, True), (128, 96, 8, 2, 8, 2, 32, False), (64, 64, 4, 4, 2, 2, 64, True)])
def test_decode_step_matches_fp32_on_every_path(isa, shape):
    *dims, qk = shape
    lay = Layer(*dims, qk_norm=qk, topk_bf16=qk)
    for B, pos in ((1, 0), (1, 37), (3, 5)):
        check(lay, isa, B, pos)


@pytest.mark.parametrize("isa", [p for p in PATHS if not p.endswith("emulated")])
def test_decode_step_on_qwen3_30b_a3b_widths(isa):
    """Qwen3-30B-A3B's own layer widths (H 2048, I 768, 32 / 4 heads of 128; 16 experts of its 128 kept)."""
    lay = Layer(2048, 768, 16, 8, 32, 4, 128, qk_norm=True, topk_bf16=True)
    check(lay, isa, 1, 100)


@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), pos=st.integers(0, 70), E=st.sampled_from([4, 8, 32]), k=st.integers(1, 4),
       heads=st.sampled_from([(4, 4), (4, 2), (8, 1)]), d=st.sampled_from([16, 32, 64]), qk=st.booleans(),
       norm_topk=st.booleans(), seed=st.integers(0, 2**16))
@example(B=1, pos=33, E=4, k=3, heads=(4, 4), d=16, qk=False, norm_topk=False, seed=1634)
def test_decode_step_on_random_shapes(B, pos, E, k, heads, d, qk, norm_topk, seed):
    h_q, h_kv = heads
    assume(k <= E and (h_q * d) % 32 == 0 and (h_kv * d) % 32 == 0)   # the linear kernel has no tail code
    lay = Layer(64, 32, E, k, h_q, h_kv, d, qk_norm=qk, norm_topk=norm_topk, seed=seed)
    check(lay, PATHS[-1] if "amx-emulated" not in PATHS else "amx-emulated", B, pos, seed=seed + 1, drawn=True,
          tol=TOL_DRAWN)


@pytest.mark.parametrize("isa", [PATHS[0], PATHS[-1]])
def test_a_stack_is_its_layers_in_turn(isa):
    """PreparedStack: the same bits as each layer called in turn, each appending to its own cache; caches
    of another geometry, or too few, are refused."""
    from hinabench.kernels_layer import PreparedStack
    lays = [Layer(128, 64, 8, 2, 8, 2, 32, qk_norm=True, seed=s) for s in range(3)]
    prepared = [lay.prepare(isa) for lay in lays]
    x, cos, sin, _, _ = step_inputs(lays[0], 2, 6, 9)
    caches = [step_inputs(lays[0], 2, 6, 9, seed=10 + i)[3:] for i in range(3)]
    mine = [(k.clone(), v.clone()) for k, v in caches]
    h = x
    for p, (k, v) in zip(prepared, caches):
        h = p(h, cos, sin, k, v, 6)
    out = PreparedStack(prepared)(x, cos, sin, [k for k, _ in mine], [v for _, v in mine], 6)
    assert torch.equal(out, h) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(mine, caches))
    with pytest.raises(ValueError, match="one K and one V cache per layer"):
        PreparedStack(prepared)(x, cos, sin, [k for k, _ in mine][:2], [v for _, v in mine][:2], 6)
    with pytest.raises(ValueError, match="must match the first K cache"):
        PreparedStack(prepared)(x, cos, sin, [k for k, _ in mine], [v for _, v in mine][:2] + [mine[2][1][:, :, :8]], 6)


def test_hostile_inputs_are_clear_errors():
    lay = Layer(64, 32, 8, 2, 4, 2, 16, qk_norm=True)
    layer = lay.prepare("scalar")
    x, cos, sin, keys, values = step_inputs(lay, 1, 4, 5)
    with pytest.raises(ValueError, match="no room for position 5"):
        layer(x, cos, sin, keys, values, 5)
    with pytest.raises(ValueError, match="x must be a contiguous bfloat16"):
        layer(x.float(), cos, sin, keys, values, 4)
    with pytest.raises(ValueError, match="cos must be bfloat16"):
        layer(x, cos[:, :8], sin, keys, values, 4)
    with pytest.raises(ValueError, match="k_cache must be bfloat16"):
        layer(x, cos, sin, keys.transpose(1, 2), values, 4)
    kw = dict(experts=kernels.moe_ffn_prepare(None, None, lay.w_down, w13=lay.w13, isa="scalar"), in_norm=lay.in_norm,
              post_norm=lay.post_norm, wq=lay.wq, wk=lay.wk, wv=lay.wv, wo=lay.wo, router=lay.router, h_q=4, h_kv=2,
              eps=1e-6, top_k=2, attn_isa="scalar")
    with pytest.raises(ValueError, match="q_norm and k_norm go together"):
        decoder_layer_prepare(**kw, q_norm=lay.q_norm)
    with pytest.raises(ValueError, match=r"router must be \[8, 64\]"):
        decoder_layer_prepare(**dict(kw, router=lay.router[:4]))
    with pytest.raises(ValueError, match="top_k must be in"):
        decoder_layer_prepare(**dict(kw, top_k=9))
    with pytest.raises(ValueError, match="multiple of h_kv"):
        decoder_layer_prepare(**dict(kw, h_kv=3))
    with pytest.raises(ValueError, match="in_norm must be a contiguous bfloat16"):
        decoder_layer_prepare(**dict(kw, in_norm=lay.in_norm.float()))
    with pytest.raises(ValueError, match="multiples of 32"):   # one KV head of 16: the linear kernel has no tail code
        decoder_layer_prepare(**dict(kw, wk=lay.wk[:16], wv=lay.wv[:16], h_kv=1))
    with pytest.raises(ValueError, match="experts must be"):
        decoder_layer_prepare(**dict(kw, experts=None))


# ---- engine hina+fused in transformers ------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


def tiny(kind: str):
    if kind == "qwen3":
        from transformers import Qwen3MoeConfig as Cfg, Qwen3MoeForCausalLM as LM
        cfg = Cfg(vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=32, num_experts_per_tok=2,
                  decoder_sparse_step=1)
    else:
        from transformers import MixtralConfig as Cfg, MixtralForCausalLM as LM
        cfg = Cfg(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2)
    torch.manual_seed(0)
    return LM(cfg).to(torch.bfloat16).eval()


@pytest.mark.parametrize("kind", ["qwen3", "mixtral"])
def test_fused_engine_decodes_as_transformers_layers_do(kind, monkeypatch):
    """hina+fused against hina+l+a (the same kernels with transformers' own glue), teacher-forced step by step:
    the logits agree (transformers' bf16 roundings are the native layer's); a decode step is one native call
    for the whole stack, or, where the model's forward must run (positions given), one per layer; prefill
    on the layers' own forward; and back."""
    from hinabench import kernels_layer
    from hinabench.e2e import dropin_layer
    from hinabench.e2e import measure as M
    model = tiny(kind)
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(3))
    M.set_engine(model, "hina+l+a", "eager", "sdpa")
    ref = M._decode_logits(model, ids, 10)
    calls = {"stack": [], "layer": []}
    for cls, key in ((kernels_layer.PreparedStack, "stack"), (kernels_layer.PreparedLayer, "layer")):
        real = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, _r=real, _k=key, **kw: calls[_k].append(a[-1]) or _r(self, *a, **kw))
    assert M.set_engine(model, "hina+fused", "eager", "sdpa") == "experts=hina attn=hina linear=hina layer=hina"
    got = M._decode_logits(model, ids, 10)
    assert rel_err(got, ref) <= 5e-3, rel_err(got, ref)
    assert calls == {"stack": list(range(10, 20)), "layer": []}     # one call a step, at its position
    prepared = [layer._hina_layer for layer in model.model.layers]
    stack = model.model._hina_stack
    assert stack.layers == prepared
    M._decode_logits(model, ids, 2)
    assert [layer._hina_layer for layer in model.model.layers] == prepared   # the weights checked once, not per step
    assert model.model._hina_stack is stack
    o = model.model.layers[1].self_attn.o_proj
    o.weight = torch.nn.Parameter(o.weight.detach().clone())                # transformers' tensor replaced:
    M._decode_logits(model, ids, 2)                                         # the next generation reads the new one
    assert model.model.layers[0]._hina_layer is prepared[0] and model.model.layers[1]._hina_layer is not prepared[1]
    ex = model.model.layers[1].mlp.experts
    assert model.model.layers[1]._hina_layer.reads(*dropin_layer._weights(model.model.layers[1], (ex.gate_up_proj, ex.down_proj)))
    assert model.model._hina_stack.layers[1] is model.model.layers[1]._hina_layer
    # positions given: transformers' model forward, each layer's step one native call
    calls["stack"].clear()
    with torch.inference_mode():
        cache = M.new_cache(model)
        model(input_ids=ids[:, :10], past_key_values=cache, use_cache=True)
        per_layer = torch.stack([model(input_ids=ids[:, t:t + 1], position_ids=torch.tensor([[t]]), past_key_values=cache,
                                       use_cache=True).logits[0, -1].float() for t in range(10, 20)])
    assert rel_err(per_layer, ref) <= 5e-3 and calls["stack"] == [] and calls["layer"] == [p for p in range(10, 20) for _ in range(2)]
    # two sequences at once: the same logits as each alone on hina+l+a's path (rotary tables of one row shared)
    two = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    fused = batch_steps(model, two, 4)
    M.set_engine(model, "hina+l+a", "eager", "sdpa")
    assert rel_err(fused, batch_steps(model, two, 4)) <= 5e-3
    assert not any("forward" in m.__dict__ for m in [model.model, *model.model.layers])


@pytest.mark.parametrize("kind", ["qwen3", "mixtral"])
def test_fused_int8_engine_runs_the_int8_engines_experts_in_one_call(kind):
    """hina+fused:int8: the same INT8 copies as hina+l+a:int8 (made once), the same logits at decode steps;
    back on hina+fused the layers are prepared again on transformers' bf16 experts."""
    from hinabench.e2e import measure as M
    from hinabench.e2e.dropin_int8 import int8_experts
    model = tiny(kind)
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(5))
    M.set_engine(model, "hina+l+a:int8", "eager", "sdpa")
    ref = M._decode_logits(model, ids, 6)
    copies = [int8_experts(layer.mlp.experts) for layer in model.model.layers]
    assert M.set_engine(model, "hina+fused:int8", "eager", "sdpa").endswith("layer=hina")
    got = M._decode_logits(model, ids, 6)
    assert rel_err(got, ref) <= 5e-3, rel_err(got, ref)
    assert [layer._hina_layer.experts for layer in model.model.layers] == copies
    M.set_engine(model, "hina+fused", "eager", "sdpa")
    bf16 = M._decode_logits(model, ids, 6)
    assert all(layer._hina_layer.experts.weights[0].dtype == torch.bfloat16 for layer in model.model.layers)
    M.set_engine(model, "hina+l+a", "eager", "sdpa")
    assert rel_err(bf16, M._decode_logits(model, ids, 6)) <= 5e-3


@torch.inference_mode()
def batch_steps(model, ids, n):
    """[B, n, V] logits of the last n tokens of ids [B, P] fed as decode steps after a prefill of the rest."""
    from hinabench.e2e import measure as M
    cache = M.new_cache(model)
    model(input_ids=ids[:, :-n], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return torch.stack([model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1].float()
                        for t in range(ids.shape[1] - n, ids.shape[1])], 1)


def test_fused_engine_knows_its_layers():
    from hinabench.e2e import dropin_layer, engines
    assert set(dropin_layer.ROUTERS) == set(engines.FUSED_MODEL_TYPES)
    st_, why = engines.status("hina+fused", "qwen2_moe")
    assert st_ == "unsupported" and "qwen2_moe" in why


def test_append_cache_with_native_appends_across_growth():
    """AppendLayer as hina+fused drives it (reserve, write the buffers, commit without views): the keys and
    values read afterwards are DynamicLayer's, also when a reserve grows the buffers over uncommitted views."""
    from transformers.cache_utils import DynamicLayer

    from hinabench.e2e.dropin_cache import AppendLayer
    g = torch.Generator().manual_seed(1)
    kv = lambda n: (torch.randn(1, 2, n, 16, generator=g).bfloat16(), torch.randn(1, 2, n, 16, generator=g).bfloat16())  # noqa: E731
    ours, theirs = AppendLayer(), DynamicLayer()
    k, v = kv(250)
    ours.update(k, v), theirs.update(k, v)
    for _ in range(10):                      # 256 slots, then 512: the growth copies committed positions
        k, v = kv(1)
        keys, values, pos = ours.reserve(1)
        keys[..., pos:pos + 1, :], values[..., pos:pos + 1, :] = k, v
        ours.commit(1, views=False)
        theirs.update(k, v)
        assert ours.get_seq_length() == theirs.get_seq_length()
    assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
