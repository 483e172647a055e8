"""HiNa decode attention dropped into transformers: engine `hina+a` (the paper's "+a"); this file is the patch.

transformers dispatches every attention module through its AttentionInterface by
`config._attn_implementation`. Registering one function there (and sdpa's mask function under the same
name, so padding and causal masks are built as for sdpa) and selecting it is the integration. A decode
step (one new token per sequence, no mask needed) runs `decode_attention` on the KV cache transformers
keeps ([B, h_kv, L, d], read in place: no copy, no repeat of the KV heads); anything else (prefill, a
padding mask, a sliding window shorter than the cache, dropout) is sdpa's, unchanged.
"""
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hinabench.kernels import decode_attention


def hina_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    B, h_q, n, d = query.shape
    L = key.shape[2]
    window = kwargs.get("sliding_window")
    if (n != 1 or attention_mask is not None or dropout or query.dtype != torch.bfloat16
            or (window is not None and L > window) or d % 16 or kwargs.get("softcap")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = decode_attention(query[:, :, 0], key, value, [L] * B, sm_scale=scaling)   # [B, h_q, d]
    return out.unsqueeze(1), None                                                     # [B, 1, h_q, d]


AttentionInterface.register("hina", hina_attention_forward)
AttentionMaskInterface.register("hina", sdpa_mask)


def use_hina_attention(model):
    """Route `model`'s attention through HiNa decode attention (transformers' own API)."""
    model.set_attn_implementation("hina")
    return model
