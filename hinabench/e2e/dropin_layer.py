"""Each decoder layer's decode step as one native call: engine `hina+fused`; this file is the patch.

Why: at batch 1 the HiNa kernels of a Qwen3-30B-A3B layer take ~4.0 ms on 2 cores of the AMX Xeon and
the layer under `hina+l+a` ~5.0: the rest is transformers' Python around them (the norms, rotary, views,
the router, the drop-ins' own wrappers), which no kernel wins back. Here the decoder layer's forward is
replaced, instance by instance, by one call of hinabench.kernels_layer (the same kernels, and the glue
between them in C++, transformers' bf16 roundings kept). transformers keeps everything else: the
embedding, the rotary tables, the KV cache object (dropin_cache.py's buffers, written in place), the
masks, the final norm and the LM head (`hina+l`'s linear kernel), generation. Anything but a decode step
of a model whose layer it knows (prefill, a mask, a cache without room, a sliding window shorter than the
cache) runs the layer's own forward, i.e. `hina+l+a`.
"""
import types
import weakref

import torch

from hinabench.e2e.dropin_cache import AppendLayer
from hinabench.kernels import moe_ffn_prepare
from hinabench.kernels_layer import decoder_layer_prepare

# the routers' arithmetic, by model type (engines.FUSED_MODEL_TYPES): norm_topk (the top-k weights over their
# sum), topk_bf16 (rounded to bf16)
ROUTERS = {"qwen3_moe": lambda cfg: dict(norm_topk=cfg.norm_topk_prob, topk_bf16=True),
           "mixtral": lambda cfg: dict(norm_topk=True, topk_bf16=False)}


def _weights(layer):
    """The tensors the prepared layer reads, in PreparedLayer.weights' order (its `reads` compares them)."""
    a, mlp = layer.self_attn, layer.mlp
    qk = (a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else ()
    return (layer.input_layernorm.weight, layer.post_attention_layernorm.weight, *qk, a.q_proj.weight,
            a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, mlp.gate.weight, mlp.experts.gate_up_proj,
            mlp.experts.down_proj)


def _prepare(layer, cfg):
    a, mlp = layer.self_attn, layer.mlp
    ex = mlp.experts
    if ex.has_bias or not ex.has_gate or ex.is_transposed or not ex.is_concatenated:
        raise NotImplementedError("hina layer: fused [gate; up] expert weights without bias only")
    qk = (a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else (None, None)
    return decoder_layer_prepare(
        experts=moe_ffn_prepare(None, None, ex.down_proj, w13=ex.gate_up_proj), in_norm=layer.input_layernorm.weight,
        post_norm=layer.post_attention_layernorm.weight, q_norm=qk[0], k_norm=qk[1], wq=a.q_proj.weight,
        wk=a.k_proj.weight, wv=a.v_proj.weight, wo=a.o_proj.weight, router=mlp.gate.weight,
        h_q=cfg.num_attention_heads, h_kv=cfg.num_key_value_heads, eps=layer.input_layernorm.variance_epsilon,
        top_k=cfg.num_experts_per_tok, sm_scale=a.scaling, **ROUTERS[cfg.model_type](cfg))


def hina_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                       use_cache=False, position_embeddings=None, **kwargs):
    B, n, H = hidden_states.shape
    cache = past_key_values.layers[self.self_attn.layer_idx] if past_key_values is not None else None
    window = getattr(self.self_attn.config, "sliding_window", None)
    if (n != 1 or attention_mask is not None or not isinstance(cache, AppendLayer) or not cache.is_initialized
            or hidden_states.dtype != torch.bfloat16 or (window is not None and cache.length >= window)):
        return type(self).forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, use_cache=use_cache,
                                  position_embeddings=position_embeddings, **kwargs)
    # the weights checked once per cache (a generation), the layer prepared again if transformers' tensors changed
    layer, seen = self.__dict__.get("_hina_layer"), self.__dict__.get("_hina_seen")
    if seen is None or seen() is not past_key_values:
        if layer is None or not layer.reads(*_weights(self)):
            layer = self._hina_layer = _prepare(self, self.self_attn.config)
        self._hina_seen = weakref.ref(past_key_values)
    keys, values, pos = cache.reserve(1)
    cos, sin = (t.reshape(-1, t.shape[-1]).expand(B, -1) for t in position_embeddings)   # [1 or B, 1, d] -> [B, d]
    out = layer(hidden_states.view(B, H), cos, sin, keys, values, pos)
    cache.commit(1, views=False)
    return out.view(B, 1, H)


def use_hina_layer(model, on: bool = True):
    """Every decoder layer's decode step as one native call (on=False: the layers' own forward again).
    Raises NotImplementedError for a model whose decoder layer this file does not know."""
    cfg = model.config
    for layer in model.model.layers:
        if on:
            if cfg.model_type not in ROUTERS:
                raise NotImplementedError(f"hina+fused knows the decoder layers of {', '.join(ROUTERS)}, not "
                                          f"{cfg.model_type}")
            layer.forward = types.MethodType(hina_layer_forward, layer)
        elif "forward" in layer.__dict__:
            del layer.forward
    return model
