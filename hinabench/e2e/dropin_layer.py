"""The decoder's decode step as one native call: engines `hina+fused` and `hina+fused:int8`; this file is the patch.

Why: at batch 1 the HiNa kernels of a Qwen3-30B-A3B layer take ~4.0 ms on 2 cores of the AMX Xeon and
the layer under `hina+l+a` ~5.0: the rest is transformers' Python around them (the norms, rotary, views,
the router, the drop-ins' own wrappers), which no kernel wins back, and a decode step's Python runs with
its caches cold (every layer streams ~100 MB through them). Here the decoder model's forward is replaced
for decode steps by transformers' embedding and rotary tables, one call of hinabench.kernels_layer's
PreparedStack for every layer (the same kernels, and the glue between them in C++, transformers' bf16
roundings kept), and transformers' final norm; a step the model cannot take whole (a padding mask, outputs
asked for, positions given) runs transformers' forward with each decoder layer's step as one native call,
and anything else (prefill, a sliding window shorter than the cache) the layer's own forward, i.e.
`hina+l+a`. transformers keeps the KV cache object (dropin_cache.py's buffers, written in place), the LM
head (`hina+l`'s linear kernel) and generation. The layers run the experts the model's experts implementation
names: dropin_int8.py's INT8 copies under "hina-int8", else transformers' bf16 tensors as dropin.py prepares them.
"""
import types
import weakref

import torch
from transformers.modeling_outputs import MoeModelOutputWithPast

from hinabench.e2e.dropin import hina_experts
from hinabench.e2e.dropin_cache import AppendLayer
from hinabench.e2e.dropin_int8 import int8_experts
from hinabench.kernels_layer import PreparedStack, decoder_layer_prepare

# the routers' arithmetic, by model type (engines.FUSED_MODEL_TYPES): norm_topk (the top-k weights over their
# sum), topk_bf16 (rounded to bf16)
ROUTERS = {"qwen3_moe": lambda cfg: dict(norm_topk=cfg.norm_topk_prob, topk_bf16=True),
           "mixtral": lambda cfg: dict(norm_topk=True, topk_bf16=False)}


def _qk_norms(attn):
    """Qwen3's per-head q and k RMSNorm weights, or None, None (Mixtral has none)."""
    return (attn.q_norm.weight, attn.k_norm.weight) if hasattr(attn, "q_norm") else (None, None)


def _weights(layer, experts):
    """The tensors the prepared layer reads, in PreparedLayer.weights' order (its `reads` compares them)."""
    a, mlp = layer.self_attn, layer.mlp
    return tuple(w for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight, *_qk_norms(a),
                             a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, mlp.gate.weight,
                             *experts) if w is not None)


def _prepare(layer, cfg, experts):
    a, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = _qk_norms(a)
    return decoder_layer_prepare(
        experts=experts, in_norm=layer.input_layernorm.weight,
        post_norm=layer.post_attention_layernorm.weight, q_norm=q_norm, k_norm=k_norm, wq=a.q_proj.weight,
        wk=a.k_proj.weight, wv=a.v_proj.weight, wo=a.o_proj.weight, router=mlp.gate.weight,
        h_q=cfg.num_attention_heads, h_kv=cfg.num_key_value_heads, eps=layer.input_layernorm.variance_epsilon,
        top_k=cfg.num_experts_per_tok, sm_scale=a.scaling, **ROUTERS[cfg.model_type](cfg))


def _prepared(layer):
    """The layer's prepared call, made again if transformers' tensors changed (checked once per cache)."""
    p, cfg = layer.__dict__.get("_hina_layer"), layer.self_attn.config
    moe = (int8_experts if cfg._experts_implementation == "hina-int8" else hina_experts)(layer.mlp.experts)
    if p is None or not p.reads(*_weights(layer, moe.weights)):
        p = layer._hina_layer = _prepare(layer, cfg, moe)
    return p


def _rows(tables, B):
    """transformers' rotary (cos, sin), [1 or B, 1, d], as [B, d] views (one row shared by every sequence)."""
    return tuple(t.reshape(-1, t.shape[-1]).expand(B, -1) for t in tables)


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
    seen = self.__dict__.get("_hina_seen")   # the weights checked once per cache (a generation), not per step
    if seen is None or seen() is not past_key_values:
        _prepared(self)
        self._hina_seen = weakref.ref(past_key_values)
    keys, values, pos = cache.reserve(1)
    out = self._hina_layer(hidden_states.view(B, H), *_rows(position_embeddings, B), keys, values, pos)
    cache.commit(1, views=False)
    return out.view(B, 1, H)


def _stack_caches(model, input_ids, attention_mask, position_ids, cache, inputs_embeds, kwargs):
    """The cache's layers when this call is a decode step the stack can take whole, else None."""
    if (input_ids is None or inputs_embeds is not None or position_ids is not None or input_ids.dim() != 2
            or input_ids.shape[1] != 1 or set(kwargs) - QUIET_KWARGS or any(kwargs.get(k) for k in OUTPUTS)):
        return None
    layers = getattr(cache, "layers", None)
    if (layers is None or len(layers) != len(model.layers) or model.config.num_hidden_layers != len(model.layers)
            or not all(type(c) is AppendLayer and c.is_initialized and c.buffers is not None for c in layers)):
        return None
    pos, window = layers[0].length, model.config.sliding_window
    if any(c.length != pos for c in layers) or (window is not None and pos >= window):
        return None
    cp = kwargs.get("cache_position")
    if (cp is not None and int(cp.reshape(-1)[0]) != pos) or (attention_mask is not None and not bool(attention_mask.all())):
        return None
    return layers


OUTPUTS = ("output_router_logits", "output_attentions", "output_hidden_states")
QUIET_KWARGS = set(OUTPUTS) | {"return_dict", "cache_position"}


def hina_model_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                       inputs_embeds=None, use_cache=None, **kwargs):
    caches = _stack_caches(self, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, kwargs)
    if caches is None:
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                  **kwargs)
    seen = self.__dict__.get("_hina_seen")   # the layers' weights checked once per cache, as a layer's are
    if seen is None or seen() is not past_key_values:
        layers = [_prepared(layer) for layer in self.layers]
        stack = self.__dict__.get("_hina_stack")
        if (stack is None or len(stack.layers) != len(layers)     # a model cut to its first layers: measure.first_layers
                or any(a is not b for a, b in zip(stack.layers, layers))):
            self._hina_stack = PreparedStack(layers)
        self._hina_seen = weakref.ref(past_key_values)
    B, pos = input_ids.shape[0], caches[0].length
    bufs = [c.reserve(1) for c in caches]
    hidden = self.embed_tokens(input_ids)
    cos, sin = _rows(self.rotary_emb(hidden, torch.full((1, 1), pos, dtype=torch.long)), B)
    out = self._hina_stack(hidden.view(B, -1), cos, sin, [b[0] for b in bufs], [b[1] for b in bufs], pos)
    for c in caches:
        c.commit(1, views=False)
    return MoeModelOutputWithPast(last_hidden_state=self.norm(out.view(B, 1, -1)), past_key_values=past_key_values)


def use_hina_layer(model, on: bool = True):
    """The decoder's decode steps as one native call (the model's forward), or each layer's as one where
    the step is not the model's alone (on=False: transformers' forwards again). Raises NotImplementedError
    for a model whose decoder layer this file does not know."""
    cfg = model.config
    if on and cfg.model_type not in ROUTERS:
        raise NotImplementedError(f"hina+fused knows the decoder layers of {', '.join(ROUTERS)}, not {cfg.model_type}")
    for mod, fwd in [(layer, hina_layer_forward) for layer in model.model.layers] + [(model.model, hina_model_forward)]:
        if on:
            mod.forward = types.MethodType(fwd, mod)
        elif "forward" in mod.__dict__:
            del mod.forward
    return model
