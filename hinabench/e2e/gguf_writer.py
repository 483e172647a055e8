"""The same checkpoint as GGUF (BF16 or Q8_0) for llama.cpp, written with the `gguf` package.

Tensor names and metadata keys are llama.cpp's (its converter's mapping for these architectures):
qwen3_moe -> `qwen3moe`, qwen2_moe -> `qwen2moe`, mixtral -> `llama` with experts (its q/k rows permuted
from the Hub's rotate-half order to ggml's interleaved rope, as llama.cpp's converter does). Experts are
stacked per layer: ffn_{gate,up}_exps [E, I, H], ffn_down_exps [E, H, I] (numpy order; ggml's ne is
reversed). 1-D tensors (norms, biases) stay F32, and so do the routers (ffn_gate_inp), in both types,
as llama.cpp's converter writes them and llama-quantize leaves them ("do not quantize expert gating
tensors"): a Q8_0 router flipped expert choices of Mixtral-8x7B's 2-layer model on the AMX Xeon (prompt
log-probs 0.449 nats from the reference, 0.031 at 1 layer; 2026-12-04). The vocabulary is the
checkpoint's (`<0> ... <V-1>`) as a plain token list: the engine is given token ids, never text.
Written beside the safetensors, once per type.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

ARCH = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "mixtral": "llama"}
TYPES = ("bf16", "q8_0")
# what this writer writes, in the file ("hinabench.gguf_writer"): a file of another version is rewritten
# (2: the routers F32)
WRITER = 2
WRITER_KEY = "hinabench.gguf_writer"


def writer_version(path: Path) -> int | None:
    """The WRITER a GGUF was written by, or None (an older writer's file, or not readable)."""
    import gguf
    try:
        f = gguf.GGUFReader(path).get_field(WRITER_KEY)
        return None if f is None else int(f.parts[f.data[0]][0])
    except Exception:  # noqa: BLE001 - a damaged or foreign file is rewritten
        return None


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hub (rotate-half) q/k rows -> ggml's interleaved rope order (llama.cpp's converter, llama arch)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(ck, qtype: str = "bf16", echo=None) -> Path:
    import gguf
    from safetensors import safe_open
    from .checkpoint import word
    from ..errors import UserError
    qtype = qtype.lower()
    if qtype not in TYPES:
        raise UserError(f"GGUF type must be one of {', '.join(TYPES)} (got {qtype})")
    path = Path(ck.path) / f"model-{qtype}.gguf"
    if path.exists():
        if writer_version(path) == WRITER:
            return path
        path.unlink()
    import shutil
    need = int(ck.bytes * (34 / 64 if qtype == "q8_0" else 1.0)) + (256 << 20)   # the checkpoint is bf16
    free = shutil.disk_usage(ck.path).free
    if need > free:
        raise UserError(f"writing {path.name} needs ~{need / 2**30:.1f} GiB of disk, {free / 2**30:.1f} GiB free "
                        f"under {ck.path}: free some (other checkpoints' model-*.gguf are rebuilt on demand)")
    cfg = ck.config
    mt = cfg["model_type"]
    arch = ARCH[mt]
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    if echo:
        echo(f"writing {path.name} ({arch}, {qtype})")
    index = json.loads((Path(ck.path) / "model.safetensors.index.json").read_text())["weight_map"]
    files: dict[str, object] = {}

    def get(name: str) -> np.ndarray:
        shard = index[name]
        if shard not in files:
            files[shard] = safe_open(str(Path(ck.path) / shard), "pt")
        return files[shard].get_tensor(name).float().numpy()

    w = gguf.GGUFWriter(str(path) + ".partial", arch)
    w.add_name(f"{ck.model}-L{L} (hinabench synthetic, seed {ck.seed}, {ck.hash})")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg.get("intermediate_size", inter))
    w.add_head_count(hq)
    w.add_head_count_kv(hkv)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if mt != "mixtral":
        w.add_expert_feed_forward_length(inter)
    if mt == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype])
    w.add_uint32(WRITER_KEY, WRITER)
    w.add_tokenizer_model("llama")
    w.add_token_list([word(i) for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([gguf.TokenType.NORMAL] * V)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    qt = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[qtype]

    def put(name: str, a: np.ndarray, f32: bool = False) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1 or f32:
            w.add_tensor(name, a)
            return
        q = qtype
        if q == "q8_0" and a.shape[-1] % 32:
            q = "bf16"    # Q8_0 blocks are 32 wide along a row
        t = qt if q == qtype else gguf.GGMLQuantizationType.BF16
        w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)

    put("token_embd.weight", get("model.embed_tokens.weight"))
    put("output_norm.weight", get("model.norm.weight"))
    put("output.weight", get("lm_head.weight"))
    for i in range(L):
        p, b = f"model.layers.{i}", f"blk.{i}"
        put(f"{b}.attn_norm.weight", get(f"{p}.input_layernorm.weight"))
        put(f"{b}.ffn_norm.weight", get(f"{p}.post_attention_layernorm.weight"))
        q, k = get(f"{p}.self_attn.q_proj.weight"), get(f"{p}.self_attn.k_proj.weight")
        if arch == "llama":
            q, k = _permute(q, hq), _permute(k, hkv)
        put(f"{b}.attn_q.weight", q)
        put(f"{b}.attn_k.weight", k)
        put(f"{b}.attn_v.weight", get(f"{p}.self_attn.v_proj.weight"))
        put(f"{b}.attn_output.weight", get(f"{p}.self_attn.o_proj.weight"))
        if mt == "qwen3_moe":
            put(f"{b}.attn_q_norm.weight", get(f"{p}.self_attn.q_norm.weight"))
            put(f"{b}.attn_k_norm.weight", get(f"{p}.self_attn.k_norm.weight"))
        if mt == "qwen2_moe":
            for x in ("q", "k", "v"):
                put(f"{b}.attn_{x}.bias", get(f"{p}.self_attn.{x}_proj.bias"))
        if mt == "mixtral":
            m = f"{p}.block_sparse_moe"
            names = {"gate": "w1", "up": "w3", "down": "w2"}
            expert = lambda e, which: get(f"{m}.experts.{e}.{names[which]}.weight")  # noqa: E731
        else:
            m = f"{p}.mlp"
            expert = lambda e, which: get(f"{m}.experts.{e}.{which}_proj.weight")  # noqa: E731
        put(f"{b}.ffn_gate_inp.weight", get(f"{m}.gate.weight"), f32=True)
        for which in ("gate", "up", "down"):
            put(f"{b}.ffn_{which}_exps.weight", np.stack([expert(e, which) for e in range(E)]))
        if mt == "qwen2_moe":
            for which in ("gate", "up", "down"):
                put(f"{b}.ffn_{which}_shexp.weight", get(f"{m}.shared_expert.{which}_proj.weight"))
            put(f"{b}.ffn_gate_inp_shexp.weight", get(f"{m}.shared_expert_gate.weight")[0])
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    except OSError as e:          # a full disk, mostly: no half-written file is left to look like a GGUF
        Path(str(path) + ".partial").unlink(missing_ok=True)
        raise UserError(f"could not write {path.name}: {e}") from e
    os.sync()   # as checkpoint(): the write reaches the disk before any engine is timed
    Path(str(path) + ".partial").rename(path)
    return path
